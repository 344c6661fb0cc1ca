"""How long a notebook takes to work through: estimated from what it holds, its run time measured.

    python -m selfattn_lite.course.study_time [FOLDER]               # the table for every notebook
    python -m selfattn_lite.course.study_time --measure 07 08 [FOLDER]  # re-measure run times (all if none named)
    python -m selfattn_lite.course.study_time --write [FOLDER]       # set every stated time to its estimate

The estimate of one notebook, in minutes, is

    minutes = words / WORDS_PER_MINUTE             the prose: every markdown cell, math and tables included
            + code lines / LINES_PER_MINUTE        every non-blank line of the code cells a learner reads, and
                                                   of the printed listings (outputs of a cell tagged ``listing``)
            + figures * FIGURE_MINUTES             every image, in the markdown or among the outputs
            + run seconds / 60                     the cells' execution, measured (RUN_SECONDS)
            + exercises * EXERCISE_MINUTES         per exercise cell, or its ``study_minutes`` metadata

with the paces of technical reading: 100 words a minute for prose with math, 15 lines a minute for code
(four seconds a line), 0.5 minutes per figure, 10 minutes per exercise (write a short function, run
its checker, fix what it names). Solutions (cells tagged ``solution``) are not read, they are written:
the exercise's allowance covers them; the Colab setup cell (``colab-setup``) is not counted. A word is
a whitespace-separated token with a letter or a digit in it; a link counts its text, not its address.

The stated time ("**Time:** about 75 minutes" in each opening cell, the same in TEACHING.md) is the
estimate rounded as ``stated`` does: to the minute below 10 minutes, to 5 below two hours, to half an
hour above. tests/course/test_study_time.py holds every stated time within 20% of the estimate
(TOLERANCE), or within a minute of it (TOLERANCE_MINUTES, for short sections). A
notebook in lessons (markdown headings "## Lesson N · ...") is estimated per lesson too, its opening
cell naming each lesson's time; an optional section (a heading "## Optional: ... (about N minutes)",
up to the next heading of its level or above) states its own.

The run seconds come from one execution of each notebook with nbclient (what ``jupyter nbconvert
--execute`` runs), in a fresh kernel, read back from the cell timings nbclient records; nothing is
written to the notebook. ``--measure`` re-measures and rewrites RUN_SECONDS
(``selfattn_lite/data/run_seconds.json``), recording the machine it ran on. ``--write`` sets every
stated time (opening cells, lessons, optional headings, TEACHING.md's table and total) to its estimate,
keeping what follows a time (" (two sessions)").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import nbformat

__all__ = ["WORDS_PER_MINUTE", "LINES_PER_MINUTE", "FIGURE_MINUTES", "EXERCISE_MINUTES", "TOLERANCE",
           "TOLERANCE_MINUTES", "RUN_SECONDS", "Estimate", "count_words", "estimate", "estimate_cells", "sections",
           "stated", "parse_stated", "stated_times", "measure", "report", "write_stated", "main"]

WORDS_PER_MINUTE = 100      # technical prose with math and tables
LINES_PER_MINUTE = 15       # code read, not written: four seconds a line
FIGURE_MINUTES = 0.5        # look at one figure: what its title says to see
EXERCISE_MINUTES = 10       # one exercise: write it, run its checker, fix what it names
TOLERANCE = 0.20            # a stated time within 20% of the estimate,
TOLERANCE_MINUTES = 1.0     # or within a minute of it (a short section)

ROOT = Path(__file__).resolve().parents[2]
RUN_SECONDS = Path(__file__).resolve().parents[1] / "data" / "run_seconds.json"
COMMAND = "python -m selfattn_lite.course.study_time --measure"
SKIPPED_TAGS = {"solution", "colab-setup"}

WORD = re.compile(r"\w")
LINK = re.compile(r"(!?)\[([^\]]*)\]\([^)]*\)")             # ![alt](path) or [text](url)
HTML_COMMENT = re.compile(r"<!--.*?-->", re.S)
HEADING = re.compile(r"^(#{1,6})\s+(.*)$")
TIME_PHRASE = r"about \d+½? (?:minutes?|hours?)"


@dataclass
class Estimate:
    """What a notebook (or a part of it) holds, and the minutes it takes."""

    words: int = 0
    code_lines: int = 0
    figures: int = 0
    run_seconds: float = 0.0
    exercises: int = 0
    exercise_minutes: float = 0.0

    @property
    def minutes(self) -> float:
        """words / WORDS_PER_MINUTE + lines / LINES_PER_MINUTE + figures * FIGURE_MINUTES + run s / 60 + exercises."""
        return (self.words / WORDS_PER_MINUTE + self.code_lines / LINES_PER_MINUTE
                + self.figures * FIGURE_MINUTES + self.run_seconds / 60 + self.exercise_minutes)

    def __add__(self, other: Estimate) -> Estimate:
        return Estimate(self.words + other.words, self.code_lines + other.code_lines, self.figures + other.figures,
                        self.run_seconds + other.run_seconds, self.exercises + other.exercises,
                        self.exercise_minutes + other.exercise_minutes)


def count_words(markdown: str) -> tuple[int, int]:
    """(words, images) of one markdown cell's source: links count their text, images count as figures."""
    text = HTML_COMMENT.sub(" ", markdown)
    images = sum(1 for m in LINK.finditer(text) if m.group(1))
    text = LINK.sub(lambda m: " " if m.group(1) else m.group(2), text)
    return sum(1 for token in text.split() if WORD.search(token)), images


