"""Student build: copies of the notebooks with the solutions removed.

    python -m selfattn_lite.course.student notebooks student

Every cell tagged ``solution`` is dropped (nbconvert's ``TagRemovePreprocessor``) and all
outputs are cleared (``ClearOutputPreprocessor``), so the checkers report "Not attempted
yet" until the learner fills in each exercise.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import nbformat
from nbconvert.preprocessors import ClearOutputPreprocessor, TagRemovePreprocessor

__all__ = ["strip_solutions", "build"]

NOTE = ("> **Student edition.** Solutions are removed; each exercise's checker says "
        "\"Not attempted yet\" until you fill it in.")


def strip_solutions(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Return a copy of ``nb`` without ``solution`` cells and without outputs, with a note on top."""
    nb = nbformat.from_dict(nb)
    for preprocessor in (TagRemovePreprocessor(remove_cell_tags={"solution"}), ClearOutputPreprocessor()):
        nb, _ = preprocessor.preprocess(nb, {})
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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m selfattn_lite.course.student",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("src", nargs="?", default="notebooks", help="folder of NN_*.ipynb (default: notebooks)")
    parser.add_argument("dst", nargs="?", default="student", help="folder to write them to (default: student)")
    args = parser.parse_args(argv)
    for path in build(args.src, args.dst):
        print(path)


if __name__ == "__main__":
    main()
