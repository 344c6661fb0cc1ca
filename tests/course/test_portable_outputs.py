"""No compared output prints an error that rounding decides.

An error at the rounding level (``max |ours - autograd| = 6.7e-16``) is a different number under
another SIMD width (AVX2, AVX-512, NEON), thread count or torch build, so a learner's strict nbval
would fail on a correct machine. A cell prints the bound it asserts instead (``< 1e-12``), or keeps
the exact value in a cell tagged ``nbval-ignore-output`` with an assert beside it. This test reads
the committed outputs (no kernel) of every cell whose output nbval compares, and fails on an
error-looking line that prints a value below 1e-9 that is not a bound. ``make notebooks-portable``
runs the notebooks themselves under other CPU settings.
"""

from __future__ import annotations

import re

import nbformat
import pytest
from helpers import NOTEBOOKS, ROOT, tags

LIMIT = 1e-9
NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?![\w.])")
# a line about an error or a difference: the quantity whose last digits rounding decides
ERROR_WORDS = re.compile(r"err|diff|differ|deviat|mismatch|residual|\|[^|]*-[^|]*\||\bmax\b.*\s-\s|\bvs\b|ulp",
                         re.IGNORECASE)
# a bound: the value follows <, <=, below, within, atol ... (the cell asserts it; every machine prints it)
BOUND = re.compile(r"(?:<|<=|≤|\bbelow|\bunder|\bwithin|\bat most|\batol|\brtol|\btol(?:erance)?|\bbound)\W*$",
                   re.IGNORECASE)


def rounding_errors(text: str) -> list[str]:
    """The error-looking lines of ``text`` that print a nonzero value below LIMIT which is not a bound."""
    found = []
    for line in text.splitlines():
        if not ERROR_WORDS.search(line):
            continue
        for match in NUMBER.finditer(line):
            value = abs(float(match.group(0)))
            if 0 < value < LIMIT and not BOUND.search(line[:match.start()]):
                found.append(line.strip())
                break
    return found


def compared_outputs(nb) -> list[tuple[int, str]]:
    """(code cell number from 1, output text) of every output nbval compares."""
    outputs = []
    code = [c for c in nb.cells if c.cell_type == "code"]
    for number, cell in enumerate(code, 1):
        if {"nbval-ignore-output", "nbval-skip"} & set(tags(cell)):
            continue
        for out in cell.get("outputs", []):
            text = out.get("text", "") + out.get("data", {}).get("text/plain", "")
            outputs.append((number, text))
    return outputs


def offenders(nb) -> list[tuple[int, str]]:
    return [(number, line) for number, text in compared_outputs(nb) for line in rounding_errors(text)]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_compared_output_prints_a_rounding_level_error(path):
    found = offenders(nbformat.read(path, as_version=4))
    assert not found, (f"{path.name}: compared outputs print errors that rounding decides (another CPU prints "
                       "another value); print the bound the cell asserts, or tag the cell nbval-ignore-output and "
                       "assert:\n" + "\n".join(f"  code cell {n}: {line}" for n, line in found))


def test_the_scan_catches_a_planted_rounding_level_error():
    nb = nbformat.v4.new_notebook()
    printed = nbformat.v4.new_code_cell("print(err)")
    printed.outputs = [nbformat.v4.new_output("stream", name="stdout", text=(
        "dq (2, 8, 6, 16)  max |ours - autograd| = 6.7e-16\n"
        "max |naive - absorbed| = 5.6e-16\n"
        "relative error 3.1e-17, close enough\n"))]
    result = nbformat.v4.new_code_cell("err")
    result.outputs = [nbformat.v4.new_output("execute_result", data={"text/plain": "difference: 0.0000000000002"},
                                             execution_count=2)]
    ignored = nbformat.v4.new_code_cell("print(err)", metadata={"tags": ["nbval-ignore-output"]})
    ignored.outputs = [nbformat.v4.new_output("stream", name="stdout", text="max |ours - torch| = 1.2e-15\n")]
    nb.cells = [printed, result, ignored]
    assert offenders(nb) == [(1, "dq (2, 8, 6, 16)  max |ours - autograd| = 6.7e-16"),
                             (1, "max |naive - absorbed| = 5.6e-16"), (1, "relative error 3.1e-17, close enough"),
                             (2, "difference: 0.0000000000002")]


@pytest.mark.parametrize("text", [
    "dq (2, 8, 6, 16)  max |ours - autograd| < 1e-12",           # the bound the cell asserts
    "equal within atol 1e-10",
    "max |ours - torch| = 0.0e+00",                               # exactly zero: no rounding in it
    "LSTM  influence of the first token / of the last: 7.0e-14",  # a quantity, not an error
    "bf16 error 3.9e-03 (torch's: 3.9e-03)",                      # above the rounding level of float64
])
def test_the_scan_lets_bounds_zeros_and_quantities_through(text):
    assert rounding_errors(text) == []


def test_make_and_ci_run_the_notebooks_under_other_cpu_settings():
    makefile = (ROOT / "Makefile").read_text()
    settings = re.search(r"^PORTABLE_SETTINGS \?= (.*)$", makefile, re.M).group(1).split()
    assert settings == ["ATEN_CPU_CAPABILITY=default", "ATEN_CPU_CAPABILITY=avx2", "OMP_NUM_THREADS=1"]
    assert re.search(r"^notebooks-portable:.*\n\t.*\$\(PORTABLE_SETTINGS\)", makefile, re.M)
    ci = (ROOT / ".ci" / "run").read_text()
    run = re.search(r"^make notebooks-portable PORTABLE_SETTINGS=(\S+)$", ci, re.M)
    assert run and run.group(1) in settings and ci.index("make test") < run.start()
