"""Every command's JSON and CSV equal the outputs recorded before the run pipeline was
rebuilt (issue 8), apart from the documented fixes in ``tests.golden.DOCUMENTED``."""

from __future__ import annotations

from tests.golden import compare


def test_outputs_match_the_recording(one_thread) -> None:
    found = compare()
    assert not found, "\n".join(f"{name}: {diff[:5]}" for name, diff in found.items())
