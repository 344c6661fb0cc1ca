"""Where, in which dtype and at which sizes every notebook's timing cell runs: one decision, one table.

Every notebook ends by timing what it taught against torch's SDPA on the best device present.
``timing_setup("nb07")`` makes that decision for one notebook, and the GPU report asks the same:

* **device**: CUDA when present; else the CPU. On Apple silicon the timing stays on the CPU too
  (the course does not test its code on MPS), and the table's device line says so.
* **dtype**: bfloat16 where the GPU computes it natively (compute capability 8.0 and later: A100,
  RTX 30xx/40xx, L4, H100, H200); float16 below (a T4, sm_75), so that SDPA stays on a fused
  kernel; float32 on a CPU.
* **sizes**: each notebook declares, in ``PROBLEMS``, its CPU sizes (small: a whole cell in
  under 10 s) and its CUDA sizes as candidates, largest first. The plan keeps the largest
  candidate at which every row's memory model fits the **budget**:
  ``MEMORY_FRACTION`` of the device's memory (``torch.cuda.get_device_properties(...).total_memory``)
  less ``RESERVED_BYTES`` for the CUDA context, the libraries' workspaces and the allocator's slack.
* a row that cannot fit even at the smallest candidate is **skipped with one printed line** that
  says what it needed and what the device has (``TimingPlan.runnable``), never an exception.

A memory model is the peak a row allocates, counted from the tensors it makes (the inputs in the
timing dtype, and, for explicit attention, float32 copies of them and three (B, H, L, S) float32
tensors: the scores, their scaled or masked copy and the weights; GQA's explicit row also the
K and V repeated to every query head). Taught where the notebooks measure it: notebook 08
("O(n^2) measured") and notebook 09 (GQA's copies).

Used by every notebook's timing section and by ``gpu_report`` / ``gpu_sections``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

__all__ = ["DeviceInfo", "Row", "Problem", "TimingPlan", "PROBLEMS", "MEMORY_FRACTION", "RESERVED_BYTES",
           "timing_dtype", "memory_budget", "device_note", "timing_setup", "plans", "format_gib"]

MEMORY_FRACTION = 0.8          # of the device's total memory...
RESERVED_BYTES = 2**30         # ...less 1 GiB: CUDA context, cuBLAS/cuDNN workspaces, allocator slack
F32 = 4                        # bytes of a float32


# ---------------------------------------------------------------------------------------------
# The device
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DeviceInfo:
    """What the decision reads of the device: its kind, name, compute capability, memory, SM count.

    ``mps``: an Apple-silicon GPU is present (it is not used: timing stays on the CPU).
    """

    type: str                                   # "cuda" or "cpu"
    name: str
    capability: tuple[int, int] | None = None
    total_memory: int | None = None             # bytes
    sm_count: int | None = None
    mps: bool = False

    @classmethod
    def probe(cls) -> DeviceInfo:
        """The device this process would time on (``torch.cuda.get_device_properties(0)`` on CUDA)."""
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            return cls("cuda", props.name, (props.major, props.minor), props.total_memory,
                       props.multi_processor_count)
        mps = getattr(torch.backends, "mps", None)
        has_mps = bool(mps is not None and mps.is_available())
        return cls("cpu", f"CPU ({torch.get_num_threads()} threads)", mps=has_mps)

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cuda") if self.type == "cuda" else torch.device("cpu")


def timing_dtype(info: DeviceInfo) -> torch.dtype:
    """bfloat16 on compute capability >= 8.0, float16 on older GPUs (fused SDPA kernels), float32 on a CPU."""
    if info.type != "cuda":
        return torch.float32
    return torch.bfloat16 if info.capability is not None and info.capability >= (8, 0) else torch.float16


def memory_budget(info: DeviceInfo) -> int | None:
    """Bytes a timing may allocate on the device: MEMORY_FRACTION of its memory less RESERVED_BYTES (None on a CPU)."""
    if info.type != "cuda" or info.total_memory is None:
        return None
    return max(0, int(MEMORY_FRACTION * info.total_memory) - RESERVED_BYTES)


def device_note(info: DeviceInfo | None = None) -> str:
    """The device line's note on Apple silicon ("" elsewhere): timing stays on the CPU."""
    info = DeviceInfo.probe() if info is None else info
    if info.type == "cpu" and info.mps:
        return "Apple-silicon GPU (MPS) present but not used: the course times on the CPU, MPS is not tested"
    return ""


def format_gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GiB"


