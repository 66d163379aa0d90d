"""``hookscope check`` and ``hookscope report`` on a training log (a directory holding
``watch.jsonl``): the rules, their JUnit and GitHub outputs, the training page, and a real
browser (Debian's chromium, as tests/test_report.py).

The logs here are written by hand in the documented format, with values chosen so that each
rule's verdict and offenders are known without running any rule."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from html import escape
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from hookscope.cli import app
from tests.test_report import Tags

ROOT = Path(__file__).resolve().parent.parent
EVIL = "<img src=x onerror=__xss=1>"  # a module name that runs code if written unescaped
LAYERS = [("conv1", "Conv2d"), ("relu", "ReLU"), (EVIL, "ReLU"), ("fc", "Linear")]
PARAMS = ["conv1.weight", "fc.weight"]


def run(*args: object) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args])


def layer_row(i: int, k: int, name: str, kind: str, **extra: Any) -> dict[str, Any]:
    """Layer ``i`` at logging step ``k``: its gradient norm is 10**(i - k), and the ReLUs
    are half zeros."""
    return {"name": name, "type": kind, "call": 0, "output_shape": [4, 8, 8, 8],
            "mean": 0.1 * k + i, "std": 1.0 + k, "min": -1.0, "max": 2.0,
            "zero_fraction": 0.5 if kind == "ReLU" else 0.0, "nonfinite": 0,
            "grad_norm": 10.0 ** (i - k), "grad_mean": 0.0, "grad_std": 0.1,
            "grad_nonfinite": 0, "flags": [], "drift": 0.0} | extra


def write_log(folder: Path, *, steps: int = 5, every: int = 10,
              event: dict[str, Any] | None = None, tweak: Any = None) -> Path:
    """A log of ``steps`` logging steps in the documented format; update ratios
    1e-3 * k (conv1.weight) and 2e-3 (fc.weight), none at the first step: over the
    ``every`` steps since the previous logging step, so 1e-4 * k and 2e-4 per step."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"hookscope": "0.1.0", "command": "watch", "model": f"Net{EVIL}",
                         "every": every, "selection": {"layers": None, "types": None},
                         "reference": "train-stats.json"})]
    for k in range(steps):
        line: dict[str, Any] = {
            "step": k * every, "time": float(k),
            "layers": [layer_row(i, k, n, t) for i, (n, t) in enumerate(LAYERS)],
            "params": [{"name": "conv1.weight", "norm": 3.0, "grad_norm": 0.5,
                        "update_ratio": None if k == 0 else 1e-3 * k},
                       {"name": "fc.weight", "norm": 2.0, "grad_norm": 0.2,
                        "update_ratio": None if k == 0 else 2e-3}]}
        if tweak is not None:
            tweak(k, line)
        lines.append(json.dumps(line))
    (folder / "watch.jsonl").write_text("\n".join(lines) + "\n")
    if event is not None:  # under "event", beside the envelope and the flight recorder
        (folder / "nonfinite.json").write_text(json.dumps({"command": "watch", "event": event,
                                                           "steps": []}))
    return folder


EVENT = {"module": "relu", "type": "ReLU", "phase": "forward", "step": 43, "call": 0,
         "message": "step 43, forward: relu (ReLU) produced 3 NaN from finite inputs "
                    "(min -1 max 2)",
         "inputs": [{"shape": [4, 8, 8, 8], "min": -1.0, "max": 2.0, "mean": 0.1}]}


