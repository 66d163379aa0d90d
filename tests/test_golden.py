"""Every command's output in every format equals its recording in ``tests/golden/``, field by
field within the tolerances of ``tests.golden.tolerance`` (re-record: ``python -m tests.golden
record``, then review ``git diff tests/golden``)."""

from __future__ import annotations

import pytest

from tests.golden import CASES, GOLDEN, compare


@pytest.mark.parametrize("name", list(CASES))
def test_output_matches_the_recording(name: str) -> None:
    assert (GOLDEN / name).is_file(), f"not recorded: python -m tests.golden record {name}"
    found = compare(name)
    assert not found, "\n".join(found[:20])


def test_every_recording_is_a_case() -> None:
    assert sorted(p.name for p in GOLDEN.iterdir()) == sorted(CASES)


def test_the_comparison_can_fail() -> None:
    from tests.golden import LOGITS, REL, differences, line_differences

    row = {"name": "conv1", "mean": 0.01, "std": 2.0, "calls": 3}
    assert differences(row, row | {"mean": 0.01 + 0.5 * REL * 2.0}) == []  # noise of std's size
    assert differences(row, row | {"mean": 0.01 + 2 * REL * 2.0}) != []
    assert differences(row, row | {"calls": 4}) != []  # counts are exact
    assert differences(row, row | {"new": 1}) != []  # a new field changes the golden
    drop = {"channel": 1, "drop": 0.001}
    assert differences(drop, {"channel": 1, "drop": 0.001 + 0.5 * REL * LOGITS}) == []
    assert differences(drop, {"channel": 1, "drop": 0.001 + 2 * REL * LOGITS}) != []
    assert line_differences("conv1  0.1234  2.000", "conv1    0.1235  2.000", "") == []
    assert line_differences("conv1  0.1234  2.000", "conv1  0.1237  2.000", "") != []
    assert line_differences("conv1  0.1234", "conv2  0.1234", "") != []