# ---------------------------------------------------------------------------------------------
# Memory models (bytes at sizes ``s``, element size ``e`` of the timing dtype)
# ---------------------------------------------------------------------------------------------

def _io(s: dict, e: int) -> int:
    """q (B, H, L, D), k and v (B, Hkv, S, D), the output (B, H, L, D), in the timing dtype."""
    B, H, L, D = s["B"], s["H"], s["L"], s["D"]
    S, Hkv = s.get("S", L), s.get("Hkv", H)
    return e * B * D * (2 * H * L + 2 * Hkv * S)


def _scores(s: dict) -> int:
    """One (B, H, L, S) float32 tensor."""
    return F32 * s["B"] * s["H"] * s["L"] * s.get("S", s["L"])


def sdpa(s: dict, e: int) -> int:
    """Fused SDPA: its inputs and output, and one float32 log-sum-exp per query row (tiles stay on chip)."""
    return _io(s, e) + F32 * s["B"] * s["H"] * s["L"]


def sdpa_mask(s: dict, e: int) -> int:
    """SDPA with a boolean (L, S) mask."""
    return _io(s, e) + s["L"] * s.get("S", s["L"])


def explicit(s: dict, e: int) -> int:
    """Explicit attention: float32 copies of q, k, v and out, the (B, H, L, S) float32 scores and weights (and,
    for half-precision inputs, a third such tensor: the float32 weights' copy on the way back), a mask."""
    H = s["H"]
    repeated = dict(s, Hkv=H)                               # GQA: K and V repeated to every query head
    copies = _io(repeated, F32) + (_io(repeated, e) - _io(s, e))
    return _io(s, e) + copies + (2 if e == F32 else 3) * _scores(s) + s["L"] * s.get("S", s["L"])


def repeat_sdpa(s: dict, e: int) -> int:
    """K and V copied to every query head (repeat_interleave), then fused SDPA."""
    return _io(dict(s, Hkv=s["H"]), e) + _io(s, e)


def tiled(s: dict, e: int) -> int:
    """The tiled loop (notebook 08): float32 accumulators and three float32 (B, H, 1024, 1024) tiles."""
    B, H, L, D = s["B"], s["H"], s["L"], s["D"]
    tile = F32 * B * H * min(L, 1024) * min(s.get("S", L), 1024)
    return _io(s, e) + 3 * F32 * B * H * L * D + 3 * tile


def rope(fn: Callable[[dict, int], int]) -> Callable[[dict, int], int]:
    """``fn`` after rotating q and k (two more (B, H, L, D) tensors, and their float32 temporaries)."""
    def model(s: dict, e: int) -> int:
        return fn(s, e) + 2 * (e + F32) * s["B"] * s["H"] * s["L"] * s["D"]
    return model


def training(fn: Callable[[dict, int], int], saved_scores: int = 0) -> Callable[[dict, int], int]:
    """Forward + backward of ``fn``: the gradient of every input and output, plus ``saved_scores`` float32
    (B, H, L, S) tensors kept for the backward (explicit attention keeps its weights and their gradient)."""
    def model(s: dict, e: int) -> int:
        return fn(s, e) + 2 * _io(s, e) + saved_scores * _scores(s)
    return model


def module(need_weights: bool) -> Callable[[dict, int], int]:
    """A multi-head attention module on x (B, T, d): x, q, k, v, the output, its projections; with the
    weights, three (B, h, T, T) float32 tensors."""
    def model(s: dict, e: int) -> int:
        B, T, d, h = s["B"], s["T"], s["d"], s["h"]
        dense = 8 * e * B * T * d + 4 * e * d * d
        return dense + (3 * F32 * B * h * T * T if need_weights else 0)
    return model


def decode_step(fn: Callable[[dict, int], int]) -> Callable[[dict, int], int]:
    """One query over a cache of S keys: the cache's buffer and the drawn K, V (the cells draw then copy)."""
    def model(s: dict, e: int) -> int:
        step = dict(s, L=1)
        return fn(step, e) + 2 * e * s["B"] * s["H"] * s["S"] * s["D"]
    return model


def kernel_check(s: dict, e: int) -> int:
    """A kernel against SDPA, forward and backward, with a float64 reference on one batch element
    (q, k, v, the output gradient, and each implementation's outputs and gradients; three float64
    (1, H, N, N) tensors for the reference)."""
    B, H, N, D = s["B"], s["H"], s["L"], s["D"]
    tensors = e * B * H * N * D
    return 4 * tensors + 2 * 4 * tensors + 8 * H * N * D * 8 + 3 * 8 * H * N * N


