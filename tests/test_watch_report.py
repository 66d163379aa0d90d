"""``hookscope check`` and ``hookscope report`` on logs that real watched runs wrote: they
honour what the watch was told (``allow_inf``, ``nonfinite="warn"``; issue #28, finding 7),
and the training page (finding 8): one verdict, the flight recorder, ranked findings with
drift only when it matters, robust colour scales, zeros apart from "not logged", and the
update ratio per step, as check's rule reads it."""

from __future__ import annotations

import json
import math
import re
from html import unescape
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import hookscope
from tests.test_report import Tags
from tests.test_watch_logs import LAYERS, rules, run, write_log

ROOT = Path(__file__).resolve().parent.parent


class Mask(nn.Module):
    """-inf at the first of the features, as an attention mask does: intended."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keep = torch.ones(x.shape[-1], dtype=torch.bool)
        keep[0] = False
        return x.masked_fill(~keep, -math.inf)


class Log(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)


def page(log: Path, tmp_path: Path) -> tuple[Tags, str]:
    """The page's tags, and its text with the summary chips first (each once)."""
    out = tmp_path / "page.html"
    r = run("report", log, "-o", out)
    assert r.exit_code == 0, r.output
    html = out.read_text(encoding="utf-8")
    parsed = Tags()
    parsed.feed(html)
    parsed.html = html  # type: ignore[attr-defined]
    chips = [unescape(c) for c in re.findall(r'<span class="chip[^"]*">(.*?)</span>', html)]
    return parsed, "|".join(chips) + "|" + " ".join("".join(parsed.text).split())


def chips(parsed: Tags, text: str) -> list[str]:
    """The chips: logging steps, layer calls, the non-finite verdict, flagged layers."""
    return text.split("|")[:4]


def check(log: Path, *args: object) -> tuple[int, dict[str, Any]]:
    r = run("check", log, "--format", "json", *args)
    return r.exit_code, json.loads(r.stdout)


