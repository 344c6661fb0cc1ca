"""No course term before its definition: every term is defined (or linked to its definition) where first used.

``TERMS`` lists the course's terms with the notebook and cell that define them. Reading the notebooks in
the course's order (01, 02, ... 16; cells top to bottom), the first cell that uses a term must be its
defining cell or come after it, unless that earlier cell links to the defining notebook (its file name,
or "notebook NN"). A use is a match of the term's pattern in a markdown cell or in a code comment.
"""

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


@dataclass(frozen=True)
class Term:
    name: str
    pattern: str          # a regular expression, matched case-sensitively
    notebook: str         # "06": the notebook that defines the term
    cell: str             # the id of the cell that defines it


TERMS = [
    Term("fused kernel", r"\bfused\b", "01", "6b6b6bdd"),
    Term("SDPA backends: flash", r"\bflash\b|FlashAttention", "01", "a01kern1"),
    Term("SDPA backends: memory-efficient", r"memory-efficient", "01", "a01kern1"),
    Term("SDPA backends: cuDNN", r"cuDNN", "01", "a01kern1"),
    Term("bf16", r"\bbf16\b|bfloat16", "01", "a01kern1"),
    Term("tensor cores", r"[Tt]ensor cores?", "01", "a01kern1"),
    Term("residual stream", r"\b[Rr]esidual", "06", "b06blk01"),
    Term("pre-norm", r"\b[Pp]re-norm", "06", "b06blk01"),
    Term("RMSNorm", r"RMSNorm", "06", "b06blk01"),
    Term("nats (entropy with the natural log)", r"\bnats\b", "01", "cef27270"),
    Term("nats per character", r"\bnats? per char", "06", "174b0620"),
    Term("multi-head latent attention", r"\bMLA\b|latent attention", "06", "af43fb01"),
    Term("cross-layer sharing", r"[Cc]ross-layer", "06", "af43fb01"),
    Term("principal angles", r"[Pp]rincipal angles?", "07", "b7c1a0e1"),
    Term("QR factorisation", r"\bQR\b", "07", "b7c1a0e1"),
    Term("SVD", r"\bSVD\b|singular value", "07", "b7c1a0e1"),
]


def comments(code: str) -> str:
    """The comments of a code cell (what follows a '#' on each line)."""
    return "\n".join(line.split("#", 1)[1] for line in code.splitlines() if "#" in line)


def course_cells(folder: Path = NOTEBOOKS) -> list[tuple[str, str, str]]:
    """(notebook number, cell id, text a reader reads) for every cell of every notebook, in course order."""
    cells = []
    for path in sorted(folder.glob("[0-9][0-9]_*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            text = "".join(cell["source"])
            cells.append((path.name[:2], cell.get("id", ""), text if cell["cell_type"] == "markdown" else comments(text)))
    return cells


def links_to(text: str, notebook: str, folder: Path = NOTEBOOKS) -> bool:
    """Whether a cell's text points the reader at notebook ``notebook``."""
    names = [p.name for p in folder.glob(f"{notebook}_*.ipynb")]
    return any(name in text for name in names) or re.search(rf"\bnotebooks? {notebook}\b", text) is not None


def violations(terms, cells, folder: Path = NOTEBOOKS) -> list[str]:
    """One line per term used before its definition, or whose defining cell does not use it."""
    order = {(nb, cid): i for i, (nb, cid, _) in enumerate(cells)}
    found = []
    for term in terms:
        where = order.get((term.notebook, term.cell))
        if where is None:
            found.append(f"{term.name}: no cell {term.cell} in notebook {term.notebook}")
            continue
        if not re.search(term.pattern, cells[where][2]):
            found.append(f"{term.name}: its defining cell {term.notebook}/{term.cell} does not use it")
        for nb, cid, text in cells[:where]:
            if re.search(term.pattern, text) and not links_to(text, term.notebook, folder):
                found.append(f"{term.name}: used in {nb}/{cid} before its definition in {term.notebook}/{term.cell}")
                break
    return found


def test_every_term_is_defined_where_first_used():
    assert violations(TERMS, course_cells()) == []


@pytest.mark.parametrize("text, ok", [
    ("a fused kernel, built in notebook 01", True),                 # a link to the definition
    ("see [01](01_scaled_dot_product_attention.ipynb) for fused kernels", True),
    ("a fused kernel", False),                                      # a bare use before the definition
])
def test_a_use_before_the_definition_is_caught(text, ok):
    early = [("00", "planted", text)]
    assert (violations(TERMS[:1], early + course_cells()) == []) is ok


def test_a_stale_definition_is_caught():
    moved = [Term("fused kernel", r"\bfused\b", "01", "no-such-cell"),
             Term("QR factorisation", r"\bQR\b", "01", "6b6b6bdd")]
    found = violations(moved, course_cells())
    assert found == ["fused kernel: no cell no-such-cell in notebook 01",
                     "QR factorisation: its defining cell 01/6b6b6bdd does not use it"]