def small(nbytes: int) -> Callable[[dict, int], int]:
    """A row whose memory is fixed and small (a recurrent step, a sentence encoder)."""
    return lambda s, e: nbytes


# ---------------------------------------------------------------------------------------------
# The table of problems
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    """One implementation a timing cell runs: its name (as the table prints it) and its memory model."""

    name: str
    memory: Callable[[dict, int], int]


@dataclass(frozen=True)
class Problem:
    """One notebook's timing: CPU sizes, CUDA sizes (candidates, largest first) and each row's memory model.

    ``sweep``: the name of a size the cell sweeps over (``ns`` holds its values; rows are checked at
    each). ``cpu_only``: why this notebook times on the CPU on every machine (None: it uses the GPU).
    """

    notebook: str
    what: str
    cpu: dict
    cuda: tuple[dict, ...]
    rows: tuple[Row, ...]
    sweep: str | None = None
    cpu_only: str | None = None


def _attention(**kw) -> dict:
    return dict(dict(B=2, H=16, L=4096, D=128), **kw)


# The CUDA candidates of a plain attention timing: notebook 01's sizes (2 GiB of float32 scores),
# then half the batch, then half the length.
_ATTENTION_CUDA = (_attention(), _attention(B=1), _attention(B=1, L=2048))
_ATTENTION_CPU = dict(B=1, H=8, L=512, D=64)
_SDPA = "torch SDPA"
_EXPLICIT = "selfattn_lite (explicit)"

