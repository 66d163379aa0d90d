"""The command line around training: telling a training log (a directory holding
``watch.jsonl``, read without torch) from MODEL INPUT for ``check`` and ``report``, and
``hookscope watch``, a smoke training run under :func:`hookscope.watch`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hookscope import options as o
from hookscope.core.errors import HookscopeError
from hookscope.options import runs_model
from hookscope.session import Session


def is_log_run(s: Session, model: str, inputs: Sequence[str] | None) -> bool:
    """Whether MODEL is a training log (True) or a model to run on INPUT (False).

    Raises:
        HookscopeError: a log with inputs or under torchrun (one process reads a log), or
            a model without inputs.
    """
    from hookscope.training.log_reader import LOG_FILE, is_log

    if is_log(model):
        if inputs:
            raise HookscopeError(f"{model!r} is a training log (it holds {LOG_FILE}); give it "
                                 "alone, without INPUT.")
        if s.ranks > 1:
            raise HookscopeError("a training log is read by one process: run this without "
                                 "torchrun.")
        return True
    if not inputs and s.model.data is None:
        hint = f" ({model!r} is a directory without {LOG_FILE})" if Path(model).is_dir() \
            else ""
        raise HookscopeError(f"missing INPUT: give images, directories of images or tensor "
                             f"files after MODEL, or a training log directory (holding "
                             f"{LOG_FILE}) alone{hint}.")
    return False


@runs_model
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
    import shutil

    from hookscope.checks.log import evaluate_log
    from hookscope.checks.rulefile import load_rules
    from hookscope.core.errors import CheckFailed
    from hookscope.training.smoke import SmokeOptions, smoke_labels, train

    if log_dir is not None:
        s.folder(log_dir, [log_dir / "watch.jsonl"])
    checks = load_rules(rules).only("log") if rules is not None else None
    resolved = s.inputs(inputs)
    loaded = s.load("watch")
    labels = smoke_labels(label, resolved.labels, loaded.categories)
    options = SmokeOptions(steps=steps, lr=lr, momentum=momentum, overfit=overfit, every=every,
                           log_dir=log_dir, layers=layers, types=types, force=s.force)
    # The outermost folder of --log-dir that this run creates, if any.
    fresh = next((p for p in reversed([log_dir, *log_dir.parents]) if not p.exists()),
                 None) if log_dir is not None else None
    try:
        with s.progress(steps, "watch", enabled=s.shown(fmt)) as bar:
            report = train(loaded, lambda: s.batches(resolved, loaded), labels, options,
                           progress=bar)
    except KeyboardInterrupt:  # Ctrl-C or a signal: no output, so no log this run began
        if fresh is not None:
            shutil.rmtree(fresh, ignore_errors=True)
        raise
    verdict = evaluate_log(checks, report.log) if checks and report.log is not None else None
    doc = loaded.envelope("watch", resolved.names) | report.to_dict() | {
        "check": verdict.to_dict() if verdict is not None else None}
    failure = report.failure or (verdict.summary() if verdict and not verdict.passed else None)
    doc |= {"passed": failure is None, "failure": failure}
    s.emit("watch", doc, fmt)
    if failure is not None:
        raise CheckFailed(failure)
