"""The setup files agree with each other and with the README."""

import re

import pytest
from helpers import ROOT

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

CONDA_TO_PIP = {"pytorch": "torch"}
NOT_PACKAGES = {"python", "pip"}


def _split(spec: str) -> tuple[str, str]:
    name, version = re.match(r"^([A-Za-z0-9_.\-]+)\s*(.*)$", spec.strip()).groups()
    return name.lower().replace("_", "-"), version.replace(" ", "")


def pyproject_packages() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        specs += [s for s in extra if not s.startswith(project["name"])]   # skip "selfattn-lite[...]"
    return dict(_split(s) for s in specs)


def environment_packages() -> dict[str, str]:
    packages, in_pip = {}, False
    for line in (ROOT / "environment.yml").read_text().splitlines():
        item = re.match(r"^(\s*)- (.+)$", line)
        if line.strip().startswith("- pip:"):
            in_pip = True
            continue
        if item and not item.group(2).endswith(":") and line.split("#")[0].strip():
            name, version = _split(item.group(2).split("#")[0])
            if name in {"conda-forge"}:
                continue
            name = CONDA_TO_PIP.get(name, name)
            if name not in NOT_PACKAGES or in_pip:
                packages[name] = version
    return packages


def test_environment_yml_lists_the_same_packages_as_pyproject():
    env, pyproject = environment_packages(), pyproject_packages()
    assert env == pyproject, (
        f"only in environment.yml: {sorted(set(env.items()) - set(pyproject.items()))}; "
        f"only in pyproject.toml: {sorted(set(pyproject.items()) - set(env.items()))}")


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme and "make lab" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test\b", ci, re.M), ".ci/run must call the README's test command"


def test_nothing_runs_nbval_lax():
    for name in ("pyproject.toml", "Makefile", ".ci/run"):
        assert "nbval-lax" not in (ROOT / name).read_text()
    assert "--nbval " in (ROOT / "pyproject.toml").read_text()
