"""Inputs at scale, in one process: DataLoader workers that change nothing in the output,
--limit/--shuffle/--recursive, ImageFolder classes for ``grads --loss ce`` and ``check``, the
shards torchrun ranks take, and reports that merge like one run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from hookscope.core.distributed import Launch, shard, timeout_seconds
from hookscope.core.errors import HookscopeError
from hookscope.core.run import drive
from hookscope.core.select import Selection
from hookscope.inputs.dataset import MAX_DEFAULT_WORKERS, default_workers
from hookscope.inputs.resolve import Batch, InputItem, resolve_inputs
from hookscope.probes.debug import DebugProbe
from hookscope.probes.grads import GradsProbe

from .conftest import TinyNet

#: A model that tells dark images (class 0) from light ones (class 1): the logits are
#: -s and +s for s the mean of the normalised pixels. Its weights are set, not drawn.
BRIGHT = """
import torch
from torch import nn


class Bright(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4, 2)
        with torch.no_grad():
            self.conv.weight.fill_(0.05)
            self.conv.bias.zero_()
            self.fc.weight.copy_(torch.tensor([[-1.0] * 4, [1.0] * 4]))
            self.fc.bias.zero_()

    def forward(self, x):
        return self.fc(self.pool(self.conv(x)).flatten(1))
"""


def write_images(folder: Path, count: int, *, seed: int = 0, light: bool | None = None,
                 prefix: str = "img") -> list[Path]:
    """``count`` JPEGs of seeded noise, of several sizes (dark or light when asked)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    lo, hi = (0, 256) if light is None else (190, 256) if light else (0, 60)
    paths = []
    for i in range(count):
        pixels = rng.integers(lo, hi, size=(40 + 3 * i, 48, 3), dtype=np.uint8)
        path = folder / f"{prefix}{i:02d}.jpg"
        Image.fromarray(pixels).save(path)
        paths.append(path)
    return paths


def one_line(result, code: int = 2) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == code, result.stderr
    assert len(lines) == 1 and lines[0].startswith("hookscope: error: "), result.stderr
    return lines[0]


def json_of(cli, *args: object) -> dict:
    result = cli(*args, "-f", "json", "-q")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture()
def bright(tmp_path: Path) -> tuple[str, Path]:
    """The model as ``file.py:NAME`` and its labels file."""
    code = tmp_path / "bright_model.py"
    code.write_text(BRIGHT)
    labels = tmp_path / "labels.txt"
    labels.write_text("dark\nlight\n")
    return f"{code}:Bright", labels


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    """An ImageFolder: dark/ and light/ class folders."""
    root = tmp_path / "photos"
    write_images(root / "dark", 3, seed=1, light=False)
    write_images(root / "light", 2, seed=2, light=True)
    return root


# ------------------------------------------------------------------ DataLoader workers


@pytest.mark.parametrize("command, extra", [
    ("stats", ["--per-channel", "--percentiles", "1,50,99"]),
    ("grads", []),
])
def test_workers_change_nothing_in_the_output(cli, tmp_path: Path, command: str,
                                              extra: list[str]) -> None:
    write_images(tmp_path / "imgs", 7)
    args = [command, "resnet18", tmp_path / "imgs", "-w", "none", "--size", "32", "-b", "3",
            *extra]
    docs = [json_of(cli, *args, "--workers", n) for n in ("0", "2")]
    assert docs[0]["inputs"] == sorted(docs[0]["inputs"]) and len(docs[0]["inputs"]) == 7
    if command == "stats":
        assert docs[0] == docs[1]
    else:  # the CPU convolution's weight gradient varies run to run in its last bits
        assert_close_docs(docs[0], docs[1])