def _tags(cell) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", []))


def estimate_cells(cells, run_seconds: dict | None = None) -> Estimate:
    """The estimate of a list of cells; ``run_seconds`` maps a code cell's id to its measured seconds."""
    run_seconds = run_seconds or {}
    total = Estimate()
    for cell in cells:
        tags = _tags(cell)
        if cell.cell_type == "markdown":
            words, images = count_words(cell.source)
            total += Estimate(words=words, figures=images)
            continue
        if cell.cell_type != "code" or SKIPPED_TAGS & tags:
            continue
        images = sum("image/png" in out.get("data", {}) or "image/svg+xml" in out.get("data", {})
                     for out in cell.get("outputs", []))
        lines = sum(1 for line in cell.source.splitlines() if line.strip())
        if "listing" in tags:                       # the cell prints source code the learner reads
            lines += sum(1 for out in cell.get("outputs", []) if out.get("output_type") == "stream"
                         for line in "".join(out.get("text", "")).splitlines() if line.strip())
        part = Estimate(code_lines=lines, figures=images, run_seconds=run_seconds.get(cell.get("id"), 0.0))
        if "exercise" in tags:
            part += Estimate(exercises=1,
                             exercise_minutes=float(cell.metadata.get("study_minutes", EXERCISE_MINUTES)))
        total += part
    return total


def _run_record(stem: str, record: dict | None) -> dict:
    if record is None:
        record = json.loads(RUN_SECONDS.read_text()) if RUN_SECONDS.exists() else {"notebooks": {}}
    return record["notebooks"].get(stem, {}).get("cells", {})


def sections(nb) -> dict[str, list]:
    """The cells of each lesson and of each optional section, by heading.

    Lessons start at a markdown cell whose heading begins "Lesson N"; lesson 1 also takes the cells
    before it (the opening cell, the imports), the last lesson the cells after it. An optional section
    starts at a heading "Optional: ..." and runs to the next heading of its level or above.
    Returns {"lesson 1": cells, ..., "optional: <title>": cells}; empty when there are neither.
    """
    headings = []                                   # (index, level, title)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            match = HEADING.match(cell.source.split("\n", 1)[0])
            if match:
                headings.append((i, len(match.group(1)), match.group(2).strip()))
    out = {}
    lessons = [(i, title) for i, _, title in headings if re.match(r"Lesson \d+\b", title)]
    for k, (i, title) in enumerate(lessons):
        start = 0 if k == 0 else i
        stop = lessons[k + 1][0] if k + 1 < len(lessons) else len(nb.cells)
        number = re.match(r"Lesson (\d+)", title).group(1)
        out[f"lesson {number}"] = nb.cells[start:stop]
    for n, (i, level, title) in enumerate(headings):
        if title.startswith("Optional:"):
            stop = next((j for j, lv, _ in headings[n + 1:] if lv <= level), len(nb.cells))
            name = re.sub(r"\s*\(about [^)]*\)$", "", title[len("Optional:"):]).strip()
            out[f"optional: {name}"] = nb.cells[i:stop]
    return out


def estimate(path: Path, record: dict | None = None) -> dict[str, Estimate]:
    """{"notebook": its estimate, plus one per lesson and optional section (see ``sections``)}."""
    nb = nbformat.read(path, as_version=4)
    seconds = _run_record(Path(path).stem, record)
    out = {"notebook": estimate_cells(nb.cells, seconds)}
    out.update({name: estimate_cells(cells, seconds) for name, cells in sections(nb).items()})
    return out


def stated(minutes: float) -> str:
    """The phrase a notebook states: "about N minutes" (to the minute below 10, to 5 below two hours),
    "about N½ hours" (to the half hour) above."""
    if minutes < 9.5:
        n = max(1, round(minutes))
        return f"about {n} minute{'s' if n > 1 else ''}"
    if minutes < 117.5:
        return f"about {5 * round(minutes / 5)} minutes"
    halves = round(minutes / 30)
    whole, half = divmod(halves, 2)
    return f"about {whole}{'½' if half else ''} hours"


