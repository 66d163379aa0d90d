"""hookscope.probes.features and `hookscope features`: grid geometry, per-tile normalisation,
channel order, PNG sizes, TensorBoard events read back, and bad input."""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch
from PIL import Image
from torch import nn

from hookscope.core.errors import HookscopeError
from hookscope.core.hooks import hook_count
from hookscope.core.run import drive
from hookscope.inputs.resolve import Batch, InputItem
from hookscope.probes.features import FeaturesProbe, feature_grids, feature_sites, make_tiles

ARGS = ("--weights", "none", "--size", "64")


def grid_side(tiles: int, tile: int, pad: int = 2) -> tuple[int, int]:
    """make_grid's layout: ceil(sqrt(k)) tiles per row, 2 px padding around every tile."""
    per_row = math.ceil(math.sqrt(tiles))
    rows = math.ceil(tiles / per_row)
    return per_row * (tile + pad) + pad, rows * (tile + pad) + pad


def batch_of(x: torch.Tensor, stem: str = "img") -> Batch:
    items = [InputItem(f"{stem}{i}", "tensor") for i in range(x.shape[0])]
    return Batch(items=items, tensor=x, images=[None] * x.shape[0], start=0)


def test_each_tile_normalised_on_its_own():
    torch.manual_seed(0)
    fmap = torch.randn(5, 6, 7) * torch.tensor([1.0, 10.0, 100.0, 0.01, 3.0]).view(5, 1, 1)
    grid, channels = make_tiles(fmap, max_channels=64)
    assert channels == [0, 1, 2, 3, 4]
    width, height = 3 * 9 + 2, 2 * 8 + 2  # 3 tiles per row of 7 px wide, 6 px high tiles
    assert tuple(grid.shape) == (3, height, width)
    for k in range(5):
        r, c = divmod(k, 3)
        y, x = 2 + r * 8, 2 + c * 9
        tile = grid[0, y:y + 6, x:x + 7]
        f = fmap[k].double()
        expected = (f - f.min()) / (f.max() - f.min())
        torch.testing.assert_close(tile.double(), expected, atol=1e-6, rtol=0)


def test_channel_order_and_limit():
    torch.manual_seed(1)
    fmap = torch.randn(10, 4, 4)
    fmap[7] += 5  # the largest mean
    fmap[2, 0, 0] = 50  # the largest max
    _, by_index = make_tiles(fmap, max_channels=3, order="index")
    _, by_mean = make_tiles(fmap, max_channels=3, order="mean")
    _, by_max = make_tiles(fmap, max_channels=3, order="max")
    assert by_index == [0, 1, 2]
    assert by_mean == fmap.mean(dim=(1, 2)).argsort(descending=True)[:3].tolist()
    assert by_mean[0] == 7
    assert by_max == fmap.amax(dim=(1, 2)).argsort(descending=True)[:3].tolist()
    assert by_max[0] == 2


def test_nonfinite_values_do_not_break_the_grid():
    fmap = torch.randn(4, 5, 5)
    fmap[1, 2, 2] = math.nan
    fmap[3, 0, 0] = math.inf
    grid, _ = make_tiles(fmap)
    assert bool(torch.isfinite(grid).all()) and 0 <= float(grid.min()) <= float(grid.max()) <= 1


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3, padding=1)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(6, 4, 3, stride=2, padding=1)
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.conv1(x))
        return self.fc(self.conv2(x).mean(dim=(2, 3)))


def test_iter_grids_captures_before_inplace_relu_and_removes_hooks():
    torch.manual_seed(2)
    net = Net().eval()
    x = torch.randn(2, 3, 12, 12)
    sites = feature_sites(net, ["conv1"], ["Conv2d"])
    assert [s.name for s in sites] == ["conv1", "conv2"]
    grids = feature_grids(net, [batch_of(x)], sites, upsample=True)
    assert [(g.input, g.layer) for g in grids] == [
        ("img0", "conv1"), ("img0", "conv2"), ("img1", "conv1"), ("img1", "conv2")]
    with torch.no_grad():
        pre_relu = net.conv1(x)
    assert float(pre_relu.min()) < 0
    torch.testing.assert_close(grids[0].values, pre_relu[0])  # negatives kept: before ReLU
    # conv2 is 6x6, upsampled to the 12x12 input: 4 tiles, two per row.
    assert tuple(grids[1].image.shape[1:]) == grid_side(4, 12)[::-1]
    assert grids[1].shape == [4, 6, 6]
    assert hook_count(net) == 0
    # A sink that fails (a full disk, Ctrl-C) stops the run with the hooks removed too.
    seen = []

    def sink(grid):
        seen.append(hook_count(net))
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        drive(net, [batch_of(x)], FeaturesProbe(sites, sink=sink))
    assert seen[0] > 0 and hook_count(net) == 0


def test_selection_errors():
    net = Net()
    with pytest.raises(HookscopeError, match="^Choose layers with layers "):
        feature_sites(net)
    with pytest.raises(HookscopeError, match="Did you mean: conv1"):
        feature_sites(net, ["conv_1"])
    with pytest.raises(HookscopeError, match=r"\(N, C, H, W\)"):
        feature_grids(net, [batch_of(torch.randn(1, 3, 8, 8))], feature_sites(net, ["fc"]))
    assert hook_count(net) == 0


