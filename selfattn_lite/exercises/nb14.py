"""Checkers for notebook 14: a learned sink merged through the log-sum-exp, the work of every step of a causal
ring, where a zig-zag rank holds a position, and Ulysses and the ring's backward played in one process,
checked against the multi-process run."""

from __future__ import annotations

import contextlib
import sys

import torch
import torch.nn.functional as F

from ..distributed import (
    block_attention,
    block_attention_backward,
    causal_work,
    ring_tiles,
    shard,
    shard_indices,
    shard_segments,
    unshard,
)
from . import ExerciseError, NotAttempted, attempt, close, not_attempted, passed, require_tensor
from . import solution as solution  # the notebooks' guard on their folded solutions
from . import unanswered as unanswered

__all__ = ["check_add_sink", "check_step_work", "check_zigzag_owner", "check_simulated_ulysses",
           "check_ring_backward"]


# ---------------------------------------------------------------------------------------------
# Package functions an exercise asks the learner to do without
# ---------------------------------------------------------------------------------------------

_PACKAGE_MODULES = ("selfattn_lite.distributed", "selfattn_lite.distributed.sharding", "selfattn_lite.distributed.ring")


@contextlib.contextmanager
def _hidden(names: tuple[str, ...], exercise: str, why: str):
    """While the learner's function runs, the package's ``names`` (as ``dist_attn.X``, or from their own module)
    raise ExerciseError saying ``why``; restored after. The checker's own references are bound at import and
    unaffected."""
    saved = []

    def refuse(name):
        def refused(*args, **kwargs):
            raise ExerciseError(f"{exercise} calls dist_attn.{name}, which this exercise asks you to do without: {why}")
        return refused

    try:
        for module_name in _PACKAGE_MODULES:
            module = sys.modules.get(module_name)
            for name in names:
                if module is not None and hasattr(module, name):
                    saved.append((module, name, getattr(module, name)))
                    setattr(module, name, refuse(name))
        yield
    finally:
        for module, name, fn in reversed(saved):
            setattr(module, name, fn)


# ---------------------------------------------------------------------------------------------
# A learned sink merged through the log-sum-exp (gpt-oss)
# ---------------------------------------------------------------------------------------------

def _sink_case(h: int, L: int, seed: int):
    """Attention over all keys (out, lse) of float32 rows, some with scores past exp's float32 range, row 0
    seeing no key; the heads' sink logits; and gpt-oss's attention with those sinks (out, lse)."""
    gen = torch.Generator().manual_seed(seed)
    B, S, E, Ev = 2, 7, 4, 3
    q, k, v = (torch.randn(B, h, n, e, generator=gen) for n, e in ((L, E), (S, E), (S, Ev)))
    q[:, :, -1] *= 60.0                                  # the last row's lse passes 88.7: exp(lse) overflows float32
    mask = torch.arange(S)[None, :] <= torch.arange(L)[:, None] + 1
    mask[0] = False                                      # row 0 sees no key: lse = -inf, out = 0
    scale = E ** -0.5
    sink = torch.linspace(-1.0, 2.5, h)                  # one logit per head, each different
    out, lse = block_attention(q, k, v, scale=scale, mask=mask)
    # gpt-oss's sdpa: the sink as one more column of the scaled scores, softmax, the column dropped
    scores = (q @ k.transpose(-2, -1) * scale).masked_fill(~mask, float("-inf"))
    scores = torch.cat([scores, sink.view(1, h, 1, 1).expand(B, h, L, 1)], dim=-1)
    want = torch.softmax(scores, dim=-1)[..., :-1] @ v
    return (out, lse, sink), (want, torch.logsumexp(scores, dim=-1))