def rules(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "rules.toml"
    path.write_text(text)
    return path


# ------------------------------------------------------------------------- check


def test_a_nonfinite_event_fails_check_and_is_written_to_junit(tmp_path) -> None:
    log = write_log(tmp_path / "run", event=EVENT)
    junit = tmp_path / "check.xml"
    r = run("check", log, "--junit", junit, "--format", "json")
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    assert doc["command"] == "check" and doc["log"] == str(log) and not doc["passed"]
    assert doc["logging_steps"] == 5 and doc["nonfinite_event"]["module"] == "relu"
    [rule] = doc["rules"]
    assert rule["rule"] == "nonfinite" and rule["offenders"] == [EVENT["message"]]
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("failures") == "1"
    failure = suite.find("testcase[@name='nonfinite']/failure")
    assert failure is not None and "relu (ReLU) produced 3 NaN" in (failure.text or "")
    assert "1 of 1 rules failed: nonfinite" in r.stderr


def test_a_clean_log_passes_every_rule(tmp_path) -> None:
    log = write_log(tmp_path / "run")
    path = rules(tmp_path, "max_zero_fraction = 0.9\nmax_grad_norm = 100.0\n"
                 "min_update_ratio = 5e-5\nmax_update_ratio = 1e-3\nlast = 3\n")
    r = run("check", log, "--rules", path, "--format", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [x["rule"] for x in doc["rules"]] == ["nonfinite", "max_zero_fraction",
                                                 "max_grad_norm", "min_update_ratio",
                                                 "max_update_ratio"]
    assert doc["calls"] == 3 * len(LAYERS) and doc["passed"]


def test_gradient_norms_over_the_last_steps(tmp_path) -> None:
    # Layer i's norm at logging step k is 10**(i - k): above 5, over all 5 steps, are
    # relu (i=1) at k=0, EVIL (i=2) at k<=1 and fc (i=3) at k<=2; over the last 2 (k=3, 4)
    # none is. Parameters' norms are 0.5 and 0.2.
    log = write_log(tmp_path / "run")
    r = run("check", log, "--rules", rules(tmp_path, "max_grad_norm = 5.0\n"), "-f", "json")
    assert r.exit_code == 1, r.output
    [_, rule] = json.loads(r.stdout)["rules"]
    assert rule["offenders"] == [
        "relu#0 at step 0: gradient norm 10", f"{EVIL}#0 at step 0: gradient norm 100",
        "fc#0 at step 0: gradient norm 1000", f"{EVIL}#0 at step 10: gradient norm 10",
        "fc#0 at step 10: gradient norm 100", "fc#0 at step 20: gradient norm 10"]
    last = run("check", log, "--rules", rules(tmp_path, "max_grad_norm = 5.0\nlast = 2\n"))
    assert last.exit_code == 0, last.output
    low = run("check", log, "--rules", rules(tmp_path, "min_grad_norm = 0.3\nlast = 1\n"),
              "-f", "json")
    assert low.exit_code == 1
    [_, rule] = json.loads(low.stdout)["rules"]
    # At step 40 (k=4): conv1 1e-4, relu 1e-3, EVIL 1e-2, fc 0.1, then fc.weight's 0.2.
    assert [o.split(":")[0] for o in rule["offenders"]] == [
        "conv1#0 at step 40", "relu#0 at step 40", f"{EVIL}#0 at step 40", "fc#0 at step 40",
        "parameter fc.weight at step 40"]


def test_update_ratios_and_ignore(tmp_path) -> None:
    log = write_log(tmp_path / "run")
    r = run("check", log, "--rules", rules(tmp_path, "max_update_ratio = 0.00025\n"), "-f", "json")
    assert r.exit_code == 1
    [_, rule] = json.loads(r.stdout)["rules"]  # conv1.weight: 1e-4 * k per step, k=3, 4 above
    assert rule["offenders"] == [
        "parameter conv1.weight at step 30: per-step update ratio 0.0003",
        "parameter conv1.weight at step 40: per-step update ratio 0.0004"]
    ignored = run("check", log, "--rules", rules(tmp_path, "max_update_ratio = 0.00025\n"
                                                 "ignore = [\"conv1\"]\n"))
    assert ignored.exit_code == 0, ignored.output


def test_every_key_is_a_flag_too(tmp_path) -> None:
    """The log's keys as flags: the same verdicts as in a file, and a flag overrides its key."""
    from hookscope.checks.rulefile import KEYS

    shown = " ".join(run("check", "--help").stdout.split())
    assert all(f"--{name.replace('_', '-')}" in shown for name in KEYS)
    log = write_log(tmp_path / "run")
    r = run("check", log, "--max-grad-norm", "5", "-f", "json")
    assert r.exit_code == 1 and len(json.loads(r.stdout)["rules"][1]["offenders"]) == 6
    assert run("check", log, "--max-grad-norm", "5", "--last", "2").exit_code == 0
    over = run("check", log, "--rules", rules(tmp_path, "max_grad_norm = 5.0\n"),
               "--max-grad-norm", "2000")
    assert over.exit_code == 0, over.output
    # conv1.weight's ratio is 1e-4 * k per step from k = 1: below 1.5e-4 at step 10 only.
    low = run("check", log, "--min-update-ratio", "0.00015", "-f", "json")
    assert low.exit_code == 1
    assert json.loads(low.stdout)["rules"][1]["offenders"] == [
        "parameter conv1.weight at step 10: per-step update ratio 0.0001"]
    bad = run("check", log, "--last", "0")
    assert bad.exit_code == 2 and "--last must be a positive integer" in bad.stderr


def test_dead_and_nonfinite_rows_name_their_step(tmp_path) -> None:
    def tweak(k: int, line: dict[str, Any]) -> None:
        if k == 2:
            line["layers"][1] |= {"zero_fraction": 1.0, "grad_nonfinite": 4}

    log = write_log(tmp_path / "run", tweak=tweak)
    r = run("check", log, "--max-zero-fraction", "0.99", "-f", "json")
    assert r.exit_code == 1
    nonfinite, zeros = json.loads(r.stdout)["rules"]
    assert nonfinite["offenders"] == ["relu#0 at step 20: nonfinite 4"]
    assert zeros["offenders"] == ["relu#0 at step 20: zero_fraction 1"]


def test_github_annotations_for_a_log(tmp_path) -> None:
    log = write_log(tmp_path / "run", event=EVENT)
    r = run("check", log, "--format", "github")
    assert r.exit_code == 1
    lines = r.stdout.splitlines()
    assert lines[0].startswith("::error title=hookscope check%3A nonfinite::")
    assert "relu (ReLU) produced 3 NaN" in lines[0] and lines[-1].startswith("::notice")


@pytest.mark.parametrize("args,words", [
    (["--baseline", "stats.json"], "--baseline checks a model run"),
    (["--min-prob", "0.5"], "--min-prob checks a model run"),
    (["--max-mean-drift", "0.1"], "--max-mean-drift checks a model run"),
    (["--baseline", "stats.json", "--max-drift", "0.1"], "--baseline checks a model run"),
    (["cat.jpg"], "give it alone, without INPUT"),
])
def test_what_a_log_cannot_check(tmp_path, args, words) -> None:
    log = write_log(tmp_path / "run")
    r = run("check", log, *args)
    assert r.exit_code == 2 and words in r.stderr, r.output
    assert len(r.stderr.strip().splitlines()) == 1


def test_log_keys_on_a_model_run_and_missing_inputs(tmp_path, cat_jpg) -> None:
    r = run("check", "resnet18", cat_jpg, "--weights", "none", "--rules",
            rules(tmp_path, "max_grad_norm = 1.0\n"))
    assert r.exit_code == 2 and "rules.toml:1: max_grad_norm checks a training log" in r.stderr
    flag = run("check", "resnet18", cat_jpg, "--weights", "none", "--max-update-ratio", "1")
    assert flag.exit_code == 2 and "--max-update-ratio checks a training log" in flag.stderr
    missing = run("check", "resnet18")
    assert missing.exit_code == 2 and "missing INPUT" in missing.stderr
    folder = run("report", tmp_path)
    assert folder.exit_code == 2 and "a directory without watch.jsonl" in folder.stderr


@pytest.mark.parametrize("command", ["check", "report"])
def test_a_wrong_log_path_says_what_is_wrong(tmp_path, command) -> None:
    import os

    log = write_log(tmp_path / "w1")
    fifo, loop = tmp_path / "fifo", tmp_path / "loop"
    fifo.mkdir()
    os.mkfifo(fifo / "watch.jsonl")
    loop.mkdir()
    (loop / "watch.jsonl").symlink_to(loop / "watch.jsonl")
    for path, words in (
            (tmp_path / "nonexist", f"{str(tmp_path / 'nonexist')!r} does not exist"),
            (log / "watch.jsonl", f"is a training log's file: give its directory, "
                                  f"{str(log)!r}"),
            (fifo, f"training log {str(fifo / 'watch.jsonl')!r} is not a regular file"),
            (loop, f"training log {str(loop / 'watch.jsonl')!r} cannot be read: Too many")):
        r = run(command, path)
        assert r.exit_code == 2 and words in r.stderr, r.output
        assert len(r.stderr.strip().splitlines()) == 1, r.output


def test_bad_log_lines(tmp_path) -> None:
    log = write_log(tmp_path / "run")
    text = (log / "watch.jsonl").read_text()
    (log / "watch.jsonl").write_text(text + '{"step": 50, "layers": [{"na')  # cut short
    r = run("check", log, "-f", "json")
    assert r.exit_code == 0 and json.loads(r.stdout)["logging_steps"] == 5
    assert "the last line is cut short" in r.stderr
    (log / "watch.jsonl").write_text(text + '{"step": 50, "layers": 3}\n' + text)
    bad = run("check", log)
    assert bad.exit_code == 2 and "watch.jsonl:7: not a logging step" in bad.stderr


def _set(kind: str, key: str, value: Any) -> Any:
    """A tweak that sets ``key`` of the second row of ``kind`` at the second logging step."""
    def tweak(k: int, line: dict[str, Any]) -> None:
        if k == 1:
            line[kind][1][key] = value
    return tweak


@pytest.mark.parametrize("tweak,words", [
    (_set("layers", "call", "x"), 'watch.jsonl:3: not a logging step of hookscope.watch: '
                                  'layers[1] "call" is a string, not an integer'),
    (_set("layers", "mean", "big"), 'watch.jsonl:3: not a logging step of hookscope.watch: '
                                    'layers[1] "mean" is a string, not a number'),
    (_set("params", "norm", "x"), 'watch.jsonl:3: not a logging step of hookscope.watch: '
                                  'params[1] "norm" is a string, not a number'),
    (_set("layers", "flags", [1]), 'layers[1] "flags" is a list, not a list of strings'),
    (lambda k, line: line.update(loss="low") if k == 2 else None,
     'watch.jsonl:4: not a logging step of hookscope.watch: "loss" is a string, not a number'),
])
@pytest.mark.parametrize("command", ["check", "report"])
def test_a_field_of_the_wrong_type_is_one_line_naming_it(tmp_path, tweak, words,
                                                         command) -> None:
    log = write_log(tmp_path / "run", tweak=tweak)
    r = run(command, log, "-o", tmp_path / "out.html") if command == "report" else \
        run(command, log)
    assert r.exit_code == 2 and words in r.stderr, r.output
    assert len(r.stderr.strip().splitlines()) == 1, r.output


def test_a_bad_envelope_or_event_field_is_one_line_naming_it(tmp_path) -> None:
    envelope = write_log(tmp_path / "envelope")
    text = (envelope / "watch.jsonl").read_text()
    (envelope / "watch.jsonl").write_text(text.replace('"every": 10', '"every": "often"', 1))
    event = write_log(tmp_path / "event", event=EVENT | {"step": "43"})
    for log, words in ((envelope, 'watch.jsonl:1: not the envelope of hookscope.watch: '
                                  '"every" is a string, not an integer.'),
                       (event, 'nonfinite.json\' is not the non-finite event of '
                               'hookscope.watch: its "step" is a string, not an integer.')):
        r = run("check", log)
        assert r.exit_code == 2 and words in r.stderr, r.output


@pytest.mark.parametrize("command", ["check", "report"])
def test_deep_nesting_and_a_looping_event_are_one_line(tmp_path, command) -> None:
    cases = [(write_log(tmp_path / "loop"), "nonfinite.json' cannot be read")]
    (cases[0][0] / "nonfinite.json").symlink_to(cases[0][0] / "nonfinite.json")
    for depth in (500, 100_000):  # one the parser takes, one it cannot
        deep = write_log(tmp_path / f"deep{depth}")
        with (deep / "watch.jsonl").open("a") as fh:
            fh.write('{"step": 60, "layers": [], "params": [], "x": ' + "[" * depth
                     + "]" * depth + "}\n")
        event = write_log(tmp_path / f"event{depth}")
        (event / "nonfinite.json").write_text('{"x": ' + "[" * depth + "]" * depth + "}")
        cases += [(deep, "watch.jsonl:7: nested too deeply"),
                  (event, "nonfinite.json' is nested too deeply")]
    for log, words in cases:
        args = ["-o", tmp_path / "out.html"] if command == "report" else []
        r = run(command, log, *args)
        assert r.exit_code == 2 and words in r.stderr, (log, r.output)
        assert len(r.stderr.strip().splitlines()) == 1, r.output


@pytest.mark.slow
def test_reading_a_log_imports_no_torch(tmp_path) -> None:
    log = write_log(tmp_path / "run", event=EVENT)
    code = ("import sys\nfrom hookscope.cli import app\n"
            "for argv in (['check', sys.argv[1], '--junit', sys.argv[2]],\n"
            "             ['report', sys.argv[1], '-o', sys.argv[3]]):\n"
            "    try:\n        app(argv)\n    except SystemExit:\n        pass\n"
            "print('torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code, str(log), str(tmp_path / "j.xml"),
                           str(tmp_path / "t.html")], capture_output=True, text=True,
                          cwd=ROOT, timeout=600)  # a hang guard only
    assert done.stdout.strip().splitlines()[-1] == "False", done.stderr
    assert (tmp_path / "j.xml").exists() and (tmp_path / "t.html").exists()


# ------------------------------------------------------------------------- report


def _flag(k: int, line: dict[str, Any]) -> None:
    if k >= 2:  # sustained: at each of the last 3 logging steps, so a finding
        line["layers"][2] |= {"flags": ["drift"], "drift": 0.8}


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("train")
    log = write_log(root / f"run {EVIL}", event=EVENT, tweak=_flag)
    out = root / "train.html"
    r = run("report", log, "-o", out)
    assert r.exit_code == 0, r.output
    return out, out.read_text(encoding="utf-8")


def test_extreme_finite_values_are_drawn(tmp_path) -> None:
    def extreme(k: int, line: dict[str, Any]) -> None:
        line["layers"][0]["mean"] = (-1) ** k * 1.5e308  # the colour scale spans 3e308

    log = write_log(tmp_path / "run", tweak=extreme)
    text = (log / "watch.jsonl").read_text()
    (log / "watch.jsonl").write_text(text.replace('"every": 10', '"started": 1e300, "every": 10',
                                                  1))
    r = run("report", log, "-o", tmp_path / "page.html")
    assert r.exit_code == 0, r.output


def test_training_page_escapes_every_string(page) -> None:
    _, text = page
    parsed = Tags()
    parsed.feed(text)
    assert EVIL not in text and escape(EVIL) in text
    assert EVIL in "".join(parsed.text)
    assert not [(t, a) for t, a in parsed.tags for name in a if name.startswith("on")]
    assert [a for t, a in parsed.tags if t == "script"] == [{}]
    assert not [t for t, _ in parsed.tags if t in ("iframe", "object", "embed", "base", "form")]
    assert "https://" not in text and "http://" not in text.replace("http://www.w3.org/", "")


def test_training_page_shows_the_log(page) -> None:
    _, text = page
    parsed = Tags()
    parsed.feed(text)
    ids = {a.get("id") for _, a in parsed.tags}
    assert {"heat-mean", "heat-std", "heat-zero_fraction", "heat-grad_norm", "lines-grad_norm",
            "lines-update_ratio", "event", "nonfinite-event"} <= ids
    rows = [a["data-name"] for t, a in parsed.tags if t == "tr" and
            (a.get("id") or "").startswith("layers-")]
    assert rows == [n for n, _ in LAYERS]  # the last step's rows, in order
    params = [a["data-name"] for t, a in parsed.tags if t == "tr" and
              (a.get("id") or "").startswith("params-")]
    assert params == PARAMS
    shown = " ".join("".join(parsed.text).split())
    assert EVENT["message"] in shown
    assert f"{EVIL} (flagged at 3 steps, 20 to 40): drift 0.8" in shown
    cells = [a.get("data-v") for t, a in parsed.tags if t == "td"]
    assert repr(0.004) in cells and repr(0.1 * 4 + 3) in cells  # conv1.weight ratio, fc mean


@pytest.mark.slow
def test_training_page_in_a_real_browser(page) -> None:
    from selenium.webdriver.common.by import By

    from tests.test_report import _driver, open_page

    out, _ = page
    driver = _driver()
    try:
        open_page(driver, out)
        # The heat maps and colour bars are PNG images inside the inline SVGs: each decodes.
        sizes = driver.execute_async_script("""
            const done = arguments[arguments.length - 1];
            const hrefs = Array.from(document.querySelectorAll('svg image'),
                i => i.getAttribute('xlink:href') || i.getAttribute('href'));
            Promise.all(hrefs.map(h => new Promise(ok => {
                const img = new Image(); img.onload = () => ok(img.naturalWidth);
                img.onerror = () => ok(0); img.src = h; }))).then(done);""")
        assert len(sizes) == 8 and min(sizes) > 0, sizes  # 4 maps and their colour bars
        header = driver.find_elements(By.CSS_SELECTOR, "#layers thead th")
        mean = header[[h.text for h in header].index("mean")]
        mean.click()
        mean.click()  # descending: fc's mean is the largest
        first = driver.find_element(By.CSS_SELECTOR, "#layers tbody tr").get_attribute("data-name")
        assert first == "fc"
        shown = driver.find_element(By.CSS_SELECTOR, "#layers-2 td:nth-child(2)").text
        assert shown == EVIL  # the hostile name is text on the page, not an element
    finally:
        driver.quit()
