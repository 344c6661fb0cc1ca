"""The folded solutions keep the learner's answer: under "Run All" a solution cell defines its function (or
values) only while the learner's is still the stub, so the checker after it checks the learner's code."""

import ast
import json
from pathlib import Path

import pytest

from selfattn_lite import exercises
from selfattn_lite.course.assignments import unguarded
from selfattn_lite.exercises import nb01

NOTEBOOKS = sorted(Path(__file__).resolve().parents[2].joinpath("notebooks").glob("[0-9][0-9]_*.ipynb"))


def cells(path):
    return [("".join(c["source"]), c["metadata"].get("tags", [])) for c in json.loads(path.read_text())["cells"]]


def solutions(path):
    """(stub source, solution source) of each exercise of a notebook."""
    cs = cells(path)
    return [(cs[i - 1][0], src) for i, (src, tags) in enumerate(cs) if "solution" in tags]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_every_folded_solution_is_guarded(path):
    for stub, solution in solutions(path):
        stub_defs = [n.name for n in ast.parse(stub).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        tree = ast.parse(solution)
        if stub_defs:
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in stub_defs:
                    assert node.decorator_list and ast.unparse(node.decorator_list[0]) == "check.solution", \
                        (path.name, node.name)
        else:
            assert isinstance(tree.body[0], ast.If) and len(tree.body) == 1, (path.name, solution[:80])
            assert ast.unparse(tree.body[0].test).startswith("check.unanswered("), (path.name, solution[:80])


def run(*sources):
    namespace = {"check": nb01}
    for source in sources:
        exec(source, namespace)
    return namespace


def test_the_solution_runs_over_a_stub_and_keeps_an_answer(capsys):
    stub = "def f(x):\n    raise NotImplementedError"
    solution = "@check.solution  # keeps your answer above if you wrote one\ndef f(x):\n    return 'course'"
    assert run(stub, solution)["f"](0) == "course"
    said = capsys.readouterr().out                                    # over the stub: says whose answer is checked
    assert said == exercises.solution_ran("`f` above is still the stub") + "\n" and "course's solution" in said
    assert run(stub, "def f(x):\n    return 'mine'", solution)["f"](0) == "mine"
    assert capsys.readouterr().out.startswith("Your `f` above is kept")
    assert run(solution)["f"](0) == "course"                          # the stub cell skipped: the solution


def test_a_value_solution_runs_only_while_the_answers_are_none(capsys):
    stub = "a = None\nb = None"
    solution = "if check.unanswered(a, b):  # keeps your answers above if you wrote them\n    a, b = 1, 2"
    assert (run(stub, solution)["a"], run(stub, solution)["b"]) == (1, 2)
    assert "the answers above are still None" in capsys.readouterr().out
    ns = run(stub, "a, b = 5, 6", solution)
    assert (ns["a"], ns["b"]) == (5, 6) and "kept" in capsys.readouterr().out


def test_is_stub_tells_a_stub_from_an_answer():
    def stub(q, k, v, *, mask=None):
        """Doc."""
        raise NotImplementedError

    def fix_me(x, n):                       # a "find the bug" stub: the learner deletes the first line
        raise NotImplementedError("delete this line")
        return [t[:n] for t in x]               # a closure over n: MAKE_CELL comes first

    def answer(q):
        raise ValueError("not implemented yet")

    def partial(q):
        if q is None:
            raise NotImplementedError
        return q

    class StubModel:
        def __init__(self):
            super().__init__()
            raise NotImplementedError

    class Model:
        def __init__(self):
            self.n = 1

    assert exercises.is_stub(stub) and exercises.is_stub(fix_me) and exercises.is_stub(StubModel)
    assert not exercises.is_stub(Model)
    assert not any(exercises.is_stub(f) for f in (answer, partial, len))


def test_the_assignments_strip_the_guard():
    assert unguarded("@check.solution  # keeps\ndef f(x):\n    return x") == "def f(x):\n    return x"
    assert unguarded("if check.unanswered(a):  # keeps\n    b = 2\n    a = b\n") == "b = 2\na = b\n"
    assert unguarded("def f(x):\n    return x") == "def f(x):\n    return x"
