"""The stated times are the estimate: every notebook's "**Time:**", its lessons' and optional sections' times, and
TEACHING.md's table and total, held against ``selfattn_lite.course.study_time``."""

import json
import re

import nbformat
import pytest
from helpers import NOTEBOOKS, ROOT

from selfattn_lite.course import study_time
from selfattn_lite.course.study_time import (
    COMMAND,
    EXERCISE_MINUTES,
    FIGURE_MINUTES,
    LINES_PER_MINUTE,
    RUN_SECONDS,
    TOLERANCE,
    TOLERANCE_MINUTES,
    WORDS_PER_MINUTE,
    count_words,
    estimate,
    estimate_cells,
    parse_stated,
    sections,
    stated,
    stated_times,
)

PARTS = {"Part I (01-10)": range(1, 11), "Part II (11-15)": range(11, 16), "Part III (16)": range(16, 17)}


def teaching_rows() -> dict[str, str]:
    """TEACHING.md's time table: {"NN": the stated time}."""
    text = (ROOT / "TEACHING.md").read_text()
    return dict(re.findall(r"^\| (\d\d) · [^|]+ \| ([^|]+?) \| \d+ \|$", text, re.M))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_each_stated_time_is_the_estimate_within_the_tolerance(path):
    parts, said = estimate(path), stated_times(path)
    assert set(said) == set(parts), (f"{path.name}: every lesson and optional section states its time "
                                     f"(stated {sorted(said)}, found {sorted(parts)})")
    for name, e in parts.items():
        minutes = parse_stated(said[name])
        assert abs(minutes - e.minutes) <= max(TOLERANCE * e.minutes, TOLERANCE_MINUTES), (
            f"{path.name}, {name}: states {said[name]!r}, the estimate is {e.minutes:.0f} minutes "
            f"({stated(e.minutes)}); `python -m selfattn_lite.course.study_time` prints how it is made")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_run_seconds_were_measured_for_every_notebook(path):
    record = json.loads(RUN_SECONDS.read_text())
    assert record["command"] == COMMAND and COMMAND in study_time.__doc__
    cells = record["notebooks"][path.stem]["cells"]
    code = {c.id for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"}
    assert set(cells) & code, f"{path.name}: no cell of it was measured; run {COMMAND} {path.stem[:2]}"


def test_teaching_guide_table_and_total_agree_with_the_notebooks():
    rows = teaching_rows()
    assert sorted(rows) == [p.stem[:2] for p in NOTEBOOKS]
    minutes = {nn: parse_stated(time) for nn, time in rows.items()}
    estimates = {p.stem[:2]: estimate(p)["notebook"].minutes for p in NOTEBOOKS}
    total_line = re.search(r"^Altogether (about [^:]+): (.+)\.$", (ROOT / "TEACHING.md").read_text(), re.M)
    assert total_line, "TEACHING.md: after the table, 'Altogether about N hours: Part I (01-10) about ..., ...'"
    assert total_line.group(1) == stated(sum(minutes.values()))
    assert abs(parse_stated(total_line.group(1)) - sum(estimates.values())) <= TOLERANCE * sum(estimates.values())
    for part, numbers in PARTS.items():
        said = re.search(re.escape(part) + r" (about [^,.]+)", total_line.group(2))
        assert said, f"TEACHING.md's total should name {part}"
        assert said.group(1) == stated(sum(m for nn, m in minutes.items() if int(nn) in numbers)), part


def test_teaching_guide_and_docstring_state_the_paces():
    guide = " ".join((ROOT / "TEACHING.md").read_text().split())
    doc = " ".join(study_time.__doc__.split())
    for phrase in (f"{WORDS_PER_MINUTE} words a minute", f"{LINES_PER_MINUTE} lines a minute",
                   f"{FIGURE_MINUTES} minutes per figure", f"{EXERCISE_MINUTES} minutes per exercise",
                   f"within {TOLERANCE:.0%}"):
        assert phrase in guide and phrase in doc, phrase


def test_counting():
    words, images = count_words("## Two words\n\n![a figure](../figures/x.png) see [the link text](https://x.y/z) "
                                "$q \\cdot k$ | a | b |\n|---|---|\n<!-- not read -->")
    assert (words, images) == (2 + 1 + 3 + 3 + 2, 1)          # heading, "see", link text, math, table cells
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("one two three"),
                nbformat.v4.new_code_cell("import os\n\nx = 1", metadata={"tags": ["colab-setup"]}),
                nbformat.v4.new_code_cell("a = 1\n\nb = 2\n"),
                nbformat.v4.new_code_cell("def f():\n    raise NotImplementedError", metadata={"tags": ["exercise"]}),
                nbformat.v4.new_code_cell("def f():\n    return 1", metadata={"tags": ["solution"]}),
                nbformat.v4.new_code_cell("def g():\n    raise NotImplementedError",
                                          metadata={"tags": ["exercise"], "study_minutes": 25})]
    nb.cells[2].id = "timed"
    nb.cells[2].outputs = [nbformat.v4.new_output("display_data", {"image/png": "", "text/plain": ""})]
    e = estimate_cells(nb.cells, {"timed": 30.0})
    assert (e.words, e.code_lines, e.figures, e.run_seconds, e.exercises) == (3, 6, 1, 30.0, 2)
    assert e.minutes == pytest.approx(3 / WORDS_PER_MINUTE + 6 / LINES_PER_MINUTE + FIGURE_MINUTES + 0.5
                                      + EXERCISE_MINUTES + 25)


