"""``hookscope report`` and ``--plot``: the page's content, its safety, its size, and a real
browser (Debian's chromium through Selenium, never a downloaded one)."""

from __future__ import annotations

import json
import math
import os
import shutil
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import torch
from markupsafe import escape  # Jinja2's autoescape: quotes as &#34; and &#39;
from PIL import Image
from typer.testing import CliRunner

from hookscope.cli import app

# One intra-op thread: on a shared 2-core machine, two spinning threads run 10x slower.
pytestmark = pytest.mark.usefixtures("one_thread")

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
XSS = '<img src=x onerror="window.__xss=1;alert(1)">'
#: A module name may hold anything but a dot: this one runs code if written unescaped.
EVIL_MODULE = "<img src=x onerror=__xss=1>"
NET = f'''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.add_module({EVIL_MODULE!r}, nn.ReLU())
        self.dead = nn.ReLU()
        self.broken = nn.Identity()
        self.quiet = nn.Tanh()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        x = getattr(self, {EVIL_MODULE!r})(self.conv(x))
        self.broken(torch.log(-x.abs() - 1))  # NaN, off the path to the logits
        x = x + self.dead(-x.abs() - 1)  # all zeros: a dead call
        x = x + 0.0 * self.quiet(x)  # no gradient reaches its output: it vanishes
        return self.fc(self.pool(x).flatten(1))
'''


def run(*args: object) -> Any:
    """The CLI in-process; stdout and stderr apart."""
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def evil(tmp_path_factory, samples) -> dict[str, Any]:
    """A small model from code, labels and an input file, all with names that would run
    code if the page wrote them unescaped."""
    root = tmp_path_factory.mktemp("evil")
    folder = root / 'a&b "q" <x>'
    folder.mkdir()
    (folder / "net.py").write_text(NET)
    labels = root / "labels.txt"
    labels.write_text("".join(f"{XSS} <script>alert({i})</script>\n" for i in range(5)))
    image = root / f"{XSS.replace('/', '')}.jpg"
    shutil.copy(samples / "cat.jpg", image)
    return {"model": f"{folder}/net.py:Net", "labels": labels, "image": image, "root": root}


def _small(evil: dict[str, Any]) -> list[object]:
    return [evil["model"], evil["image"], "--labels", evil["labels"], "--size", "32"]


# ------------------------------------------------------------------------- HTML text


