"""Checkers for the notebooks' exercises, one module per notebook (nb01, nb02, ...).

A checker runs the learner's code on fresh inputs and compares it with a reference.
It prints a one-line success message and returns None, or raises ``ExerciseError`` saying what is
wrong (a shape, a missing scale, a flipped mask...) rather than only "wrong".
A function that still raises ``NotImplementedError`` is reported as not attempted
(no exception), so a student notebook runs top to bottom before it is filled in.
"""

from __future__ import annotations

import dis
import sys
import types
from collections.abc import Callable
from contextlib import contextmanager

import torch

__all__ = ["ExerciseError", "NotAttempted", "attempt", "passed", "close", "not_attempted", "graded", "names_used",
           "forbidden", "is_stub", "solution", "solution_ran", "unanswered"]

_GRADING = False   # True while ``graded`` runs a checker: a stub then fails instead of printing


class ExerciseError(AssertionError):
    """The learner's answer is wrong; the message says how."""


class NotAttempted(Exception):
    """The exercise still raises NotImplementedError."""


def attempt(fn: Callable, *args, **kwargs):
    """Call the learner's function; NotImplementedError becomes ``NotAttempted``."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError:
        raise NotAttempted from None


def not_attempted(name: str) -> None:
    """Say that the exercise is still a stub (no exception: a student notebook runs to the end).

    Inside ``graded`` the same words are raised as ``ExerciseError``: an unanswered exercise scores 0.
    """
    message = (f"Not attempted yet: fill in `{name}` above (replace `raise NotImplementedError`) "
               "and run this cell again.")
    if _GRADING:
        raise ExerciseError(message)
    print(message)


def graded(check: Callable, *args, **kwargs) -> None:
    """Run a checker as the autograder does: like ``check(*args)``, but a stub raises ExerciseError.

    The nbgrader assignments (``selfattn_lite.course.assignments``) call it in their hidden tests, so a
    learner sees "Not attempted yet" while working and the grader gives an untouched exercise 0 points.
    """
    global _GRADING
    previous, _GRADING = _GRADING, True
    try:
        check(*args, **kwargs)
    finally:
        _GRADING = previous


def is_stub(fn) -> bool:
    """True for a function whose body starts with ``raise NotImplementedError`` (an exercise's stub, also one that
    hands the learner buggy code below that line to fix), or a class one of whose own methods raises it."""
    if isinstance(fn, type):                   # a class stub: one of its own methods raises NotImplementedError
        return any("NotImplementedError" in getattr(f, "__code__", types.SimpleNamespace(co_names=())).co_names
                   for f in vars(fn).values())
    code = getattr(fn, "__code__", None)
    if code is None:
        return False
    skip = ("RESUME", "NOP", "CACHE", "PUSH_NULL", "MAKE_CELL", "COPY_FREE_VARS")
    steps = [i for i in dis.get_instructions(code) if i.opname not in skip]
    if not steps or steps[0].opname != "LOAD_GLOBAL" or steps[0].argval != "NotImplementedError":
        return False
    for step in steps[1:6]:
        if step.opname == "RAISE_VARARGS":
            return True
        if step.opname not in ("LOAD_CONST", "PRECALL", "CALL", "CALL_FUNCTION"):
            return False
    return False


def solution_ran(why: str) -> str:
    """What a folded solution prints when it runs: the check below it then checks the course's answer."""
    return (f"The course's solution ran here ({why}): the check below checks it. "
            "Write yours above, run it and the check.")


def solution(fn: Callable) -> Callable:
    """Decorator of a notebook's folded solution: it defines ``fn`` only while the learner's function of that
    name is still the stub (or absent), so "Run All" checks the learner's answer, not the course's.

        @check.solution   # keeps your answer above if you wrote one
        def softmax_rows(x): ...
    """
    current = sys._getframe(1).f_globals.get(fn.__name__)
    if current is None or is_stub(current):
        print(solution_ran(f"`{fn.__name__}` above is still the stub"))
        return fn
    print(f"Your `{fn.__name__}` above is kept: this cell's solution was not run (unfold the cell to read it).")
    return current


def unanswered(*answers) -> bool:
    """True while every answer is still ``None`` (a value exercise's stub): the guard of its folded solution.

        if check.unanswered(grad_q):   # keeps your answer above if you wrote one
            grad_q = ...
    """
    if all(answer is None for answer in answers):
        print(solution_ran("the answer above is still None" if len(answers) == 1 else
                           "the answers above are still None"))
        return True
    print("Your answer above is kept: this cell's solution was not run (unfold the cell to read it).")
    return False


def passed(message: str) -> None:
    print(f"Correct: {message}")


@contextmanager
def forbidden(targets, message: str):
    """Within the block, calling any ``(owner, name)`` in ``targets`` raises ExerciseError(message).

    Checkers wrap the learner's call in it to refuse an answer that calls what it is checked against.
    """
    def refuse(*args, **kwargs):
        raise ExerciseError(message)

    saved = [(owner, name, owner.__dict__.get(name)) for owner, name in targets]
    for owner, name, _ in saved:
        setattr(owner, name, refuse)
    try:
        yield
    finally:
        for owner, name, original in saved:
            if original is None:
                delattr(owner, name)            # it was inherited (torch.Tensor.softmax): inherit it again
            else:
                setattr(owner, name, original)


def close(a, b, atol: float = 1e-5, rtol: float = 1e-4) -> bool:
    """True when a and b are tensors of the same shape and agree within tolerance."""
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    if a.shape != b.shape:
        return False
    return torch.allclose(a.to(torch.float64), b.to(torch.float64), atol=atol, rtol=rtol, equal_nan=False)


def require_tensor(name: str, x, shape: tuple | None = None) -> torch.Tensor:
    """Raise ExerciseError unless x is a tensor of the expected shape."""
    if not isinstance(x, torch.Tensor):
        raise ExerciseError(f"{name} should be a torch.Tensor, got {type(x).__name__}")
    if shape is not None and tuple(x.shape) != tuple(shape):
        raise ExerciseError(f"{name} should have shape {tuple(shape)}, got {tuple(x.shape)}")
    return x


def names_used(fn) -> set[str]:
    """The global and attribute names a function's code (and any function defined in it) refers to; for a class,
    every method defined in its body. Checkers use it to refuse an answer that calls the package's own."""
    if isinstance(fn, type):
        todo = [f.__code__ for f in vars(fn).values() if isinstance(f, types.FunctionType)]
    else:
        todo = [fn.__code__] if hasattr(fn, "__code__") else []
    names = set()
    while todo:
        code = todo.pop()
        names |= set(code.co_names)
        todo += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return names
