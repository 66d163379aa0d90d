"""The command line around training: telling a training log (a directory holding
``watch.jsonl``, read without torch) from MODEL INPUT for ``check`` and ``report``, and
``hookscope watch``, a smoke training run under :func:`hookscope.watch`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from contextlib import suppress
from pathlib import Path

from hookscope import options as o
from hookscope.core.errors import HookscopeError, param
from hookscope.session import Session


def is_log_run(s: Session, model: str, inputs: Sequence[str] | None) -> bool:
    """Whether MODEL is a training log (True) or a model to run on INPUT (False).
    HookscopeError: a log with inputs or under torchrun (one process reads a log), or a model
    without inputs."""
    from hookscope.training.log_reader import EVENT_FILE, LOG_FILE, is_log

    path = Path(model)
    if path.name in (LOG_FILE, EVENT_FILE) and is_log(path.parent):
        raise HookscopeError(f"{model!r} is a training log's file: give its directory, "
                             f"{str(path.parent)!r}.")
    if is_log(model):
        if inputs:
            raise HookscopeError(f"{model!r} is a training log (it holds {LOG_FILE}); give it "
                                 "alone, without INPUT.")
        if s.group.size > 1:
            raise HookscopeError("a training log is read by one process: run this without "
                                 "torchrun.")
        return True
    if not inputs and s.model.data is None:
        if "/" in model and ":" not in model and not os.path.lexists(model):  # not a source
            raise HookscopeError(f"{model!r} does not exist: give a training log directory "
                                 f"(holding {LOG_FILE}), or MODEL and INPUT.")
        hint = f" ({model!r} is a directory without {LOG_FILE})" if path.is_dir() else ""
        raise HookscopeError(f"missing INPUT: give images, directories of images or tensor "
                             f"files after MODEL, or a training log directory (holding "
                             f"{LOG_FILE}) alone{hint}.")
    return False


def _apart(log_dir: Path, given: Iterable[str]) -> None:
    """Refuse a log directory that is an input, lies inside an input folder, or holds an
    input: the log would be read as data, or written into the data set."""
    log = log_dir.resolve()
    for spec in given:
        path = Path(spec)
        with suppress(OSError):
            real = path.resolve(strict=True)
            if real.is_relative_to(log) or (path.is_dir() and log.is_relative_to(real)):
                raise HookscopeError(
                    f"{param('log_dir')} {str(log_dir)!r} overlaps the input {str(spec)!r} "
                    "(the same folder, or one inside the other): an input is never an output; "
                    f"give a {param('log_dir')} outside the inputs.")


@o.runs_model
def watch_command(
    model: o.ModelArg, inputs: o.InputsArg, steps: o.WatchStepsOpt = 50,
    lr: o.WatchLrOpt = 0.01, momentum: o.WatchMomentumOpt = 0.0,
    label: o.WatchLabelOpt = None, overfit: o.WatchOverfitOpt = False,
    every: o.WatchEveryOpt = 10, log_dir: o.WatchLogDirOpt = None, rules: o.WatchRulesOpt = None,
    layers: o.LayersOpt = None, types: o.TypesOpt = None, fmt: o.FormatOpt = "table", *,
    s: Session,
) -> None:
    """Smoke training: SGD on a copy of the model over the inputs, watched every step.

    Labels are the inputs' ImageFolder class folders, or --label. The table says the loss
    at the first and last step, the layers flagged, and the first non-finite value with the
    module that produced it. Exit 1 when the loss is not finite, a NaN or Inf appeared, or,
    with --overfit (one batch, repeated), the loss did not fall, or a --rules rule failed
    on the training log. The model file is never written.

    Example: hookscope watch resnet18 data/train --weights none --steps 50 --lr 0.01 --overfit
    """
    from hookscope.checks.log import evaluate_log
    from hookscope.checks.rulefile import load_rules
    from hookscope.core.errors import CheckFailed
    from hookscope.training.log_writer import check_log_dir
    from hookscope.training.smoke import SmokeOptions, smoke_labels, train

    if log_dir is not None:
        check_log_dir(log_dir, force=s.force)
        s.folder(log_dir, [log_dir / "watch.jsonl"])
        _apart(log_dir, inputs)
    checks = load_rules(rules).only("log") if rules is not None else None
    resolved = s.inputs(inputs)
    loaded = s.load("watch")
    labels = smoke_labels(label, resolved.labels, loaded.categories)
    options = SmokeOptions(steps=steps, lr=lr, momentum=momentum, overfit=overfit, every=every,
                           log_dir=log_dir, layers=layers, types=types, force=s.force)
    with s.progress(steps, "watch", enabled=s.shown(fmt)) as bar:  # --log-dir: at the end
        report = train(loaded, lambda: s.batches(resolved, loaded), labels, options,
                       progress=bar)
    verdict = evaluate_log(checks, report.log) if checks and report.log is not None else None
    doc = loaded.envelope("watch", resolved.names) | report.to_dict() | {
        "check": verdict.to_dict() if verdict is not None else None}
    failure = report.failure or (verdict.summary() if verdict and not verdict.passed else None)
    doc |= {"passed": failure is None, "failure": failure}
    s.emit("watch", doc, fmt)
    if failure is not None:
        raise CheckFailed(failure)