def test_an_allowed_inf_fails_no_rule_and_is_no_finding(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), Mask(), nn.Softmax(-1), nn.Linear(5, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with hookscope.watch(model, tmp_path / "log", every=1, allow_inf=["1"]) as w:
        for _ in range(3):
            nn.functional.cross_entropy(model(torch.randn(8, 6)), torch.randint(0, 3, (8,))).backward()
            opt.step()
            opt.zero_grad()
            w.step()
    lines = (tmp_path / "log" / "watch.jsonl").read_text().splitlines()[1:]
    masked = [json.loads(line)["layers"][1] for line in lines]
    assert all(row["nonfinite"] == 8 and row["flags"] == [] for row in masked)  # 8 -inf each
    code, doc = check(tmp_path / "log")
    assert code == 0 and doc["rules"][0]["offenders"] == [], doc["rules"]
    parsed, text = page(tmp_path / "log", tmp_path)
    assert chips(parsed, text)[2:] == ["no non-finite value", "0 flagged layers"]
    assert "Nothing flagged" in text


def test_a_warned_run_that_went_on_is_not_said_to_have_stopped(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with hookscope.watch(model, tmp_path / "log", every=1, nonfinite="warn") as w:
        for step in range(6):
            x = torch.randn(8, 6)
            if step == 2:
                x[0, 0] = math.nan  # a NaN pixel; the loop skips that step's update
            loss = nn.functional.cross_entropy(model(x), torch.randint(0, 3, (8,)))
            loss.backward()
            if torch.isfinite(loss):
                opt.step()
            opt.zero_grad()
            w.step(loss)
    said = "warned about non-finite values at step 2; training continued to step 5"
    code, doc = check(tmp_path / "log")
    [rule] = doc["rules"]
    assert code == 1 and rule["detail"].startswith(f"the watch {said}: step 2, forward"), rule
    assert "stopped" not in rule["detail"]
    parsed, text = page(tmp_path / "log", tmp_path)
    assert chips(parsed, text)[2] == said
    assert f"non-finite: {said}: step 2" in text and "stopped" not in text


def test_a_stop_draws_the_flight_recorder_and_one_verdict(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(Log(), nn.Linear(6, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(hookscope.NonFiniteError), \
            hookscope.watch(model, tmp_path / "log", every=2, keep=3) as w:
        for step in range(6):
            x = torch.rand(8, 6) + 1 - (10 if step == 3 else 0)  # negative at step 3
            nn.functional.cross_entropy(model(x), torch.randint(0, 3, (8,))).backward()
            opt.step()
            opt.zero_grad()
            w.step()
    code, doc = check(tmp_path / "log")
    assert code == 1
    assert doc["rules"][0]["detail"].startswith("the watch stopped on a non-finite value at "
                                                "step 3: step 3, forward: 0 (Log) produced NaN")
    parsed, text = page(tmp_path / "log", tmp_path)
    assert chips(parsed, text)[2] == "stopped on a non-finite value at step 3"
    assert "non-finite at the last step" not in text
    ids = [a.get("id") for _, a in parsed.tags]
    assert "recorder" in ids
    table = parsed.html[parsed.html.index('<table id="recorder"'):]  # type: ignore[attr-defined]
    table = table[:table.index("</table>")]
    assert re.findall(r"<th scope=\"col\">(.*?)</th>", table) == [
        "call", "step 1", "step 2", "step 3 (event)"]  # the last keep=3 steps
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in table.split("<tr")[2:]]
    red = [(row.startswith(' class="bad"'), re.findall(r"<td( class=\"bad\")?", row))
           for row in table.split("<tr")[2:]]
    # Every module is recorded, the model itself too. The blamed call's row is red; at step 3
    # every output is NaN (its kind shown, not the nulls JSON writes), red too.
    assert [r[0] for r in rows] == ["<code>0</code>", "<code>1</code>", "<code>(the model)</code>"]
    assert red == [(True, ["", "", "", ' class="bad"']), (False, ["", "", "", ' class="bad"']),
                   (False, ["", "", "", ' class="bad"'])]
    number = r"-?\d[\d.e+-]*"
    # The input needs no gradient, so none reaches the Log's output: "-"; one reaches fc's.
    assert all(re.fullmatch(f"{number} … {number}; ∇ -", c) for c in rows[0][1:3]), rows
    assert all(re.fullmatch(f"{number} … {number}; ∇ {number}", c) for c in rows[1][1:3]), rows
    # The NaN loss's backward ran before w.step(): fc's output gradient is NaN, told from none.
    assert rows[0][3] == "nan; ∇ -" and rows[1][3] == rows[2][3] == "nan; ∇ nan"


def _ranked(k: int, line: dict[str, Any]) -> None:
    """conv1: drift at every step from 20 (sustained); relu dead at 30; fc non-finite at 10;
    the hostile name: drift at 10 only (brief)."""
    layers = line["layers"]
    if k >= 2:
        layers[0] |= {"flags": ["drift"], "drift": 3.0}
    if k == 3:
        layers[1] |= {"flags": ["dead"], "zero_fraction": 1.0}
    if k == 1:
        layers[3] |= {"flags": ["nonfinite"], "nonfinite": 2}
        layers[2] |= {"flags": ["drift"], "drift": 2.0}


@pytest.mark.parametrize("reference", [True, False])
def test_findings_are_ranked_and_drift_listed_when_it_matters(tmp_path: Path,
                                                              reference: bool) -> None:
    log = write_log(tmp_path / "run", tweak=_ranked)
    if not reference:
        text = (log / "watch.jsonl").read_text()
        (log / "watch.jsonl").write_text(text.replace('"train-stats.json"', "null", 1))
    parsed, text = page(log, tmp_path)
    items = [a.get("class") for t, a in parsed.tags if t == "li"]
    findings = text[text.index("Findings"):text.index("Mean over steps")]
    evil = LAYERS[2][0]
    if reference:  # non-finite, dead, then the sustained drift; the brief one in a line
        assert items == ["error", "warning", ""]
        assert re.search(r"fc \(flagged at step 10\): nonfinite.*relu \(flagged at step 30\): "
                         r"dead.*conv1 \(flagged at 3 steps, 20 to 40\): drift 3 ", findings)
        assert findings.endswith(f"1 layer call drifted past max_drift not at each of the last 3 "
                                 f"logging steps: {evil}. ")
    else:  # no reference: drift from the first logging step is training itself
        assert items == ["error", "warning"] and "conv1 (flagged" not in findings
        assert findings.endswith("2 layer calls drifted past max_drift from the first logging "
                                 "step, as training does (a drift from a reference is a "
                                 f"finding): {evil}, conv1. ")
    assert chips(parsed, text)[2:] == ["non-finite values at logging steps 10",
                                       f"{len(items)} flagged layers"]


class PlainCNN(nn.Sequential):
    def __init__(self) -> None:
        super().__init__(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3),
                         nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, 10))


def _train_plain(log_dir: Path, steps: int, every: int) -> dict[int, dict[str, torch.Tensor]]:
    """Seeded SGD on 64 fixed samples; the weights after each logging step."""
    torch.manual_seed(0)
    model = PlainCNN()
    xs, ys = torch.randn(64, 3, 12, 12), torch.randint(0, 10, (64,))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    kept = {}
    with hookscope.watch(model, log_dir, every=every) as w:
        for step in range(steps):
            batch = slice(step % 4 * 16, step % 4 * 16 + 16)
            loss = nn.functional.cross_entropy(model(xs[batch]), ys[batch])
            loss.backward()
            opt.step()
            opt.zero_grad()
            if step % every == 0:
                kept[step] = {n: p.detach().double().clone() for n, p in model.named_parameters()}
            w.step(loss)
    return kept


def test_a_clean_run_has_no_drift_finding(tmp_path: Path) -> None:
    _train_plain(tmp_path / "log", steps=121, every=20)
    lines = [json.loads(t) for t in (tmp_path / "log" / "watch.jsonl").read_text().splitlines()[1:]]
    drifted = {r["name"] for line in lines for r in line["layers"] if "drift" in r["flags"]}
    assert drifted  # training moves the activations away from the first logging step...
    parsed, text = page(tmp_path / "log", tmp_path)
    assert "Nothing flagged" in text  # ...which is no finding
    assert f"{len(drifted)} layer call" in text and chips(parsed, text)[3] == "0 flagged layers"


def test_update_ratios_are_per_step_and_the_docs_rules_pass(tmp_path: Path) -> None:
    every = 10
    kept = _train_plain(tmp_path / "log", steps=21, every=every)
    per_step = {(step, name): float((w - kept[step - every][name]).norm() / w.norm()) / every
                for step in (10, 20) for name, w in kept[step].items()}
    docs = (ROOT / "docs" / "watch.md").read_text()
    toml = re.search(r"<!-- file: train-rules.toml -->\n```toml\n(.*?)```", docs, re.S)
    assert toml is not None
    code, doc = check(tmp_path / "log", "--rules", rules(tmp_path, toml.group(1)))
    assert code == 0, doc["rules"]
    # Every per-step ratio is an offender of a bound above none: each is ‖Δw‖/‖w‖ over the
    # span, divided by the span, as float64 computes it from the weights.
    code, doc = check(tmp_path / "log", "--min-update-ratio", "1e9")
    offenders = doc["rules"][1]["offenders"]
    assert code == 1 and len(offenders) == len(per_step)
    for line in offenders:
        step, name, value = re.fullmatch(r"parameter (\S+) at step (\d+): per-step update "
                                         r"ratio (\S+)", line).group(2, 1, 3)
        assert float(value) == pytest.approx(per_step[int(step), name], rel=1e-3)  # 4 digits
    parsed, text = page(tmp_path / "log", tmp_path)
    assert "Update ratio ‖Δw‖/‖w‖ per step" in "".join(parsed.text)


def test_one_outlier_does_not_wash_out_the_mean_map() -> None:
    import matplotlib

    from hookscope.render.training import _norm

    values = np.add.outer(np.arange(4.0), 0.1 * np.arange(5.0))  # 0 to 3.4, as layers differ
    values[1, 2] = -100.0
    norm = _norm(values, "mean")
    # Each layer's colour apart from the next: at least a tenth of the scale between rows
    # (a scale spanning -100 to 100 would put them 0.005 apart).
    rows = np.asarray(norm(values[:, 0]))
    assert np.all(np.diff(rows) > 0.1), rows
    cmap = matplotlib.colormaps["RdBu_r"]
    assert cmap(norm(-100.0)) == cmap(0.0)  # below the scale: drawn in its end colour


def test_zeros_have_a_colour_of_their_own() -> None:
    from matplotlib.colors import to_hex

    from hookscope.render.training import MISSING, ZERO, heatmap_figure

    series = {("conv", 0): [1.0, 2.0, None], ("relu", 0): [0.0, 0.0, 0.0]}
    fig = heatmap_figure([0, 1, 2], series, "std", "std", True, "viridis")
    ax = fig.axes[0]
    base, zeros = ax.images
    assert to_hex(base.cmap.get_bad()) == MISSING and zeros.cmap(0.5) and \
        to_hex(zeros.cmap(1.0)) == ZERO and ZERO != MISSING
    shown = np.ma.getdata(zeros.get_array())
    assert np.isnan(shown[0]).all() and (shown[1] == 1.0).all()  # the relu row, all of it
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "not logged / not finite", "exactly 0 (dead)"]
