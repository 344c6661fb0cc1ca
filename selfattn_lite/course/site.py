"""The course as a static, offline website.

    python -m selfattn_lite.course.site [OUT]          # what `make site` runs; OUT defaults to _site

stages ``OUT/src``: every numbered notebook with its committed outputs (never executed), the
figures they show, ``site/`` (Sphinx configuration, the explorer page and its script), a home page
with the syllabus (title and time of each notebook, read from its opening cell) and the explorer's
precomputed weights; then builds ``OUT/html`` with Sphinx, MyST-NB and the book theme. Open
``OUT/html/index.html``: math (MathJax, served from the site), figures, search and the explorer
all work without a network.

On the way, what would load from the network is made local: the notebooks' Binder/Colab badges
(remote images) become text links, and a widget output (which needs a running kernel) becomes a
short note; the static picture next to every widget is an ordinary output and stays.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat

from .badges import as_text_links

__all__ = ["ROOT", "notebook_info", "prepare_notebook", "index_page", "stage", "build"]

ROOT = Path(__file__).resolve().parents[2]  # the repository: selfattn_lite/course/site.py
WIDGET = "application/vnd.jupyter.widget-view+json"
WIDGET_NOTE = ("<p class=\"widget-note\"><em>Interactive widget: it runs in Jupyter (make lab, Binder or Colab). "
               "The static figure beside it shows the same view.</em></p>")


def notebook_info(path: Path) -> dict:
    """Number, title and time of a notebook, from its opening cell ``# NN · Title ... **Time:** ...``."""
    first = nbformat.read(path, as_version=4).cells[0].source
    title = first.split("\n", 1)[0].lstrip("# ").strip()
    time = re.search(r"\*\*Time:?\*\*:?\s*(.+)", first)
    return {"stem": path.stem, "number": int(path.stem[:2]), "title": title,
            "time": time.group(1).strip().rstrip(".") if time else ""}


def prepare_notebook(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A copy for the website: badges as text links, widget outputs as a note, no widget state."""
    nb = nbformat.from_dict(nb)
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = as_text_links(cell.source)
        for out in cell.get("outputs", []):
            if WIDGET in out.get("data", {}):
                out["data"] = {"text/html": WIDGET_NOTE}
    return nb


def index_page(infos: list[dict]) -> str:
    """The home page: what the course is, the syllabus table, the navigation."""
    rows = "\n".join(f"| {i['number']:02d} | [{i['title'].split('·', 1)[-1].strip()}](notebooks/{i['stem']}) "
                     f"| {i['time']} |" for i in infos)
    parts = [("Part I", [i for i in infos if i["number"] <= 10]),
             ("Part II (advanced)", [i for i in infos if 10 < i["number"] <= 15]),
             ("Part III", [i for i in infos if i["number"] > 15])]
    toctrees = "\n".join(
        f"```{{toctree}}\n:caption: {caption}\n:maxdepth: 1\n\n" + "\n".join(f"notebooks/{i['stem']}" for i in items)
        + "\n```\n" for caption, items in parts if items)
    return f"""# selfattn-course

An interactive course on self-attention, from softmax(QK^T/√d_k)V to the KV cache, grouped-query
attention and FlashAttention. Every number, table and figure on these pages was produced by code
that the course's tests execute; here you read the notebooks as they were run. To run them
yourself, use the Binder or Colab links at the top of each notebook, or clone the repository and
`make lab`.

## Syllabus

| # | notebook | time |
|---|---|---|
{rows}

The [attention explorer](explorer) shows every head of a real pretrained encoder and of the
course's tiny decoder, in the page, without a kernel.

{toctrees}
```{{toctree}}
:caption: Tools
:maxdepth: 1

explorer
```
"""


def stage(out: str | Path = "_site", root: str | Path = ROOT, explorer_data: bool = True) -> Path:
    """Write the Sphinx source folder ``out/src``; return it."""
    from . import explorer_data as data

    out, root = Path(out), Path(root)
    src = out / "src"
    if src.exists():
        shutil.rmtree(src)
    shutil.copytree(root / "site", src)
    shutil.copytree(root / "figures", src / "figures")
    (src / "notebooks").mkdir()
    paths = sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    for path in paths:
        nbformat.write(prepare_notebook(nbformat.read(path, as_version=4)), src / "notebooks" / path.name)
    (src / "index.md").write_text(index_page([notebook_info(p) for p in paths]))
    if explorer_data:
        data.write(src / "_static")
    return src


def build(out: str | Path = "_site", root: str | Path = ROOT) -> Path:
    """Stage and build the site; return the path of its ``index.html``."""
    out = Path(out)
    src = stage(out, root)
    html = out / "html"
    result = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", "-W", "--keep-going",
                             "-d", str(out / "doctrees"), str(src), str(html)], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"sphinx-build failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return html / "index.html"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m selfattn_lite.course.site", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", default="_site", help="output folder (default: _site)")
    print(build(parser.parse_args(argv).out))


if __name__ == "__main__":
    main()
