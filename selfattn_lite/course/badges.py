"""Start in the cloud: Binder and Colab badges at the top of every notebook.

    python -m selfattn_lite.course.badges notebooks

puts, idempotently, into each ``NN_*.ipynb``:

* a line of badges right under the title of the first markdown cell (which keeps starting
  with ``# NN · Title``): "launch on Binder" and "open in Colab", both for that notebook;
* a second cell, a code cell tagged ``colab-setup``, that sets ``OMP_WAIT_POLICY=PASSIVE`` before
  torch is imported (whatever started the kernel: make, conda, Binder, Colab) and installs the
  course package when the notebook runs in Google Colab (without the triton extra: Colab keeps the torch and
  Triton it ships; notebook 15 runs without the kernel where that Triton is older than the course's minimum,
  ``triton_attention.TRITON_MIN``); it prints nothing;
* every exercise's solution cell (tagged ``solution``) collapsed (``metadata.jupyter.source_hidden``):
  JupyterLab (and so Binder) opens it folded under its stub, so a learner sees the exercise, not
  its answer, until they click it open (``make student`` removes the solutions altogether).

Running it twice changes nothing the second time. The repository the badges point at is
``REPO``, defined here only.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import nbformat

__all__ = ["REPO", "BRANCH", "binder_url", "colab_url", "badge_line", "COLAB_SETUP", "add_badges", "apply",
           "SOLUTION_TAG"]

# The GitHub repository "owner/name" the badges open. A placeholder until the course has its
# canonical public home: change it here (and only here), then re-run `make badges`.
REPO = "selfattn-course/selfattn-course"
BRANCH = "main"

BINDER_BADGE = "https://mybinder.org/badge_logo.svg"
COLAB_BADGE = "https://colab.research.google.com/assets/colab-badge.svg"
BADGE_MARK = "<!-- badges -->"
SETUP_TAG = "colab-setup"

COLAB_DIR = "/content/selfattn-course"

# The first code cell. Everywhere: idle OpenMP threads sleep instead of spinning, so that the CPU
# timings do not depend on how the kernel was started (`make lab` exports the same; a kernel from
# conda, Binder or Colab would not have it). OpenMP reads the variable once, when torch loads it:
# this cell runs before any import of torch. Colab opens one notebook alone: fetch the repository
# (the package, and the figures/ the notebooks read next to notebooks/), install the package, and
# work from notebooks/ as in the repository. Elsewhere that branch does not run.
COLAB_SETUP = f'''import os
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # before torch loads OpenMP: idle threads sleep, fair timings

if "google.colab" in sys.modules:   # only in Google Colab: fetch the course and install its package
    import subprocess

    if not os.path.isdir("{COLAB_DIR}"):
        subprocess.run(["git", "clone", "--quiet", "--depth", "1", "--branch", "{BRANCH}",
                        "https://github.com/{REPO}", "{COLAB_DIR}"], check=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "{COLAB_DIR}[explore]"],
                       check=True)
    os.chdir("{COLAB_DIR}/notebooks")'''


def binder_url(name: str) -> str:
    """Binder link that opens ``notebooks/<name>`` in JupyterLab."""
    return f"https://mybinder.org/v2/gh/{REPO}/{BRANCH}?urlpath=lab/tree/notebooks/{name}"


def colab_url(name: str) -> str:
    """Colab link that opens ``notebooks/<name>`` from GitHub."""
    return f"https://colab.research.google.com/github/{REPO}/blob/{BRANCH}/notebooks/{name}"


def badge_line(name: str) -> str:
    """The markdown line of badges for notebook file ``name`` (starts with ``BADGE_MARK``)."""
    return (f"{BADGE_MARK}[![Launch on Binder]({BINDER_BADGE})]({binder_url(name)}) "
            f"[![Open in Colab]({COLAB_BADGE})]({colab_url(name)})")


SOLUTION_TAG = "solution"


def _tags(cell) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def add_badges(nb: nbformat.NotebookNode, name: str) -> nbformat.NotebookNode:
    """Return a copy of ``nb`` with the badge line under its title and the Colab setup cell second.

    Args:
        nb: a course notebook; its first cell is markdown starting ``# NN · Title``.
        name: the notebook's file name (``01_scaled_dot_product_attention.ipynb``).
    """
    nb = nbformat.from_dict(nb)
    first = nb.cells[0] if nb.cells else None
    if first is None or first.cell_type != "markdown" or not first.source.startswith("# "):
        raise ValueError(f"{name}: the first cell must be markdown starting with '# NN · Title'")
    lines = [line for line in first.source.split("\n") if not line.startswith(BADGE_MARK)]
    lines.insert(1, badge_line(name))
    if len(lines) > 2 and lines[2].strip():        # a blank line between the badges and the text below
        lines.insert(2, "")
    first.source = "\n".join(lines)
    setup = [c for c in nb.cells if SETUP_TAG in _tags(c)]
    if setup:
        cell = setup[0]
        nb.cells = [c for c in nb.cells if c is not cell]
        cell.source = COLAB_SETUP
    else:
        cell = nbformat.v4.new_code_cell(COLAB_SETUP, metadata={"tags": [SETUP_TAG]})
        cell["id"] = "colab-setup"
    nb.cells.insert(1, cell)
    for c in nb.cells:
        if SOLUTION_TAG in _tags(c):
            c.metadata.setdefault("jupyter", {})["source_hidden"] = True
    return nb


def apply(folder: str | Path = "notebooks") -> list[Path]:
    """Add the badges to every ``NN_*.ipynb`` in ``folder``; return the files that changed."""
    changed = []
    for path in sorted(Path(folder).glob("[0-9][0-9]_*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        new = add_badges(nb, path.name)
        if new != nb:
            nbformat.validate(new)
            nbformat.write(new, path)
            changed.append(path)
    return changed


def has_badges(nb: nbformat.NotebookNode, name: str) -> bool:
    """True when ``nb`` carries this notebook's badge line and the Colab setup cell second."""
    return (badge_line(name) in nb.cells[0].source.split("\n") and len(nb.cells) > 1
            and SETUP_TAG in _tags(nb.cells[1]) and nb.cells[1].source == COLAB_SETUP
            and all(c.metadata.get("jupyter", {}).get("source_hidden") for c in nb.cells
                    if SOLUTION_TAG in _tags(c)))


BADGE_RE = re.compile(r"\[!\[([^\]]*)\]\([^)]*\)\]\(([^)]*)\)")


def as_text_links(markdown: str) -> str:
    """Badges (remote images) as plain links: for pages that must load nothing from the network."""
    return BADGE_RE.sub(lambda m: f"[{m.group(1)}]({m.group(2)})", markdown.replace(BADGE_MARK, ""))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m selfattn_lite.course.badges", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", nargs="?", default="notebooks",
                        help="folder of NN_*.ipynb to edit in place (default: notebooks)")
    for path in apply(parser.parse_args(argv).folder):
        print(f"badges added: {path}")


if __name__ == "__main__":
    main()
