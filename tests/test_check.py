"""`hookscope check`: rules from TOML or flags, one run, one verdict, JUnit and GitHub output.

Expected values come from plain forward hooks in float64, from the inputs themselves (a
model whose logits are known in closed form), or from two `stats` documents, never from
the check's own output.
"""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
from torch import nn

from hookscope.checks.rulefile import load_rules
from hookscope.core.errors import HookscopeError
from hookscope.numerics.drift import drift
from hookscope.render.check import check_view, escape_data, escape_property, junit_xml
from hookscope.render.console import render_text

NET = """
from torch import nn


class Net(nn.Module):
    def __init__(self, classes=3):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)
        self.relu2 = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4, classes)

    def forward(self, x):
        x = self.relu2(self.conv2(self.relu(self.conv(x))))
        return self.fc(self.pool(x).flatten(1))
"""
LABELS = ["cat", "dog", "Bird"]
CALLS = ["conv", "relu", "conv2", "relu2", "pool", "fc"]


def _net_class() -> type[nn.Module]:
    """NET's class, built here from the same source, for the independent computations."""
    namespace: dict[str, object] = {}
    exec(NET, namespace)
    return namespace["Net"]  # type: ignore[return-value]


Net = _net_class()


def _seeded(seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return Net().state_dict()


def _readable() -> dict[str, torch.Tensor]:
    """Weights whose logits are known in closed form: logit k = 4 * mean(relu(x[k]))."""
    state = {k: torch.zeros_like(v) for k, v in _seeded(0).items()}
    for k in range(3):
        state["conv.weight"][k, k, 1, 1] = 1.0
        state["conv2.weight"][k, k, 1, 1] = 1.0
        state["fc.weight"][k, k] = 4.0
    return state


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """net.py, checkpoints, inputs and labels, written once for the module."""
    root = tmp_path_factory.mktemp("check")
    (root / "net.py").write_text(NET)
    torch.save(_seeded(0), root / "good.pt")
    torch.save(_seeded(1), root / "other.pt")
    nan = _seeded(0)
    nan["conv.weight"][0, 0, 0, 0] = float("nan")
    torch.save(nan, root / "nan.pt")
    dead = _seeded(0)
    dead["conv2.bias"][:] = -100.0  # relu2 outputs only zeros, and so does the pool
    torch.save(dead, root / "dead.pt")
    torch.save(_readable(), root / "readable.pt")
    torch.manual_seed(2)
    torch.save(torch.randn(3, 16, 16), root / "a.pt")
    torch.save(torch.randn(2, 3, 16, 16), root / "b.pt")
    picked = torch.zeros(3, 3, 16, 16)  # top-1: class 0 (p .96), 2 (p .79), 1 (p .58)
    picked[0, 0], picked[1, 2], picked[2, 1] = 1.0, 0.5, 0.25
    torch.save(picked[0], root / "p0.pt")
    torch.save(picked[1:], root / "p12.pt")
    (root / "labels.txt").write_text("\n".join(LABELS) + "\n")
    return root


def model(work: Path) -> str:
    return f"{work / 'net.py'}:Net"


def inputs(work: Path) -> list[Path]:
    return [work / "a.pt", work / "b.pt"]


def one_error_line(result, code: int) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == code, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert len(lines) == 1 and lines[0].startswith("hookscope: error: "), result.stderr
    return lines[0]


def reference_outputs(state: dict[str, torch.Tensor], xs: list[torch.Tensor]
                      ) -> dict[str, torch.Tensor]:
    """Each leaf's output over all inputs, from plain hooks, in float64 (one batch, as the
    check runs them: a NaN weight meets the zero padding only in some conv algorithms)."""
    net = Net()
    net.load_state_dict(state)
    net.eval()
    outs: dict[str, list[torch.Tensor]] = {}
    handles = [m.register_forward_hook(
        lambda mod, a, o, name=name: outs.setdefault(name, []).append(o.detach().double()))
        for name, m in net.named_children()]
    with torch.no_grad():
        net(torch.cat([x if x.dim() == 4 else x.unsqueeze(0) for x in xs]))
    for h in handles:
        h.remove()
    return {name: torch.cat(v) for name, v in outs.items()}


def batch(work: Path, *names: str) -> list[torch.Tensor]:
    return [torch.load(work / n) for n in names]


def parse_junit(path: Path) -> ET.Element:
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert len(suites) == 1
    suite = suites[0]
    cases = suite.findall("testcase")
    assert int(suite.get("tests")) == len(cases) == int(root.get("tests"))
    failed = [c for c in cases if c.find("failure") is not None]
    assert int(suite.get("failures")) == len(failed) == int(root.get("failures"))
    assert all(c.get("classname").startswith("hookscope.check.") for c in cases)
    return suite


# ------------------------------------------------------------------------- nonfinite


def test_nan_checkpoint_fails_nonfinite_with_one_junit_failure(cli, work, tmp_path) -> None:
    junit = tmp_path / "check.xml"
    result = cli("check", model(work), *inputs(work), "--weights", work / "nan.pt",
                 "--junit", junit, "--format", "json")
    line = one_error_line(result, 1)
    assert line == "hookscope: error: 1 of 1 rules failed: nonfinite"
    doc = json.loads(result.stdout)
    assert doc["command"] == "check" and doc["passed"] is False and doc["failed"] == 1
    [rule] = doc["rules"]
    assert set(rule) == {"rule", "passed", "limit", "detail", "offenders"}
    assert rule["rule"] == "nonfinite" and rule["limit"] == 0

    outs = reference_outputs(torch.load(work / "nan.pt"), batch(work, "a.pt", "b.pt"))
    want = [f"{name}#0: nonfinite {int((~torch.isfinite(outs[name])).sum())}"
            for name in CALLS if not torch.isfinite(outs[name]).all()]
    assert want and rule["offenders"] == want

    suite = parse_junit(junit)
    assert suite.get("tests") == "1" and suite.get("failures") == "1"
    failures = list(suite.iter("failure"))
    assert len(failures) == 1
    [case] = suite.findall("testcase")
    assert case.get("name") == "nonfinite"
    # One class per model: the model's name is one part of the dotted class name.
    assert case.get("classname").startswith("hookscope.check.")
    assert case.get("classname").count(".") == 2 and case.get("classname").endswith("_Net")
    assert failures[0].get("message") == rule["detail"]
    assert failures[0].text.splitlines()[1:] == want


def test_good_weights_pass(cli, work, tmp_path) -> None:
    junit = tmp_path / "check.xml"
    result = cli("check", model(work), *inputs(work), "--weights", work / "good.pt",
                 "--junit", junit, "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert "error" not in result.stderr
    doc = json.loads(result.stdout)
    assert doc["passed"] is True and doc["failed"] == 0
    assert [r["rule"] for r in doc["rules"]] == ["nonfinite"]
    assert doc["calls"] == len(CALLS) and doc["ignored"] == 0
    suite = parse_junit(junit)
    assert suite.get("failures") == "0" and not list(suite.iter("failure"))


# ------------------------------------------------------------------------- expect, min_prob


def closed_form(x: torch.Tensor) -> tuple[int, float]:
    """Top-1 and its probability of the readable weights, from the input alone."""
    logits = [4.0 * float(x[k].double().clamp(min=0).mean()) for k in range(3)]
    top = max(range(3), key=lambda k: logits[k])
    return top, math.exp(logits[top]) / sum(math.exp(v) for v in logits)


@pytest.fixture(scope="module")
def tops(work) -> list[tuple[int, float]]:
    xs = [torch.load(work / "p0.pt"), *torch.load(work / "p12.pt")]
    found = [closed_form(x) for x in xs]
    assert len({t for t, _ in found}) == 3  # three different classes
    return found


def readable(work: Path) -> tuple[str, ...]:
    return (model(work), str(work / "p0.pt"), str(work / "p12.pt"), "--weights",
            str(work / "readable.pt"), "--labels", str(work / "labels.txt"))


def test_expect_passes_by_label_and_index(cli, work, tops, tmp_path) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text(f'[expect]\n"p0.pt" = "{LABELS[tops[0][0]].upper()}"\n'
                     f'"p12.pt[0]" = {tops[1][0]}\n"{work / "p12.pt"}[1]" = "{tops[2][0]}"\n')
    result = cli("check", *readable(work), "--rules", rules, "-f", "json")
    assert result.exit_code == 0, result.stderr
    [_, rule] = json.loads(result.stdout)["rules"]
    assert rule["rule"] == "expect" and rule["passed"] and rule["offenders"] == []
    assert rule["limit"] == {str(work / "p0.pt"): LABELS[tops[0][0]].upper(),
                             f"{work / 'p12.pt'}[0]": tops[1][0],
                             f"{work / 'p12.pt'}[1]": str(tops[2][0])}


def test_expect_fails_naming_the_input_and_both_classes(cli, work, tops, tmp_path) -> None:
    wrong = (tops[1][0] + 1) % 3
    junit = tmp_path / "check.xml"
    result = cli("check", *readable(work), "--expect", f"p0.pt={tops[0][0]}",
                 "--expect", f"p12.pt[0]={LABELS[wrong]}", "--junit", junit, "-f", "json")
    assert one_error_line(result, 1).endswith("1 of 2 rules failed: expect")
    rule = json.loads(result.stdout)["rules"][1]
    top = LABELS[tops[1][0]]
    assert rule["offenders"] == [
        f"{work / 'p12.pt'}[0]: top-1 '{top}' ({tops[1][0]}, prob {tops[1][1]:.4g}), "
        f"expected '{LABELS[wrong]}' ({wrong})"]
    [failure] = parse_junit(junit).iter("failure")
    assert rule["offenders"][0] in failure.text


def test_min_prob(cli, work, tops) -> None:
    low = min(p for _, p in tops)
    ok = cli("check", *readable(work), "--min-prob", f"{low - 0.01:.4f}", "-f", "json")
    assert ok.exit_code == 0, ok.stderr
    bad = cli("check", *readable(work), "--min-prob", f"{low + 0.01:.4f}", "-f", "json")
    assert one_error_line(bad, 1).endswith("1 of 2 rules failed: min_prob")
    rule = json.loads(bad.stdout)["rules"][1]
    lowest = min(range(3), key=lambda i: tops[i][1])
    name = [str(work / "p0.pt"), f"{work / 'p12.pt'}[0]", f"{work / 'p12.pt'}[1]"][lowest]
    assert rule["offenders"] == [f"{name}: top-1 '{LABELS[tops[lowest][0]]}' "
                                 f"({tops[lowest][0]}, prob {tops[lowest][1]:.4g})"]


# ------------------------------------------------------------------------- baseline


def stats_doc(cli, work: Path, weights: str, out: Path, *extra: str) -> dict:
    result = cli("stats", model(work), *inputs(work), "--weights", work / weights,
                 "-f", "json", "-o", out, *extra)
    assert result.exit_code == 0, result.stderr
    return json.loads(out.read_text())


def expected_drift(now: dict, base: dict, stat: str) -> dict[str, float]:
    """The documented drift, computed from two stats documents."""
    found = {}
    for row, ref in zip(now["layers"], base["layers"], strict=True):
        mb, sb = ref["mean"], ref["std"]
        scale = max(abs(mb), sb, 1e-6) if stat == "mean" else max(sb, 1e-6 * abs(mb), 1e-6)
        found[f"{row['name']}#{row['call']}"] = abs(row[stat] - ref[stat]) / scale
    return found


def test_baseline_passes_then_drift_fails(cli, work, tmp_path) -> None:
    folder = tmp_path / "rules"  # the baseline is found beside the rules file, not the cwd
    folder.mkdir()
    base = stats_doc(cli, work, "good.pt", folder / "base.json")
    other = stats_doc(cli, work, "other.pt", tmp_path / "other.json")
    rules = folder / "check.toml"
    rules.write_text('baseline = "base.json"\nmax_mean_drift = 0.05\nmax_std_drift = 0.05\n')
    same = cli("check", model(work), *inputs(work), "--weights", work / "good.pt",
               "--rules", rules, "-f", "json")
    assert same.exit_code == 0, same.stderr
    assert [r["rule"] for r in json.loads(same.stdout)["rules"]] == [
        "nonfinite", "baseline", "max_mean_drift", "max_std_drift"]

    moved = cli("check", model(work), *inputs(work), "--weights", work / "other.pt",
                "--rules", rules, "-f", "json")
    assert one_error_line(moved, 1)
    by_rule = {r["rule"]: r for r in json.loads(moved.stdout)["rules"]}
    assert by_rule["baseline"]["passed"]
    for stat in ("mean", "std"):
        want = {k for k, d in expected_drift(other, base, stat).items() if d > 0.05}
        rule = by_rule[f"max_{stat}_drift"]
        assert want and not rule["passed"]
        assert {o.split(":")[0] for o in rule["offenders"]} == want


def test_baseline_with_other_calls_fails_naming_them(cli, work, tmp_path) -> None:
    stats_doc(cli, work, "good.pt", tmp_path / "base.json", "--layers", "conv*")
    result = cli("check", model(work), *inputs(work), "--weights", work / "good.pt",
                 "--baseline", tmp_path / "base.json", "-f", "json")
    assert one_error_line(result, 1).endswith("1 of 2 rules failed: baseline")
    rule = json.loads(result.stdout)["rules"][1]
    assert rule["offenders"] == [f"{n}#0: not in the baseline"
                                 for n in CALLS if not n.startswith("conv")]


def test_drift_scale_does_not_explode_at_zero_mean() -> None:
    # mean 0 -> scale max(|mean|, std): a shift of 0.01 std is a drift of 0.01
    assert drift(0.01, 0.0, max(0.0, 1.0)) == pytest.approx(0.01)
    assert drift(1e-9, 0.0, 0.0) == pytest.approx(1e-3)  # the EPS floor, not inf
    assert drift(None, None, 1.0) == 0.0 and drift(None, 1.0, 1.0) == math.inf


# ------------------------------------------------------------------------- zeros, ignore


def test_max_zero_fraction_and_ignore_globs(cli, work, tmp_path) -> None:
    outs = reference_outputs(torch.load(work / "dead.pt"), batch(work, "a.pt", "b.pt"))
    zero = {name: float((outs[name] == 0).double().mean()) for name in CALLS}
    dead = [name for name in CALLS if zero[name] > 0.9]
    assert dead == ["relu2", "pool"]
    args = (model(work), *inputs(work), "--weights", work / "dead.pt", "-f", "json")
    rules = tmp_path / "rules.toml"
    rules.write_text("max_zero_fraction = 0.9\n")
    result = cli("check", *args, "--rules", rules)
    assert one_error_line(result, 1).endswith("1 of 2 rules failed: max_zero_fraction")
    rule = json.loads(result.stdout)["rules"][1]
    assert rule["offenders"] == [f"{n}#0: zero_fraction {zero[n]:.4g}" for n in dead]

    rules.write_text('max_zero_fraction = 0.9\nignore = ["relu2", "po*"]\n')
    result = cli("check", *args, "--rules", rules)
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["ignored"] == 2 and doc["calls"] == len(CALLS) - 2
    # A flag replaces the file's globs; a glob that matches nothing is a warning.
    result = cli("check", *args, "--rules", rules, "--ignore", "relu*", "--ignore", "nothing")
    assert result.exit_code == 1
    assert "ignore glob 'nothing' matches no module call" in result.stderr
    assert [o.split(":")[0] for o in json.loads(result.stdout)["rules"][1]["offenders"]] == [
        "pool#0"]


# ------------------------------------------------------------------------- flags, formats


def test_flags_override_the_file(cli, work, tmp_path) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text("nonfinite = 100000\nmax_zero_fraction = 1.0\n")
    nan = (model(work), *inputs(work), "--weights", work / "nan.pt", "--rules", rules)
    assert cli("check", *nan).exit_code == 0
    result = cli("check", *nan, "--nonfinite", "0", "-f", "json")
    assert result.exit_code == 1
    assert json.loads(result.stdout)["rules"][0]["limit"] == 0
    dead = (model(work), *inputs(work), "--weights", work / "dead.pt", "--rules", rules)
    assert cli("check", *dead).exit_code == 0
    assert cli("check", *dead, "--max-zero-fraction", "0.9").exit_code == 1


def test_github_annotations(cli, work) -> None:
    result = cli("check", model(work), *inputs(work), "--weights", work / "nan.pt",
                 "--format", "github")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("::error title=hookscope check%3A nonfinite::")
    assert "%0Aconv#0: nonfinite " in lines[0] and "\r" not in lines[0]
    assert lines[1] == f"::notice title=hookscope check::{escape_data(model(work))}: " \
        "1 of 1 rules failed (nonfinite)"
    assert escape_data("50% a\r\nb") == "50%25 a%0D%0Ab"
    assert escape_property("a: b, 5%") == "a%3A b%2C 5%25"


def test_table_fits_80_columns(cli, work, tmp_path) -> None:
    base = tmp_path / "base.json"
    stats_doc(cli, work, "good.pt", base)
    result = cli("check", model(work), *inputs(work), "--weights", work / "other.pt",
                 "--baseline", base, "--max-mean-drift", "0.01", "--max-std-drift", "0.01",
                 "--max-zero-fraction", "0.3", "-f", "json")
    doc = json.loads(result.stdout)
    text = render_text(check_view(doc), width=80)
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80
    for rule in doc["rules"]:
        assert rule["rule"] in text
    assert "FAIL" in text and "offenders" in text and "FAILED:" in text
    table = cli("check", model(work), *inputs(work), "--weights", work / "good.pt")
    assert table.exit_code == 0 and "passed: all 1 rules" in table.stdout


def test_junit_escapes_what_xml_cannot_hold() -> None:
    doc = {"model": "m", "rules": [{"rule": "expect", "passed": False, "limit": {},
                                    "detail": "a <b> & \x1b c", "offenders": ["x\x00y"]}]}
    root = ET.fromstring(junit_xml(doc).encode())
    failure = root.find("testsuite/testcase/failure")
    assert failure is not None and failure.get("message") == "a <b> & \ufffd c"


# ------------------------------------------------------------------------- bad input


def test_rules_parse_to_typed_values(tmp_path) -> None:
    rules = tmp_path / "r.toml"
    rules.write_text('nonfinite = 2\nmax_zero_fraction = 1\nignore = ["fc"]\n'
                     'baseline = "b.json"\nmin_prob = 0.5\n[expect]\n"a.jpg" = "tabby"\n')
    found = load_rules(rules, {"min_prob": 0.25})
    assert found.nonfinite == 2 and found.max_zero_fraction == 1.0
    assert isinstance(found.max_zero_fraction, float) and found.ignore == ("fc",)
    assert found.baseline == tmp_path / "b.json" and found.min_prob == 0.25
    assert [(e.input, e.want) for e in found.expect] == [("a.jpg", "tabby")]
    assert load_rules().nonfinite == 0 and load_rules().max_zero_fraction is None
    with pytest.raises(HookscopeError, match="nonfinite must be a non-negative integer"):
        load_rules(None, {"nonfinite": -1})


MALFORMED = {
    "syntax": ("nonfinite = 0\nmax_zero_fraction = \n", ":2: not valid TOML (column"),
    "syntax_at_end": ('nonfinite = 0\nignore = ["a",\n', ":2: not valid TOML"),
    "unknown_key": ("nonfinite = 0\n\nmax_zero_frac = 0.5\n",
                    ":3: unknown key 'max_zero_frac'. Did you mean: max_zero_fraction"),
    "unknown_table": ("[check]\nnonfinite = 1\n", ":1: unknown key 'check'. Rules sit at"),
    "wrong_type": ('nonfinite = 0\nmin_prob = "high"\n',
                   ":2: min_prob must be a number from 0 to 1, not the string 'high'"),
    "bool_for_int": ("nonfinite = true\n", ":1: nonfinite must be a non-negative integer"),
    "out_of_range": ("max_zero_fraction = 1.5\n", ":1: max_zero_fraction must be a number"),
    "glob_not_array": ('ignore = "fc"\n', ":1: ignore must be an array of module-name globs"),
    "globs_not_strings": ("ignore = [1, 2]\n", ":1: ignore must be an array of module-name "
                          "globs, not an array of integers."),
    "globs_mixed": ('ignore = ["fc", 2.5, ""]\n', ":1: ignore must be an array of module-name "
                    "globs, not an array of strings, floats and blank strings."),
    "expect_type": ('[expect]\n"a.pt" = 1.5\n', ":2: expect 'a.pt' must be a class label"),
    "expect_dotted": ('[expect]\na.pt = "cat"\n', ":2: expect 'a' must be a class label"),
    "expect_not_table": ('expect = "cat"\n', ":1: expect must be a table"),
    "missing_baseline": ('nonfinite = 0\nbaseline = "nope.json"\n', ":2: baseline '"),
    "drift_without_baseline": ("max_mean_drift = 0.1\n", ":1: max_mean_drift needs a baseline"),
    "unknown_input": ('[expect]\n"a.pt" = 0\n"zzz.pt" = 0\n',
                      ":3: expect 'zzz.pt': no input is named 'zzz.pt'"),
    "unknown_label": ('[expect]\n"a.pt" = "zebra"\n',
                      ":2: expect 'a.pt': 'zebra' is not one of the model's 3 class labels"),
    "index_out_of_range": ('[expect]\n"a.pt" = 3\n', ":2: expect 'a.pt': class index 3 is out"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_rules_are_bad_input(cli, work, tmp_path, case) -> None:
    text, message = MALFORMED[case]
    rules = tmp_path / "rules.toml"
    rules.write_text(text)
    junit = tmp_path / "check.xml"
    result = cli("check", model(work), *inputs(work), "--weights", work / "good.pt",
                 "--labels", work / "labels.txt", "--rules", rules, "--junit", junit)
    line = one_error_line(result, 2)
    assert f"hookscope: error: {rules}{message}" in line, line
    assert not junit.exists()


@pytest.mark.parametrize(("content", "message"), [
    ('{"command": "gradcam", "layers": []}', "is not a `hookscope stats --format json` "
     "document: its command is 'gradcam'"),
    ('{"command": "stats", "layers": [{"name": "x"}]}', "its layer 0 lacks name, call"),
    ("[1, 2", "is not JSON (line 1"),
])
def test_baseline_that_is_not_a_stats_document(cli, work, tmp_path, content, message) -> None:
    (tmp_path / "b.json").write_text(content)
    rules = tmp_path / "rules.toml"
    rules.write_text('\nbaseline = "b.json"\n')
    junit = tmp_path / "check.xml"
    result = cli("check", model(work), *inputs(work), "--rules", rules, "--junit", junit)
    line = one_error_line(result, 2)
    assert f"{rules}:2: baseline '{tmp_path / 'b.json'}' " in line and message in line, line
    assert not junit.exists()


@pytest.mark.parametrize(("args", "message"), [
    (("--rules", "missing.toml"), "rules file 'missing.toml' not found"),
    (("--expect", "a.pt"), "--expect 'a.pt': give INPUT=LABEL"),
    (("--nonfinite", "-1"), "--nonfinite must be a non-negative integer"),
    (("--min-prob", "2"), "--min-prob must be a number from 0 to 1, not 2.0"),
    (("--max-std-drift", "0.1"), "--max-std-drift needs a baseline"),
    (("--baseline", "nope.json"), "--baseline 'nope.json' not found"),
    (("--expect", "x.pt=1"), "--expect 'x.pt=1': no input is named 'x.pt'"),
    (("--junit", "same.xml", "-o", "same.xml"), "--junit and --output name the same file"),
])
def test_bad_flags_are_bad_input(cli, work, tmp_path, monkeypatch, args, message) -> None:
    monkeypatch.chdir(tmp_path)
    result = cli("check", model(work), *inputs(work), "--weights", work / "good.pt", *args)
    assert message in one_error_line(result, 2)
    assert not list(tmp_path.iterdir())


def test_expect_by_basename_must_be_unambiguous(cli, work, tmp_path) -> None:
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "a.pt").write_bytes((work / "a.pt").read_bytes())
    result = cli("check", model(work), tmp_path / "one" / "a.pt", tmp_path / "two" / "a.pt",
                 "--weights", work / "good.pt", "--expect", "a.pt=0")
    assert "matches several inputs" in one_error_line(result, 2)
    ok = cli("check", model(work), tmp_path / "one" / "a.pt", tmp_path / "two" / "a.pt",
             "--weights", work / "good.pt", "--expect", "two/a.pt=0", "-f", "json")
    assert ok.exit_code in (0, 1), ok.stderr
    [rule] = [r for r in json.loads(ok.stdout)["rules"] if r["rule"] == "expect"]
    assert list(rule["limit"]) == [str(tmp_path / "two" / "a.pt")]


def test_a_key_is_named_by_the_line_that_defines_it() -> None:
    """The line is found by the TOML parser itself, across multi-line arrays (their first
    line), comments, tables and quoted or dotted keys."""
    from hookscope.checks.rulefile import _at

    text = ('ignore = [\n  "fc",\n  "layer4.*",\n]\n# a comment\nmin_prob = 2\n'
            '[expect]\n"a.jpg" = "tabby"\nb.jpg = 1\n')
    assert _at("r.toml", text, "min_prob") == "r.toml:6:"
    assert _at("r.toml", text, "ignore") == "r.toml:1:"
    assert _at("r.toml", text, "expect") == "r.toml:7:"
    assert _at("r.toml", text, "expect", "a.jpg") == "r.toml:8:"
    assert _at("r.toml", text, "expect", "b") == "r.toml:9:"
    assert _at("r.toml", text, "nowhere") == "r.toml:"