class Tags(HTMLParser):
    """Every start tag with its attributes, and the text of the page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


@pytest.fixture(scope="module")
def evil_page(evil) -> tuple[str, Any]:
    out = evil["root"] / "report.html"
    r = run("report", *_small(evil), "-o", out, "-m", "eigencam")
    assert r.exit_code == 0, r.output
    return out.read_text(encoding="utf-8"), r


def test_strings_from_the_model_labels_and_file_names_are_escaped(evil, evil_page) -> None:
    text, _ = evil_page
    parsed = Tags()
    parsed.feed(text)
    for raw in (XSS, EVIL_MODULE, "<script>alert(", str(evil["image"]), 'a&b "q" <x>'):
        assert raw not in text, f"{raw!r} written unescaped"
    shown = "".join(parsed.text)
    for raw in (XSS, EVIL_MODULE, "<script>alert(0)</script>", evil["image"].name):
        assert raw in shown, f"{raw!r} is not shown as text"
    assert escape(EVIL_MODULE) in text and escape(evil["model"]) in text
    # Nothing the page holds can run or load: no handler attributes, one inline script,
    # images only from data: URIs, no external resource of any kind.
    assert not [(t, a) for t, a in parsed.tags for name in a if name.startswith("on")]
    scripts = [a for t, a in parsed.tags if t == "script"]
    assert scripts == [{}]
    srcs = [a.get("src") or "" for t, a in parsed.tags if t == "img"]
    assert len(srcs) == 4 and all(s.startswith("data:image/jpeg;base64,") for s in srcs)
    assert not [t for t, _ in parsed.tags if t in ("iframe", "object", "embed", "base", "form")]
    assert [a.get("href") for t, a in parsed.tags if t == "link"] == ["data:,"]
    assert "http://" not in text.replace("http://www.w3.org/", "") and "https://" not in text


def test_findings_link_to_the_rows_that_show_them(evil, evil_page) -> None:
    text, _ = evil_page
    parsed = Tags()
    parsed.feed(text)
    rows = {a["id"]: a.get("data-name") for t, a in parsed.tags if t == "tr" and a.get("id")}
    links = [a["href"][1:] for t, a in parsed.tags
             if t == "a" and (a.get("href") or "").startswith("#")]
    # By construction: `broken` holds NaN, `dead` is all zeros, `quiet` gets no gradient.
    assert [rows[i] for i in links] == ["broken", "dead", "quiet"]
    assert links[0].startswith("stats-") and links[1].startswith("stats-")
    assert links[2].startswith("grads-")
    classes = {a.get("data-name"): a.get("class") for t, a in parsed.tags
               if t == "tr" and (a.get("id") or "").startswith("stats-")}
    assert classes["broken"] == "bad" and classes["dead"] == "dead" and classes["conv"] is None


def test_table_rows_are_the_stats_rows(evil, evil_page) -> None:
    text, _ = evil_page
    r = run("stats", *_small(evil), "--format", "json")
    assert r.exit_code == 0, r.output
    layers = json.loads(r.stdout)["layers"]
    parsed = Tags()
    parsed.feed(text)
    rows = [a for t, a in parsed.tags if t == "tr" and (a.get("id") or "").startswith("stats-")]
    assert [r["data-name"] for r in rows] == [row["name"] for row in layers]
    means = [a.get("data-v") for t, a in parsed.tags if t == "td"]
    for row in layers:  # the same numbers, as data attributes for sorting
        if row["mean"] is not None:
            assert repr(float(row["mean"])) in means


def test_report_is_plain_data(evil) -> None:
    from hookscope.core.files import dumps_json
    from hookscope.inputs.resolve import iter_batches, resolve_inputs
    from hookscope.report import ReportOptions, build_report
    from hookscope.sources import LoadOptions, load

    loaded = load(evil["model"], LoadOptions(size=32, labels=str(evil["labels"])))
    inputs = resolve_inputs([str(evil["image"])])
    report = build_report(loaded, lambda: iter_batches(inputs, loaded.preprocess,
                                                       keep_images=True),
                          inputs.names, ReportOptions(methods=("gradcam", "eigencam")))
    doc = json.loads(dumps_json(report))
    assert doc["command"] == "report" and doc["inputs"] == inputs.names
    assert doc["params"] == sum(p.numel() for p in loaded.model.parameters())
    assert doc["flops"] > 0 and doc["gradcam"]["methods"] == ["gradcam", "eigencam"]
    assert [f["kind"] for f in doc["findings"]] == ["nonfinite", "dead", "vanish"]
    assert [m.shape for m in report.inputs[0].maps.values()] == [(32, 32), (32, 32)]
    assert max(report.inputs[0].image.size) <= 512
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in loaded.model.modules())


@pytest.mark.slow
@pytest.mark.parametrize("name", ["lraspp_mobilenet_v3_large", "ssdlite320_mobilenet_v3_large"])
def test_a_segmenter_or_detector_gets_statistics_and_grad_cam(name, cat_jpg, tmp_path) -> None:
    """Their output is no (N, classes) logits: the gradient section is left out, and the
    page and stderr say so."""
    out = tmp_path / "page.html"
    r = run("report", name, cat_jpg, "--weights", "none", "--size", "64", "-o", out)
    assert r.exit_code == 0, r.output
    assert "gradients left out: a " in r.stderr
    tags = Tags()
    tags.feed(out.read_text(encoding="utf-8"))
    ids = {attrs.get("id") for _tag, attrs in tags.tags}
    assert {"activations", "gradcam", "profile"} <= ids
    assert not ids & {"gradients", "gradient-flow"}
    assert "Gradients left out: a " in "".join(tags.text)


def test_cam_options_are_refused_before_any_model_runs(evil, tmp_path, monkeypatch) -> None:
    import hookscope.report

    def no_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model ran")

    monkeypatch.setattr(hookscope.report, "drive", no_run)
    monkeypatch.setattr(hookscope.report, "explain", no_run)
    r = run("report", *_small(evil), "-o", tmp_path / "r.html", "--layer", "nope")
    assert r.exit_code == 2 and "no module named 'nope'" in r.stderr, r.output
    assert not (tmp_path / "r.html").exists()


def test_dead_threshold_is_the_terminal_tables() -> None:
    from hookscope.render.tables import ZERO_WARN
    from hookscope.report import DEAD

    assert DEAD == ZERO_WARN


def test_size_and_time_are_printed_on_stderr(evil_page) -> None:
    _, result = evil_page
    line = [ln for ln in result.stderr.splitlines() if "wrote" in ln]
    assert len(line) == 1 and "report.html (" in line[0] and line[0].endswith(" s"), line


def test_existing_page_needs_force_and_is_checked_before_the_model_loads(evil) -> None:
    out = evil["root"] / "taken.html"
    out.write_text("mine")
    r = run("report", *_small(evil), "-o", out)
    assert r.exit_code == 2 and "--force" in r.stderr and out.read_text() == "mine"


def test_a_failed_run_leaves_no_page(evil, tmp_path) -> None:
    gray = tmp_path / "gray.pt"
    torch.save(torch.zeros(1, 1, 32, 32), gray)  # the model takes 3 channels: its forward fails
    r = run("report", evil["model"], gray, "-o", tmp_path / "report.html")
    assert r.exit_code == 1 and "conv" in r.stderr, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gray.pt"]


# ------------------------------------------------------------------------- --plot


@pytest.mark.parametrize("command,suffix", [("stats", "svg"), ("grads", "png"),
                                            ("stats", "png"), ("grads", "svg")])
def test_plot_files(evil, tmp_path, command, suffix) -> None:
    plot = tmp_path / f"plot.{suffix}"
    r = run(command, *_small(evil), "--plot", plot, "--format", "json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["command"] == command
    if suffix == "svg":
        root = ET.parse(plot).getroot()
        assert root.tag == "{http://www.w3.org/2000/svg}svg"
    else:
        with Image.open(plot) as img:
            assert img.format == "PNG" and img.width > 500
            img.load()
    assert sorted(p.name for p in tmp_path.iterdir()) == [plot.name]


def test_plot_failures_leave_no_file(evil, tmp_path) -> None:
    bad = run("stats", *_small(evil), "--plot", tmp_path / "plot.pdf")
    assert bad.exit_code == 2 and ".svg or .png" in bad.stderr
    gray = tmp_path / "gray.pt"
    torch.save(torch.zeros(1, 1, 32, 32), gray)  # the model takes 3 channels: its forward fails
    failed = run("grads", evil["model"], gray, "--plot", tmp_path / "plot.svg")
    assert failed.exit_code == 1, failed.output
    taken = tmp_path / "taken.png"
    taken.write_bytes(b"mine")
    exists = run("stats", *_small(evil), "--plot", taken)
    assert exists.exit_code == 2 and "--force" in exists.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gray.pt", "taken.png"]
    assert taken.read_bytes() == b"mine"


# ------------------------------------------------------------------------- size


@pytest.mark.slow
def test_resnet50_on_the_samples_is_under_5_mb(samples, tmp_path) -> None:
    out = tmp_path / "r50.html"
    r = run("report", "resnet50", samples, "--weights", "none", "-o", out)
    assert r.exit_code == 0, r.output
    size = out.stat().st_size
    assert size < 5_000_000, f"{size / 1e6:.2f} MB"
    page = Tags()
    page.feed(out.read_text(encoding="utf-8"))
    for tag, attrs in page.tags:
        if tag == "img":
            assert max(int(attrs["width"] or 0), int(attrs["height"] or 0)) <= 512
    assert "wrote" in r.stderr


# ------------------------------------------------------------------------- the browser


def _driver(*, offline: bool = True) -> Any:
    """Debian's chromium, headless, through its chromedriver; Selenium Manager never runs."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        pytest.fail(f"{' and '.join(missing)} missing: the browser test needs Debian's "
                    "browser: apt-get install -y chromium chromium-driver (.ci/run does it)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("selenium missing: pip install -e '.[test]'")
    os.environ["SE_OFFLINE"] = "true"
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--host-resolver-rules=MAP * ~NOTFOUND", "--window-size=1280,2000"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    if offline:
        driver.execute_cdp_cmd("Network.enable", {})
        driver.execute_cdp_cmd("Network.emulateNetworkConditions", {
            "offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1})
    return driver


@pytest.fixture(scope="module")
def resnet_page(tmp_path_factory, samples) -> tuple[Path, list[dict[str, Any]]]:
    """resnet18's report on three samples and a copy of the cat named to run code, with
    labels that would run code, and the ``stats`` rows of the same run."""
    root = tmp_path_factory.mktemp("page")
    images = sorted(samples.glob("*.jpg"))[:3]
    evil_cat = root / f"{XSS.replace('/', '')}.jpg"
    shutil.copy(samples / "cat.jpg", evil_cat)
    labels = root / "labels.txt"
    labels.write_text("".join(f"{XSS} {i}\n" for i in range(1000)))
    common = ["resnet18", *images, evil_cat, "--weights", "none", "--size", "64",
              "--labels", labels]
    out = root / "report.html"
    r = run("report", *common, "-o", out)
    assert r.exit_code == 0, r.output
    stats = run("stats", *common, "--format", "json")
    assert stats.exit_code == 0, stats.output
    return out, json.loads(stats.stdout)["layers"]


def _order(rows: list[dict[str, Any]], key: str, descending: bool) -> list[str]:
    """Row ids sorted as the page should: by value, ties in table order, missing last."""
    sign = -1 if descending else 1
    present = [i for i, r in enumerate(rows) if r[key] is not None]
    ranked = sorted(present, key=lambda i: (sign * rows[i][key], i))
    return [f"stats-{i}" for i in ranked + [i for i, r in enumerate(rows) if r[key] is None]]


def open_page(driver: Any, page: Path) -> None:
    """Open ``page`` and check that it raised no alert, ran no injected code, logged no
    error and loaded nothing but ``data:`` URIs."""
    from selenium.common.exceptions import NoAlertPresentException

    driver.get(page.as_uri())
    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert.text  # noqa: B018
    assert driver.execute_script("return typeof window.__xss") == "undefined"
    errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert errors == [], errors
    loaded = driver.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)")
    assert [u for u in loaded if not u.startswith("data:")] == []


@pytest.mark.slow
def test_page_in_a_real_browser(resnet_page) -> None:
    from selenium.webdriver.common.by import By

    page, layers = resnet_page
    driver = _driver()
    try:
        open_page(driver, page)
        widths = driver.execute_script(
            "return Array.from(document.images, i => i.complete ? i.naturalWidth : 0)")
        assert len(widths) == 12 and min(widths) > 0, widths  # 4 x (input, gradcam, saliency)
        ids = lambda: driver.execute_script(  # noqa: E731
            "return Array.from(document.querySelectorAll('#stats tbody tr'), r => r.id)")
        assert ids() == [f"stats-{i}" for i in range(len(layers))]
        header = driver.find_elements(By.CSS_SELECTOR, "#stats thead th")
        mean = header[[h.text for h in header].index("mean")]
        mean.click()
        assert ids() == _order(layers, "mean", descending=False)
        mean.click()
        assert ids() == _order(layers, "mean", descending=True)
        header[1].click()  # layer: text order
        assert ids() == [f"stats-{i}" for i in sorted(range(len(layers)), key=lambda i: (
            layers[i]["name"].lower(), i))]
        _check_filter(driver, layers)
        closed = "return document.getElementById('grads-details').open"
        assert driver.execute_script(closed) is False
        driver.get(page.as_uri() + "#grads-5")  # a finding's link opens the gradient table
        assert driver.execute_script(closed) is True
        assert driver.find_element(By.ID, "grads-5").is_displayed()
        shown = driver.find_element(By.CSS_SELECTOR, "table.preds td:nth-child(2)").text
        assert shown.startswith(XSS)  # the label is text on the page, not an element
    finally:
        driver.quit()


def _check_filter(driver: Any, layers: list[dict[str, Any]]) -> None:
    from selenium.webdriver.common.by import By

    box = driver.find_element(By.CSS_SELECTOR, "input[data-filter=stats]")
    box.send_keys("layer3")
    visible = driver.execute_script(
        "return Array.from(document.querySelectorAll('#stats tbody tr:not([hidden])'),"
        " r => r.dataset.name)")
    assert sorted(visible) == sorted(r["name"] for r in layers if "layer3" in r["name"])


@pytest.mark.slow
def test_page_without_javascript_shows_static_tables(resnet_page) -> None:
    from selenium.webdriver.common.by import By

    page, layers = resnet_page
    driver = _driver()
    try:
        driver.execute_cdp_cmd("Emulation.setScriptExecutionDisabled", {"value": True})
        driver.get(page.as_uri())
        rows = driver.find_elements(By.CSS_SELECTOR, "#stats tbody tr")
        assert len(rows) == len(layers)
        assert rows[0].find_elements(By.TAG_NAME, "td")[1].text == layers[0]["name"]
        assert driver.find_elements(By.CSS_SELECTOR, "#stats thead th button") == []
        assert not driver.find_element(By.CSS_SELECTOR, "p.filter").is_displayed()
        images = driver.find_elements(By.CSS_SELECTOR, "img")
        assert images and all(int(i.get_property("naturalWidth")) > 0 for i in images)
        assert driver.find_element(By.ID, "profile").is_displayed()
        assert math.isfinite(float(rows[0].find_elements(By.TAG_NAME, "td")[6]
                                   .get_attribute("data-v")))
    finally:
        driver.quit()