def assert_close_docs(a: object, b: object, where: str = "") -> None:
    """Equal, but floats within 1e-6 relative."""
    if isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_close_docs(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_close_docs(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-6, abs=1e-12), where
    else:
        assert a == b, where


def test_workers_keep_images_and_order_for_gradcam(cli, tmp_path: Path, cat_jpg: Path) -> None:
    write_images(tmp_path / "imgs", 4)
    outs = []
    for n in ("0", "2"):
        out = tmp_path / f"cams{n}"
        result = cli("gradcam", "resnet18", tmp_path / "imgs", cat_jpg, "-w", "none", "--size",
                     "32", "-b", "2", "--workers", n, "--out", out, "-f", "json", "-q")
        assert result.exit_code == 0, result.stderr
        outs.append(out)
    names = sorted(p.name for p in outs[0].iterdir())
    assert names == sorted(p.name for p in outs[1].iterdir()) and "cat.gradcam.png" in names
    for name in names:
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name


def test_a_bad_image_in_a_worker_is_one_line_and_no_file(cli, tmp_path: Path) -> None:
    paths = write_images(tmp_path / "imgs", 6)
    data = paths[4].read_bytes()
    paths[4].write_bytes(data[: len(data) * 2 // 3])  # the header reads; the pixels do not
    out = tmp_path / "stats.json"
    result = cli("stats", "resnet18", tmp_path / "imgs", "-w", "none", "--size", "32", "-b",
                 "2", "--workers", "2", "-f", "json", "-o", out)
    line = one_line(result)
    assert "img04.jpg" in line and "truncated" in line
    assert not out.exists()


def test_default_workers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)), raising=False)
    images = resolve_inputs([str(p) for p in write_images(tmp_path, 20)])
    assert default_workers(images, batch_size=8) == MAX_DEFAULT_WORKERS
    assert default_workers(images, batch_size=8, processes=4) == 3  # 4 CPUs per rank
    assert default_workers(images, batch_size=8, processes=8) == 0  # 1 would be the thread
    assert default_workers(images, batch_size=16) == 0  # fewer than two batches
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert default_workers(images, batch_size=8) == 0


# ------------------------------------------------------------------ choosing the inputs


def test_limit_shuffle_and_seed(tmp_path: Path) -> None:
    write_images(tmp_path, 12)
    names = resolve_inputs([str(tmp_path)]).names
    assert names == sorted(names)
    assert resolve_inputs([str(tmp_path)], limit=3).names == names[:3]
    drawn = resolve_inputs([str(tmp_path)], shuffle=True, seed=1).names
    assert sorted(drawn) == names and drawn != names
    assert resolve_inputs([str(tmp_path)], shuffle=True, seed=1).names == drawn
    assert resolve_inputs([str(tmp_path)], shuffle=True, seed=2).names != drawn
    assert resolve_inputs([str(tmp_path)], shuffle=True, seed=1, limit=4).names == drawn[:4]


def test_limit_and_shuffle_on_the_command_line(cli, tmp_path: Path) -> None:
    write_images(tmp_path / "imgs", 6)
    args = ["stats", "resnet18", tmp_path / "imgs", "-w", "none", "--size", "32", "--limit",
            "2"]
    first = json_of(cli, *args)
    assert [Path(n).name for n in first["inputs"]] == ["img00.jpg", "img01.jpg"]
    sample = json_of(cli, *args, "--shuffle", "--seed", "3")["inputs"]
    assert len(sample) == 2 and sample == json_of(cli, *args, "--shuffle", "--seed", "3")["inputs"]
    assert "--limit must be at least 1" in one_line(cli(*args[:-1], "0"))
    assert "--workers must be 0 or more" in one_line(cli(*args, "--workers", "-1"))


def test_recursive_walks_subdirectories(tmp_path: Path) -> None:
    write_images(tmp_path, 2, prefix="top")
    write_images(tmp_path / "b" / "deeper", 1, prefix="deep")
    write_images(tmp_path / "a", 1, prefix="sub")
    flat = resolve_inputs([str(tmp_path)])
    assert [Path(n).name for n in flat.names] == ["top00.jpg", "top01.jpg"]
    assert flat.labels is None
    walked = resolve_inputs([str(tmp_path)], recursive=True)
    assert [Path(n).relative_to(tmp_path).as_posix() for n in walked.names] == [
        "a/sub00.jpg", "b/deeper/deep00.jpg", "top00.jpg", "top01.jpg"]
    assert walked.labels is None


def test_a_directory_of_only_subdirectories_without_images_says_recursive(tmp_path) -> None:
    write_images(tmp_path / "a" / "b", 1)  # images two levels down: no class folder holds any
    with pytest.raises(HookscopeError, match="recursive"):
        resolve_inputs([str(tmp_path)])
    assert len(resolve_inputs([str(tmp_path)], recursive=True)) == 1