def test_a_printed_listing_is_read_as_code():
    """A cell tagged ``listing`` prints source the learner reads: its printed lines count as code lines."""
    listing = nbformat.v4.new_code_cell("print(source)", metadata={"tags": ["listing"]})
    listing.outputs = [nbformat.v4.new_output("stream", name="stdout", text="def f(x):\n\n    return x\n")]
    plain = nbformat.v4.new_code_cell("print(source)")
    plain.outputs = listing.outputs
    assert estimate_cells([listing]).code_lines == 1 + 2 and estimate_cells([plain]).code_lines == 1


def test_stated_rounds_and_parses_back():
    assert [stated(m) for m in (0.2, 3.3, 9.6, 52, 112, 117, 118, 143, 165, 1500)] == [
        "about 1 minute", "about 3 minutes", "about 10 minutes", "about 50 minutes", "about 110 minutes",
        "about 115 minutes", "about 2 hours",
        "about 2½ hours", "about 3 hours", "about 25 hours"]
    for m in (1, 3, 5, 50, 115, 120, 150, 180):
        assert parse_stated(stated(m)) == m
    assert parse_stated("about 100 minutes (two sessions)") == 100
    with pytest.raises(ValueError, match="no time"):
        parse_stated("a while")


def test_sections_split_lessons_and_optional_parts():
    md = nbformat.v4.new_markdown_cell
    nb = nbformat.v4.new_notebook()
    nb.cells = [md("# 99 · T"), md("## Lesson 1 · A"), md("### x"), md("### Optional: deep (about 5 minutes)"),
                md("#### inside"), md("### y"), md("## Lesson 2 · B"), md("## Further reading")]
    parts = sections(nb)
    assert list(parts) == ["lesson 1", "lesson 2", "optional: deep"]
    assert [c.source for c in parts["lesson 1"]][0] == "# 99 · T"            # lesson 1 takes the opening cells
    assert [c.source for c in parts["optional: deep"]] == ["### Optional: deep (about 5 minutes)", "#### inside"]
    assert parts["lesson 2"][-1].source == "## Further reading"               # the last lesson runs to the end


def test_the_command_prints_the_table(capsys):
    rows = study_time.report(ROOT / "notebooks")
    out = capsys.readouterr().out
    assert f"{WORDS_PER_MINUTE} words/min" in out and "all notebooks:" in out
    assert {r["notebook"] for r in rows} == {p.stem for p in NOTEBOOKS}


def test_write_sets_every_stated_time_to_the_estimate(tmp_path):
    """``--write`` rewrites opening cells, lessons, optional headings and TEACHING.md; a suffix such as
    "(two sessions)" stays."""
    folder = tmp_path / "notebooks"
    folder.mkdir()
    picked = [p for p in NOTEBOOKS if p.stem[:2] in {"05", "08"}]
    for path in picked:
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                cell.source = re.sub(r"about \d+½? (minutes|hours)", "about 7 hours", cell.source)
        nbformat.write(nb, folder / path.name)
    rows = "\n".join(f"| {p.stem[:2]} · Title | about 9 hours | 0 |" for p in picked)
    teaching = tmp_path / "TEACHING.md"
    teaching.write_text(f"# Guide\n\n{rows}\n\nAltogether about 1 hour: Part I (01-10) about 1 hour, "
                        "Part II (11-15) about 1 hour, Part III (16) about 1 hour.\n")
    changed = study_time.write_stated(folder, teaching)
    assert changed == [p.stem for p in picked]
    for path in picked:
        parts, said = estimate(folder / path.name), stated_times(folder / path.name)
        assert set(said) == set(parts)
        for name, e in parts.items():
            assert said[name].startswith(stated(e.minutes)), (path.name, name, said[name])
    assert "(two sessions)" in stated_times(folder / picked[0].name)["notebook"]
    guide = teaching.read_text()
    minutes = [estimate(folder / p.name)["notebook"].minutes for p in picked]
    assert f"| 05 · Title | {stated_times(folder / picked[0].name)['notebook']} | 5 |" in guide
    total = sum(parse_stated(stated(m)) for m in minutes)
    assert f"Altogether {stated(total)}: Part I (01-10) {stated(total)}, Part II" in guide
    assert study_time.write_stated(folder, teaching) == []                    # a second run changes nothing
