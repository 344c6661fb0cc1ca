"""`make student` writes valid notebooks without solutions, and they run top to bottom."""

import shutil
from pathlib import Path

import nbformat
import pytest

from selfattn_lite.student import build

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def tags(cell):
    return cell.get("metadata", {}).get("tags", [])


@pytest.fixture(scope="module")
def student_dir(tmp_path_factory):
    """student/ next to a copy of figures/, as `make student` lays them out in the repository."""
    root = tmp_path_factory.mktemp("course")
    shutil.copytree(ROOT / "figures", root / "figures")
    build(ROOT / "notebooks", root / "student")
    return root / "student"


def test_every_notebook_has_exercises_with_solutions():
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        assert any("exercise" in tags(c) for c in nb.cells), f"{path.name} has no exercise"
        assert any("solution" in tags(c) for c in nb.cells), f"{path.name} has no solution cell"


def test_student_notebooks_have_no_solutions_and_are_valid(student_dir):
    for path in NOTEBOOKS:
        teacher = nbformat.read(path, as_version=4)
        student = nbformat.read(student_dir / path.name, as_version=4)
        nbformat.validate(student)
        assert not any("solution" in tags(c) for c in student.cells)
        solutions = [c.source for c in teacher.cells if "solution" in tags(c)]
        for source in solutions:
            assert all(source != c.source for c in student.cells)
        stubs = [c.source for c in teacher.cells if "exercise" in tags(c)]
        assert stubs == [c.source for c in student.cells if "exercise" in tags(c)]
        assert all(c.get("outputs", []) == [] for c in student.cells if c.cell_type == "code")


@pytest.mark.slow
@pytest.mark.parametrize("name", [p.name for p in NOTEBOOKS])
def test_student_notebook_runs_and_reports_not_attempted(student_dir, name):
    from nbclient import NotebookClient

    nb = nbformat.read(student_dir / name, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(student_dir)}}).execute()
    printed = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []) if c.cell_type == "code")
    assert "Not attempted yet" in printed
