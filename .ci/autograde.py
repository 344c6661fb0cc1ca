"""CI: nbgrader's own autograde on the course's assignments, as a teacher would run it.

    .venv/bin/python .ci/autograde.py [WORKDIR]

Builds the nbgrader course from notebooks/ (``selfattn_lite.course.assignments``), then submits, for
every numbered notebook,

* ``solutions``: the release notebook with every answer cell filled in from the source: full marks;
* ``blank``: the release notebook untouched: zero;
* ``planted`` (the notebooks in PLANTED): the solutions with classic mistakes planted in some
  answers (missing scale, flipped mask, sums not rescaled...): partial marks, and nbgrader's
  generated feedback shows the checker's message naming each mistake.

Autograding runs in two worker processes (two course copies, two gradebooks), so the 2-core CI
machine executes two notebooks at a time. Prints a table of scores and the time taken; exits 1
on any unexpected score.
"""

from __future__ import annotations

import html
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from selfattn_lite.course import assignments  # noqa: E402

# notebook stem -> [(answer cell's grade_id, text in its solution, replacement, checker message expected)]
PLANTED = {
    "01_scaled_dot_product_attention": [
        ("answer_2", "torch.diag_embed(w) - w[..., :, None] * w[..., None, :]", "torch.diag_embed(w)",
         "only diag(w): the term -w_i w_j is missing"),
        ("answer_3", "(scale * math.sqrt(dk))", "(scale * dk)", "which is their variance's scale"),
    ],
    "03_masks_and_cross_attention": [
        ("answer_2", "k_pos[None, :] <= q_pos", "k_pos[None, :] < q_pos", "off by one: a token may attend to itself"),
        ("answer_3", "torch.softmax(scores.masked_fill(fully_masked, 0.0), dim=-1)", "torch.softmax(scores, dim=-1)",
         "the forward pass is right but the gradient is NaN"),
    ],
    "08_efficient_attention": [
        ("answer_1", "l = l * scale + p.sum(-1)", "l = l + p.sum(-1)", "rescale the running sum l"),
        ("answer_3", "a = (phi_q @ phi_k.transpose(1, 2)).tril()", "a = (phi_q @ phi_k.transpose(1, 2)).tril(-1)",
         "token i does not see its own key"),
    ],
    "09_common_pitfalls": [
        ("answer_1", "(i - j < window)", "(i - j <= window)", "a window one too wide"),
        ("answer_3", "if not torch.allclose(attn(q2, k2, v2)[:, :t], out[:, :t], atol=1e-6):",
         "if not torch.allclose(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-6):",
         "differing from a reference is not a leak"),
        ("answer_4", "/ math.sqrt(q.shape[-1])", "/ math.sqrt(d_model)", "the wrong width in the scale"),
    ],
    "12_context_extension": [
        ("answer_1", "** ((head_dim - 2) / (2 * i))", "** (2 * i / (head_dim - 2))", "upside down: pair i is slowed"),
        ("answer_4", "smooth = (ratio - 1 / factor) / (1 - 1 / factor)", "smooth = ratio", "the blend gives"),
    ],
    "13_serving_the_cache": [
        ("answer_2", '"bhln,hnc->bhlc"', '"bhln,hnc->blc"', "a matrix is contracted over the wrong axis"),
    ],
    "14_attention_across_devices": [
        ("answer_2", "src = (r - s) % W", "src = (r + s) % W", "the schedule runs backwards"),
    ],
    "15_flashattention_in_triton": [
        ("answer_4", "start = max(0, q0 - window + 1) // block_n * block_n", "start = 0",
         "which no query of the block sees"),
    ],
}
STUDENTS = ("solutions", "blank", "planted")


def _answers(nb) -> dict:
    return {c.metadata["nbgrader"]["grade_id"]: c for c in nb.cells
            if c.metadata.get("nbgrader", {}).get("solution")}


