"""`make student` writes valid notebooks without solutions; their exercises run and say "Not attempted yet"."""

import ast
import shutil

import nbformat
import pytest
from helpers import NOTEBOOKS, ROOT, tags

from selfattn_lite.course.student import build


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


def defined_names(source: str) -> set[str]:
    """Top-level names a cell binds: functions, classes, imports and assignment targets."""
    names = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        else:
            for target in ast.walk(node):
                if isinstance(target, ast.Name) and isinstance(target.ctx, ast.Store):
                    names.add(target.id)
    return names


def used_names(source: str) -> set[str]:
    return {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def is_exercise(cell) -> bool:
    """An exercise stub, or a cell that calls its checker (``check``, the notebook's exercises module)."""
    return "exercise" in tags(cell) or "check" in used_names(cell.source)


def exercise_slice(cells: list) -> list:
    """The code cells an exercise needs: its stub and checker cells, and every earlier cell that
    defines a name one of them (or another kept cell) uses, back to the setup and import cells."""
    code = [c for c in cells if c.cell_type == "code"]
    keep, needed = [], set()
    for i, cell in reversed(list(enumerate(code))):
        if i == 0 or is_exercise(cell) or defined_names(cell.source) & needed:
            keep.append(cell)
            needed |= used_names(cell.source)
    return keep[::-1]


def test_no_student_cell_needs_a_name_only_a_solution_defines():
    for path in NOTEBOOKS:
        teacher = nbformat.read(path, as_version=4)
        code = [c for c in teacher.cells if c.cell_type == "code"]
        solution_only = set().union(*(defined_names(c.source) for c in code if "solution" in tags(c)))
        solution_only -= set().union(*(defined_names(c.source) for c in code if "solution" not in tags(c)))
        for cell in code:
            if "solution" not in tags(cell):
                missing = used_names(cell.source) & solution_only
                assert not missing, f"{path.name}: a student cell uses {sorted(missing)}, defined only in a solution"


def test_the_name_check_catches_a_cell_that_needs_a_solution():
    solution = "def attention(q, k, v):\n    return q\nhelper = 3"
    assert defined_names(solution) == {"attention", "helper"}
    assert {"attention", "print"} <= used_names("print(attention(1, 2, 3))")


def test_the_exercise_slice_keeps_what_the_checkers_need_and_drops_the_rest():
    cells = [nbformat.v4.new_code_cell(src) for src in (
        "import os",                                         # the setup cell: always kept
        "import torch\nfrom selfattn_lite.exercises import nb01 as check",
        "x = torch.ones(3)",
        "slow = sum(range(10**8))",                          # nothing below needs it
        "def f(q):\n    raise NotImplementedError",
        "check.check_f(f, x)")]
    cells[4].metadata["tags"] = ["exercise"]
    assert [c.source for c in exercise_slice(cells)] == [cells[i].source for i in (0, 1, 2, 4, 5)]


@pytest.mark.slow
@pytest.mark.parametrize("name", [p.name for p in NOTEBOOKS])
def test_student_notebook_runs_and_reports_not_attempted(student_dir, name):
    """The exercises of the student notebook, run in a fresh kernel, each say "Not attempted yet".

    What runs is ``exercise_slice``: the stubs, their checkers and every cell they depend on by name.
    The cells left out are the teacher's code unchanged, executed by nbval in the teacher notebook,
    and ``test_no_student_cell_needs_a_name_only_a_solution_defines`` shows none of them needs a
    solution; running them twice would only double the suite's time.
    """
    from nbclient import NotebookClient

    nb = nbformat.read(student_dir / name, as_version=4)
    exercises = sum("exercise" in tags(c) for c in nb.cells)
    nb.cells = exercise_slice(nb.cells)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(student_dir)}}).execute()
    printed = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []) if c.cell_type == "code")
    assert printed.count("Not attempted yet") == exercises >= 1     # one report per exercise, none crashed
