"""Figures for the notebooks' markdown, regenerated from code: ``python -m selfattn_lite.course.figures``.

Each module in this package defines ``FIGURES``: a dict of file name -> function
``draw() -> matplotlib.figure.Figure``. ``make_all(outdir)`` writes every one of them
as a PNG (metadata stripped, so rebuilding gives the same bytes on the same machine).
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

__all__ = ["collect", "make_all"]


def collect() -> dict:
    """All figures of all modules of this package: file name -> draw function."""
    figures = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for name, draw in getattr(module, "FIGURES", {}).items():
            if name in figures:
                raise ValueError(f"figure {name} is defined twice")
            figures[name] = draw
    return figures


def make_all(outdir: str | Path = "figures") -> list[Path]:
    """Draw every figure into ``outdir``; returns the paths written."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, draw in collect().items():
        fig = draw()
        path = outdir / name
        fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
        written.append(path)
    return written
