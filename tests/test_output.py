"""hookscope.core.files: where output goes (files, links, devices, FIFOs, stdout), atomic
replacement, one-line errors, staged folders, CSV cells.

Device tests never pass ``force``: were the code to rename over ``/dev/null``, it fails on
"already exists" instead of replacing the machine's device.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from hookscope.core import files as output
from hookscope.core.errors import HookscopeError
from hookscope.core.files import OutputKind, Staging, atomic_path, check_folder, resolve_output


def one_line(exc: pytest.ExceptionInfo[HookscopeError]) -> str:
    message = str(exc.value)
    assert message and "\n" not in message
    return message


def listing(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# ----------------------------------------------------------------- symlinks


def test_symlink_is_written_through_and_stays_a_link(tmp_path: Path) -> None:
    real, links = tmp_path / "real", tmp_path / "links"
    real.mkdir()
    links.mkdir()
    target = real / "target.json"
    target.write_text("old")
    link = links / "link.json"
    link.symlink_to(target)
    with pytest.raises(HookscopeError, match="already exists"):
        resolve_output(link, force=False)
    out = resolve_output(link, force=True)
    with atomic_path(out) as tmp:
        assert tmp.parent == real  # beside the target, so the rename stays on its file system
        tmp.write_text("new")
    assert target.read_text() == "new"
    assert link.is_symlink() and os.readlink(link) == str(target)
    output.write(out, "newer")
    assert target.read_text() == "newer" and link.is_symlink()
    assert listing(real) == {"target.json"} and listing(links) == {"link.json"}


def test_dangling_symlink_creates_its_target(tmp_path: Path) -> None:
    link = tmp_path / "link.json"
    link.symlink_to("made.json")  # relative: resolved from the link's folder
    output.emit("{}\n", link)  # nothing exists yet, so no force is needed
    assert (tmp_path / "made.json").read_text() == "{}\n"
    assert link.is_symlink() and listing(tmp_path) == {"link.json", "made.json"}


# ----------------------------------------------------------------- devices, FIFOs, sockets, stdout


def test_dev_null_is_written_in_place(tmp_path: Path) -> None:
    before = os.stat("/dev/null")
    out = resolve_output("/dev/null", force=False)
    assert out.kind is OutputKind.DEVICE
    output.write(out, "discarded\n")
    with atomic_path("/dev/null") as tmp:
        tmp.write_bytes(b"\x89PNG")
    after = os.lstat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev


def test_fifo_is_written_in_place(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    out = resolve_output(fifo, force=False)  # no force needed: nothing is replaced
    output.write(out, "through the pipe\n")
    reader.join(timeout=10)
    assert got == [b"through the pipe\n"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and listing(tmp_path) == {"pipe"}


def test_symlink_to_a_fifo_is_written_in_place(tmp_path: Path) -> None:
    fifo, link = tmp_path / "pipe", tmp_path / "link"
    os.mkfifo(fifo)
    link.symlink_to(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    output.emit("via link\n", link)
    reader.join(timeout=10)
    assert got == [b"via link\n"] and link.is_symlink()


def test_unix_socket_is_connected_to(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    got: list[bytes] = []

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            got.append(b"".join(iter(lambda: conn.recv(4096), b"")))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        output.write(resolve_output(path, force=False), "over a socket\n")
        thread.join(timeout=10)
    finally:
        server.close()
    assert got == [b"over a socket\n"]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_dev_full_gives_one_line_naming_enospc() -> None:
    out = resolve_output("/dev/full", force=False)
    with pytest.raises(HookscopeError) as exc:
        output.write(out, "x" * 10000)
    message = one_line(exc)
    assert "/dev/full" in message and os.strerror(errno.ENOSPC) in message
    assert stat.S_ISCHR(os.lstat("/dev/full").st_mode)


@pytest.mark.parametrize("where", [None, "-"])
def test_dash_and_none_go_to_stdout(where: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    out = resolve_output(where, force=False)
    assert out.is_stdout
    output.emit("to stdout\n", out)
    assert capsys.readouterr().out == "to stdout\n"


@pytest.mark.skipif(not os.path.islink("/dev/stdout"), reason="/dev/stdout is not a link")
def test_dev_stdout_is_the_stream_even_when_it_is_a_file(capfd: pytest.CaptureFixture[str]) -> None:
    # Under capfd, fd 1 is a regular temporary file: a rename would replace it (and, as
    # root, --force used to replace the /dev/stdout link itself).
    out = resolve_output("/dev/stdout", force=False)
    assert out.kind is OutputKind.STDOUT
    output.write(out, "hello\n")
    assert capfd.readouterr().out == "hello\n"
    assert os.path.islink("/dev/stdout")


# ----------------------------------------------------------------- checks before any work


def test_parent_that_is_a_file_fails_early(tmp_path: Path) -> None:
    (tmp_path / "cat.jpg").write_bytes(b"jpeg")
    for path in (tmp_path / "cat.jpg" / "x.json", tmp_path / "cat.jpg" / "sub" / "x.json"):
        with pytest.raises(HookscopeError) as exc:
            resolve_output(path, force=True)
        assert "cat.jpg is not a directory" in one_line(exc)


def test_missing_parent_and_directory_fail_early(tmp_path: Path) -> None:
    with pytest.raises(HookscopeError, match="does not exist"):
        resolve_output(tmp_path / "nope" / "x.json", force=False)
    with pytest.raises(HookscopeError, match="is a directory"):
        resolve_output(tmp_path, force=True)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="no /proc")
def test_unwritable_parent_fails_in_resolve_output() -> None:
    with pytest.raises(HookscopeError) as exc:  # os.access says yes to root; the probe does not
        resolve_output("/proc/x.json", force=False)
    assert "/proc" in one_line(exc)
    assert not os.path.exists("/proc/x.json")


def test_existing_file_needs_force_and_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "out.json"
    path.write_text("old")
    with pytest.raises(HookscopeError) as exc:
        resolve_output(path, force=False)
    assert "--force" in one_line(exc)
    output.emit("new\n", path, force=True)
    assert path.read_text() == "new\n" and listing(tmp_path) == {"out.json"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask()  # not mkstemp's 0600


def test_failed_write_leaves_no_part_file(tmp_path: Path) -> None:
    path = tmp_path / "out.json"
    out = resolve_output(path, force=True)
    path.mkdir()  # the name turns into a folder while the model runs: the rename fails
    with pytest.raises(HookscopeError) as exc:
        output.write(out, "data")
    assert str(path) in one_line(exc)
    assert listing(tmp_path) == {"out.json"} and path.is_dir()


def test_interrupted_write_leaves_the_old_file_and_no_part(tmp_path: Path) -> None:
    path = tmp_path / "out.png"
    path.write_bytes(b"old")
    with pytest.raises(KeyboardInterrupt), atomic_path(path, force=True) as tmp:
        tmp.write_bytes(b"half")
        raise KeyboardInterrupt
    assert path.read_bytes() == b"old" and listing(tmp_path) == {"out.png"}


def test_file_appearing_meanwhile_is_not_clobbered(tmp_path: Path) -> None:
    path = tmp_path / "out.json"
    out = resolve_output(path, force=False)
    path.write_text("someone else's")
    with pytest.raises(HookscopeError, match="already exists"):
        output.write(out, "ours")
    assert path.read_text() == "someone else's" and listing(tmp_path) == {"out.json"}


# ----------------------------------------------------------------- folders and staging


def test_check_folder(tmp_path: Path) -> None:
    (tmp_path / "cat.jpg").write_bytes(b"jpeg")
    with pytest.raises(HookscopeError) as exc:
        check_folder(tmp_path / "cat.jpg" / "sub", planned=[], force=True)
    assert "cat.jpg is not a directory" in one_line(exc)
    taken = tmp_path / "a.png"
    taken.write_bytes(b"png")
    with pytest.raises(HookscopeError, match="--force"):
        check_folder(tmp_path, planned=[taken, tmp_path / "b.png"], force=False)
    check_folder(tmp_path, planned=[taken], force=True)
    check_folder(tmp_path / "new" / "deeper", planned=[tmp_path / "new" / "deeper" / "a.png"],
                 force=False)
    assert listing(tmp_path) == {"cat.jpg", "a.png"}  # the probe left nothing


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="no /proc")
def test_check_folder_probes_writability() -> None:
    with pytest.raises(HookscopeError, match="/proc"):
        check_folder("/proc/maps-out", planned=[], force=False)


@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit, ValueError])
def test_staging_abort_leaves_nothing(tmp_path: Path, stop: type[BaseException]) -> None:
    folder = tmp_path / "a" / "b"
    with pytest.raises(stop), Staging(folder, force=False) as staging:
        staging.save_npy(np.zeros(3), folder / "one.npy")
        staging.submit(staging.save_png, Image.new("RGB", (4, 3)), folder / "two.png")
        staging.wait()
        assert len(list(folder.iterdir())) == 2  # staged under hidden names
        raise stop
    assert listing(tmp_path) == set()  # the folders it created are gone too


def test_staging_commit_places_every_file(tmp_path: Path) -> None:
    folder = tmp_path / "maps"
    with Staging(folder) as staging:
        staging.submit(staging.save_png, Image.new("RGB", (4, 3)), folder / "pil.png")
        staging.save_png(torch.rand(3, 5, 7), folder / "grid.png")
        staging.save_npy(np.ones((2, 2)), folder / "raw.npy")
        assert not (folder / "grid.png").exists()  # nothing visible before the commit
    assert listing(folder) == {"pil.png", "grid.png", "raw.npy"}
    assert Image.open(folder / "grid.png").size == (7, 5)
    assert Image.open(folder / "pil.png").size == (4, 3)
    assert stat.S_IMODE((folder / "raw.npy").stat().st_mode) == 0o666 & ~umask()


def test_staging_commit_refuses_a_file_that_appeared(tmp_path: Path) -> None:
    with pytest.raises(HookscopeError, match="already exists"), Staging(tmp_path) as staging:
        staging.save_npy(np.zeros(3), tmp_path / "a.npy")
        staging.save_npy(np.zeros(3), tmp_path / "b.npy")
        (tmp_path / "b.npy").write_text("theirs")
    assert listing(tmp_path) == {"b.npy"} and (tmp_path / "b.npy").read_text() == "theirs"


def test_staging_folder_error_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "cat.jpg").write_bytes(b"jpeg")
    with pytest.raises(HookscopeError) as exc, Staging(tmp_path / "cat.jpg" / "sub"):
        pass
    assert "cat.jpg" in one_line(exc)


# ----------------------------------------------------------------- CSV cells


def test_csv_booleans_use_json_spelling() -> None:
    rows = [{"a": True, "b": False, "c": None, "d": np.bool_(True), "e": np.float64(0.5),
             "f": [True, False]}]
    text = output.dumps_csv(rows, ["a", "b", "c", "d", "e", "f"])
    assert text.splitlines() == ["a,b,c,d,e,f", 'true,false,,true,0.5,"[true,false]"']
