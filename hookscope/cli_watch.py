"""The command line around training: ``check`` and ``report`` on a training log (a
directory holding ``watch.jsonl``, read without torch, in place of MODEL INPUT), and
``hookscope watch``, a smoke training run under :func:`hookscope.watch`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hookscope import options as o
from hookscope.core.errors import HookscopeError
from hookscope.options import Options, runs_model
from hookscope.options import value as _value


def is_log_run(model: str, inputs: Sequence[str] | None) -> bool:
    """Whether MODEL is a training log (True) or a model to run on INPUT (False).

    Raises:
        HookscopeError: a log with inputs, or a model without them.
    """
    from hookscope.training.logs import LOG_FILE, is_log

    if is_log(model):
        if inputs:
            raise HookscopeError(f"{model!r} is a training log (it holds {LOG_FILE}); give it "
                                 "alone, without INPUT.")
        return True
    if not inputs:
        hint = f" ({model!r} is a directory without {LOG_FILE})" if Path(model).is_dir() \
            else ""
        raise HookscopeError(f"missing INPUT: give images, directories of images or tensor "
                             f"files after MODEL, or a training log directory (holding "
                             f"{LOG_FILE}) alone{hint}.")
    return False


def _one_process(opts: Options) -> str:
    """MODEL, a training log, read by this one process."""
    if opts.s.ranks > 1:
        raise HookscopeError("a training log is read by one process: run this without "
                             "torchrun.")
    return opts.model.name


def check_log(opts: Options, rules: Path | None, overrides: Mapping[str, Any],
              junit: Path | None, fmt: str) -> None:
    """``hookscope check LOG_DIR``: the rules over the log, written as a model run's check."""
    from hookscope.core.errors import CheckFailed
    from hookscope.probes.rulefile import load_rules
    from hookscope.render.check import resolve_junit
    from hookscope.training.logs import read_log
    from hookscope.training.rules import evaluate_log, log_doc

    s, folder = opts.s, _one_process(opts)
    out = s.output(opts.output, force=opts.force)
    junit_out = resolve_junit(junit, opts.output, force=opts.force)
    checks = load_rules(rules, overrides)
    log = read_log(folder)
    report = evaluate_log(checks, log)
    doc = log_doc(log, report)
    if junit_out is not None:
        s.emit("check", doc, "junit", junit_out)
    s.emit("check", doc, fmt, out)
    if not report.passed:
        raise CheckFailed(report.summary())


def report_log(opts: Options) -> None:
    """``hookscope report LOG_DIR``: the training page."""
    from hookscope.training.logs import read_log

    folder = _one_process(opts)
    out = opts.s.output(opts.output, force=opts.force)
    opts.s.emit("training", read_log(folder), "html", out)


@runs_model
def watch_command(
    model: o.ModelArg, inputs: o.InputsArg, steps: o.WatchStepsOpt = 50,
    lr: o.WatchLrOpt = 0.01, momentum: o.WatchMomentumOpt = 0.0,
    label: o.WatchLabelOpt = None, overfit: o.WatchOverfitOpt = False,
    every: o.WatchEveryOpt = 10, log_dir: o.WatchLogDirOpt = None, rules: o.WatchRulesOpt = None,
    layers: o.LayersOpt = None, types: o.TypesOpt = None, fmt: o.FormatOpt = "table", *,
    opts: Options,
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

    from hookscope.core.errors import CheckFailed
    from hookscope.probes.rulefile import load_rules
    from hookscope.training.rules import evaluate_log, for_log
    from hookscope.training.smoke import SmokeOptions, smoke_labels, train

    s, fmt = opts.s, _value(fmt)
    out = s.output(opts.output, force=opts.force)
    if log_dir is not None:
        s.folder(log_dir, [log_dir / "watch.jsonl"], force=opts.force)
    checks = for_log(load_rules(rules)) if rules is not None else None
    resolved = s.inputs(inputs, opts.model)
    loaded = s.load(opts.model, "watch")
    labels = smoke_labels(label, resolved.labels, loaded.categories)
    options = SmokeOptions(steps=steps, lr=lr, momentum=momentum, overfit=overfit, every=every,
                           log_dir=log_dir, layers=layers, types=types, force=opts.force)
    # The outermost folder of --log-dir that this run creates, if any.
    fresh = next((p for p in reversed([log_dir, *log_dir.parents]) if not p.exists()),
                 None) if log_dir is not None else None
    try:
        with s.progress(steps, "watch", enabled=fmt == "table" or not out.is_stdout) as bar:
            report = train(loaded, lambda: s.batches(resolved, loaded, opts.model), labels,
                           options, progress=bar)
    except KeyboardInterrupt:  # Ctrl-C or a signal: no output, so no log this run began
        if fresh is not None:
            shutil.rmtree(fresh, ignore_errors=True)
        raise
    verdict = evaluate_log(checks, report.log) if checks and report.log is not None else None
    doc = loaded.envelope("watch", resolved.names) | report.to_dict() | {
        "check": verdict.to_dict() if verdict is not None else None}
    failure = report.failure or (verdict.summary() if verdict and not verdict.passed else None)
    doc |= {"passed": failure is None, "failure": failure}
    s.emit("watch", doc, fmt, out)
    if failure is not None:
        raise CheckFailed(failure)
