"""#28: ``hookscope.watch`` in five real training scripts (our own small adaptations, in
:mod:`tests.training_scripts`, synthetic data, CPU, seeded), each with one planted fault, and
what the watch must name: the module that made the value, the phase and the step; for the
gradient faults, the flag on the right layers.

=====  ==========  ===============  ===========================================  ==================
 #     script      fault            what the watch must say                      today
=====  ==========  ===============  ===========================================  ==================
 1     mnist       nan_weight       fc1, forward, step 2                         passes
 2     mnist       nan_pixels       conv1 reached first from outside, step 1     passes
 3     mnist       sqrt_between     dropout1's output gradient from outside,     passes
                                    backward, step 0
 4     mnist       fc2_tiny         conv1, conv2, fc1 vanish; fc2 not explode    passes
 5     mnist       dead_conv1       conv1 zero_grad (its gradient is exactly 0)  passes
 6     imagenet    sqrt_shared      backward, step 0: one of layer2.0.conv1,     passes
                                    its downsample (they read one tensor) or the
                                    block's code; said to be unclear
 7     imagenet    dead_relu        the first dead row is relu                   passes
 8     imagenet    nan_pixels       conv1 reached first from outside, step 1     passes
 9     imagenet    custom_backward  layer3.1.conv2, backward, step 0             passes
 10    imagenet    grad_blowup      layers below layer4 explode; layer4, fc not  passes
 11    dcgan       nan_d_forward    BCELoss raises; netD main.2, forward,        passes
                                    step 1 still in nonfinite.json and raised
 12    dcgan       nan_pixels       BCELoss raises; netD main.0 from outside,    passes
                                    step 1 still in nonfinite.json and raised
 13    dcgan       sqrt_g_backward  netG main.12, backward, step 0               passes
 14    dcgan       dead_g           netG's first dead row is main.2              passes
 15    lightning   cli_config       the callback configured by LightningCLI      passes
 16    lightning   nan_l2           backbone.l2, forward, step 2                 passes
 17    lightning   accumulate       backbone.l2, forward, optimiser step 2       passes
 18    lightning   dead_logits      l1, l2 zero_grad (all gradients exactly 0)   passes
 19    hf          nan_pixels       the patch projection from outside, step 1    passes
 20    hf          custom_backward  vit.layers.0.mlp.fc1, backward, step 0       passes
 21    hf          loss_logged      every logging line holds the loss            passes
 22    hf          classifier_tiny  the encoder's layers vanish; classifier      passes
                                    not explode
=====  ==========  ===============  ===========================================  ==================
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from hookscope.training.nonfinite import NonFiniteError

from .watch_logs import read_log

pytestmark = pytest.mark.usefixtures("one_thread")


@dataclass(frozen=True)
class Located:
    """The run stops with this finding (``raised``: the script's own exception, e.g.
    BCELoss's, carries it; else a ``NonFiniteError``)."""

    module: str
    phase: str
    step: int
    source: str = "module"
    raised: bool = False
    #: With ``source="unclear"``: modules the event must name as possible makers.
    candidates: tuple[str, ...] = ()


@dataclass(frozen=True)
class Flagged:
    """The run ends; at logging step ``step``, each of ``on`` carries ``flag``, none of
    ``off`` carries ``off_flag``; ``first``: the first row (execution order) with ``flag``."""

    flag: str
    on: tuple[str, ...] = ()
    off: tuple[str, ...] = ()
    off_flag: str = ""
    first: str | None = None
    step: int = 0


@dataclass(frozen=True)
class Lines:
    """The run ends with ``count`` logging lines, each holding ``fields``."""

    count: int
    fields: tuple[str, ...] = field(default=())


def case(script: str, fault: str, sub: str, want: Any, marks: Any = ()) -> Any:
    """One planted fault: the script, the fault, the log's folder under the run's, the want."""
    return pytest.param(script, fault, sub, want, marks=marks, id=f"{script}-{fault}")


def _fails(finding: int, branch: str) -> Any:
    return pytest.mark.xfail(strict=True, reason=f"#28 finding {finding}: fixed on branch {branch}")


STEM = ("conv1", "layer1.0.conv1", "layer2.0.conv1", "layer3.1.conv2")
VIT = ("vit.embeddings.patch_embeddings.projection", "vit.layers.0.mlp.fc1", "vit.layers.1.mlp.fc2")

CASES = [
    case("mnist", "nan_weight", "", Located("fc1", "forward", 2)),
    case("mnist", "nan_pixels", "", Located("conv1", "forward", 1, "outside")),
    case("mnist", "sqrt_between", "", Located("dropout1", "backward", 0, "outside")),
    case("mnist", "fc2_tiny", "",
         Flagged("vanish", on=("conv1", "conv2", "fc1"), off=("fc2",), off_flag="explode")),
    case("mnist", "dead_conv1", "", Flagged("zero_grad", on=("conv1",))),
    case("imagenet", "sqrt_shared", "", Located("layer2.0", "backward", 0, "unclear",
                                                candidates=("layer2.0.conv1", "layer2.0.downsample.0"))),
    case("imagenet", "dead_relu", "", Flagged("dead", first="relu")),
    case("imagenet", "nan_pixels", "", Located("conv1", "forward", 1, "outside")),
    case("imagenet", "custom_backward", "", Located("layer3.1.conv2", "backward", 0)),
    case("imagenet", "grad_blowup", "", Flagged("explode", on=STEM, off=("layer4.1.conv2", "fc"),
                                                   off_flag="explode")),
    case("dcgan", "nan_d_forward", "D", Located("main.2", "forward", 1, raised=True)),
    case("dcgan", "nan_pixels", "D", Located("main.0", "forward", 1, "outside", raised=True)),
    case("dcgan", "sqrt_g_backward", "G", Located("main.12", "backward", 0)),
    case("dcgan", "dead_g", "G", Flagged("dead", first="main.2")),
    case("lightning_cli", "cli_config", "", Lines(4), ),
    case("lightning_cli", "nan_l2", "", Located("backbone.l2", "forward", 2)),
    case("lightning_cli", "accumulate", "", Located("backbone.l2", "forward", 2)),
    case("lightning_cli", "dead_logits", "", Flagged("zero_grad", on=("backbone.l1", "backbone.l2"))),
    case("hf_image_classification", "nan_pixels", "watch",
         Located("vit.embeddings.patch_embeddings.projection", "forward", 1, "outside")),
    case("hf_image_classification", "custom_backward", "watch",
         Located("vit.layers.0.mlp.fc1", "backward", 0)),
    case("hf_image_classification", "loss_logged", "watch", Lines(3, ("loss",))),
    case("hf_image_classification", "classifier_tiny", "watch",
         Flagged("vanish", on=VIT, off=("classifier",), off_flag="explode")),
]


def _said(error: BaseException) -> str:
    """Everything an exception says: its message, notes and chain."""
    parts, seen = [], set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts += [str(current), *getattr(current, "__notes__", ())]
        current = current.__cause__ or current.__context__
    return " | ".join(parts)


def _located(run: Any, log: Path, want: Located) -> None:
    with pytest.raises(Exception) as caught:  # noqa: PT011 - which one is the point below
        run()
    error = caught.value
    if want.raised:
        assert not isinstance(error, NonFiniteError) or error.__cause__ is not None
        assert f"step {want.step}, {want.phase}: " in _said(error) and want.module in _said(error)
    else:
        assert isinstance(error, NonFiniteError), _said(error)
        assert (error.module, error.phase, error.step) == (want.module, want.phase, want.step), str(error)
    _, _, event = read_log(log)
    assert event is not None, "no nonfinite.json"
    got = event["event"]
    assert (got["module"], got["phase"], got["step"], got["source"]) == \
        (want.module, want.phase, want.step, want.source), got["message"]
    assert set(want.candidates) <= {c["module"] if isinstance(c, dict) else c
                                    for c in got.get("candidates") or ()}, got["message"]


def _flagged(lines: list[dict[str, Any]], want: Flagged) -> None:
    line = next(line for line in lines if line["step"] == want.step)
    flags: dict[str, set[str]] = {}
    for row in line["layers"]:
        flags.setdefault(row["name"], set()).update(row["flags"])
    missing = [name for name in want.on if want.flag not in flags[name]]
    wrong = [name for name in want.off if want.off_flag in flags[name]]
    assert not missing and not wrong, (missing, wrong, line["flagged"])
    if want.first is not None:
        assert next(r["name"] for r in line["layers"] if want.flag in r["flags"]) == want.first


@pytest.mark.parametrize(("script", "fault", "sub", "want"), CASES)
def test_planted_fault_is_named(tmp_path: Path, script: str, fault: str, sub: str, want: Any) -> None:
    main = importlib.import_module(f".training_scripts.{script}", __package__).main
    log = tmp_path / sub

    steps = want.count if isinstance(want, Lines) else want.step + 1  # no step more than needed

    def run() -> None:
        main(tmp_path, None if fault == "loss_logged" else fault, steps=steps)

    if isinstance(want, Located):
        _located(run, log, want)
        return
    run()
    envelope, lines, event = read_log(log)
    assert event is None and envelope["every"] == 1
    if isinstance(want, Flagged):
        _flagged(lines, want)
    else:
        assert len(lines) == want.count and all(set(want.fields) <= set(line) for line in lines), \
            [sorted(line) for line in lines]
        assert json.loads((log / "watch.jsonl").read_text().splitlines()[-1])["step"] == want.count - 1
