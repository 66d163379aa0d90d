"""The examples of the README and of docs/*.md run, in one process, on files made here.

Each ``console`` block's ``$ hookscope ...`` lines run through the CLI in-process (importing
torch once); what follows an unquoted ``|`` runs in bash on the command's stdout. To stay
offline and quick, ``--weights none`` is added where an example names no weights, a small
``--size`` where it names none, ``--force`` so that an output may be replaced, and resnet50
runs as resnet18 (SWAP). ``python``
blocks run as scripts; ``<!-- file: NAME -->`` saves the next block as NAME instead. A block
after ``<!-- example: skip (why) -->`` is not run: the reasons are listed in SKIP_REASONS, and
any other command than ``hookscope`` must sit in such a block. The output shown under a command
is illustrative (random weights) and not compared; the exit code is (0 unless EXPECTED_EXIT
names the example).
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: Why a block may be left out; a skip marker must give one of these.
SKIP_REASONS = (
    "builds the environment",   # make demo / make test: the suite itself
    "needs a GPU",
    "needs several processes",  # torchrun: tests/test_distributed.py runs it
    "needs several machines",
    "needs pretrained weights",
)

#: Examples that exit non-zero by design (a substring of the command -> its exit code).
EXPECTED_EXIT = {
    "gray.pt": 1,                          # the crash the debug example locates
    "--expect cat.jpg=tabby": 1,           # random weights do not see a tabby
    "check resnet50 val/ --min-prob 0.2": 1,  # nor reach 0.2 on the folders' classes
    "--against-dtype bfloat16 --fail": 1,  # bfloat16 parts by more than the default 0.001
}

#: The input size an example runs at when it gives none (a ViT is built for 224 only).
SMALL = {"vit_b_16": None}
SIZE = "64"
#: Models swapped for a smaller one with the same module names (layer3, layer4, fc), so that
#: the examples stay quick: resnet50 takes 2.5 times resnet18's time to build and run.
SWAP = {"resnet50": "resnet18"}


@dataclass
class Block:
    page: Path
    line: int
    lang: str
    text: str
    marker: str | None


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a page, each with the HTML comment right above it, if any."""
    found, marker, lang, start, body = [], None, None, 0, []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if lang is None:
            if line.startswith("```"):
                lang, start, body = line[3:].strip() or "text", number, []
            elif line.startswith("<!--"):
                marker = line
            elif line.strip():
                marker = None
        elif line.startswith("```"):
            found.append(Block(page, start, lang, "\n".join(body), marker))
            lang, marker = None, None
        else:
            body.append(line)
    return found


def commands(text: str) -> list[str]:
    """The ``$ `` lines of a console block, continuation lines joined."""
    out: list[str] = []
    joining = False
    for line in text.splitlines():
        if joining:
            out[-1] += " " + line.strip()
        elif line.startswith("$ "):
            out.append(line[2:])
        else:
            continue
        joining = out[-1].endswith("\\")
        if joining:
            out[-1] = out[-1][:-1].rstrip()
    return out


def split_pipe(command: str) -> tuple[str, str | None]:
    """The command before the first unquoted ``|``, and the rest of the pipeline."""
    quote = None
    for i, ch in enumerate(command):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "|":
            return command[:i], command[i + 1:]
    return command, None


def skip_reason(block: Block) -> str | None:
    if not block.marker or "example: skip" not in block.marker:
        return None
    reason = re.search(r"skip \((.*)\)", block.marker)
    assert reason and reason.group(1) in SKIP_REASONS, \
        f"{block.page.name}:{block.line}: a skip marker names one of {SKIP_REASONS}"
    return reason.group(1)


def file_name(block: Block) -> str | None:
    named = re.search(r"<!-- file: (\S+) -->", block.marker or "")
    return named.group(1) if named else None


def ci_jobs() -> list[str]:
    return [b.text for p in PAGES for b in blocks(p) if b.marker == "<!-- ci-job -->"]


# --- the files the examples name ----------------------------------------------------------

#: The model code the examples name (path/to/net.py, mypackage/models.py, mynet.py).
NET_PY = '''from torch import nn


class Net(nn.Module):
    def __init__(self, width=16, classes=10):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, width, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                  nn.Flatten())
        self.fc = nn.Linear(width, classes)

    def forward(self, x):
        return self.fc(self.body(x))


class NetV2(Net):
    pass


def build_model(depth=18):
    return Net(width=depth)
'''


