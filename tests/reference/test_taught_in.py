"""Every public function and class of the reference says where it is taught: one docstring line
``Taught in notebook NN, "Section".`` naming a notebook that exists and one of its section headings."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import re

import pytest
import tomllib
from helpers import ROOT

LINE = re.compile(r'^\s*Taught in notebook (\d\d), "([^"]+)"\.$', re.M)


def reference_modules() -> list[str]:
    """The reference wing as pyproject.toml's import-linter "wings" contract lists it (the one list)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c for c in config if c["id"] == "wings")["layers"]
    reference = next(layer for layer in layers if "attention" in layer.split(" : "))
    names = [name.strip() for name in reference.split(":")]
    optional = {name.strip("()") for name in names if name.startswith("(")}
    present = [name.strip("()") for name in names
               if name.strip("()") not in optional or importlib.util.find_spec(f"selfattn_lite.{name.strip('()')}")]
    return present


# Modules rewritten in other branches of issue 22, which add their own lines; an entry whose module is
# complete fails the test below, so that the list can only shrink.
PENDING: set[str] = set()


def headings(number: str) -> set[str]:
    path = next((ROOT / "notebooks").glob(f"{number}_*.ipynb"), None)
    if path is None:
        return set()
    found = set()
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] == "markdown":
            found |= {line.lstrip("#").strip() for line in "".join(cell["source"]).splitlines()
                      if re.match(r"^#{1,4} ", line)}
    return found


def public_objects(name: str) -> dict[str, object]:
    module = importlib.import_module(f"selfattn_lite.{name}")
    names = getattr(module, "__all__", [n for n in vars(module) if not n.startswith("_")])
    return {n: getattr(module, n) for n in names
            if (inspect.isfunction(getattr(module, n)) or inspect.isclass(getattr(module, n)))
            and getattr(module, n).__module__ == module.__name__}


def missing_lines(name: str) -> list[str]:
    """'module.object: why' for every public object without a valid line."""
    problems = []
    for obj_name, obj in public_objects(name).items():
        match = LINE.search(inspect.getdoc(obj) or "")
        if match is None:
            problems.append(f"{name}.{obj_name}: no line 'Taught in notebook NN, \"Section\".'")
        elif match.group(2) not in headings(match.group(1)):
            problems.append(f"{name}.{obj_name}: notebook {match.group(1)} has no section {match.group(2)!r}")
    return problems


@pytest.mark.parametrize("name", reference_modules())
def test_every_public_function_says_where_it_is_taught(name):
    if name == "triton_kernels":         # its kernels are triton.jit objects, documented in triton_attention
        pytest.importorskip("triton")
    problems = missing_lines(name)
    if name in PENDING:
        assert problems, f"{name} is complete: delete it from PENDING"
    else:
        assert not problems, problems


def test_the_reference_list_is_the_package_s():
    modules = reference_modules()
    assert {"attention", "masks", "positions", "rope_scaling", "efficient", "pitfalls"} <= set(modules)
    for name in modules:
        assert (ROOT / "selfattn_lite" / f"{name}.py").is_file() or (ROOT / "selfattn_lite" / name).is_dir()


def test_a_docstring_without_its_line_or_with_a_wrong_section_is_caught(monkeypatch):
    from selfattn_lite import masks

    monkeypatch.setattr(masks.causal_mask, "__doc__", "The causal mask.")
    assert "masks.causal_mask: no line" in " ".join(missing_lines("masks"))
    monkeypatch.setattr(masks.causal_mask, "__doc__", 'x\n\nTaught in notebook 03, "No such section".')
    assert "notebook 03 has no section 'No such section'" in " ".join(missing_lines("masks"))
