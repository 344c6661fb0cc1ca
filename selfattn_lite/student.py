"""Student build: copies of the notebooks with the solutions removed.

    python -m selfattn_lite.student notebooks student

Every cell tagged ``solution`` is dropped and all outputs are cleared, so the
checkers report "Not attempted yet" until the learner fills in each exercise.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

__all__ = ["strip_solutions", "build"]

NOTE = ("> **Student edition.** Solutions are removed; each exercise's checker says "
        "\"Not attempted yet\" until you fill it in.")


def strip_solutions(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Return a copy of ``nb`` without ``solution`` cells and without outputs."""
    nb = nbformat.from_dict(nb)
    nb.cells = [c for c in nb.cells if "solution" not in c.get("metadata", {}).get("tags", [])]
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    nb.cells.insert(1, nbformat.v4.new_markdown_cell(NOTE))
    for i, cell in enumerate(nb.cells):  # ids must stay unique and valid
        cell["id"] = f"cell-{i:03d}"
    return nb


def build(src: str | Path = "notebooks", dst: str | Path = "student") -> list[Path]:
    """Write a student copy of every ``NN_*.ipynb`` in ``src`` to ``dst``."""
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    written = []
    for path in sorted(src.glob("[0-9][0-9]_*.ipynb")):
        nb = strip_solutions(nbformat.read(path, as_version=4))
        nbformat.validate(nb)
        out = dst / path.name
        nbformat.write(nb, out)
        written.append(out)
    return written


if __name__ == "__main__":
    src, dst = (sys.argv[1:3] + ["notebooks", "student"][len(sys.argv[1:3]):])
    for path in build(src, dst):
        print(path)
