"""Binder and Colab badges: idempotent insertion, and a Colab-only install cell that does nothing elsewhere."""

import subprocess
import sys
import types

import nbformat
import pytest
from helpers import NOTEBOOKS, ROOT

from selfattn_lite.course import badges


def _notebook():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# 07 · A title\n\n**What you will learn**\n- x"),
                nbformat.v4.new_code_cell("import torch")]
    return nb


def test_badges_go_under_the_title_and_are_idempotent():
    once = badges.add_badges(_notebook(), "07_x.ipynb")
    first = once.cells[0].source.split("\n")
    assert first[0] == "# 07 · A title"
    assert first[1] == badges.badge_line("07_x.ipynb") and first[2] == ""
    assert f"{badges.REPO}" in first[1] and "mybinder.org" in first[1] and "colab.research.google.com" in first[1]
    assert "notebooks/07_x.ipynb" in badges.binder_url("07_x.ipynb")
    assert once.cells[1].cell_type == "code" and once.cells[1].source == badges.COLAB_SETUP
    assert once.cells[2].source == "import torch"
    twice = badges.add_badges(once, "07_x.ipynb")
    assert twice == once
    assert badges.has_badges(twice, "07_x.ipynb") and not badges.has_badges(_notebook(), "07_x.ipynb")
    nbformat.validate(twice)


def test_apply_writes_only_what_changed(tmp_path):
    nbformat.write(_notebook(), tmp_path / "07_x.ipynb")
    assert badges.apply(tmp_path) == [tmp_path / "07_x.ipynb"]
    assert badges.apply(tmp_path) == []


def test_first_cell_must_be_the_title():
    nb = _notebook()
    nb.cells[0] = nbformat.v4.new_code_cell("x = 1")
    with pytest.raises(ValueError, match="first cell must be markdown"):
        badges.add_badges(nb, "07_x.ipynb")


def test_badges_become_text_links_for_the_offline_site():
    line = badges.badge_line("07_x.ipynb")
    text = badges.as_text_links(line)
    assert "badge" not in text and "<!--" not in text
    assert f"[Launch on Binder]({badges.binder_url('07_x.ipynb')})" in text


def _run_setup_cell(monkeypatch, in_colab: bool, cloned: bool = False):
    import os

    calls = []
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: calls.append(("run", a, k)))
    monkeypatch.setattr(os, "chdir", lambda path: calls.append(("chdir", path)))
    real_isdir = os.path.isdir
    monkeypatch.setattr(os.path, "isdir", lambda p: cloned if p == badges.COLAB_DIR else real_isdir(p))
    if in_colab:
        monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    else:
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    exec(compile(badges.COLAB_SETUP, "colab-setup", "exec"), {})
    return calls


def test_setup_cell_fetches_and_installs_the_course_in_colab(monkeypatch):
    calls = _run_setup_cell(monkeypatch, in_colab=True)
    assert [c[0] for c in calls] == ["run", "run", "chdir"]
    clone, install = calls[0][1][0], calls[1][1][0]
    assert clone[:2] == ["git", "clone"] and f"https://github.com/{badges.REPO}" in clone
    assert clone[-1] == badges.COLAB_DIR
    assert install[:4] == [sys.executable, "-m", "pip", "install"]
    assert install[-1] == f"{badges.COLAB_DIR}[explore]"
    assert calls[0][2] == calls[1][2] == {"check": True}
    assert calls[2] == ("chdir", f"{badges.COLAB_DIR}/notebooks")


def test_colab_keeps_its_own_torch_and_triton():
    """The Colab cell does not install the triton extra: it would replace the torch Colab ships with another
    (torch pins its Triton); an older Triton is refused by ``triton_attention.HAVE_TRITON`` instead."""
    assert "[explore]" in badges.COLAB_SETUP and "triton" not in badges.COLAB_SETUP


def test_setup_cell_run_again_in_colab_only_changes_folder(monkeypatch):
    assert _run_setup_cell(monkeypatch, in_colab=True, cloned=True) == [("chdir", f"{badges.COLAB_DIR}/notebooks")]


def test_setup_cell_does_nothing_elsewhere(monkeypatch, capsys):
    assert _run_setup_cell(monkeypatch, in_colab=False) == []
    assert capsys.readouterr() == ("", "")


def test_setup_cell_lets_idle_threads_sleep_unless_told_otherwise(monkeypatch):
    import os

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    _run_setup_cell(monkeypatch, in_colab=False)
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")                  # a learner's own choice stays
    _run_setup_cell(monkeypatch, in_colab=False)
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


def test_setup_cell_runs_before_any_import_of_torch():
    for path in NOTEBOOKS:
        cells = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
        assert badges.SETUP_TAG in cells[0].metadata.get("tags", []), f"{path.name}: the setup cell is not first"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_notebook_has_its_badges(path):
    """Fails until `make badges` has been run on the notebooks and they are re-executed."""
    nb = nbformat.read(path, as_version=4)
    assert badges.has_badges(nb, path.name), f"{path.name}: run `make badges` (then re-execute the notebook)"
    assert nb.cells[1].outputs == [], f"{path.name}: the Colab setup cell prints nothing outside Colab"


def test_readme_badge_points_at_the_same_repository():
    readme = (ROOT / "README.md").read_text()
    assert f"https://mybinder.org/v2/gh/{badges.REPO}/{badges.BRANCH}" in readme


def test_solutions_are_folded_under_their_stub():
    nb = _notebook()
    stub = nbformat.v4.new_code_cell("def f():\n    raise NotImplementedError", metadata={"tags": ["exercise"]})
    solution = nbformat.v4.new_code_cell("def f():\n    return 1", metadata={"tags": ["solution"]})
    nb.cells += [stub, solution]
    assert not badges.has_badges(nb, "07_x.ipynb")
    done = badges.add_badges(nb, "07_x.ipynb")
    folded = [c for c in done.cells if c.metadata.get("jupyter", {}).get("source_hidden")]
    assert [c.source for c in folded] == [solution.source]          # the solution only, not the stub
    assert badges.has_badges(done, "07_x.ipynb")
    done.cells[-1].metadata["jupyter"]["source_hidden"] = False
    assert not badges.has_badges(done, "07_x.ipynb")                 # an unfolded solution is reported
