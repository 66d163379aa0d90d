"""Make the folder the docs' examples run in: ``python docs/sandbox.py [FOLDER]`` (``make docs-sandbox``).

The README's and docs/' examples name small files (``cat.jpg``, ``val/``, ``ckpt.pt``,
``batch.pt``, ``before.json``, ...). This script makes exactly those, in FOLDER (default
``hookscope-docs``), from the repository's ``sample_images/`` and small seeded models: nothing
is downloaded. ``cd FOLDER`` and run the examples as written. ``tests/test_docs.py`` builds its
scratch folder with this same script, so the examples are tested on these files.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_FOLDER = "hookscope-docs"

#: The README's ``mynet.py`` (tests/test_docs.py checks that the README shows this text).
MYNET_PY = '''from torch import nn

class Net(nn.Module):
    def __init__(self, width=8, classes=10):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, width, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                  nn.Flatten())
        self.fc = nn.Linear(width, classes)

    def forward(self, x):
        return self.fc(self.body(x))
'''

#: The model code of docs/own-model.md and docs/diff.md (path/to/net.py, mypackage/models.py).
NET_PY = MYNET_PY.replace("width=8", "width=16") + '''

class NetV2(Net):
    pass


def build_model(depth=18):
    return Net(width=depth)
'''

#: What the sandbox holds (a trailing ``/``: a folder of images), each named by an example.
FILES = (
    "sample_images/", "photos/", "imgs/", "images/", "val/tabby/", "val/goldfish/",
    "cat.jpg", "street.jpg", "img.png", "batch.pt", "gray.pt",
    "ckpt.pt", "a.pt", "b.pt", "ft10.pt", "classes.txt",
    "mynet.py", "path/to/net.py", "mypackage/__init__.py", "mypackage/models.py",
    "best.pt", "v1.pt", "v2.pt", "model.pt", "before.json", "after.json",
)


def _images(folder: Path, names: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy(ROOT / "sample_images" / name, folder / name)


def _code(root: Path) -> dict:
    (root / "path" / "to").mkdir(parents=True)
    (root / "path" / "to" / "net.py").write_text(NET_PY)
    (root / "mypackage").mkdir()
    (root / "mypackage" / "__init__.py").write_text("")
    (root / "mypackage" / "models.py").write_text(NET_PY)
    (root / "mynet.py").write_text(MYNET_PY)
    namespace: dict = {}
    exec(compile(NET_PY, "net.py", "exec"), namespace)
    return namespace


def _stats_documents(root: Path) -> None:
    """``before.json`` and ``after.json``: ``hookscope stats`` of two checkpoints, as diff.md compares."""
    from hookscope.cli import app

    before = Path.cwd()
    os.chdir(root)
    try:
        for name, weights in (("before.json", "a.pt"), ("after.json", "b.pt")):
            try:
                app(["stats", "resnet18", "cat.jpg", "--weights", weights, "--size", "64", "-q",
                     "-f", "json", "-o", name], prog_name="hookscope", standalone_mode=False)
            except SystemExit as stop:  # hookscope exits 0 on success
                if stop.code:
                    raise
    finally:
        os.chdir(before)


def build(root: Path) -> None:
    """Make every file of FILES in ``root`` (an empty or new folder)."""
    import torch
    from PIL import Image
    from torch import nn
    from torchvision.models import resnet18

    root.mkdir(parents=True, exist_ok=True)
    jpgs = sorted(p.name for p in (ROOT / "sample_images").glob("*.jpg"))
    shutil.copytree(ROOT / "sample_images", root / "sample_images")
    for folder in ("photos", "imgs", "images"):
        _images(root / folder, jpgs[:2])
    shutil.copy(ROOT / "sample_images" / "cat.jpg", root / "cat.jpg")
    shutil.copy(ROOT / "sample_images" / "astronaut.jpg", root / "street.jpg")
    Image.open(root / "cat.jpg").convert("RGB").resize((96, 96)).save(root / "img.png")
    _images(root / "val" / "tabby", ["cat.jpg"])          # an ImageFolder: class folders
    _images(root / "val" / "goldfish", ["coffee.jpg"])
    torch.manual_seed(0)
    torch.save(torch.randn(4, 3, 64, 64), root / "batch.pt")
    torch.save(torch.rand(1, 1, 224, 224), root / "gray.pt")     # one channel: conv1 raises
    for name, seed in (("ckpt.pt", 1), ("a.pt", 1), ("b.pt", 2)):
        torch.manual_seed(seed)
        torch.save(resnet18().state_dict(), root / name)
    torch.manual_seed(3)
    torch.save(resnet18(num_classes=10).state_dict(), root / "ft10.pt")
    (root / "classes.txt").write_text("\n".join(
        ["cat", "dog", "bird", "fish", "horse", "deer", "frog", "ship", "truck", "car"]) + "\n")
    namespace = _code(root)
    torch.manual_seed(4)
    torch.save(namespace["build_model"](18).state_dict(), root / "best.pt")
    torch.save(namespace["Net"]().state_dict(), root / "v1.pt")
    torch.save(namespace["NetV2"]().state_dict(), root / "v2.pt")
    torch.save(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()), root / "model.pt")
    _stats_documents(root)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="docs/sandbox.py", description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", default=DEFAULT_FOLDER,
                        help=f"where to make the files (default: {DEFAULT_FOLDER}); new or empty")
    folder = Path(parser.parse_args(argv).folder)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        print(f"docs/sandbox.py: {folder} exists and is not an empty folder; name another one "
              f"or remove it", file=sys.stderr)
        return 2
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        staging.chmod(0o755)
        build(staging)
        if folder.exists():
            folder.rmdir()
        staging.rename(folder)                  # all or nothing: no half-made sandbox
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"made the docs' example files in {folder}/: cd {folder} and run the examples there",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
