"""The nbgrader course (`make assignments`): source metadata, release = the course's stubs, strict grading.

The full loop (nbgrader's generate_assignment, autograde and generate_feedback on solutions, blank
and planted-mistake submissions of every notebook) runs in CI as its own step, `.ci/autograde.py`.
"""


import nbformat
import pytest
from helpers import NOTEBOOKS

from selfattn_lite.course import assignments
from selfattn_lite.exercises import ExerciseError, graded, nb01


def _tags(cell):
    return cell.get("metadata", {}).get("tags", [])


def _clear(source: str) -> str:
    """What nbgrader's ClearSolutions (configured as the course's) makes of a solution cell."""
    from nbgrader.preprocessors import ClearSolutions

    cell = nbformat.v4.new_code_cell(source, metadata={"nbgrader": {"solution": True, "grade": False,
                                                                    "grade_id": "a", "locked": False,
                                                                    "schema_version": 3, "task": False}})
    clear = ClearSolutions(code_stub={"python": assignments.CODE_STUB})
    return clear.preprocess_cell(cell, {"language": "python"}, 0)[0].source


@pytest.mark.parametrize("stub, solution", [
    ("def f(x):\n    raise NotImplementedError", "def f(x):\n    y = x + 1\n    return y"),
    ("def f(x):\n    raise NotImplementedError", "@decorate\ndef f(x):\n    return x"),
    ("def f(x):\n    raise NotImplementedError", "def g(x):\n    return x\n\n\ndef f(x):\n    return g(x)"),
    ("w = None   # your tensor", "w = torch.ones(3)"),
])
def test_answer_cell_runs_the_solution_and_releases_the_stub(stub, solution):
    source = assignments.answer_source(stub, solution)
    released = _clear(source)
    if "raise NotImplementedError" in stub:
        assert released == stub
    else:
        assert released.startswith(stub) and released.endswith(assignments.CODE_STUB)
    ran = assignments.solution_source(source)
    compile(ran, "answer", "exec")
    for line in solution.split("\n"):
        assert line in ran.split("\n")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_source_notebook_has_one_graded_cell_per_exercise(path):
    course = nbformat.read(path, as_version=4)
    stubs = [c.source for c in course.cells if "exercise" in _tags(c)]
    source = assignments.to_source(course, path.stem)
    nbformat.validate(source)
    answers = [c for c in source.cells if c.metadata.get("nbgrader", {}).get("solution")]
    tests = [c for c in source.cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert len(answers) == len(tests) == len(stubs) > 0
    for stub, answer in zip(stubs, answers):
        assert not answer.metadata.get("jupyter", {}).get("source_hidden"), "the student's answer cell is folded"
        released = _clear(answer.source)
        assert released == stub or (released.startswith(stub) and "raise NotImplementedError" not in stub)
    for test in tests:
        meta = test.metadata["nbgrader"]
        assert meta["locked"] and meta["points"] == assignments.POINTS
        visible, hidden = test.source.split("### BEGIN HIDDEN TESTS")
        assert visible.strip().startswith("check.check_") and "graded(check.check_" in hidden
    ids = [c.metadata["nbgrader"]["grade_id"] for c in source.cells if "nbgrader" in c.metadata]
    assert len(ids) == len(set(ids))
    text = "".join(c.source for c in source.cells)
    assert "../figures" not in text and not any(c.get("outputs") for c in source.cells if c.cell_type == "code")


def test_a_solution_without_its_exercise_is_refused():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("def f(): return 1", metadata={"tags": ["solution"]})]
    with pytest.raises(ValueError, match="without an exercise"):
        assignments.to_source(nb, "99_x")


def test_graded_fails_a_stub_that_the_learner_only_sees_as_not_attempted(capsys):
    def stub(x):
        raise NotImplementedError

    nb01.check_softmax(stub)
    assert "Not attempted yet" in capsys.readouterr().out
    with pytest.raises(ExerciseError, match="Not attempted yet"):
        graded(nb01.check_softmax, stub)
    nb01.check_softmax(stub)                     # back to the friendly mode afterwards
    assert "Not attempted yet" in capsys.readouterr().out
    graded(nb01.check_softmax, lambda x: (x - x.amax(-1, keepdim=True)).exp()
           / (x - x.amax(-1, keepdim=True)).exp().sum(-1, keepdim=True))
    assert "Correct" in capsys.readouterr().out
    with pytest.raises(ExerciseError, match="rows"):
        graded(nb01.check_softmax, lambda x: x.exp() / x.exp().sum(0, keepdim=True))
