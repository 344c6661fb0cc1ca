"""figures/ is regenerated from the package, and what the notebooks show is up to date."""

import io
import re
from pathlib import Path

import numpy as np
from PIL import Image

from selfattn_lite.course import figures
from selfattn_lite.course.figures.sdpa import CAT_SAT_TOKENS, CAT_SAT_WEIGHTS

ROOT = Path(__file__).resolve().parents[2]


def test_every_figure_regenerates_like_the_committed_one(tmp_path):
    written = figures.make_all(tmp_path)
    assert {p.name for p in written} == set(figures.collect())
    for path in written:
        committed = ROOT / "figures" / path.name
        assert committed.exists(), f"{committed.name} is not committed: run `make figures`"
        new = np.asarray(Image.open(path).convert("RGB"), dtype=float)
        old = np.asarray(Image.open(io.BytesIO(committed.read_bytes())).convert("RGB"), dtype=float)
        assert new.shape == old.shape, f"{path.name} changed size: run `make figures`"
        assert np.abs(new - old).mean() < 2.0, f"{path.name} differs from the committed one: run `make figures`"


def test_notebooks_only_reference_existing_figures():
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for ref in re.findall(r"\.\./figures/([\w.\-]+)", nb.read_text()):
            assert (ROOT / "figures" / ref).exists(), f"{nb.name} shows missing figure {ref}"


def test_cat_sat_table_is_a_causal_attention_table():
    assert len(CAT_SAT_TOKENS) == len(CAT_SAT_WEIGHTS) == 5
    for i, row in enumerate(CAT_SAT_WEIGHTS):
        assert abs(sum(row) - 1) < 1e-9 and all(w == 0 for w in row[i + 1:])      # causal rows sum to 1
    assert max(range(5), key=lambda j: CAT_SAT_WEIGHTS[4][j]) == 1               # "it" -> "cat"
