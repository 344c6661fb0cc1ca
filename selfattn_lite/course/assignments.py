"""Autograded assignments: the course notebooks as an nbgrader course.

    python -m selfattn_lite.course.assignments notebooks assignments      # what `make assignments` runs

writes an nbgrader course directory ``assignments/``:

* ``nbgrader_config.py``: stubs are ``raise NotImplementedError`` (the course's own), a generous
  execution timeout;
* ``source/NN_name/NN_name.ipynb``, one assignment per numbered notebook, with nbgrader's cell
  metadata: each exercise's stub and solution become one *solution cell* whose solution region
  nbgrader replaces by the stub, and each checker call ``check.check_xxx(...)`` becomes a locked,
  *graded test cell* worth ``POINTS`` point(s), with a hidden test that runs the same checker
  through ``selfattn_lite.exercises.graded`` (an untouched stub fails there, so it scores 0,
  while the learner only sees "Not attempted yet");
* ``source/NN_name/figures/``: the figures the notebook shows (its ``../figures/`` links become
  ``figures/``, so each assignment folder stands on its own on a JupyterHub);

and then runs nbgrader's own ``generate_assignment`` on each, which writes ``release/``.

The learner-facing cells are the course's: a release notebook reads like ``make student``'s,
with the checker call unchanged.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from pathlib import Path

import nbformat

__all__ = ["POINTS", "CONFIG", "answer_source", "to_source", "build_source", "generate", "solution_source",
           "unguarded"]

POINTS = 1                       # per checker call: each exercise is worth the same
CODE_STUB = "raise NotImplementedError"
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
CHECK_CALL = re.compile(r"^\s*check\.(check_\w+)\((.*)\)\s*$", re.S)
RAISE_LINE = re.compile(r"^(\s*)raise NotImplementedError(\(\))?\s*$")
GUARD_DEF = re.compile(r"^@check\.solution\b.*$")             # the course's guard on a folded solution's def
GUARD_IF = re.compile(r"^if check\.unanswered\(.*\):.*$")       # ... and on a value exercise's solution

CONFIG = f'''# nbgrader configuration of the selfattn-course assignments (written by selfattn_lite.course.assignments).
c = get_config()  # noqa: F821
c.CourseDirectory.course_id = "selfattn-course"
# the course's own stub: a release cell then reads exactly like the course's exercise cell
c.ClearSolutions.code_stub = {{"python": "{CODE_STUB}"}}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"
# each notebook runs in well under a minute on a laptop CPU; leave room for a busy grading machine
c.Execute.timeout = 600
'''


def _tags(cell) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def _meta(grade_id: str, *, solution: bool, grade: bool, locked: bool, points: int | None = None) -> dict:
    meta = {"grade": grade, "grade_id": grade_id, "locked": locked, "schema_version": 3,
            "solution": solution, "task": False}
    if points is not None:
        meta["points"] = points
    return meta


def answer_source(stub: str, solution: str) -> str:
    """One cell that runs as ``solution`` and that nbgrader's ClearSolutions turns back into ``stub``.

    The stub's ``raise NotImplementedError`` line becomes the solution region. When the solution
    starts with the stub's lines before it (``def f(x):``) and ends with those after it, the region
    holds only the body; otherwise (a decorator, extra helpers) the stub's header is kept with a
    ``...`` body and the full solution follows it inside the region, redefining it. A stub without
    that line (``x = None``) keeps its lines, and the region, with the whole solution, follows them.
    """
    s_lines, l_lines = stub.rstrip("\n").split("\n"), solution.rstrip("\n").split("\n")
    raises = [i for i, line in enumerate(s_lines) if RAISE_LINE.match(line)]
    if len(raises) != 1:
        return "\n".join(s_lines + [BEGIN] + l_lines + [END])
    r = raises[0]
    indent = RAISE_LINE.match(s_lines[r]).group(1)
    before, after = s_lines[:r], s_lines[r + 1:]
    fits = (l_lines[:len(before)] == before and (not after or l_lines[-len(after):] == after)
            and len(l_lines) > len(before) + len(after))
    if fits:
        middle = l_lines[len(before):len(l_lines) - len(after)]
        return "\n".join(before + [indent + BEGIN] + middle + [indent + END] + after)
    body = [indent + "..."] if indent else []
    return "\n".join(before + [indent + BEGIN] + body + l_lines + [END] + after)


def unguarded(solution: str) -> str:
    """A folded solution without the course's guard (``@check.solution`` lines; an ``if check.unanswered(...):``
    line and the indent under it): in an nbgrader answer cell the solution region is the answer itself."""
    lines = [line for line in solution.split("\n") if not GUARD_DEF.match(line)]
    if lines and GUARD_IF.match(lines[0]):
        lines = [line[4:] if line.startswith("    ") else line for line in lines[1:]]
    return "\n".join(lines)


def solution_source(source: str) -> str:
    """The code a source cell runs: the solution delimiters (comments) dropped."""
    return "\n".join(line for line in source.split("\n") if BEGIN not in line and END not in line)


def _test_source(call: str, check_name: str, args: str) -> str:
    return "\n".join([
        call.strip(),
        "### BEGIN HIDDEN TESTS",
        "from selfattn_lite.exercises import graded  # the grader: an exercise left as a stub fails here",
        "",
        f"graded(check.{check_name}, {args})",
        "### END HIDDEN TESTS",
    ])


def to_source(nb: nbformat.NotebookNode, stem: str) -> nbformat.NotebookNode:
    """The nbgrader source version of one course notebook.

    Every ``exercise`` cell must be followed by its ``solution`` cell; the first checker call after
    a solution becomes that exercise's graded test cell.
    """
    nb = nbformat.from_dict(nb)
    cells, pending, n = [], None, 0
    for cell in nb.cells:
        tags = _tags(cell)
        if cell.cell_type == "markdown":
            cell.source = cell.source.replace("../figures/", "figures/")
        elif cell.cell_type == "code":
            cell.source = cell.source.replace("../figures", "figures")
            cell.outputs, cell.execution_count = [], None
        if "exercise" in tags:
            pending = cell
            continue
        if "solution" in tags:
            if pending is None:
                raise ValueError(f"{stem}: a solution cell without an exercise cell before it:\n{cell.source[:200]}")
            n += 1
            cell.source = answer_source(pending.source, unguarded(cell.source))
            cell.metadata["tags"] = [t for t in tags if t != "solution"] + ["exercise"]
            cell.metadata.pop("jupyter", None)      # the course folds its solutions; the student writes here, unfolded
            cell.metadata["nbgrader"] = _meta(f"answer_{n}", solution=True, grade=False, locked=False)
            cell["id"] = f"answer-{n}"
            pending = None
            cells.append(cell)
            continue
        match = CHECK_CALL.match(cell.source) if cell.cell_type == "code" else None
        if match and cells and any("nbgrader" in c.metadata and c.metadata["nbgrader"]["grade_id"] == f"answer_{n}"
                                   for c in cells[-1:]):
            cell.source = _test_source(cell.source, match.group(1), match.group(2))
            cell.metadata["nbgrader"] = _meta(f"test_{n}_{match.group(1)}", solution=False, grade=True,
                                              locked=True, points=POINTS)
            cell["id"] = f"test-{n}"
        cells.append(cell)
    if pending is not None:
        raise ValueError(f"{stem}: an exercise cell without its solution cell")
    if n == 0:
        raise ValueError(f"{stem}: no exercise (cells tagged 'exercise' and 'solution') to grade")
    graded_cells = [c for c in cells if c.metadata.get("nbgrader", {}).get("grade")]
    if len(graded_cells) != n:
        raise ValueError(f"{stem}: {n} exercises but {len(graded_cells)} checker calls right after them")
    nb.cells = cells
    return nb


def build_source(src: str | Path = "notebooks", course: str | Path = "assignments",
                 figures: str | Path | None = None) -> list[Path]:
    """Write ``course/nbgrader_config.py`` and ``course/source/<stem>/<stem>.ipynb`` (+ figures/)."""
    src, course = Path(src), Path(course)
    figures = Path(figures) if figures is not None else src.parent / "figures"
    course.mkdir(parents=True, exist_ok=True)
    (course / "nbgrader_config.py").write_text(CONFIG)
    written = []
    for path in sorted(src.glob("[0-9][0-9]_*.ipynb")):
        folder = course / "source" / path.stem
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        nb = to_source(nbformat.read(path, as_version=4), path.stem)
        nbformat.validate(nb)
        nbformat.write(nb, folder / path.name)
        if figures.is_dir():
            shutil.copytree(figures, folder / "figures")
        written.append(folder / path.name)
    return written


def api(course: str | Path):
    """nbgrader's Python API on the course directory, configured by its ``nbgrader_config.py``.

    One process for every step (generate, autograde, feedback) instead of one ``nbgrader`` command each.
    """
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config.loader import PyFileConfigLoader

    course = Path(course).resolve()
    # nbgrader runs `alembic` (its database migrations) from PATH: put this environment's scripts first
    scripts = str(Path(sys.executable).parent)
    if scripts not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join([scripts, os.environ.get("PATH", "")])
    config = PyFileConfigLoader("nbgrader_config.py", path=str(course)).load_config()
    config.CourseDirectory.root = str(course)
    return NbGraderAPI(CourseDirectory(config=config), config=config)


def run(result: dict, what: str) -> dict:
    """Raise with nbgrader's log unless an API call succeeded."""
    if not result.get("success"):
        raise RuntimeError(f"nbgrader {what} failed:\n{result.get('log', '')[-4000:]}\n{result.get('error', '')}")
    return result


def generate(src: str | Path = "notebooks", course: str | Path = "assignments") -> list[Path]:
    """Build ``source/`` and let nbgrader's ``generate_assignment`` write ``release/``; return the release notebooks."""
    course = Path(course)
    sources = build_source(src, course)
    grader = api(course)
    released = []
    for path in sources:
        run(grader.generate_assignment(path.parent.name, force=True), f"generate_assignment {path.parent.name}")
        released.append(course / "release" / path.parent.name / path.name)
    return released


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m selfattn_lite.course.assignments",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("src", nargs="?", default="notebooks", help="folder of NN_*.ipynb (default: notebooks)")
    parser.add_argument("course", nargs="?", default="assignments",
                        help="the nbgrader course folder to write (default: assignments)")
    args = parser.parse_args(argv)
    for path in generate(args.src, args.course):
        print(path)


if __name__ == "__main__":
    main()