def submit(course: Path, stem: str) -> list[str]:
    """Write submitted/<student>/<stem>/ for each student; return the students who submitted."""
    source = nbformat.read(course / "source" / stem / f"{stem}.ipynb", as_version=4)
    release_dir = course / "release" / stem
    solved = {gid: assignments.solution_source(c.source) for gid, c in _answers(source).items()}
    students = []
    for student in STUDENTS:
        if student == "planted" and stem not in PLANTED:
            continue
        folder = course / "submitted" / student / stem
        shutil.copytree(release_dir, folder)
        nb = nbformat.read(folder / f"{stem}.ipynb", as_version=4)
        if student != "blank":
            answers = _answers(nb)
            for gid, code in solved.items():
                answers[gid].source = code
            for gid, old, new, _ in PLANTED.get(stem, []) if student == "planted" else []:
                if old not in answers[gid].source:
                    raise RuntimeError(f"{stem} {gid}: cannot plant the mistake, {old!r} not in the solution")
                answers[gid].source = answers[gid].source.replace(old, new, 1)
        nbformat.write(nb, folder / f"{stem}.ipynb")
        students.append(student)
    return students


def grade(course: str, stems: list[str]) -> dict:
    """Autograde and generate feedback for ``stems`` in one course copy; {(stem, student): (score, max, html)}."""
    import warnings

    warnings.filterwarnings("ignore", module="nbgrader")       # SQLAlchemy's notes on nbgrader's sessions
    warnings.filterwarnings("ignore", message=".*not in session.*")
    course = Path(course)
    grader = assignments.api(course)
    results = {}
    for stem in stems:
        students = submit(course, stem)
        for student in students:
            assignments.run(grader.autograde(stem, student, force=True), f"autograde {stem} {student}")
        assignments.run(grader.generate_feedback(stem, force=True), f"generate_feedback {stem}")
        with grader.gradebook as gb:
            for student in students:
                submission = gb.find_submission(stem, student)
                feedback = course / "feedback" / student / stem / f"{stem}.html"
                results[(stem, student)] = (submission.score, submission.max_score, feedback.read_text())
    return results


def main(work: Path) -> int:
    start = time.perf_counter()
    course = work / "course"
    assignments.generate(ROOT / "notebooks", course)
    stems = sorted(p.name for p in (course / "release").iterdir())
    only = [s for s in os.environ.get("AUTOGRADE_ONLY", "").split(",") if s]   # e.g. AUTOGRADE_ONLY=01,03
    stems = [stem for stem in stems if not only or stem[:2] in only]
    built = time.perf_counter() - start
    # two workers, each with its own copy of the course and gradebook; the slowest notebooks spread out
    halves = [stems[0::2], stems[1::2]]
    copies = []
    for i, half in enumerate(halves):
        copy = work / f"worker{i}"
        shutil.copytree(course, copy)
        copies.append((str(copy), half))
    with ProcessPoolExecutor(max_workers=2) as pool:
        results = {}
        for part in pool.map(grade, *zip(*copies)):
            results.update(part)
    failures, bad = [], set()

    def fail(stem, student, message):
        failures.append(f"{stem} ({student}): {message}")
        bad.add((stem, student))

    print(f"{'notebook':36s} {'student':10s} score")
    for (stem, student), (score, max_score, feedback) in sorted(results.items()):
        print(f"{stem:36s} {student:10s} {score:g} / {max_score:g}")
        text = html.unescape(feedback)
        if max_score <= 0:
            fail(stem, student, "no graded cells")
        if student == "solutions" and score != max_score:
            fail(stem, student, f"scored {score:g} / {max_score:g}, not full marks")
        if student == "blank" and score != 0:
            fail(stem, student, f"the untouched release scored {score:g}, not 0")
        if student == "blank" and "Not attempted yet" not in text:
            fail(stem, student, "the feedback does not say 'Not attempted yet'")
        if student == "planted":
            if not 0 < score < max_score:
                fail(stem, student, f"scored {score:g} / {max_score:g}, not partial marks")
            for gid, _, _, message in PLANTED[stem]:
                if message not in text:
                    fail(stem, student, f"{gid}: the feedback lacks the checker's message {message!r}")
    for stem in sorted(set(PLANTED) - set(stems) - ({s for s in PLANTED if s[:2] not in only} if only else set())):
        fail(stem, "planted", "in PLANTED but not a notebook")
    print(f"assignments built in {built:.0f} s; autograde + feedback of {len(results)} submissions "
          f"({len(stems)} notebooks) in {time.perf_counter() - start - built:.0f} s; "
          f"{time.perf_counter() - start:.0f} s in all")
    for failure in failures:
        print("FAIL:", failure)
    print(f"autograde: {len(results) - len(bad & set(results))} passed, {len(bad)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if len(sys.argv) > 1:
        sys.exit(main(Path(sys.argv[1])))
    with tempfile.TemporaryDirectory(prefix="selfattn-autograde-") as tmp:
        sys.exit(main(Path(tmp)))
