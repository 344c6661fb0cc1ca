"""The shape every notebook shares (DESIGN.md), checked on the committed files.

nbval executes the notebooks and compares their outputs; these checks cover what it does not:
the syllabus, the opening cell, a static figure next to every widget, the closing timing cell.
"""

import re

import nbformat
import pytest
from helpers import NOTEBOOKS, ROOT

SYLLABUS = [
    "01_scaled_dot_product_attention", "02_worked_numeric_example", "03_masks_and_cross_attention",
    "04_multi_head_attention", "05_positional_information", "06_kv_cache", "07_mqa_and_gqa",
    "08_efficient_attention", "09_common_pitfalls", "10_attention_in_the_wild",
    # Part II
    "11_backward_and_training", "12_context_extension", "13_serving_the_cache",
    "14_attention_across_devices", "15_flashattention_in_triton",
    # Part III
    "16_attention_vs_state",
]
WIDGET = "application/vnd.jupyter.widget-view+json"


def load(path):
    return nbformat.read(path, as_version=4)


def code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]


def test_notebooks_follow_the_syllabus():
    names = [p.stem for p in NOTEBOOKS]
    assert names == [n for n in SYLLABUS if n in names], "notebook names must match DESIGN.md's syllabus"
    assert set(names) <= set(SYLLABUS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_opening_cell_says_what_how_long_and_what_first(path):
    nb = load(path)
    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith(f"# {path.stem[:2]} · ")
    for needed in ("What you will learn", "Prerequisites", "Time"):
        assert needed in first.source, f"{path.name}: the opening cell should say '{needed}'"
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_outputs_come_from_one_clean_run(path):
    cells = code_cells(load(path))
    counts = [c.execution_count for c in cells]
    assert counts == list(range(1, len(cells) + 1)), f"{path.name}: restart and run all, then commit"
    for c in cells:
        for out in c.outputs:
            assert out.output_type != "error", f"{path.name}: an error output is committed"
            if out.output_type == "stream" and out.name == "stderr":
                assert "Warning" not in out.text and "Error" not in out.text, f"{path.name}: {out.text[:200]}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_widget_has_a_static_figure_next_to_it(path):
    cells = code_cells(load(path))
    for i, cell in enumerate(cells):
        if any(WIDGET in out.get("data", {}) for out in cell.outputs):
            nearby = cells[max(0, i - 2): i + 1]
            assert any("image/png" in out.get("data", {}) for c in nearby for out in c.outputs), (
                f"{path.name}: the widget in code cell {i + 1} has no static figure in it or just before it")
            assert "nbval-ignore-output" in cell.metadata.get("tags", []), f"{path.name}: widget cell {i + 1} untagged"
            assert "assert" in cell.source, f"{path.name}: widget cell {i + 1} should assert what it shows"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_last_code_cell_times_against_sdpa_and_asserts(path):
    last = code_cells(load(path))[-1]
    assert "bench." in last.source, f"{path.name}: the last cell should time with selfattn_lite.course.bench"
    assert "nbval-ignore-output" in last.metadata.get("tags", [])


# One entry of Further reading: "Authors (Year). Title. Venue or arXiv id."
REFERENCE = re.compile(r"^- (?P<authors>[^()]+?) \((?P<year>(?:19|20)\d\d)\)\. (?P<title>.+?)[.?!] (?P<venue>.+?)\.?$")


def further_reading(nb):
    """(index, cell) of the markdown cell starting '## Further reading', or (None, None)."""
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown" and cell.source.startswith("## Further reading"):
            return i, cell
    return None, None


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_further_reading_lists_primary_sources_before_the_timing(path):
    nb = load(path)
    i, cell = further_reading(nb)
    assert cell is not None, f"{path.name}: add a markdown cell starting '## Further reading'"
    entries = []                                    # one entry per list item, its wrapped lines joined
    for line in cell.source.splitlines():
        if line.startswith("- "):
            entries.append(line)
        elif entries and line.startswith("  ") and line.strip():
            entries[-1] += " " + line.strip()
    assert entries, f"{path.name}: Further reading lists no source ('- Authors (Year). Title. Venue.')"
    for entry in entries:
        assert REFERENCE.match(entry), f"{path.name}: write '- Authors (Year). Title. Venue or arXiv id.': {entry}"
    code = [k for k, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.strip()]
    exercises = [k for k, c in enumerate(nb.cells) if {"exercise", "solution"} & set(c.metadata.get("tags", []))]
    assert i < code[-1], f"{path.name}: Further reading goes before the closing timing cell"
    assert not exercises or i > max(exercises), f"{path.name}: Further reading goes after the exercises"


def test_further_reading_format_is_checked():
    good = "- Vaswani, A., et al. (2017). Attention Is All You Need. NeurIPS 2017, arXiv:1706.03762."
    assert REFERENCE.match(good)
    assert REFERENCE.match("- Brody, S., Alon, U., Yahav, E. (2022). How Attentive are Graph Attention Networks? "
                           "ICLR 2022, arXiv:2105.14491.")
    for bad in ("- Attention Is All You Need (Vaswani, 2017)", "- Vaswani et al. 2017. Attention.",
                "- Vaswani et al. (2017) Attention Is All You Need"):
        assert not REFERENCE.match(bad), bad


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_teaching_guide_lists_each_notebooks_time_and_exercises(path):
    nb = load(path)
    title = nb.cells[0].source.splitlines()[0].lstrip("# ").strip()
    time = re.search(r"\*\*Time:?\*\*:?\s*([^\n.]*)", nb.cells[0].source).group(1).strip()
    n_exercises = sum("exercise" in c.metadata.get("tags", []) for c in nb.cells)
    row = f"| {title} | {time} | {n_exercises} |"
    assert row in (ROOT / "TEACHING.md").read_text(), f"TEACHING.md's time table should have the row {row}"
