"""`hookscope models`: filtering against torchvision's own registry."""

from __future__ import annotations

import fnmatch
import json

import pytest
import torchvision.models as tvm
from torchvision.models import get_model_weights, list_models

from hookscope.catalog import find_models, name_matcher
from hookscope.core.errors import HookscopeError


def names_of(result) -> list[str]:
    assert result.exit_code == 0, result.stderr
    return [m["name"] for m in json.loads(result.stdout)["models"]]


def test_glob_pattern_and_weights(cli) -> None:
    doc_names = names_of(cli("models", "resnet1*", "--format", "json"))
    assert doc_names == sorted(n for n in list_models() if fnmatch.fnmatchcase(n, "resnet1*"))
    assert "resnet18" in doc_names and "resnet50" not in doc_names
    doc = json.loads(cli("models", "resnet1*", "-f", "json").stdout)
    assert doc["command"] == "models" and doc["pattern"] == "resnet1*"
    for m in doc["models"]:
        enum = get_model_weights(m["name"])
        assert m["weights"] == [w.name for w in enum]
        assert m["default"] == enum.DEFAULT.name
        assert m["task"] == "classification"


def test_a_plain_word_matches_substrings_case_insensitively(cli) -> None:
    assert names_of(cli("models", "ViT_B", "-f", "json")) == sorted(
        n for n in list_models() if "vit_b" in n)
    assert name_matcher("resnet") == "*resnet*" and name_matcher("res*") == "res*"


def test_task_filter(cli) -> None:
    got = names_of(cli("models", "--task", "segmentation", "-f", "json"))
    assert got == sorted(list_models(module=tvm.segmentation))
    assert {m.task for m in find_models("*3d*")} <= {"video"}


def test_no_pattern_lists_everything_as_a_table(cli) -> None:
    result = cli("models")
    assert result.exit_code == 0
    assert f"{len(list_models())} model(s)" in result.stdout
    assert "resnet18" in result.stdout and "IMAGENET1K_V1" in result.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["zzz*"], "zzz"),
    (["resnt18"], "resnet18"),  # suggests the close name
    (["--task", "segmentaton"], "segmentation"),
])
def test_nothing_matches_is_one_line_and_exit_2(cli, args, message) -> None:
    result = cli("models", *args)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]
    with pytest.raises(HookscopeError):
        find_models(args[-1] if args[0] != "--task" else None,
                    args[-1] if args[0] == "--task" else None)


def test_the_list_is_torchvisions_registry() -> None:
    found = find_models()
    assert [m.name for m in found] == sorted(list_models())
    for m in found:
        enum = get_model_weights(m.name) if m.weights else None
        assert m.weights == [w.name for w in enum or ()]
        assert m.default == (enum.DEFAULT.name if enum else None)