def check_add_sink(fn) -> None:
    """``fn(out, lse, sink) -> (out, lse)``: attention over all keys, with one learned sink logit per head
    added to the softmax (gpt-oss), from attention without it.

    out (B, h, L, Ev), lse (B, h, L) (-inf for a row that sees no key), sink (h,). The sink is one more block
    of the merge, with lse_c = sink and no value: lse' = logaddexp(lse, sink), out' = out * exp(lse - lse').
    Checked against gpt-oss's softmax over [scores, sink] with the sink's column dropped, in float32 with
    some scores past exp's range, and with as many heads as rows (a sink broadcast over the rows shows).
    """
    for h, L, seed in ((3, 5, 14), (4, 4, 15)):
        (out, lse, sink), (want, want_lse) = _sink_case(h, L, seed)
        try:
            result = attempt(fn, out.clone(), lse.clone(), sink.clone())
        except NotAttempted:
            return not_attempted("add_sink")
        except RuntimeError as error:
            raise ExerciseError(f"torch refused ({str(error).splitlines()[0]}): sink is (h,), one logit per head, "
                                "and lse (B, h, L): sink[:, None] meets every row of its own head; a share "
                                "(B, h, L) meets out (B, h, L, Ev) as share[..., None]") from None
        if not isinstance(result, tuple | list) or len(result) != 2:
            raise ExerciseError("return a pair (out, lse)")
        got, got_lse = (require_tensor(name, t, tuple(w.shape)) for name, t, w in
                        (("out", result[0], want), ("lse", result[1], want_lse)))
        if torch.isposinf(got_lse).any() or torch.isnan(got_lse).any():
            raise ExerciseError("an lse came out inf or NaN: exp(lse) overflows float32 for a row whose scores "
                                "pass 88.7 (and a row that sees no key has lse = -inf); combine the logs with "
                                "torch.logaddexp(lse, sink), never log(exp(lse) + exp(sink))")
        if not torch.isfinite(got).all():
            raise ExerciseError("NaN or inf in out: row 0 sees no key (lse = -inf, out = 0) and the last row's "
                                "scores overflow exp in float32; the keys' share exp(lse - lse_new) is finite "
                                "(0 for row 0)")
        new_lse = torch.logaddexp(lse, sink[:, None])
        keys_share = torch.exp(lse - new_lse).unsqueeze(-1)                       # (B, h, L, 1)
        if close(got, out) and close(got_lse, lse):
            raise ExerciseError("nothing changed: the sink takes part of the softmax mass, so both lse and out change")
        if close(got_lse, lse) and close(got, want):
            raise ExerciseError("out is right, but lse is still the keys' alone: the softmax now also sums "
                                "exp(sink), lse_new = logaddexp(lse, sink), which a backward needs")
        if h == L and close(got_lse, torch.logaddexp(lse, sink)):
            raise ExerciseError("the sink was broadcast over the rows, not the heads: sink[i] belongs to head i; "
                                "against lse (B, h, L) use sink[:, None]")
        if close(got_lse, lse + sink[:, None]):
            raise ExerciseError("lse + sink multiplies the two sums; the sink adds one term: lse_new = "
                                "log(exp(lse) + exp(sink)) = torch.logaddexp(lse, sink)")
        if not close(got_lse, want_lse):
            raise ExerciseError("lse should be the log-sum-exp over the keys and the sink: logaddexp(lse, sink)")
        if close(got, out):
            raise ExerciseError("out is unchanged: the sink takes weight from the keys and gives no value back; "
                                "scale out by the keys' share, exp(lse - lse_new)")
        if any(close(got, out * torch.sigmoid(x)[:, None, None]) for x in (sink, -sink)):
            raise ExerciseError("the keys' share depends on the row, not on the sink alone: exp(lse - lse_new), "
                                "with this row's lse")
        if close(got, out * torch.exp(sink[:, None] - new_lse).unsqueeze(-1)):
            raise ExerciseError("that is the sink's share of the mass; the keys keep the rest, exp(lse - lse_new)")
        if close(got, out / keys_share.clamp_min(1e-30)):
            raise ExerciseError("the share is upside down: exp(lse - lse_new) (at most 1), not exp(lse_new - lse)")
        if not close(got, want):
            raise ExerciseError("out should be gpt-oss's attention: out * exp(lse - lse_new), the keys' share of "
                                "the mass once the sink takes its own")
    return passed("the sink is one more block of the merge, with lse_c = sink and no value: lse' = "
                  "logaddexp(lse, sink), out' = out·exp(lse − lse'); equal to gpt-oss's softmax over the scores and "
                  "the sink with its column dropped")