# ---------------------------------------------------------------------------- CLI


def test_cli_pngs_sizes_json_and_no_overwrite(cli, cat_jpg, tmp_path):
    out = tmp_path / "maps"
    result = cli("features", "resnet18", cat_jpg, *ARGS, "--layer", "conv1",
                 "--layer", "layer1.0.conv1", "--out", out, "--format", "json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["command"] == "features"
    assert doc["files"] == [str(out / "cat.conv1.png"), str(out / "cat.layer1.0.conv1.png")]
    # conv1: 64 channels of 32x32 at --size 64; layer1.0.conv1: 64 of 16x16; 8 per row.
    assert Image.open(doc["files"][0]).size == grid_side(64, 32)
    assert Image.open(doc["files"][1]).size == grid_side(64, 16)
    assert doc["grids"][0]["shape"] == [64, 32, 32]
    again = cli("features", "resnet18", cat_jpg, *ARGS, "--layer", "conv1", "--out", out)
    assert again.exit_code == 2 and "--force" in again.stderr
    forced = cli("features", "resnet18", cat_jpg, *ARGS, "--layer", "layer1.0.conv1",
                 "--max-channels", "9", "--upsample", "--order", "max", "--out", out, "--force",
                 "--format", "csv")
    assert forced.exit_code == 0, forced.stderr
    header, row = forced.stdout.splitlines()
    assert header == "input,layer,type,call,shape,channels,nonfinite,path"
    assert row.split('"')[1].count(",") == 8  # the 9 channels shown, comma-separated
    assert Image.open(out / "cat.layer1.0.conv1.png").size == grid_side(9, 64)
    assert sorted(p.name for p in out.iterdir()) == ["cat.conv1.png", "cat.layer1.0.conv1.png"]


def test_cli_tensorboard_one_image_per_layer(cli, cat_jpg, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import (
        HISTOGRAMS,
        IMAGES,
        SCALARS,
        EventAccumulator,
    )

    logdir = tmp_path / "runs"
    layers = ["conv1", "layer1.0.conv1", "layer2.0.conv2"]
    result = cli("features", "resnet18", cat_jpg, *ARGS, *(a for n in layers for a in
                 ("--layer", n)), "--out", tmp_path / "png", "--tensorboard", logdir)
    assert result.exit_code == 0, result.stderr
    acc = EventAccumulator(str(logdir), size_guidance={IMAGES: 0, HISTOGRAMS: 0, SCALARS: 0})
    acc.Reload()
    tags = acc.Tags()
    assert sorted(tags["images"]) == sorted(layers)
    for layer in layers:
        images = acc.Images(layer)
        assert len(images) == 1
        png = tmp_path / "png" / f"cat.{layer}.png"
        assert (images[0].width, images[0].height) == Image.open(png).size
        assert f"{layer}/activations" in tags["histograms"]
        assert acc.Scalars(f"{layer}/nonfinite")[0].value == 0


def test_tensorboard_histogram_drops_nonfinite(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import (
        HISTOGRAMS,
        SCALARS,
        EventAccumulator,
    )

    from hookscope.core.output import Staging
    from hookscope.render.features import GridWriter

    fmap = torch.randn(2, 4, 4)
    fmap[0, 0, 0], fmap[1, 1, 1], fmap[1, 2, 2] = math.nan, math.inf, -math.inf
    grid_image, channels = make_tiles(fmap)
    from hookscope.probes.features import FeatureGrid

    grid = FeatureGrid("x", "x", 0, "conv", "Conv2d", 0, [2, 4, 4], channels, 3,
                       grid_image, fmap)
    maps, runs = tmp_path / "maps", tmp_path / "runs"
    with Staging(maps) as staging, GridWriter(staging, maps, runs) as writer:
        writer.add(grid)
    acc = EventAccumulator(str(runs), size_guidance={HISTOGRAMS: 0, SCALARS: 0})
    acc.Reload()
    assert acc.Histograms("conv/activations")[0].histogram_value.num == 32 - 3
    assert acc.Scalars("conv/nonfinite")[0].value == 3


def test_cli_without_tensorboard_says_how_to_install(cli, cat_jpg, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # `import tensorboard` fails
    result = cli("features", "resnet18", cat_jpg, *ARGS, "--layer", "conv1",
                 "--out", tmp_path / "o", "--tensorboard", tmp_path / "runs")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install hookscope[tensorboard]" in lines[0]
    assert not (tmp_path / "o").exists() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("extra, message", [
    (("--layer", "fc"), "(N, C, H, W)"),
    (("--layer", "layer9"), "hookscope layers"),
    ((), "Choose layers with --layer"),
    (("--type", "Conv3d"), "--type Conv3d matches no"),
])
def test_cli_bad_input_leaves_no_files(cli, cat_jpg, tmp_path, extra, message):
    out = tmp_path / "o"
    result = cli("features", "resnet18", cat_jpg, *ARGS, *extra, "--out", out)
    assert result.exit_code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.stderr
    assert not out.exists()
