"""What several test modules share: the repository's paths, the notebooks, and small assertions."""

from __future__ import annotations

from pathlib import Path

import pytest

from selfattn_lite.exercises import ExerciseError

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def tags(cell) -> list[str]:
    """A notebook cell's tags."""
    return cell.get("metadata", {}).get("tags", [])


def expect_error(check, fn, fragment: str) -> None:
    """An exercise checker rejects ``fn`` with a message that names the mistake (contains ``fragment``)."""
    with pytest.raises(ExerciseError) as info:
        check(fn)
    assert fragment in str(info.value), str(info.value)