# ---------------------------------------------------------------------------------------------
# The work of each step of a causal ring
# ---------------------------------------------------------------------------------------------

def _work_table(L: int, W: int, layout: str, *, mistake: str | None = None) -> list[list[int]]:
    """work[s][r]: tile scores rank r computes at step s of a causal ring (the package's tiles); ``mistake``
    plants one the checker names."""
    segs = [shard_segments(L, r, W, layout=layout) for r in range(W)]
    table = []
    for s in range(W):
        row = []
        for r in range(W):
            src = (r + s) % W if mistake == "reversed" else (r - s) % W
            if mistake is None or mistake in ("reversed", "transposed"):
                work = sum((t.rows.stop - t.rows.start) * (t.cols.stop - t.cols.start)
                           for t in ring_tiles(segs[r], segs[src], is_causal=True))
            elif mistake == "none":
                work = sum((qb - qa) * (kb - ka) for qa, qb in segs[r] for ka, kb in segs[src])
            elif mistake == "needed":
                work = sum(max(0, min(kb, q + 1) - ka) for qa, qb in segs[r] for q in range(qa, qb)
                           for ka, kb in segs[src])
            elif mistake == "full_only":
                work = sum((qb - qa) * (kb - ka) for qa, qb in segs[r] for ka, kb in segs[src] if kb - 1 <= qa)
            row.append(work)
        table.append(row)
    return [list(col) for col in zip(*table)] if mistake == "transposed" else table


_WORK_MESSAGES = {
    "transposed": "rows and columns swapped: work[s][r], one list per step s, holding every rank's work",
    "reversed": "the schedule runs backwards: at step s rank r holds the block of rank (r − s) mod W (it receives "
                "from rank r − 1)",
    "none": "nothing skipped: a tile whose keys all come after all its queries is never computed. In the zig-zag "
            "layout no block is skipped whole, but each of a rank's two chunks is a tile of its own, and its early "
            "chunk skips the block's late chunk",
    "needed": "that counts only the needed entries (key <= query); a tile is computed whole, its masked entries "
              "included, as the ranks counted",
    "full_only": "a tile only partly masked (the diagonal tile, whose keys and queries start together, or a run "
                 "that meets the queries halfway) is computed whole, not skipped: skip only when the first key "
                 "comes after the last query",
}