# ------------------------------------------------------------------ ImageFolder classes


def test_imagefolder_layout_gives_each_image_its_class(folder: Path) -> None:
    resolved = resolve_inputs([str(folder)])
    assert resolved.labels == ["dark"] * 3 + ["light"] * 2
    assert [Path(n).parent.name for n in resolved.names] == resolved.labels
    part = resolved.part(2, 4)
    assert part.labels == ["dark", "light"] and part.offset == 2


def test_grads_ce_takes_the_class_folders(cli, bright, folder: Path) -> None:
    model, labels = bright
    args = ["grads", model, folder, "--labels", labels, "--loss", "ce", "--size", "16"]
    from_folders = json_of(cli, *args)
    assert from_folders["targets"] == [0, 0, 0, 1, 1]
    explicit = json_of(cli, *args, "--label", "dark,dark,dark,light,light")
    assert from_folders == explicit


def test_check_expects_the_class_folders(cli, bright, folder: Path) -> None:
    model, labels = bright
    args = ["check", model, folder, "--labels", labels, "--size", "16", "-f", "json"]
    result = cli(*args)
    assert result.exit_code == 0, result.stderr + result.stdout
    doc = json.loads(result.stdout)
    expect = next(r for r in doc["rules"] if r["rule"] == "expect")
    assert expect["passed"] and len(expect["limit"]) == 5
    # One light photo filed as dark: the rule fails on it, naming the image.
    stray = folder / "dark" / "stray.jpg"
    write_images(folder / "tmp", 1, seed=9, light=True)[0].rename(stray)
    (folder / "tmp").rmdir()
    result = cli(*args)
    assert result.exit_code == 1, result.stderr
    expect = next(r for r in json.loads(result.stdout)["rules"] if r["rule"] == "expect")
    assert not expect["passed"] and len(expect["offenders"]) == 1
    assert "stray.jpg" in expect["offenders"][0]


def test_a_class_folder_the_model_does_not_know_is_one_line(cli, bright, folder: Path) -> None:
    model, labels = bright
    (folder / "light").rename(folder / "lihgt")
    line = one_line(cli("grads", model, folder, "--labels", labels, "--loss", "ce", "-q"))
    assert "'lihgt'" in line and "light" in line and "--label" in line


# ------------------------------------------------------------------ torchrun's shards


