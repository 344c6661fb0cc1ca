"""The registry of notebook 09's pitfalls: each demo registers itself with ``@pitfall(...)``.

``PITFALLS`` maps a pitfall's name to its ``Pitfall`` entry (title, the notebook that teaches the
right way, the symptom in words, its demo, its broken and fixed code, and for some the weights to
draw); ``run_all()`` runs every demo in order. The pitfalls themselves are in ``pitfalls``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace

from torch import Tensor

from ._checks import check_bool

__all__ = ["Demo", "Pitfall", "PITFALLS", "pitfall", "run_all", "Weights", "Code"]


@dataclass
class Demo:
    """One pitfall, run: the measurements, and whether the symptom and the fix were observed.

    A demo function returns the first three fields; its ``@pitfall`` line fills in the rest.

    Taught in notebook 09, "Check against the package".
    """

    measured: dict
    symptom_seen: bool                 # the broken code shows the symptom
    fix_works: bool                    # the fixed code does not, and matches the reference
    name: str = ""
    title: str = ""
    notebook: str = ""                 # the notebook that teaches the right way
    symptom: str = ""                  # what goes wrong, in words

    def __post_init__(self):
        if not isinstance(self.measured, dict):
            raise ValueError(f"measured must be a dict of what was measured, got {type(self.measured).__name__}")
        check_bool("symptom_seen", self.symptom_seen)
        check_bool("fix_works", self.fix_works)
        for name in ("name", "title", "notebook", "symptom"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a str, got {getattr(self, name)!r}")

    @property
    def ok(self) -> bool:
        return self.symptom_seen and self.fix_works


Weights = tuple[Tensor, Tensor | None]     # (L, S) attention weights, and the mask (True = masked) if any
Code = Callable | tuple[Callable, ...]      # the broken or the fixed code of a pitfall: functions, classes


@dataclass(frozen=True)
class Pitfall:
    """One registered pitfall: what goes wrong, its demo, its code, and (for some) the weights to draw.

    ``broken`` / ``fixed``: the functions or classes with the bug and with its fix (empty where the
    demo writes both inline, a line or two each).
    ``weights(fixed)``: the (L, S) weights with the broken (False) or fixed (True) code, and the
    mask (True = masked) if any; ``picture`` is the title they are drawn under.

    Taught in notebook 09, "Check against the package".
    """

    name: str
    title: str
    notebook: str
    symptom: str
    demo: Callable[[], Demo]
    broken: tuple[Callable, ...] = ()
    fixed: tuple[Callable, ...] = ()
    picture: str | None = None
    weights: Callable[[bool], Weights] | None = None


PITFALLS: dict[str, Pitfall] = {}


def pitfall(name: str, title: str, notebook: str, symptom: str, *, broken: Code = (), fixed: Code = (),
            picture: str | None = None, weights: Callable[[bool], Weights] | None = None):
    """Register the decorated demo as pitfall ``name``; the demo then returns a complete ``Demo``.

    ``broken`` and ``fixed``: the function(s) or class(es) holding the bug and its fix, where they
    are separate from the demo; ``picture`` and ``weights``: see ``Pitfall``.

    Taught in notebook 09, "Check against the package".
    """
    if name in PITFALLS:
        raise ValueError(f"pitfall {name!r} is already registered")

    def register(measure: Callable[..., Demo]) -> Callable[..., Demo]:
        @functools.wraps(measure)
        def demo(*args, **kwargs) -> Demo:
            return replace(measure(*args, **kwargs), name=name, title=title, notebook=notebook, symptom=symptom)

        PITFALLS[name] = Pitfall(name, title, notebook, symptom, demo, _as_tuple(broken), _as_tuple(fixed),
                                 picture, weights)
        return demo

    return register


def _as_tuple(code: Code) -> tuple[Callable, ...]:
    return code if isinstance(code, tuple) else (code,)


def run_all() -> list[Demo]:
    """Run every demonstration, in the order they are registered (numbered) here.

    Taught in notebook 09, "Check against the package".
    """
    return [p.demo() for p in PITFALLS.values()]