def check_step_work(fn) -> None:
    """``fn(L, world_size, layout) -> work``: work[s][r], the tile scores (query rows x key rows of every tile
    computed, masked entries included) rank r computes at step s of a causal ring, 0 where it skips.

    Checked against the package's tiles (``ring_tiles``, what the launched processes count) for both layouts, on
    lengths that do not divide evenly.
    """
    cases = [(37, 4, "contiguous"), (37, 4, "zigzag"), (29, 3, "zigzag"), (19, 2, "contiguous"),
             (13, 5, "zigzag"), (10, 5, "zigzag"), (23, 5, "contiguous")]
    hide = _hidden(("ring_tiles", "causal_work"), "step_work",
                   "classify each (query run, key run) tile yourself from the runs shard_segments gives (skipped "
                   "when every key comes after every query); ring_tiles is what the checker compares with")
    with hide:
        try:
            attempt(fn, 37, 4, "contiguous")
        except NotAttempted:
            return not_attempted("step_work")
        answers = {(L, W, layout): attempt(fn, L, W, layout) for L, W, layout in cases}
    for L, W, layout in cases:
        got = answers[(L, W, layout)]
        if isinstance(got, torch.Tensor):
            got = got.tolist()
        if (not isinstance(got, list | tuple) or len(got) != W
                or any(not isinstance(row, list | tuple) or len(row) != W for row in got)):
            raise ExerciseError(f"L={L}, W={W}, {layout}: return W = {W} lists (one per step) of W numbers (one per "
                                "rank)")
        got = [[int(x) for x in row] for row in got]
        want = _work_table(L, W, layout)
        if got == want:
            continue
        where = f"L={L}, W={W}, {layout}"
        for mistake, message in _WORK_MESSAGES.items():
            if got == _work_table(L, W, layout, mistake=mistake):
                raise ExerciseError(f"{where}: {message}")
        s, r = next((s, r) for s in range(W) for r in range(W) if got[s][r] != want[s][r])
        raise ExerciseError(f"{where}: at step {s} rank {r} holds the block of rank {(r - s) % W} and computes "
                            f"{want[s][r]} tile scores, got {got[s][r]}")
    for layout in ("contiguous", "zigzag"):                          # the columns add up to the ranks' counts
        assert [sum(col) for col in zip(*_work_table(37, 4, layout))] == causal_work(37, 4, layout=layout)
    W, c = 8, 64                                                     # 2W chunks of c rows
    cont, zz = (_work_table(2 * W * c, W, layout) for layout in ("contiguous", "zigzag"))
    idle = sum(x == 0 for row in cont for x in row)
    assert idle == W * (W - 1) // 2 and {x for row in cont for x in row} == {0, 4 * c * c}
    assert set(zz[0]) == {3 * c * c} and {x for row in zz[1:] for x in row} == {2 * c * c}
    return passed(f"each column adds up to what that rank counted. With W = {W} and 2W chunks of c = {c} rows: "
                  f"contiguous, a rank computes a whole block of (2c)² = {4 * c * c} scores or nothing, and {idle} "
                  f"of the {W * W} (step, rank) slots are empty; zig-zag, none is: every rank computes 3c² = "
                  f"{3 * c * c} at step 0 and 2c² = {2 * c * c}, half a block, at every later step")


# ---------------------------------------------------------------------------------------------
# Where a zig-zag rank holds position p
# ---------------------------------------------------------------------------------------------