PROBLEMS: dict[str, Problem] = {p.notebook: p for p in [
    Problem("nb01", "explicit attention against SDPA", _ATTENTION_CPU, _ATTENTION_CUDA,
            (Row(_SDPA, sdpa), Row(_EXPLICIT, explicit))),
    Problem("nb02", "the 3-token example's shape, then notebook 01's", _ATTENTION_CPU, _ATTENTION_CUDA,
            (Row(_SDPA, sdpa), Row(_EXPLICIT, explicit))),
    # L = 2048 on the CPU: torch's CPU flash kernel takes keys in blocks of 512, so is_causal can skip blocks
    Problem("nb03", "causal attention: is_causal against a boolean mask", dict(B=1, H=4, L=2048, D=64),
            _ATTENTION_CUDA,
            (Row("torch SDPA, is_causal=True", sdpa), Row("explicit + bool mask", explicit),
             Row("torch SDPA + bool mask", sdpa_mask))),
    Problem("nb04", "nn.MultiheadAttention against the course's module",
            dict(B=8, T=256, d=512, h=8),
            (dict(B=8, T=2048, d=2048, h=16), dict(B=4, T=2048, d=2048, h=16), dict(B=2, T=2048, d=2048, h=16)),
            (Row("nn.MultiheadAttention", module(False)), Row("nn.MHA, need_weights=True", module(True)),
             Row("ours, fused SDPA", module(False)), Row("ours, need_weights=True", module(True)))),
    Problem("nb05", "causal attention with and without RoPE", _ATTENTION_CPU, _ATTENTION_CUDA,
            (Row("torch SDPA (q, k pre-rotated)", rope(sdpa)), Row("RoPE + torch SDPA", rope(sdpa)),
             Row("RoPE + selfattn_lite SDPA", rope(explicit)))),
    Problem("nb06", "one decode step over a KV cache",
            dict(B=4, H=8, S=4096, D=64, L=1),
            (dict(B=16, H=32, S=8192, D=128, L=1), dict(B=8, H=32, S=8192, D=128, L=1),
             dict(B=4, H=32, S=8192, D=128, L=1)),
            (Row(_SDPA, decode_step(sdpa)), Row(_EXPLICIT, decode_step(explicit)))),
    Problem("nb07", "causal GQA: SDPA's enable_gqa against explicit attention",
            dict(B=1, H=8, Hkv=2, L=512, D=64),
            (dict(B=4, H=32, Hkv=8, L=4096, D=128), dict(B=2, H=32, Hkv=8, L=4096, D=128),
             dict(B=1, H=32, Hkv=8, L=4096, D=128)),
            (Row("torch SDPA (enable_gqa)", sdpa), Row(_EXPLICIT, explicit))),
    Problem("nb08", "explicit, tiled and fused attention as n grows",
            dict(B=1, H=8, D=64, ns=(256, 512, 1024)),
            (dict(B=1, H=16, D=128, ns=(1024, 2048, 4096, 8192, 16384)),),
            (Row(_SDPA, sdpa), Row("tiled (flash_attention)", tiled), Row("explicit (selfattn_lite)", explicit)),
            sweep="L"),
    Problem("nb09", "GQA: shared K/V heads read in place against copied",
            dict(B=1, H=8, Hkv=2, L=512, D=64),
            tuple(dict(s, Hkv=s["H"] // 4) for s in _ATTENTION_CUDA),
            (Row("SDPA enable_gqa=True", sdpa), Row("repeat_interleave + SDPA", repeat_sdpa),
             Row("selfattn_lite (explicit, gqa)", explicit))),
    Problem("nb10", "the MiniLM encoder, fused SDPA against explicit with weights",
            dict(batch=4), (dict(batch=64),),
            (Row("encoder, fused SDPA", small(2**30)), Row("encoder, explicit + weights", small(2**30)))),
    Problem("nb11", "forward + backward: explicit, tiled and SDPA",
            dict(B=1, H=8, L=512, D=64),
            (dict(B=1, H=8, L=4096, D=64), dict(B=1, H=8, L=2048, D=64)),
            (Row(_SDPA, training(sdpa)), Row("tiled (flash_attention)", training(tiled)),
             Row("explicit (selfattn_lite)", training(explicit, saved_scores=2)))),
    Problem("nb12", "YaRN RoPE + SDPA against plain RoPE + SDPA", _ATTENTION_CPU, _ATTENTION_CUDA,
            (Row("plain RoPE + SDPA (1/t in scale)", rope(sdpa)), Row("YaRN RoPE + SDPA", rope(sdpa)),
             Row("SDPA (q, k pre-rotated)", rope(sdpa)))),
    Problem("nb13", "one decoding step of multi-head latent attention and of a sink cache",
            dict(S=2048), (), (), cpu_only="batch-1 decoding of a small layer: a latency the CPU shows as well"),
    Problem("nb14", "ring attention across processes", dict(B=1, H=8, L=1024, D=64), (), (),
            cpu_only="gloo processes on one machine's CPU cores"),
    Problem("nb15", "the Triton kernel against SDPA",
            dict(B=1, H=2, L=64, D=32),
            (dict(B=1, H=16, L=4096, D=128), dict(B=1, H=16, L=2048, D=128)),
            (Row(_SDPA, sdpa), Row("triton flash_attention", sdpa))),
    Problem("nb16", "one decoding step: SDPA over a cache against fixed-state mixers",
            dict(h=8, dh=64, Ss=(256, 1024, 4096)), (dict(h=8, dh=64, Ss=(256, 1024, 4096)),),
            (Row("SDPA over a cache", lambda s, e: 3 * e * s["h"] * max(s["Ss"]) * s["dh"]),
             Row("fixed-state steps", small(2**20)))),
    # the GPU report's kernel comparison (notebooks 08, 11, 15): B = 4, H = 16, N = 4096 where it fits
    Problem("kernels", "a kernel against SDPA, forward and backward, with a float64 reference",
            dict(B=1, H=2, L=64, D=16),
            (dict(B=4, H=16, L=4096, D=128), dict(B=2, H=16, L=4096, D=128), dict(B=1, H=16, L=4096, D=128)),
            (Row(_SDPA, kernel_check), Row("kernel", kernel_check))),
]}


# ---------------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------------

def _describe(sizes: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sizes.items() if not isinstance(v, (tuple, list)))


@dataclass
class TimingPlan:
    """One notebook's timing decision: device, dtype, sizes, budget, and which rows run.

    ``skipped``: row name -> the one line that says why it does not run (at the sweep values in
    ``skipped_at`` for a swept problem: the row runs at the others).
    """

    problem: Problem
    info: DeviceInfo
    device: torch.device
    dtype: torch.dtype
    sizes: dict
    budget: int | None
    needs: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    skipped_at: dict[str, tuple] = field(default_factory=dict)

    @property
    def notebook(self) -> str:
        return self.problem.notebook

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).replace("torch.", "")

    @property
    def ns(self) -> tuple:
        """A swept problem's values (notebook 08's sequence lengths), else ()."""
        return tuple(self.sizes.get("ns", ()))

    def fits(self, name: str, **at) -> bool:
        """Whether row ``name`` runs (at sweep value ``at``, e.g. ``L=16384``, for a swept problem)."""
        if name not in self.skipped:
            return True
        if self.problem.sweep and at:
            return at[self.problem.sweep] not in self.skipped_at.get(name, ())
        return False

    def runnable(self, impls: dict, *, quiet: bool = False) -> dict:
        """``impls`` without the rows that do not fit, printing one line per row left out."""
        kept = {name: fn for name, fn in impls.items() if self.fits(name)}
        if not quiet:
            for name in impls:
                if name not in kept:
                    print(self.skipped[name])
        return kept

    def only(self, per_row: dict) -> dict:
        """``per_row`` (name -> anything, e.g. compute dtypes) restricted to the rows that run."""
        return {name: value for name, value in per_row.items() if self.fits(name)}

    def print_skips(self) -> None:
        """One line per row that is left out somewhere (a swept problem's rows run where they fit)."""
        for line in self.skipped.values():
            print(line)

    def device_line(self) -> str:
        """The device, the dtype and, on a Mac, why the timing stays on the CPU."""
        note = device_note(self.info)
        base = f"{self.info.name}, {self.dtype_name}"
        if self.problem.cpu_only and self.info.type == "cuda":
            base = f"CPU ({torch.get_num_threads()} threads), float32: {self.problem.cpu_only}"
        return base + (f"; {note}" if note else "")


def _need(row: Row, sizes: dict, e: int) -> int:
    return int(row.memory(sizes, e))


def _at(sizes: dict, sweep: str | None, value) -> dict:
    if sweep is None:
        return sizes
    point = {k: v for k, v in sizes.items() if k != "ns"}
    point[sweep] = value
    return point


def _points(problem: Problem, sizes: dict) -> list:
    return list(sizes["ns"]) if problem.sweep else [None]


def timing_setup(notebook: str, info: DeviceInfo | None = None) -> TimingPlan:
    """The timing decision for ``notebook`` ("nb01" ... "nb16", "kernels") on this device (or ``info``).

    Returns:
        A ``TimingPlan``: device, dtype, the sizes from ``PROBLEMS[notebook]`` (on CUDA the largest
        candidate at which every row fits the budget; the smallest when none does), the budget,
        each row's need in bytes, and one line for each row that does not fit.

    Raises:
        ValueError: for a notebook not in ``PROBLEMS``.
    """
    if notebook not in PROBLEMS:
        raise ValueError(f"notebook must be one of {sorted(PROBLEMS)}, got {notebook!r}")
    problem = PROBLEMS[notebook]
    info = DeviceInfo.probe() if info is None else info
    if info.type != "cuda" or problem.cpu_only:
        dtype = torch.float32
        return TimingPlan(problem, info, torch.device("cpu"), dtype, dict(problem.cpu), None)
    dtype = timing_dtype(info)
    e = torch.empty((), dtype=dtype).element_size()
    budget = memory_budget(info)

    def needs_at(sizes: dict) -> dict[str, int]:
        return {row.name: max(_need(row, _at(sizes, problem.sweep, p), e) for p in _points(problem, sizes))
                for row in problem.rows}

    chosen = problem.cuda[-1]
    for sizes in problem.cuda:
        if all(n <= budget for n in needs_at(sizes).values()):
            chosen = sizes
            break
    plan = TimingPlan(problem, info, torch.device("cuda"), dtype, dict(chosen), budget, needs_at(chosen))
    has = (f"{info.name} has a budget of {format_gib(budget)} ({MEMORY_FRACTION:.0%} of its "
           f"{format_gib(info.total_memory)}, less {format_gib(RESERVED_BYTES)})")
    for row in problem.rows:
        over = [(p, _need(row, _at(chosen, problem.sweep, p), e)) for p in _points(problem, chosen)]
        over = [(p, n) for p, n in over if n > budget]
        if not over:
            continue
        p, n = over[0]
        where = _describe(_at(chosen, problem.sweep, p))
        if problem.sweep:
            plan.skipped_at[row.name] = tuple(q for q, _ in over)
            values = ", ".join(str(q) for q, _ in over)
            plan.skipped[row.name] = (f"skipped: {row.name} at {problem.sweep} = {values}: it needs "
                                      f"{format_gib(n)} at {where}; {has}")
        else:
            plan.skipped[row.name] = f"skipped: {row.name} needs {format_gib(n)} at {where}; {has}"
    return plan


def plans(notebooks: Iterable[str] | None = None, info: DeviceInfo | None = None) -> dict[str, TimingPlan]:
    """Every notebook's plan on one device (for a test or a report over the whole course)."""
    return {nb: timing_setup(nb, info) for nb in (PROBLEMS if notebooks is None else notebooks)}