def parse_stated(text: str) -> float:
    """Minutes in a stated time: "about 75 minutes", "about 2½ hours", "about 3 hours" (the first one)."""
    match = re.search(r"(\d+)(½)?\s*(minutes?|hours?)", text)
    if not match:
        raise ValueError(f"no time in {text!r}: write 'about N minutes' or 'about N hours'")
    value = int(match.group(1)) + (0.5 if match.group(2) else 0)
    return value * 60 if match.group(3).startswith("hour") else value


def stated_times(path: Path) -> dict[str, str]:
    """What a notebook states: {"notebook": the opening cell's "**Time:**" up to its first period,
    "lesson N": "(about N minutes)" after "Lesson N" in the opening cell, "optional: <title>": its heading's}."""
    nb = nbformat.read(path, as_version=4)
    first = nb.cells[0].source
    out = {"notebook": re.search(r"\*\*Time:?\*\*:?\s*([^\n.]*)", first).group(1).strip()}
    for number, text in re.findall(r"Lesson (\d+)\b[^\n]*?\((about \d+½? (?:minutes?|hours?))\)", first):
        out[f"lesson {number}"] = text
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            match = re.match(r"#{1,6}\s+Optional:\s*(.*?)\s*\((about [^)]*)\)\s*$", cell.source.split("\n", 1)[0])
            if match:
                out[f"optional: {match.group(1)}"] = match.group(2)
    return out


def _cell_seconds(cell) -> float:
    timing = cell.metadata.get("execution", {})
    start, end = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
    if not (start and end):
        return 0.0
    parse = lambda s: datetime.fromisoformat(s.replace("Z", "+00:00"))   # noqa: E731
    return max(0.0, (parse(end) - parse(start)).total_seconds())


def _notebooks(folder: Path, which=None) -> list[Path]:
    paths = sorted(Path(folder).glob("[0-9][0-9]_*.ipynb"))
    if which:
        paths = [p for p in paths if p.stem[:2] in {w[:2] for w in which} or p.stem in which]
    return paths


def measure(folder: Path = ROOT / "notebooks", which=None, out: Path = RUN_SECONDS) -> dict:
    """Execute each notebook once in a fresh kernel (in memory: the file is not touched), record
    every code cell's seconds, and merge them into ``out``. Returns the record."""
    from nbclient import NotebookClient

    record = json.loads(out.read_text()) if out.exists() else {"notebooks": {}}
    for path in _notebooks(folder, which):
        nb = nbformat.read(path, as_version=4)
        client = NotebookClient(nb, timeout=3600, kernel_name="python3", record_timing=True, allow_errors=True,
                                resources={"metadata": {"path": str(path.parent)}})
        start = time.perf_counter()
        client.execute()                            # a failing cell (a timing assert on a loaded machine) is
        wall = time.perf_counter() - start          # still timed; it is named below
        cells = {c.id: round(_cell_seconds(c), 2) for c in nb.cells if c.cell_type == "code"}
        failed = [c.id for c in nb.cells if any(o.get("output_type") == "error" for o in c.get("outputs", []))]
        if failed:
            print(f"{path.stem}: cells {', '.join(failed)} raised (timed all the same)", flush=True)
        record["notebooks"][path.stem] = {"wall_seconds": round(wall, 1),
                                          "cell_seconds": round(sum(cells.values()), 1), "cells": cells}
        print(f"{path.stem}: {wall:.1f} s ({sum(cells.values()):.1f} s in its cells)", flush=True)
        record["command"] = COMMAND
        record["machine"] = (f"{platform.machine()}, {os.cpu_count()} CPU cores; measured on a machine shared "
                             "with other work, so the seconds are an upper bound for an idle one")
        record["notebooks"] = dict(sorted(record["notebooks"].items()))
        out.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")   # after each notebook
    return record