def _chunk_starts(L: int, parts: int) -> list[int]:
    sizes = [L // parts + (1 if p < L % parts else 0) for p in range(parts)]
    return [sum(sizes[:p]) for p in range(parts + 1)]


def _owners(L: int, W: int, *, mistake: str | None = None) -> list[tuple[int, int]]:
    """(rank, row) of every position in the zig-zag layout (from the package's shards); ``mistake`` plants one."""
    if mistake in (None, "contiguous", "swapped", "global_row"):
        layout = "contiguous" if mistake == "contiguous" else "zigzag"
        owner = {}
        for r in range(W):
            for row, p in enumerate(shard_indices(L, r, W, layout=layout).tolist()):
                owner[p] = (row, r) if mistake == "swapped" else (r, p) if mistake == "global_row" else (r, row)
        return [owner[p] for p in range(L)]
    parts = 2 * W
    size = L // parts
    starts = _chunk_starts(L, parts)
    out = []
    for p in range(L):
        if mistake == "even":                                    # chunks of L // 2W, the rest to the last
            c = min(p // size, parts - 1)
            offset, early_len = p - c * size, size
        else:
            c = max(i for i in range(parts) if starts[i] <= p)
            offset = p - starts[c]
            rank = parts - 1 - c if c >= W else c
            early_len = starts[rank + 1] - starts[rank]
        if c < W:
            out.append((c, offset))
        elif mistake == "mod":                                   # chunks r and W + r
            out.append((c - W, (starts[c - W + 1] - starts[c - W]) + offset))
        elif mistake == "partner":                               # 2W - c: off by one
            wrong = parts - c
            out.append((wrong, (starts[wrong + 1] - starts[wrong] if wrong < parts else size) + offset))
        elif mistake == "late_row":                              # the late chunk's rows counted from 0
            out.append((parts - 1 - c, offset))
        else:                                                    # "even"
            out.append((parts - 1 - c, early_len + offset))
    return out


_OWNER_MESSAGES = {
    "contiguous": "that is the contiguous split; zig-zag cuts 2W chunks and gives rank r chunks r and 2W − 1 − r",
    "swapped": "the pair is the wrong way round: return (rank, row)",
    "global_row": "row is the index in the rank's own shard (its early chunk, then its late chunk), not the "
                  "global position",
    "mod": "chunk i >= W belongs to rank 2W − 1 − i (the first paired with the last), not to rank i − W",
    "partner": "off by one: chunk i >= W belongs to rank 2W − 1 − i (chunks count from 0)",
    "late_row": "a late chunk's rows come after the rank's early chunk in its shard: add the early chunk's length",
    "even": "L is not divisible by 2W here: the first L mod 2W chunks are one row longer, which moves every "
            "chunk's start",
}


def check_zigzag_owner(fn) -> None:
    """``fn(position, L, world_size) -> (rank, row)``: which rank holds global position ``position`` in the
    zig-zag layout, and at which row of its shard (early chunk first, then late chunk, as ``shard`` lays them
    out). Every position of several lengths, most not divisible by 2W, and W = 1."""
    cases = [(37, 4), (16, 4), (11, 3), (13, 2), (8, 4), (101, 5), (7, 1)]
    hide = _hidden(("shard_indices", "shard_segments", "shard_lengths", "shard", "unshard"), "zigzag_owner",
                   "work from L and W (the 2W chunks, the first L mod 2W of them one row longer, and which rank "
                   "holds chunk i); reading the position off a rank's shard is a look-up, not the layout")
    with hide:
        try:
            attempt(fn, 0, 16, 4)
        except NotAttempted:
            return not_attempted("zigzag_owner")
        answers = {(L, W): [attempt(fn, p, L, W) for p in range(L)] for L, W in cases}
    for L, W in cases:
        got = []
        for p, pair in enumerate(answers[(L, W)]):
            if not isinstance(pair, tuple | list) or len(pair) != 2:
                raise ExerciseError(f"zigzag_owner({p}, {L}, {W}) should return a pair (rank, row), got {pair!r}")
            got.append(tuple(int(x) for x in pair))
        want = _owners(L, W)
        if got == want:
            continue
        where = f"L={L}, world_size={W}"
        for mistake, message in _OWNER_MESSAGES.items():
            if (mistake != "even" or L % (2 * W)) and got == _owners(L, W, mistake=mistake):
                raise ExerciseError(f"{where}: {message}")
        p = next(p for p in range(L) if got[p] != want[p])
        raise ExerciseError(f"{where}: position {p} is row {want[p][1]} of rank {want[p][0]}, got {got[p]}")
    L, W = 37, 4
    last = _owners(L, W)[-1]
    assert last[0] == 0 and _owners(L, W)[0] == (0, 0)
    return passed(f"chunk i < W is rank i's, chunk i >= W rank 2W − 1 − i's, after its early chunk. At L = {L}, "
                  f"W = {W} the last position, whose logits sample the next token, is row {last[1]} of rank "
                  f"{last[0]}, the rank that holds position 0 too (in the contiguous layout it is on rank {W - 1})")


# ---------------------------------------------------------------------------------------------
# Ulysses and the ring's backward in one process, against the multi-process run
# ---------------------------------------------------------------------------------------------

def _case_ranks(case: dict, per_rank: list, method: str) -> int:
    if not isinstance(case, dict) or case.get("method") != method:
        raise ValueError(f"pass one of the notebook's {method} cases (cases[i] with method {method!r})")
    W = len(case["ranks"] or range(4))
    if len(per_rank) != W or any(r is None for r in per_rank):
        raise ValueError(f"pass the results of the {W} ranks that ran this case: [results[r][i] for r in ranks]")
    return W


def _backend(per_rank: list) -> str:
    """The backend the launched processes ran on ("gloo", "nccl"), as ``attention_worker`` reports it."""
    return str(per_rank[0].get("backend", "launched")) if isinstance(per_rank[0], dict) else "launched"


def _per_rank(got, W: int, name: str, shapes: list[tuple]) -> list[torch.Tensor]:
    if not isinstance(got, (list, tuple)) or len(got) != W:
        raise ExerciseError(f"{name} should return a list with one tensor per rank ({W} ranks), got "
                            f"{type(got).__name__}{'' if not isinstance(got, (list, tuple)) else f' of {len(got)}'}")
    return [require_tensor(f"{name}[{r}]", t, shape) for r, (t, shape) in enumerate(zip(got, shapes))]


def check_simulated_ulysses(fn, case: dict, per_rank: list) -> None:
    """``fn(q_shards, k_shards, v_shards, is_causal) -> out_shards``: DeepSpeed-Ulysses played by one process.

    ``q_shards[r]`` (B, h, n_r, E) are rank r's contiguous rows with all heads (k, v the same, as many K/V heads
    as query heads). The answer makes both all-to-alls as tensor reshuffles over the W virtual ranks (rank j
    gets heads [j h/W, (j+1) h/W) of every rank's rows, attends, and each rank gets its rows back) and returns
    each rank's output rows. Checked against the multi-process run of the same case (``per_rank[r]["out"]``),
    and, through autograd on your reshuffles, its gradients (``dq``, ``dk``, ``dv``).
    """
    W = _case_ranks(case, per_rank, "ulysses")
    B, h, L, E = case["q"].shape
    if case["k"].shape[1] != h:
        raise ValueError("pass a case with as many K/V heads as query heads")
    leaves = [case[n].detach().clone().requires_grad_() for n in "qkv"]
    shards = [[shard(t, r, W) for r in range(W)] for t in leaves]
    lengths = [s.shape[-2] for s in shards[0]]
    try:
        got = attempt(fn, *shards, case["is_causal"])
    except NotAttempted:
        return not_attempted("simulate_ulysses")
    except RuntimeError as error:
        raise ExerciseError(f"torch refused ({str(error).splitlines()[0]}): rank j's heads of every rank's rows "
                            "are glued along the rows (dim -2), heads [j h/W, (j+1) h/W) taken along dim 1") from None
    outs = _per_rank(got, W, "simulate_ulysses", [(B, h, n, E) for n in lengths])
    want = [per_rank[r]["out"] for r in range(W)]
    if all(close(o, w, atol=1e-10, rtol=1e-10) for o, w in zip(outs, want)):
        try:
            torch.autograd.backward(outs, [shard(case["grad"], r, W) for r in range(W)])
        except RuntimeError as error:
            raise ExerciseError(f"the outputs match but autograd cannot reach q, k, v through them "
                                f"({str(error).splitlines()[0]}): build them with differentiable torch ops "
                                "(split, cat, narrow), not from detached copies") from None
        for name, leaf in zip(("dq", "dk", "dv"), leaves):
            if leaf.grad is None or not close(leaf.grad, unshard([per_rank[r][name] for r in range(W)],
                                                                   layout="contiguous"), atol=1e-10, rtol=1e-10):
                raise ExerciseError(f"the outputs match but autograd through your reshuffles gives a different {name}: "
                                    "build them from q, k, v with differentiable torch ops (split, cat, narrow), not "
                                    "from detached copies")
        return passed(f"two all-to-alls as reshuffles over {W} virtual ranks: every rank's rows, and the gradients "
                      f"through them, equal the {W} {_backend(per_rank)} processes' to 1e-10")
    q, k, v = (t.detach() for t in leaves)
    local = [F.scaled_dot_product_attention(*(s[r].detach() for s in shards), is_causal=case["is_causal"])
             for r in range(W)]
    if all(close(o, w, atol=1e-10) for o, w in zip(outs, local)):
        raise ExerciseError("each rank attended only to its own rows: the first all-to-all must give rank j heads "
                            "[j h/W, (j+1) h/W) of *all* rows, from every rank")
    full = F.scaled_dot_product_attention(q, k, v, is_causal=case["is_causal"])
    if case["is_causal"] and close(unshard(outs, layout="contiguous"),
                                   F.scaled_dot_product_attention(q, k, v), atol=1e-10):
        raise ExerciseError("the causal mask is missing: after the all-to-all each rank holds all rows of its "
                            "heads in order, so is_causal=True applies the global mask")
    if close(unshard(outs, layout="contiguous"), full, atol=1e-10):
        raise ExerciseError("right numbers, but not split as the ranks hold them: return one tensor per rank with "
                            "its own rows (n_r) and all h heads")
    strided = torch.cat([full[:, j::W] for j in range(W)], dim=1)        # heads dealt round-robin, never put back
    if close(unshard(outs, layout="contiguous"), strided, atol=1e-10):
        raise ExerciseError("the heads came back in the wrong order: rank j's heads are the contiguous range "
                            "[j h/W, (j+1) h/W); the second all-to-all puts them back in that order")
    raise ExerciseError("the outputs differ from the multi-process run: to heads, rank j takes heads [j h/W, "
                        "(j+1) h/W) of every rank's rows (glued in rank order along the rows), attends, and the "
                        "second all-to-all sends rows n_0.. of its output back to rank 0, and so on")


def _ring_backward_inputs(case: dict, W: int):
    """Each rank's shards, its forward output and log-sum-exp (over all keys), its incoming gradient."""
    layout, is_causal = case["layout"], case["is_causal"]
    q, k, v, grad = (case[n].detach() for n in ("q", "k", "v", "grad"))
    L = q.shape[-2]
    pos = [shard_indices(L, r, W, layout=layout) for r in range(W)]
    qs, ks, vs, gs = ([shard(t, r, W, layout=layout) for r in range(W)] for t in (q, k, v, grad))
    scale = q.shape[-1] ** -0.5
    outs, lses = [], []
    for r in range(W):
        mask = pos[r][:, None] >= torch.arange(L)[None, :] if is_causal else None
        o, s = block_attention(qs[r], k, v, scale=scale, mask=mask)
        outs.append(o)
        lses.append(s)
    return qs, ks, vs, outs, lses, gs, pos, scale


def _reference_ring_backward(qs, ks, vs, outs, lses, gs, pos, is_causal, *, hops=None, travel=True, delta=True):
    """The ring's backward in one process; the flags plant the mistakes the checker names."""
    W = len(qs)
    scale = qs[0].shape[-1] ** -0.5
    deltas = [(g * o).sum(-1) if delta else torch.zeros_like(s) for g, o, s in zip(gs, outs, lses)]
    dq = [torch.zeros_like(q) for q in qs]
    held = [(r, torch.zeros_like(ks[r]), torch.zeros_like(vs[r])) for r in range(W)]   # (block, dK, dV)
    own_dk, own_dv = [torch.zeros_like(k) for k in ks], [torch.zeros_like(v) for v in vs]
    for step in range(W):
        for r in range(W):
            src, dk_acc, dv_acc = held[r]
            mask = pos[src][None, :] <= pos[r][:, None] if is_causal else None
            g = block_attention_backward(qs[r], ks[src], vs[src], lses[r], deltas[r], gs[r], scale=scale, mask=mask)
            dq[r] += g[0]
            if travel:
                dk_acc += g[1]
                dv_acc += g[2]
            elif src == r:                                  # planted: only the own block's gradients kept
                own_dk[r] += g[1]
                own_dv[r] += g[2]
        if step < (W if hops is None else hops):
            held = [held[(r - 1) % W] for r in range(W)]     # send to r + 1, receive from r - 1
    if not travel:
        return [(dq[r], own_dk[r], own_dv[r]) for r in range(W)]
    return [(dq[r], held[r][1], held[r][2]) for r in range(W)]


_ONE_SHORT = ("the dK, dV accumulators end one hop short (rank r holds block r + 1's): after the last step they "
              "travel once more, home to their owner (W hops in all, K/V only W - 1)")


def check_ring_backward(fn, case: dict, per_rank: list) -> None:
    """``fn(q, k, v, out, lse, grad, positions, is_causal) -> [(dq, dk, dv) per rank]``: the ring's backward
    played by one process.

    Each argument but ``is_causal`` is a list over the W virtual ranks: rank r's shards q[r] (B, h, n_r, E),
    k[r], v[r], its forward output out[r] and log-sum-exp lse[r] (B, h, n_r) over all keys, the incoming
    gradient grad[r], and positions[r], the global positions of its rows. At step s rank r holds K/V block
    (r - s) mod W with the dK, dV accumulators travelling with it; it adds its tiles' gradients
    (``dist_attn.block_attention_backward``) to its own dq and to those accumulators, and passes block and
    accumulators on to rank r + 1; they come home after W hops. Checked against the multi-process run of the
    same case (``per_rank[r]["dq"]``, ``["dk"]``, ``["dv"]``).
    """
    W = _case_ranks(case, per_rank, "ring")
    inputs = _ring_backward_inputs(case, W)
    qs, ks, vs, outs, lses, gs, pos, _ = inputs
    try:
        got = attempt(fn, [t.clone() for t in qs], [t.clone() for t in ks], [t.clone() for t in vs],
                      [t.clone() for t in outs], [t.clone() for t in lses], [t.clone() for t in gs],
                      [p.clone() for p in pos], case["is_causal"])
    except NotAttempted:
        return not_attempted("ring_backward")
    if not isinstance(got, (list, tuple)) or len(got) != W or any(not isinstance(g, (list, tuple)) or len(g) != 3
                                                                  for g in got):
        raise ExerciseError(f"return one (dq, dk, dv) triple per rank: a list of {W} triples")
    one_short = [tuple(ks[(r + 1) % W].shape) for r in range(W)]
    if W > 1 and [tuple(g[1].shape) if isinstance(g[1], torch.Tensor) else None for g in got] == one_short \
            and one_short != [tuple(t.shape) for t in ks]:
        raise ExerciseError(f"{_ONE_SHORT} (rank r returned the accumulators of block r + 1: see their shapes)")
    for r, (dq, dk, dv) in enumerate(got):
        require_tensor(f"dq of rank {r}", dq, tuple(qs[r].shape))
        require_tensor(f"dk of rank {r}", dk, tuple(ks[r].shape))
        require_tensor(f"dv of rank {r}", dv, tuple(vs[r].shape))
    names = ("dq", "dk", "dv")

    def matches(triples):
        return all(close(t, w, atol=1e-10, rtol=1e-10) for trip, want in zip(got, triples) for t, w in zip(trip, want))

    want = [tuple(per_rank[r][n] for n in names) for r in range(W)]
    if matches(want):
        return passed(f"dQ stays home, dK and dV travel with their K/V block and come home after {W} hops: every "
                      f"rank's gradients equal the {W} {_backend(per_rank)} processes' to 1e-10")
    is_causal = case["is_causal"]
    dq_ok = all(close(g[0], w[0], atol=1e-10, rtol=1e-10) for g, w in zip(got, want))
    if dq_ok and matches(_reference_ring_backward(*inputs[:6], pos, is_causal, hops=W - 1)):
        raise ExerciseError(_ONE_SHORT)
    if dq_ok and matches(_reference_ring_backward(*inputs[:6], pos, is_causal, travel=False)):
        raise ExerciseError("each rank kept only the dK, dV of its own block: the gradients other ranks compute for "
                            "block j must travel with it and be summed on the way")
    if matches(_reference_ring_backward(*inputs[:6], pos, is_causal, delta=False)):
        raise ExerciseError("D = rowsum(dO * O) is missing from dS = P * (dP - D) (notebook 11): pass "
                            "delta = (grad * out).sum(-1) of the rank's rows")
    if is_causal and matches(_reference_ring_backward(*inputs[:6], pos, False)):
        raise ExerciseError("the causal mask is missing: mask each tile with the global positions, "
                            "positions[src][None, :] <= positions[r][:, None]")
    if dq_ok:
        raise ExerciseError("dq is right; dk, dv are not: add each tile's dk, dv to the accumulators of the block "
                            "the rank holds at that step, and pass them on with it")
    raise ExerciseError("dq differs from the multi-process run: at step s rank r holds block (r - s) mod W and adds "
                        "its tile's dq to its own rows' gradient, using its own lse and D")
