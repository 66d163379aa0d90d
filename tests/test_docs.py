"""The examples of the README and of docs/*.md run, in one process, in the docs sandbox.

The sandbox is the folder ``docs/sandbox.py`` makes (``make docs-sandbox`` for a reader): the
files the examples read, and no other (checked below, from the examples' arguments).

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
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

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
    "--rules hookscope.toml --junit": 1,   # nor a tabby in sample_images/, nor prob 0.5
    "--expect 'batch.pt[3]=281'": 1,       # nor class 281 in noise
    "check resnet50 val/ --min-prob 0.2": 1,  # nor reach 0.2 on the folders' classes
    "--against-dtype bfloat16 --fail": 1,  # bfloat16 parts by more than the default 0.001
    "--lr 1e30": 1,                        # the absurd learning rate watch names
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


# --- the files the examples name: docs/sandbox.py, which a reader runs too -----------------

def _sandbox():
    spec = importlib.util.spec_from_file_location("docs_sandbox", ROOT / "docs" / "sandbox.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sandbox = _sandbox()


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("docs-base")
    sandbox.build(root)
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


# --- the sandbox holds what the examples name ----------------------------------------------

#: Options whose value is a file the example reads (other options' values are not inputs).
INPUT_OPTIONS = {"--weights", "-w", "--against-weights", "--against-model", "--labels", "--rules",
                 "--reference", "--baseline"}
#: Options whose value the example writes.
OUTPUT_OPTIONS = {"-o", "--output", "--out", "--junit", "--plot", "--log-dir", "--tensorboard"}
FILE_LIKE = re.compile(r"/|\.(jpg|jpeg|png|pt|pth|json|jsonl|toml|txt|py|csv|html|xml|svg)$")


def _takes_value() -> dict[str, dict[str, bool]]:
    import typer.main

    from hookscope.cli import app

    group = typer.main.get_command(app)
    return {name: {opt: not (p.is_flag or p.count) for p in cmd.params
                   if p.param_type_name == "option" for opt in p.opts + p.secondary_opts}
            for name, cmd in group.commands.items()}  # type: ignore[attr-defined]


def _path_of(spec: str) -> str | None:
    """The file or folder a model or input argument names, or None (a registry name)."""
    if spec.startswith("timm:") or spec == ".":
        return None
    if spec.startswith("hf:"):
        return spec[3:].removeprefix("./")
    if ":" in spec:                                   # file.py:Name or package.module:name
        where = spec.split(":")[0]
        return where if where.endswith(".py") else where.replace(".", "/") + ".py"
    return spec if FILE_LIKE.search(spec) else None


def files_named(argv: list[str], takes: dict[str, bool]) -> tuple[list[str], list[str]]:
    """The paths an example line reads and those it writes."""
    reads, writes, i = [], [], 2
    while i < len(argv):
        token, value = argv[i], None
        if token.startswith("-"):
            option = token.split("=")[0]
            if takes.get(option):
                value = token.split("=", 1)[1] if "=" in token else argv[i + 1]
                i += 0 if "=" in token else 1
                if option in INPUT_OPTIONS:
                    reads.append(value)
                elif option in OUTPUT_OPTIONS:
                    writes.append(value)
        else:
            reads.append(token)
        i += 1
    return [p for p in map(_path_of, reads) if p], writes


def sandbox_files_the_docs_read() -> dict[str, str]:
    """The top-level names of the files the examples read that no earlier block of their page
    made (a file block, a python block that names it, a command that wrote it), each with the
    first example that reads it."""
    takes = _takes_value()
    needed: dict[str, str] = {}
    for page in PAGES:
        made = ""                                    # what the page's earlier blocks make
        for block in blocks(page):
            if skip_reason(block):
                continue
            if block.lang != "console":
                made += f"\n{file_name(block) or ''}\n{block.text}"
                continue
            for command in commands(block.text):
                argv = shlex.split(split_pipe(command)[0], comments=True)
                reads, writes = files_named(argv, takes[argv[1]])
                for path in reads:
                    top = path.removeprefix("./").strip("/").split("/")[0]
                    if top not in made:
                        needed.setdefault(top, f"{page.name}:{block.line}: {command}")
                made += "\n" + "\n".join(writes)
    return needed


def test_the_sandbox_holds_exactly_the_files_the_examples_read(base: Path) -> None:
    needed = sandbox_files_the_docs_read()
    for entry in sandbox.FILES:
        path = base / entry
        assert path.is_dir() if entry.endswith("/") else path.is_file(), entry
        if entry.endswith("/"):
            assert any(path.iterdir()), entry
    tops = {entry.split("/")[0] for entry in sandbox.FILES}
    assert {p.name for p in base.iterdir()} == tops
    assert tops == set(needed), (f"made but read by no example: {sorted(tops - set(needed))}; "
                                 f"read but not made: {[needed[n] for n in needed if n not in tops]}")


def test_the_readme_shows_the_sandbox_s_mynet_py() -> None:
    shown = [b.text + "\n" for b in blocks(PAGES[0]) if file_name(b) == "mynet.py"]
    assert shown == [sandbox.MYNET_PY]


def test_no_page_writes_one_output_file_twice() -> None:
    """A reader runs a page top to bottom without --force: no output file may be written twice."""
    takes = _takes_value()
    for page in PAGES:
        written: dict[str, int] = {}
        for block in blocks(page):
            if block.lang != "console" or skip_reason(block):
                continue
            for command in commands(block.text):
                argv = shlex.split(split_pipe(command)[0], comments=True)
                for path in files_named(argv, takes[argv[1]])[1]:
                    if not path.endswith("/") and "--force" not in argv:
                        assert path not in written, \
                            f"{page.name}:{block.line} writes {path}, as line {written[path]} did"
                        written[path] = block.line


def test_the_sandbox_script_refuses_a_folder_that_holds_files(tmp_path: Path, capsys) -> None:
    (tmp_path / "mine.txt").write_text("keep")
    assert sandbox.main([str(tmp_path)]) == 2
    assert "not an empty folder" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]