def report(folder: Path = ROOT / "notebooks") -> list[dict]:
    """Print the table for every notebook in ``folder``; return its rows."""
    record = json.loads(RUN_SECONDS.read_text()) if RUN_SECONDS.exists() else {"notebooks": {}}
    print(f"prose at {WORDS_PER_MINUTE} words/min, code at {LINES_PER_MINUTE} lines/min, "
          f"{FIGURE_MINUTES} min per figure, {EXERCISE_MINUTES} min per exercise (unless its cell says), "
          f"run time measured ({record.get('machine', 'not measured')})")
    header = (f"{'notebook':<32} {'words':>6} {'lines':>6} {'figs':>5} {'run s':>6} {'ex':>3} {'min':>6}"
              "  stated (estimate)")
    print(header + "\n" + "-" * len(header))
    rows = []
    for path in _notebooks(folder):
        parts = estimate(path, record)
        said = stated_times(path)
        for name, e in parts.items():
            label = path.stem if name == "notebook" else f"  {name}"
            print(f"{label[:32]:<32} {e.words:>6} {e.code_lines:>6} {e.figures:>5} {e.run_seconds:>6.0f} "
                  f"{e.exercises:>3} {e.minutes:>6.0f}  {said.get(name, '-')} ({stated(e.minutes)})")
            rows.append({"notebook": path.stem, "part": name, "minutes": e.minutes,
                         "stated": said.get(name), "estimate": stated(e.minutes)})
    for part, low, high in (("Part I", 1, 10), ("Part II", 11, 15), ("Part III", 16, 99)):
        minutes = sum(r["minutes"] for r in rows if r["part"] == "notebook" and low <= int(r["notebook"][:2]) <= high)
        if minutes:
            print(f"{part}: {minutes / 60:.1f} hours ({stated(minutes)})")
    total = sum(r["minutes"] for r in rows if r["part"] == "notebook")
    print(f"all notebooks: {total / 60:.1f} hours ({stated(total)})")
    return rows


def _set_times(path: Path) -> bool:
    """Rewrite one notebook's stated times to its estimates; True when something changed."""
    nb = nbformat.read(path, as_version=4)
    parts = estimate(path)
    said = {name: stated(e.minutes) for name, e in parts.items()}
    first = nb.cells[0].source
    new = re.sub(r"(\*\*Time:?\*\*:?\s*)" + TIME_PHRASE, lambda m: m.group(1) + said["notebook"], first, count=1)
    new = re.sub(r"(Lesson (\d+)\b[^\n]*?\()" + TIME_PHRASE + r"(\))",
                 lambda m: m.group(1) + said[f"lesson {m.group(2)}"] + m.group(3), new)
    new = re.sub(r"(lesson (\d+) )" + TIME_PHRASE, lambda m: m.group(1) + said[f"lesson {m.group(2)}"], new)
    changed = new != first
    nb.cells[0].source = new
    for cell in nb.cells[1:]:
        if cell.cell_type != "markdown":
            continue
        head = cell.source.split("\n", 1)[0]
        match = re.match(r"(#{1,6}\s+Optional:\s*(.*?)\s*\()about [^)]*(\)\s*)$", head)
        if match:
            line = match.group(1) + said[f"optional: {match.group(2)}"] + match.group(3)
            if line != head:
                cell.source, changed = line + cell.source[len(head):], True
    if changed:
        nbformat.write(nb, path)
    return changed


def write_stated(folder: Path = ROOT / "notebooks", teaching: Path = ROOT / "TEACHING.md") -> list[str]:
    """Set every notebook's stated times to its estimates, then TEACHING.md's rows and total to the
    notebooks' opening cells. Returns the names of the notebooks whose times changed."""
    changed = [path.stem for path in _notebooks(folder) if _set_times(path)]
    text = teaching.read_text()
    minutes = {}
    for path in _notebooks(folder):
        nn, phrase = path.stem[:2], stated_times(path)["notebook"]
        minutes[int(nn)] = parse_stated(phrase)
        exercises = estimate(path)["notebook"].exercises
        text = re.sub(rf"^(\| {nn} · [^|]+ \| )[^|]+?( \| )\d+( \|)$",
                      lambda m, p=phrase, x=exercises: f"{m.group(1)}{p}{m.group(2)}{x}{m.group(3)}", text, flags=re.M)
    parts = ", ".join(f"{name} {stated(sum(m for n, m in minutes.items() if low <= n <= high))}"
                      for name, low, high in (("Part I (01-10)", 1, 10), ("Part II (11-15)", 11, 15),
                                              ("Part III (16)", 16, 99)))
    text = re.sub(r"^Altogether about [^:]+: .+\.$", f"Altogether {stated(sum(minutes.values()))}: {parts}.", text,
                  flags=re.M)
    teaching.write_text(text)
    return changed


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m selfattn_lite.course.study_time",
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("folder", nargs="?", default="notebooks", help="folder of NN_*.ipynb")
    parser.add_argument("--measure", nargs="*", metavar="NN", default=None,
                        help="execute these notebooks (all when none is named) and record their run seconds")
    parser.add_argument("--write", action="store_true",
                        help="set every stated time (opening cells, lessons, optional sections, TEACHING.md) "
                             "to its estimate")
    args = parser.parse_args(argv)
    if args.write:
        changed = write_stated(Path(args.folder))
        print(f"stated times set to the estimates; changed: {', '.join(changed) or 'none'}")
        report(args.folder)
    elif args.measure is not None:
        measure(Path(args.folder), args.measure or None)
    else:
        report(args.folder)


if __name__ == "__main__":
    main()
