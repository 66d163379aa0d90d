"""Input discovery, decoding (modes, EXIF), tensors, streaming batches, and every bad input."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from hookscope.core.errors import HookscopeError
from hookscope.inputs.decode import load_image
from hookscope.inputs.resolve import iter_batches, resolve_inputs


def identity(img: Image.Image) -> torch.Tensor:
    arr = np.asarray(img, dtype=np.float32) / 255.0
    return torch.from_numpy(arr).permute(2, 0, 1).contiguous()


def save(img: Image.Image, path: Path, **kw) -> Path:
    img.save(path, **kw)
    return path


@pytest.mark.parametrize(
    "mode,value,expected",
    [
        ("L", 128, (128, 128, 128)),
        ("RGBA", (10, 20, 30, 0), (255, 255, 255)),  # fully transparent: white background
        ("RGBA", (10, 20, 30, 255), (10, 20, 30)),
        ("LA", (40, 255), (40, 40, 40)),
        ("CMYK", (0, 0, 0, 0), (255, 255, 255)),
        ("I;16", 65535, (255, 255, 255)),
        ("I;16", 257 * 100, (100, 100, 100)),
        ("1", 1, (255, 255, 255)),
    ],
)
def test_modes_become_rgb(tmp_path, mode, value, expected) -> None:
    suffix = ".tif" if mode in ("CMYK",) else ".png"
    path = save(Image.new(mode, (6, 4), value), tmp_path / f"x{suffix}")
    img = load_image(path, str(path))
    assert img.mode == "RGB" and img.size == (6, 4)
    assert img.getpixel((2, 2)) == expected


def test_palette_with_transparency(tmp_path) -> None:
    img = Image.new("P", (4, 4), 0)
    img.putpalette([255, 0, 0] + [0, 255, 0] * 255)
    img.info["transparency"] = 0
    path = save(img, tmp_path / "p.png", transparency=0)
    assert load_image(path, "p.png").getpixel((0, 0)) == (255, 255, 255)


def test_exif_orientation_applied(tmp_path) -> None:
    img = Image.new("RGB", (30, 10), (200, 0, 0))
    exif = img.getexif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise on display
    path = save(img, tmp_path / "rot.jpg", exif=exif)
    assert load_image(path, "rot.jpg").size == (10, 30)


def test_directory_sorted_skipping_other_files(tmp_path, caplog) -> None:
    for name in ["b.png", "a.jpg", "c.webp"]:
        save(Image.new("RGB", (8, 8)), tmp_path / name)
    (tmp_path / "notes.txt").write_text("hi")
    (tmp_path / "sub").mkdir()
    with caplog.at_level("INFO", logger="hookscope"):
        inputs = resolve_inputs([str(tmp_path)])
    assert [Path(i.name).name for i in inputs.items] == ["a.jpg", "b.png", "c.webp"]
    assert "skipped 1 file that is not an image: notes.txt" in caplog.text
    assert "1 subdirectory not walked (sub); --recursive includes it" in caplog.text


def test_stdin_image(cat_jpg) -> None:
    inputs = resolve_inputs(["-"], stdin=io.BytesIO(cat_jpg.read_bytes()))
    (batch,) = list(iter_batches(inputs, identity, keep_images=True))
    assert batch.items[0].name == "-" and batch.items[0].stem == "stdin"
    assert batch.images[0].size == Image.open(cat_jpg).size


def test_tensor_files_used_as_is(tmp_path) -> None:
    one = torch.randn(3, 8, 8)
    many = torch.randn(5, 3, 8, 8)
    torch.save(one, tmp_path / "one.pt")
    np.save(tmp_path / "many.npy", many.numpy())
    inputs = resolve_inputs([str(tmp_path / "one.pt"), str(tmp_path / "many.npy")])
    assert len(inputs) == 6
    names = [i.name for i in inputs.items]
    assert names[0].endswith("one.pt") and names[-1].endswith("many.npy[4]")
    batches = list(iter_batches(inputs, identity, batch_size=4))
    assert [len(b) for b in batches] == [4, 2]
    assert torch.equal(batches[0].tensor[0], one)
    assert torch.equal(torch.cat([b.tensor for b in batches])[1:], many)


def test_batches_stream_and_split_on_shape_change(tmp_path) -> None:
    for i in range(5):
        save(Image.new("RGB", (8 + 4 * (i == 2), 8), (i, i, i)), tmp_path / f"{i}.png")
    batches = iter_batches(resolve_inputs([str(tmp_path)]), identity, batch_size=2)
    sizes = [(len(b), b.start) for b in batches]
    assert sizes == [(2, 0), (1, 2), (2, 3)]


def _bad(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("just text")
    good = Image.new("RGB", (64, 64), (1, 2, 3))
    buf = io.BytesIO()
    good.save(buf, format="JPEG")
    (tmp_path / "trunc.jpg").write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    (tmp_path / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 40)
    torch.save(torch.randn(0, 2), tmp_path / "flat.pt")
    torch.save((torch.zeros(3, 4), torch.zeros(2, 4)), tmp_path / "ints.pt")
    torch.save({"x": "one", "y": torch.zeros(2)}, tmp_path / "dict.pt")
    torch.save({"x": 1}, tmp_path / "number.pt")  # a constant is given to every batch: no tensor
    np.save(tmp_path / "u8.npy", np.array(["a", "b"]))
    return {
        "missing": ([str(tmp_path / "nope.jpg")], "no such file"),
        "empty dir": ([str(tmp_path / "empty")], "holds no images"),
        "not an image": ([str(tmp_path / "notes.txt")], "not an image"),
        "truncated": ([str(tmp_path / "trunc.jpg")], "truncated"),
        "corrupt": ([str(tmp_path / "corrupt.png")], "corrupt|not an image"),
        "tensor shape": ([str(tmp_path / "flat.pt")], r"shape is \[0, 2\]; it holds no values"),
        "tensor dtype": ([str(tmp_path / "ints.pt")], "disagree on the number of samples"),
        "not a tensor": ([str(tmp_path / "dict.pt")], r"\['x'\]: is a string"),
        "no tensor": ([str(tmp_path / "number.pt")], r"holds no tensor \(\{x: int\}\)"),
        "npy dtype": ([str(tmp_path / "u8.npy")], "<U1 array"),
        "nothing": ([], "No inputs"),
    }


@pytest.mark.parametrize("case", ["missing", "empty dir", "not an image", "truncated", "corrupt",
                                  "tensor shape", "tensor dtype", "not a tensor", "no tensor",
                                  "npy dtype", "nothing"])
def test_bad_inputs(tmp_path, case) -> None:
    specs, message = _bad(tmp_path)[case]
    with pytest.raises(HookscopeError, match=message):
        list(iter_batches(resolve_inputs(specs), identity))


def test_decompression_bomb_refused(tmp_path, monkeypatch) -> None:
    path = save(Image.new("RGB", (100, 100)), tmp_path / "big.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    with pytest.raises(HookscopeError, match="decompression-bomb"):
        resolve_inputs([str(path)])