@pytest.mark.parametrize("count", [0, 1, 7, 20, 33])
@pytest.mark.parametrize("batch", [1, 3, 8])
@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_shards_are_disjoint_whole_batches_covering_every_input(count, batch, world) -> None:
    parts = [shard(count, batch, rank, world) for rank in range(world)]
    assert parts[0][0] == 0 and parts[-1][1] == count
    for (_, hi), (lo, _) in zip(parts, parts[1:], strict=False):
        assert hi == lo  # contiguous, so nothing is repeated or left out
    for lo, hi in parts:
        assert lo % batch == 0 and (hi % batch == 0 or hi == count)
    sizes = [-(-(hi - lo) // batch) for lo, hi in parts]
    assert max(sizes) - min(sizes) <= 1  # as even as whole batches allow


def test_launch_and_timeout_from_the_environment() -> None:
    assert Launch.from_env({}) is None
    assert Launch.from_env({"WORLD_SIZE": "1", "RANK": "0"}) is None
    launch = Launch.from_env({"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1",
                              "LOCAL_WORLD_SIZE": "2"})
    assert launch == Launch(3, 4, 1, 2)
    with pytest.raises(HookscopeError, match="integers"):
        Launch.from_env({"WORLD_SIZE": "two", "RANK": "0"})
    assert timeout_seconds({}) == 60 and timeout_seconds({"HOOKSCOPE_DIST_TIMEOUT": "2.5"}) == 2.5
    for bad in ("0", "-1", "soon", "nan"):
        with pytest.raises(HookscopeError, match="HOOKSCOPE_DIST_TIMEOUT"):
            timeout_seconds({"HOOKSCOPE_DIST_TIMEOUT": bad})


# ------------------------------------------------------------------ reports merge like one run


def batches_of(x: torch.Tensor, size: int, start: int = 0) -> list[Batch]:
    """``x`` in batches that know their place among all inputs, as a rank's do."""
    return [Batch([InputItem(f"x[{start + i + j}]", "tensor") for j in range(len(t))], t,
                  [None] * len(t), start + i, (start + i) // size)
            for i, t in zip(range(0, len(x), size), x.split(size), strict=True)]


def test_grads_reports_merge_like_one_run(tiny_net) -> None:
    x = torch.randn(6, 3, 12, 12, generator=torch.Generator().manual_seed(5))

    def report(part: torch.Tensor):
        probe = GradsProbe(tiny_net, loss="ce", label="1", select=Selection(all_modules=True))
        return drive(tiny_net, batches_of(part, 2), probe)

    one, ranks = report(x), [report(p) for p in x.split([4, 2])]
    merged = ranks[0].merge(ranks[1])
    a, b = merged.to_dict(), one.to_dict()
    assert a["targets"] == b["targets"] and a["objective"] == pytest.approx(b["objective"])
    for row_a, row_b in zip(a["layers"], b["layers"], strict=True):
        assert (row_a["name"], row_a["call"], row_a["shape"]) == \
            (row_b["name"], row_b["call"], row_b["shape"])
        for key in ("norm", "mean", "std", "max_abs"):
            assert row_a[key] == pytest.approx(row_b[key], rel=1e-5, abs=1e-9), key
        assert row_a["flag"] == row_b["flag"]
    for p_a, p_b in zip(a["params"], b["params"], strict=True):
        assert p_a["grad_norm"] == pytest.approx(p_b["grad_norm"], rel=1e-5)


def test_debug_reports_merge_like_one_run_and_keep_the_first_origin() -> None:
    torch.manual_seed(0)
    net = TinyNet().eval()
    x = torch.randn(6, 3, 8, 8)
    x[3, 0, 0, 0] = float("nan")  # on the second rank's part

    def report(part: torch.Tensor, start: int = 0):
        return drive(net, batches_of(part, 2, start), DebugProbe(net, record=True))

    one, ranks = report(x), [report(x[:2]), report(x[2:], 2)]
    merged = ranks[0].merge(ranks[1])
    assert merged.to_dict() == one.to_dict()
    assert [type(e).__name__ for e in merged.events or ()] == \
        [type(e).__name__ for e in one.events or ()]


def test_ablate_noise_is_refused_across_processes() -> None:
    from hookscope.probes.ablate import parse_mode

    assert parse_mode("noise:0.5").value == 0.5
    assert parse_mode("zero", processes=2).kind == "zero"
    with pytest.raises(HookscopeError, match="under torchrun"):
        parse_mode("noise:0.5", processes=2)


def test_ranks_agree_on_their_inputs_or_say_so() -> None:
    from hookscope.core.distributed import check_agreed, fingerprint

    both = fingerprint(["a.jpg", "b.jpg"])
    check_agreed([both, both])
    with pytest.raises(HookscopeError, match=r"^rank 1 resolved other inputs than rank 0 "
                                             r"\(rank 1: 1, rank 0: 2, or in another order\)"):
        check_agreed([both, fingerprint(["a.jpg"])])
    with pytest.raises(HookscopeError, match=r"^ranks 1, 3 resolved .*same files at the same "
                                             "paths"):
        check_agreed([both, fingerprint(["b.jpg", "a.jpg"]), both, fingerprint(["a", "b"])])


def test_after_a_failed_collective_the_process_ends_without_tearing_its_group_down(
        monkeypatch) -> None:
    import os

    import torch.distributed as dist

    from hookscope.session import session

    class Ended(BaseException):
        pass

    calls: list[object] = []

    def ended(code: int) -> None:
        calls.append(code)
        raise Ended

    def broken(*_: object) -> None:
        raise RuntimeError("[gloo.cc:1] Connection closed by peer. more")

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "gather_object", lambda *_: None)
    monkeypatch.setattr(dist, "barrier", broken)
    monkeypatch.setattr(dist, "destroy_process_group", lambda: calls.append("destroy"))
    monkeypatch.setattr(os, "_exit", ended)
    with pytest.raises(Ended), session({}, "stats") as s:
        s.group.launch = Launch(0, 2, 0, 2)
        s.group.gathered(torch.zeros(1))
    assert calls == [1]  # hookscope's exit code, and the broken group is left alone