def _images(folder: Path, names: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy(ROOT / "sample_images" / name, folder / name)


def make_sandbox(root: Path) -> None:
    """Every file and folder the examples name, small."""
    from PIL import Image
    from torchvision.models import resnet18

    jpgs = sorted(p.name for p in (ROOT / "sample_images").glob("*.jpg"))
    shutil.copytree(ROOT / "sample_images", root / "sample_images")
    for folder in ("photos", "imgs", "images"):
        _images(root / folder, jpgs[:2])
    shutil.copy(ROOT / "sample_images" / "cat.jpg", root / "cat.jpg")
    shutil.copy(ROOT / "sample_images" / "astronaut.jpg", root / "street.jpg")
    Image.open(root / "cat.jpg").convert("RGB").resize((96, 96)).save(root / "img.png")
    _images(root / "val" / "tabby", ["cat.jpg"])
    _images(root / "val" / "goldfish", ["coffee.jpg"])
    torch.manual_seed(0)
    torch.save(torch.randn(4, 3, 64, 64), root / "batch.pt")
    torch.save(torch.rand(1, 1, 64, 64), root / "gray.pt")       # one channel: conv1 raises
    for name, seed in (("ckpt.pt", 1), ("a.pt", 1), ("b.pt", 2)):
        torch.manual_seed(seed)
        torch.save(resnet18().state_dict(), root / name)
    torch.save(resnet18(num_classes=10).state_dict(), root / "ft10.pt")
    (root / "classes.txt").write_text("\n".join(
        ["cat", "dog", "bird", "fish", "horse", "deer", "frog", "ship", "truck", "car"]) + "\n")
    (root / "path" / "to").mkdir(parents=True)
    (root / "path" / "to" / "net.py").write_text(NET_PY)
    (root / "mypackage").mkdir()
    (root / "mypackage" / "__init__.py").write_text("")
    (root / "mypackage" / "models.py").write_text(NET_PY)
    (root / "mynet.py").write_text(NET_PY)
    namespace: dict = {}
    exec(compile(NET_PY, "net.py", "exec"), namespace)
    torch.save(namespace["build_model"](18).state_dict(), root / "best.pt")
    torch.save(namespace["Net"]().state_dict(), root / "v1.pt")
    torch.save(namespace["NetV2"]().state_dict(), root / "v2.pt")
    torch.save(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()), root / "model.pt")
    (root / "hookscope.toml").write_text('nonfinite = 0\nmax_zero_fraction = 0.99\n'
                                         'ignore = ["fc"]\n')


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("docs-base")
    make_sandbox(root)
    for name in ("before.json", "after.json"):
        result = run_hookscope(f"hookscope stats resnet18 cat.jpg -f json -o {name}", root)
        assert result[0] == 0, result
    return root


# --- running -------------------------------------------------------------------------------

def _params() -> dict[str, set[str]]:
    import typer.main

    from hookscope.cli import app

    group = typer.main.get_command(app)
    return {name: {opt for p in cmd.params for opt in getattr(p, "opts", [])}
            for name, cmd in group.commands.items()}  # type: ignore[attr-defined]


def rewrite(argv: list[str], params: dict[str, set[str]], cwd: Path) -> list[str]:
    """Offline and small: --weights none, --size, --force; globs expanded as a shell would."""
    name = argv[1]
    accepts = params[name]
    args: list[str] = []
    for token in argv[1:]:
        matches = sorted(glob.glob(token, root_dir=cwd)) if any(c in token for c in "*?[") else []
        args += matches or [token]
    args = [SWAP.get(a, a) for a in args]
    positional = [a for a in args[1:] if not a.startswith("-")]
    model = positional[0] if positional else ""
    if "--weights" in accepts and not {"--weights", "-w"} & set(args) \
            and not model.endswith(".json"):
        args += ["--weights", "none"]
    if "--size" in accepts and "--size" not in args and SMALL.get(model, SIZE) \
            and not model.endswith(".json"):
        args += ["--size", SMALL.get(model, SIZE) or SIZE]
    if "--force" in accepts and "--force" not in args:
        args.append("--force")
    return args


def run_hookscope(command: str, cwd: Path, params: dict | None = None) -> tuple[int, str, str]:
    """Run one example line in-process in ``cwd``: its exit code, stdout and stderr."""
    from typer.testing import CliRunner

    from hookscope.cli import app

    first, rest = split_pipe(command)
    argv = shlex.split(first, comments=True)
    assert argv[0] == "hookscope", f"not a hookscope command: {command}"
    args = rewrite(argv, params or _params(), cwd)
    before = Path.cwd()
    os.chdir(cwd)
    try:
        result = CliRunner().invoke(app, args)
    finally:
        os.chdir(before)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    code, out, err = result.exit_code, result.stdout, result.stderr
    if rest is not None and code == 0:
        piped = subprocess.run(["bash", "-c", f"set -o pipefail; {rest}"], input=out, cwd=cwd,
                               capture_output=True, text=True, timeout=120)
        code, out, err = piped.returncode, piped.stdout, err + piped.stderr
    return code, out, err


def expected_exit(command: str) -> int:
    return next((code for key, code in EXPECTED_EXIT.items() if key in command), 0)


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_the_examples_run(page: Path, base: Path, tmp_path: Path) -> None:
    here = tmp_path / "examples"
    shutil.copytree(base, here, copy_function=os.link)  # outputs are replaced, never written into
    params = _params()
    ran = 0
    for block in blocks(page):
        where = f"{page.name}:{block.line}"
        if skip_reason(block):
            continue
        if (name := file_name(block)) is not None:
            (here / name).unlink(missing_ok=True)  # a hard link to the shared base
            (here / name).write_text(block.text + "\n")
        elif block.lang == "console":
            for command in commands(block.text):
                code, out, err = run_hookscope(command, here, params)
                assert code == expected_exit(command), f"{where}: {command}\n{out[-2000:]}\n{err}"
                ran += 1
        elif block.lang == "python":
            run = subprocess.run([sys.executable, "-c", block.text],
                                 cwd=here, capture_output=True, text=True, timeout=300,
                                 env=os.environ | {"PYTHONPATH": str(ROOT)})
            assert run.returncode == 0, f"{where}\n{run.stderr[-3000:]}"
            ran += 1
    assert ran or page.name != "README.md", "the README ran no example"


def test_the_readme_is_short_and_every_page_is_indexed() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 350
    index = (ROOT / "docs" / "index.md").read_text()
    for page in PAGES[1:]:
        assert page.name == "index.md" or f"]({page.name})" in index, page.name


def test_the_ci_job_is_the_same_in_the_readme_and_in_docs() -> None:
    jobs = ci_jobs()
    assert len(jobs) == 2 and jobs[0] == jobs[1]


def test_a_skipped_block_says_why_and_other_commands_are_skipped() -> None:
    for page in PAGES:
        for block in blocks(page):
            if block.lang == "console" and not skip_reason(block):
                for command in commands(block.text):
                    assert command.startswith("hookscope "), f"{page.name}:{block.line}"
