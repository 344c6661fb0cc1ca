"""selfattn_lite.distributed: sharding, the log-sum-exp merge, formulas, and real multi-process runs
(gloo processes on this CPU) of ring attention and Ulysses against single-process SDPA."""

import multiprocessing
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import ROOT
from hypothesis import given
from hypothesis import strategies as st

from selfattn_lite import distributed as D

# ----------------------------------------------------------------------------- sharding (one process)

def test_split_sizes_give_the_first_ranks_the_extra_rows():
    assert D.split_sizes(10, 4) == [3, 3, 2, 2]
    assert D.split_sizes(8, 4) == [2, 2, 2, 2]
    assert D.shard_indices(10, 1, 3).tolist() == [4, 5, 6]
    # zigzag: 2W = 6 chunks of [2, 2, 2, 2, 1, 1]; rank 1 holds chunks 1 and 4
    assert D.shard_indices(10, 1, 3, layout="zigzag").tolist() == [2, 3, 8]
    assert D.shard_indices(16, 0, 4, layout="zigzag").tolist() == [0, 1, 14, 15]


@given(L=st.integers(1, 60), world=st.integers(1, 6), layout=st.sampled_from(D.LAYOUTS),
       dim=st.sampled_from([0, 1, -1, -2]))
def test_shard_then_unshard_is_the_identity(L, world, layout, dim):
    if L < (world if layout == "contiguous" else 2 * world):
        with pytest.raises(ValueError, match="cannot be cut"):
            D.shard(torch.zeros(L), 0, world, layout=layout, dim=0)
        return
    shape = [3, 2, 4]
    shape[dim] = L
    x = torch.randn(shape)
    parts = [D.shard(x, r, world, layout=layout, dim=dim) for r in range(world)]
    assert [p.shape[dim] for p in parts] == D.shard_lengths(L, world, layout=layout)
    lengths = [p.shape[dim] for p in parts]
    assert max(lengths) - min(lengths) <= (1 if layout == "contiguous" else 2)
    assert torch.equal(D.unshard(parts, layout=layout, dim=dim), x)
    positions = torch.cat([D.shard_indices(L, r, world, layout=layout) for r in range(world)])
    assert sorted(positions.tolist()) == list(range(L))          # every row exactly once


def test_bad_sharding_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="layout must be one of"):
        D.shard(torch.zeros(4, 2), 0, 2, layout="striped")
    with pytest.raises(ValueError, match="rank must be"):
        D.shard(torch.zeros(4, 2), 2, 2)
    with pytest.raises(ValueError, match="not a 'contiguous' split"):
        D.unshard([torch.zeros(2, 3), torch.zeros(4, 3)])
    with pytest.raises(ValueError, match="out of range"):
        D.shard(torch.zeros(4, 2), 0, 2, dim=5)


# ----------------------------------------------------------------------------- merge (one process)

@given(L=st.integers(1, 9), S=st.integers(2, 12), cut=st.integers(1, 11), is_causal=st.booleans(),
       dtype=st.sampled_from([torch.float32, torch.float64]))
def test_merging_two_blocks_of_keys_is_attention_to_all(L, S, cut, is_causal, dtype):
    cut = min(cut, S - 1)
    gen = torch.Generator().manual_seed(L * 100 + S)
    q, k, v = (torch.randn(2, n, 5, generator=gen, dtype=dtype) for n in (L, S, S))
    mask = torch.ones(L, S, dtype=torch.bool).tril() if is_causal else None
    scale = 5 ** -0.5
    o1, l1 = D.block_attention(q, k[:, :cut], v[:, :cut], scale=scale, mask=None if mask is None else mask[:, :cut])
    o2, l2 = D.block_attention(q, k[:, cut:], v[:, cut:], scale=scale, mask=None if mask is None else mask[:, cut:])
    out, lse = D.merge_partials(o1, l1, o2, l2)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=is_causal))
    scores = (q @ k.transpose(-2, -1) * scale).masked_fill(~mask if is_causal else torch.zeros(L, S, dtype=torch.bool),
                                                           float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1))


def test_merge_of_two_empty_blocks_is_zero_not_nan():
    ninf = torch.full((3,), float("-inf"))
    out, lse = D.merge_partials(torch.zeros(3, 2), ninf, torch.zeros(3, 2), ninf)
    assert torch.equal(out, torch.zeros(3, 2)) and torch.isneginf(lse).all()


# ----------------------------------------------------------------------------- formulas (one process)

@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_causal_work_contiguous_is_unbalanced_and_zigzag_is_balanced(world):
    c = 3                                               # rows per chunk; 2W chunks
    L = 2 * world * c
    contiguous = D.causal_work(L, world, layout="contiguous")
    zigzag = D.causal_work(L, world, layout="zigzag")
    # contiguous: rank r computes r + 1 blocks of (2c)^2 (its diagonal block in full, masked inside)
    assert contiguous == [4 * c * c * (r + 1) for r in range(world)]
    # zigzag: chunk tiles (a, b) with b <= a: (r + 1) for the early chunk, 2W - r for the late one
    assert zigzag == [(2 * world + 1) * c * c] * world
    assert D.causal_work(L, world, is_causal=False) == [L * L // world] * world


def test_ring_bytes_formula_for_even_lengths():
    for world in (2, 3, 4):
        L, N, d, b = 12 * world, 6, 8, 4
        for row in D.ring_bytes_per_rank(L, world, batch_heads=N, head_dim=d, itemsize=b):
            assert row["kv"] == 2 * (world - 1) * (L // world) * N * d * b
            assert row["dkv"] == 2 * L * N * d * b                 # W hops of dK, dV


def test_ulysses_bytes_formula_for_even_lengths():
    world, L, B, h, d, b = 4, 16, 2, 8, 8, 4
    for row in D.ulysses_bytes_per_rank(L, world, batch=B, heads=h, head_dim=d, itemsize=b):
        shard_bytes = B * h * (L // world) * d * b                  # one of q, k, v, out on one rank
        assert row["forward"] == 4 * shard_bytes * (world - 1) // world
        assert row["backward"] == row["forward"]


def test_kv_replication_fills_the_ranks_and_keeps_the_groups():
    assert D.kv_replication(8, 8, 4) == 1 and D.kv_replication(8, 2, 2) == 1
    assert D.kv_replication(8, 2, 4) == 2 and D.kv_replication(8, 2, 8) == 4
    assert D.kv_replication(64, 8, 16) == 2 and D.kv_replication(64, 8, 64) == 8
    assert D.kv_replication(12, 6, 4) == 2                           # 6 K/V heads over 4 ranks: 12 copies
    with pytest.raises(ValueError, match="divisible by 16"):
        D.kv_replication(8, 2, 16)                                    # the query heads cap the degree
    with pytest.raises(ValueError, match="divisible"):
        D.kv_replication(8, 3, 4)                                     # 3 K/V heads cannot group 8 query heads
    for h, h_kv, w in ((8, 2, 4), (24, 6, 8), (12, 3, 4), (64, 8, 32)):
        copies = D.kv_replication(h, h_kv, w)
        assert (h_kv * copies) % w == 0 and h % (h_kv * copies) == 0   # a whole share each, groups kept


def test_ulysses_bytes_grow_with_the_replication():
    kw = dict(batch=1, heads=8, head_dim=4, itemsize=4)
    plain = D.ulysses_bytes_per_rank(32, 4, kv_heads=8, **kw)[0]
    gqa = D.ulysses_bytes_per_rank(32, 4, kv_heads=2, **kw)[0]        # replicated to 4 K/V heads
    # per row of the shard: q sends 8 - 2 heads, K and V send (4 - 1) heads each, of 4 values of 4 bytes
    assert gqa["qkv"] == 8 * ((8 - 2) * 4 + (4 - 1) * 8) * 4
    assert plain["qkv"] == 8 * ((8 - 2) * 4 + (8 - 2) * 8) * 4


def test_ring_tiles_classify_with_the_shared_tile_kind():
    from selfattn_lite.efficient import TileKind

    tiles = list(D.ring_tiles([(4, 8)], [(0, 4), (4, 8), (8, 12)], is_causal=True))
    assert [t.kind for t in tiles] == [TileKind.FULL, TileKind.PARTIAL]          # the later keys: SKIP
    assert tiles[0].mask is None and tiles[1].mask.tolist() == torch.ones(4, 4).tril().bool().tolist()
    assert (tiles[1].rows, tiles[1].cols) == (slice(0, 4), slice(4, 8))
    assert [t.kind for t in D.ring_tiles([(4, 8)], [(8, 12)], is_causal=False)] == [TileKind.FULL]


def test_ring_kv_held_formula():
    per_block = 2 * 5 * 4                                              # 2 heads x (E + Ev = 5) x 4 bytes, per row
    assert D.ring_kv_held_bytes(12, 4, batch_heads=2, head_dim=2, value_dim=3) == [3 * 3 * per_block] * 4
    assert D.ring_kv_held_bytes(12, 2, batch_heads=2, head_dim=2, value_dim=3) == [2 * 6 * per_block] * 2
    assert D.ring_kv_held_bytes(12, 1, batch_heads=2, head_dim=2, value_dim=3) == [12 * per_block]


def test_ring_schedule():
    assert D.ring_schedule(3) == [[0, 1, 2], [2, 0, 1], [1, 2, 0]]


def test_max_sequence_length_calculator():
    kw = dict(d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336)      # Llama-3-8B's shapes
    layer = D.activation_values_per_token(d_model=4096, n_heads=32, n_kv_heads=8, ffn_dim=14336)
    assert layer == 6 * 4096 + 2 * 1024 + 4 * 14336
    one = D.max_sequence_length(1, 80, **kw)
    eight = D.max_sequence_length(8, 80, **kw)
    # one device, checkpointed: each layer's input, one layer recomputed and its gradients, 2 bytes each
    per_token = (32 * 4096 + 2 * layer) * 2
    assert one["bytes_per_token"]["single"] == per_token
    assert one["single"] == int(80 * 2**30 / per_token) // 2 * 2
    # without checkpointing every layer keeps everything: far shorter
    assert D.max_sequence_length(1, 80, **kw, checkpoint=False)["single"] == int(80 * 2**30 / ((33 * layer) * 2)) // 2 * 2
    # ring, as ring-flash-attention's backward holds it: two K/V blocks (in use, arriving) in bf16, one block's
    # kernel gradients dq, dk, dv in bf16, and float32 accumulators: dQ, and dK, dV in use and arriving
    ring_pt = per_token + 4 * 1024 * 2 + (4096 + 2 * 1024) * 2 + (4096 + 4 * 1024) * 4
    assert eight["bytes_per_token"]["ring"] == ring_pt
    assert eight["ring"] == int(80 * 2**30 * 8 / ring_pt) // 16 * 16       # linear in the devices, per token of a shard
    assert D.max_sequence_length(2, 80, **kw)["ring"] == int(80 * 2**30 * 2 / ring_pt) // 4 * 4
    sixteen = D.max_sequence_length(16, 80, **kw)
    # 16 ranks, 8 K/V heads: each K/V head replicated twice; the 32 query heads cap the degree at 32
    # Ulysses: the head-layout q, k, v replace the shard's; beyond A the K/V copies (2 (R - 1) d_kv), the kernel's
    # head-layout output beside the shard-layout one o_proj saves (d), and the head-layout dq, dk, dv during the
    # backward's all-to-all (d + 2 R d_kv): 2 d + (4 R - 2) d_kv
    budget = 80 * 2**30 * 16 / (per_token + (2 * 4096 + (4 * 2 - 2) * 1024) * 2)
    assert sixteen["ulysses"] == int(budget) // 32 * 32
    assert D.max_sequence_length(32, 80, **kw)["ulysses"] is not None
    assert D.max_sequence_length(64, 80, **kw)["ulysses"] is None
    for n in (2, 4, 8, 16, 32):
        row = D.max_sequence_length(n, 80, **kw)
        assert row["bytes_per_token"]["ring"] == ring_pt                    # the ring's count does not depend on W
        assert row["bytes_per_token"]["ulysses"] == per_token + (2 * 4096 + (4 * D.kv_replication(32, 8, n) - 2) * 1024) * 2
    assert one["ring"] == one["ulysses"] == one["single"]              # one device: nothing travels
    mha = dict(d_model=4096, n_layers=32, n_heads=32, ffn_dim=11008)    # MHA: ring 7 d (bf16) + 5 d (fp32), Ulysses 4 d
    mha8 = D.max_sequence_length(8, 80, **mha)
    assert mha8["bytes_per_token"]["ring"] - mha8["bytes_per_token"]["ulysses"] == (7 * 2 + 5 * 4 - 4 * 2) * 4096
    # Ulysses' output is held twice (the kernel's head layout, o_proj's shard layout): d more than one device's count
    assert mha8["bytes_per_token"]["ulysses"] - mha8["bytes_per_token"]["single"] == (2 * 4096 + 2 * 4096) * 2
    fp32 = D.max_sequence_length(8, 80, **mha, bytes_per_value=4)      # float32 model: the accumulators are 4 bytes too
    assert fp32["bytes_per_token"]["ring"] - fp32["bytes_per_token"]["single"] == 12 * 4096 * 4
    with pytest.raises(ValueError, match="nothing left"):
        D.max_sequence_length(2, 8, reserved_gib=9, **kw)


def test_ring_attention_without_a_process_group_says_so():
    q = torch.randn(1, 4, 8)
    with pytest.raises(ValueError, match="no process group"):
        D.ring_attention(q, q, q)


def test_launch_rejects_a_function_spawn_cannot_import():
    def local(x):
        return x
    with pytest.raises(ValueError, match="top level of an importable module"):
        D.launch(local, 2, 1)


# ----------------------------------------------------------------------------- the ring widget and figure

def test_ring_widget_steps_and_counts_work():
    import matplotlib
    matplotlib.use("Agg")
    from selfattn_lite import viz

    w = viz.RingWidget(4, layout="contiguous")
    first = w.image.value
    assert w.held == [0, 1, 2, 3] and w.renders == 1
    w.step_slider.value = 3
    assert w.held == [1, 2, 3, 0] and w.image.value != first and w.renders == 2
    needed = w.L * (w.L + 1) // 2
    assert (w.grid >= 0).sum() == needed                     # every causal score computed exactly once
    assert w.work == [10 + 16 * r for r in range(4)]          # contiguous: r full 4 x 4 blocks + a triangle of 10
    w.layout_choice.value = "zigzag"
    assert w.work == [34, 34, 34, 34] and sum(w.work) == needed
    w.world_slider.value = 3
    assert w.step_slider.max == 2 and w.play.max == 2
    w.causal.value = False
    w.step_slider.value = 2
    assert (w.grid >= 0).sum() == w.L ** 2


def test_ring_schedule_figure_shows_skips_only_for_contiguous():
    from selfattn_lite.course.figures.distributed import _share

    assert [_share(0, s, 4, "contiguous") for s in (0, 1, 2, 3)] == [1.0, 0.0, 0.0, 0.0]
    assert [_share(3, s, 4, "contiguous") for s in (0, 1, 2, 3)] == [1.0, 1.0, 1.0, 1.0]
    assert [_share(1, s, 4, "zigzag") for s in (0, 1, 2, 3)] == [0.5, 0.75, 0.5, 0.5]


# ----------------------------------------------------------------------------- real processes

def _random_cases(rng, world, n, ranks=None, dtype=torch.float64, heads=4):
    """n cases with lengths nobody wrote down: at least 2W, usually not divisible by W or 2W."""
    cases = []
    for i in range(n):
        L = rng.randint(2 * world, 6 * world + 5)
        gen = torch.Generator().manual_seed(rng.randint(0, 10**6))
        B, E, Ev = rng.randint(1, 2), rng.choice([4, 8]), rng.choice([4, 6])
        q, k = (torch.randn(B, heads, L, E, generator=gen, dtype=dtype) for _ in range(2))
        v, g = (torch.randn(B, heads, L, Ev, generator=gen, dtype=dtype) for _ in range(2))
        method = "ulysses" if i % 3 == 2 and heads % world == 0 else "ring"
        layout = "zigzag" if (i % 2 and method == "ring") else "contiguous"
        cases.append(dict(method=method, q=q, k=k, v=v, grad=g, is_causal=bool(i % 4 < 2), layout=layout,
                          ranks=ranks))
    return cases


def _check_against_sdpa(cases, per_rank, tol):
    for i, case in enumerate(cases):
        ranks = case["ranks"] or list(range(len(per_rank)))
        parts = [per_rank[r][i] for r in ranks]
        world, layout = len(ranks), case["layout"]
        q, k, v = (case[n].clone().requires_grad_() for n in "qkv")
        want = F.scaled_dot_product_attention(q, k, v, is_causal=case["is_causal"], enable_gqa=k.shape[1] != q.shape[1])
        want.backward(case["grad"])
        for name, ref in (("out", want), ("dq", q.grad), ("dk", k.grad), ("dv", v.grad)):
            torch.testing.assert_close(D.unshard([p[name] for p in parts], layout=layout), ref.detach(), **tol,
                                       msg=lambda m, n=name, c=case: f"{n} of {c['method']}, W={world}, "
                                       f"L={c['q'].shape[-2]}, {c['layout']}, causal={c['is_causal']}: {m}")
        # the bytes each rank sent, counted on the tensors it sent, against the formulas
        B, h, L, E = case["q"].shape
        Ev, b = case["v"].shape[-1], case["q"].element_size()
        if case["method"] == "ring":
            formula = D.ring_bytes_per_rank(L, world, layout=layout, batch_heads=B * h, head_dim=E, value_dim=Ev,
                                            itemsize=b)
            work = D.causal_work(L, world, layout=layout, is_causal=case["is_causal"])
            for r, p in enumerate(parts):
                assert p["forward"]["sent"].get("kv", 0) == formula[r]["kv"]
                assert p["backward"]["sent"].get("kv_bwd", 0) == formula[r]["kv_bwd"]
                assert p["backward"]["sent"].get("dkv", 0) == formula[r]["dkv"]
                assert p["forward"]["scores"] == work[r]
                assert p["kv_bytes"] == B * h * D.shard_lengths(L, world, layout=layout)[r] * (E + Ev) * b
        else:
            formula = D.ulysses_bytes_per_rank(L, world, batch=B, heads=h, kv_heads=case["k"].shape[1], head_dim=E,
                                               value_dim=Ev, itemsize=b)
            for r, p in enumerate(parts):
                assert p["forward"]["sent"].get("all_to_all", 0) == formula[r]["forward"]
                assert p["backward"]["sent"].get("all_to_all", 0) == formula[r]["backward"]


def _descendants(pid=None):
    """Pids of every process below this one (children, their children...), from /proc (Linux)."""
    pid = os.getpid() if pid is None else pid
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _helpers():
    """multiprocessing's own long-lived helpers: the forkserver the ranks fork from, the resource tracker."""
    import multiprocessing.forkserver as forkserver
    import multiprocessing.resource_tracker as resource_tracker
    return {forkserver._forkserver._forkserver_pid, resource_tracker._resource_tracker._pid} - {None}


_BEFORE: set = set()        # processes below us before this module ran (other tests' servers, say)


def _no_children_left():
    """Every rank has exited; nothing new is left below us but multiprocessing's two helpers."""
    assert multiprocessing.active_children() == []
    if Path("/proc/self/stat").exists():
        assert not _descendants() - _BEFORE - _helpers(), "a rank process is still running"


@pytest.fixture(scope="module", autouse=True)
def _stop_the_helpers_at_the_end():
    if Path("/proc/self/stat").exists():
        _BEFORE.update(_descendants())
    yield
    import multiprocessing.forkserver as forkserver
    import multiprocessing.resource_tracker as resource_tracker
    forkserver._forkserver._stop()
    resource_tracker._resource_tracker._stop()
    if Path("/proc/self/stat").exists():
        left = _descendants() - _BEFORE
        assert not left, f"processes left after the tests: {left}"


def test_two_processes_ring_and_ulysses_equal_sdpa_with_gradients_and_counted_bytes():
    rng = random.Random(2)
    cases = _random_cases(rng, 2, 12)
    cases += _random_cases(rng, 2, 4, dtype=torch.float32)
    gqa = _random_cases(rng, 2, 3, heads=4)[2]                       # Ulysses with 2 K/V heads for 4 query heads
    assert gqa["method"] == "ulysses"
    gqa.update(k=gqa["k"][:, :2].contiguous(), v=gqa["v"][:, :2].contiguous())
    cases.append(gqa)
    assert {c["layout"] for c in cases} == set(D.LAYOUTS) and {c["method"] for c in cases} == {"ring", "ulysses"}
    assert any(c["q"].shape[-2] % 4 for c in cases)                  # uneven lengths are in
    per_rank = D.launch(D.attention_worker, 2, cases)
    _no_children_left()
    _check_against_sdpa([c for c in cases if c["q"].dtype == torch.float64],
                        [[r for r, c in zip(rank, cases) if c["q"].dtype == torch.float64] for rank in per_rank],
                        dict(atol=1e-10, rtol=1e-10))
    _check_against_sdpa([c for c in cases if c["q"].dtype == torch.float32],
                        [[r for r, c in zip(rank, cases) if c["q"].dtype == torch.float32] for rank in per_rank],
                        dict(atol=2e-5, rtol=2e-5))


def test_four_processes_and_a_group_of_three():
    rng = random.Random(4)
    cases = _random_cases(rng, 4, 6) + _random_cases(rng, 3, 4, ranks=[0, 1, 3], heads=6)
    per_rank = D.launch(D.attention_worker, 4, cases)
    _no_children_left()
    assert per_rank[2][-1] is None                                    # rank 2 is not in the group of three
    _check_against_sdpa(cases, per_rank, dict(atol=1e-10, rtol=1e-10))
    # memory: each rank holds its 1/W share of K/V (measured on the tensors it holds)
    case = cases[0]
    full_kv = case["k"].nbytes + case["v"].nbytes
    assert sum(r[0]["kv_bytes"] for r in per_rank) == full_kv
    assert all(r[0]["kv_bytes"] <= full_kv / 4 * 1.5 for r in per_rank)
    # at its peak in the forward a rank holds its own shard, the block in use and the one arriving
    B, h, L, E = case["q"].shape
    held = D.ring_kv_held_bytes(L, 4, layout=case["layout"], batch_heads=B * h, head_dim=E,
                                value_dim=case["v"].shape[-1], itemsize=case["q"].element_size())
    assert [r[0]["forward"]["kv_held"] for r in per_rank] == held
    assert all(2 * kv < peak < full_kv for kv, peak in zip((r[0]["kv_bytes"] for r in per_rank), held))


def test_ulysses_replicates_kv_heads_when_there_are_more_ranks_than_kv_heads():
    gen = torch.Generator().manual_seed(8)
    cases = []
    for ranks, is_causal in (([0, 1, 2, 3], True), (None, False), (None, True)):   # W = 4, 8, 8
        L = 21 if ranks else 29
        q, grad = (torch.randn(1, 8, L, 4, generator=gen, dtype=torch.float64) for _ in range(2))
        k, v = (torch.randn(1, 2, L, 4, generator=gen, dtype=torch.float64) for _ in range(2))   # h_kv = 2
        cases.append(dict(method="ulysses", q=q, k=k, v=v, grad=grad, is_causal=is_causal, layout="contiguous",
                          ranks=ranks))
    per_rank = D.launch(D.attention_worker, 8, cases)
    _no_children_left()
    _check_against_sdpa(cases, per_rank, dict(atol=1e-10, rtol=1e-10))   # outputs, gradients and bytes
    plain = D.ulysses_bytes_per_rank(21, 4, heads=8, kv_heads=4, head_dim=4, itemsize=8)
    assert per_rank[0][0]["forward"]["sent"]["all_to_all"] == plain[0]["forward"]   # as if 4 K/V heads


def test_one_process_is_plain_attention():
    cases = _random_cases(random.Random(1), 1, 3)
    per_rank = D.launch(D.attention_worker, 1, cases)
    _check_against_sdpa(cases, per_rank, dict(atol=1e-10, rtol=1e-10))
    assert all(not r["forward"]["sent"].get("kv") and not r["backward"]["sent"].get("dkv") for r in per_rank[0])
    _no_children_left()


def test_bad_input_in_the_ranks_raises_value_error_and_leaves_no_process():
    q = torch.randn(1, 3, 8, 4)                                        # 3 heads over 2 ranks
    with pytest.raises(ValueError, match="divisible by 2"):
        D.launch(D.attention_worker, 2, [dict(method="ulysses", q=q, k=q, v=q, grad=None)])
    _no_children_left()


def test_a_failing_rank_raises_with_its_traceback_and_a_hung_one_times_out():
    import time

    with pytest.raises(RuntimeError, match=r"rank \d of 2 failed:[\s\S]*TypeError"):
        D.launch(D.reset_counters, 2, "an argument it does not take")
    _no_children_left()
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="timed out after 1"):
        D.launch(time.sleep, 2, 60, timeout=1.0)                  # both ranks sleep: stopped, not waited for
    assert time.monotonic() - start < 30
    _no_children_left()


@pytest.mark.parametrize("layout,is_causal", [("zigzag", True), ("contiguous", True), ("contiguous", False)])
def test_rank_tiles_are_the_rings_rows(layout, is_causal):
    """Notebook 14's timing rows: a rank's tiles against every block, no transfer, give its rows of attention."""
    from selfattn_lite.course.distributed_cli import rank_tiles

    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 23, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    W = 3
    segs = [D.shard_segments(23, r, W, layout=layout) for r in range(W)]
    ks, vs = ([D.shard(t, r, W, layout=layout) for r in range(W)] for t in (k, v))
    rows = [rank_tiles(D.shard(q, r, W, layout=layout), ks, vs, segs, r, is_causal) for r in range(W)]
    torch.testing.assert_close(D.unshard(rows, layout=layout), F.scaled_dot_product_attention(q, k, v, is_causal=is_causal))


def test_tiles_worker_times_the_rings_tiles_on_every_rank_at_once():
    from selfattn_lite.course.distributed_cli import tiles_worker

    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 64, 8, generator=gen) for _ in range(3))
    per_rank = D.launch(tiles_worker, 2, q, k, v, True, "zigzag", 0.05)
    _no_children_left()
    got = D.unshard([r["out"] for r in per_rank], layout="zigzag")
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-5, rtol=1e-5)
    for r in per_rank:
        assert 0 < r["min"] <= r["seconds"] <= r["max"] and r["threads"] >= 1


def test_peak_memory_of_a_rank_is_a_fraction_of_one_process():
    from selfattn_lite import attention
    from selfattn_lite.course.distributed_cli import memory_worker
    from selfattn_lite.course.memory import peak_memory

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 256, 16, generator=gen) for _ in range(3))
    per_rank = D.launch(memory_worker, 2, q, k, v, "ring", False)
    explicit = peak_memory(lambda: attention.scaled_dot_product_attention(q, k, v))
    block = (k.nbytes + v.nbytes) // 2                              # one rank's K/V block
    for peak in per_rank:
        assert block <= peak < explicit / 2       # receives a block; never the full score matrix
    _no_children_left()


@pytest.mark.skipif(sys.platform == "win32", reason="torchrun needs POSIX")
def test_the_same_code_runs_under_torchrun():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                          "--master-port", str(D.free_port()), "-m", "selfattn_lite.course.distributed_cli"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "equal to single-process SDPA" in run.stdout


def test_the_subpackage_keeps_every_name_and_imports_no_machinery():
    import subprocess

    from selfattn_lite.distributed import launch, ring_attention, shard, ulysses_attention, unshard  # noqa: F401

    before = ["LAYOUTS", "split_sizes", "shard_segments", "shard_indices", "shard_lengths", "shard", "unshard",
              "Counters", "counters", "reset_counters", "block_attention", "block_attention_backward", "merge_partials", "ring_attention",
              "ulysses_attention", "ring_bytes_per_rank", "ulysses_bytes_per_rank", "causal_work", "ring_schedule",
              "max_sequence_length", "activation_values_per_token", "launch", "attention_worker", "device", "METHODS"]
    assert all(hasattr(D, name) for name in before) and set(D.__all__) >= set(before)
    # timing (bench) and the command line belong to the machinery: importing the reference loads neither
    code = ("import sys, selfattn_lite.distributed; "
            "print(sorted(m for m in sys.modules if m.startswith(('selfattn_lite.bench', 'selfattn_lite.course'))))")
    run = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=120)
    assert run.stdout.strip() == "[]", run.stdout + run.stderr


def test_max_sequence_length_counts_the_lm_head():
    kw = dict(d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336)      # Llama-3-8B's shapes
    layer = D.activation_values_per_token(d_model=4096, n_heads=32, n_kv_heads=8, ffn_dim=14336)
    without = D.max_sequence_length(8, 80, **kw)
    big = D.max_sequence_length(8, 80, **kw, vocab_size=128_256)   # logits, log-probs, two gradients: 4 V, beat 2 A
    head = 32 * 4096 * 2 + 4 * 128_256 * 2
    assert big["bytes_per_token"]["single"] == head > without["bytes_per_token"]["ring"]
    assert big["bytes_per_token"]["ring"] == big["bytes_per_token"]["ulysses"] == head
    assert big["ring"] < without["ring"]
    small = D.max_sequence_length(8, 80, **kw, vocab_size=1000)    # a small vocabulary: the layer's peak binds
    assert small == without
    assert 4 * 1000 < 2 * layer
    off = D.max_sequence_length(1, 80, **kw, checkpoint=False, vocab_size=128_256)   # the forward kept 32 A
    assert off["bytes_per_token"]["single"] == max(33 * layer, 32 * layer + 4 * 128_256) * 2
    with pytest.raises(ValueError, match="vocab_size"):
        D.max_sequence_length(8, 80, **kw, vocab_size=0)


def test_max_sequence_length_with_the_loss_upcast_to_float32():
    kw = dict(d_model=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_dim=28672)     # Llama-3-70B's shapes
    bf16 = D.max_sequence_length(8, 80, **kw, reserved_gib=20, vocab_size=128_256)
    assert D.max_sequence_length(8, 80, **kw, reserved_gib=20, vocab_size=128_256, loss_itemsize=2) == bf16
    fp32 = D.max_sequence_length(8, 80, **kw, reserved_gib=20, vocab_size=128_256, loss_itemsize=4)
    # each layer's input (bf16); bf16 logits; fp32 log-probs, their gradient, the logits' gradient
    head = 80 * 8192 * 2 + 128_256 * (2 + 3 * 4)
    assert fp32["bytes_per_token"] == {"single": head, "ring": head, "ulysses": head}          # the LM head binds
    head_bf16 = 80 * 8192 * 2 + 128_256 * 4 * 2
    assert bf16["bytes_per_token"] == {"single": head_bf16, "ring": head_bf16, "ulysses": head_bf16}   # in bf16 too
    chunked = D.max_sequence_length(8, 80, **kw, reserved_gib=20)                              # no LM head counted
    assert max(chunked["bytes_per_token"].values()) < head_bf16
    assert fp32["ring"] == int(60 * 2**30 * 8 / head) // 16 * 16
    assert 0.22 < 1 - fp32["ring"] / bf16["ring"] < 0.26
    with pytest.raises(ValueError, match="loss_itemsize"):
        D.max_sequence_length(8, 80, **kw, vocab_size=128_256, loss_itemsize=0)


@pytest.mark.parametrize("upcast", [False, True])
def test_the_lm_head_count_is_what_torch_cross_entropy_holds(upcast):
    """V (b + 3 c) bytes per token: measured with torch's profiler (CPU allocator) through F.cross_entropy's backward."""
    from selfattn_lite.course.memory import cpu_peak_bytes

    N, V = 64, 8192
    logits = torch.randn(N, V, dtype=torch.bfloat16, requires_grad=True)     # held, as the model's output holds it
    target = torch.randint(0, V, (N,), generator=torch.Generator().manual_seed(0))

    def loss_and_backward():
        F.cross_entropy(logits.float() if upcast else logits, target).backward()

    peak, _ = cpu_peak_bytes(loss_and_backward)
    c = 4 if upcast else 2
    kw = dict(d_model=64, n_layers=1, n_heads=1, ffn_dim=64)
    head = D.max_sequence_length(1, 80, **kw, vocab_size=V, loss_itemsize=c)["bytes_per_token"]["single"] - 64 * 2
    assert head == V * (2 + 3 * c)
    assert abs((2 * N * V + peak) - N * head) < 0.01 * N * head      # the logits themselves + what the loss adds


# ----------------------------------------------------------------------------- the ring's cost model (notebook 14)

def _forward_finish(work):
    """Notebook 14's recurrence: a rank starts step s + 1 when its own tiles of step s are done and both
    neighbours have posted step s (the transfers are posted before the compute); finish after the last step."""
    W, start = len(work), [0] * len(work)
    for s in range(W - 1):
        start = [max(start[r] + work[s][r], start[(r - 1) % W], start[(r + 1) % W]) for r in range(W)]
    return [start[r] + work[W - 1][r] for r in range(W)]


def _backward_finish(work):
    """The backward's: the dK, dV hop is posted after the tiles and waited at once, so a rank's next step
    waits for its neighbours' tiles too."""
    W, t = len(work), [0] * len(work)
    for s in range(W):
        end = [t[r] + work[s][r] for r in range(W)]
        t = [max(end[r], end[(r - 1) % W], end[(r + 1) % W]) for r in range(W)]
    return t


def test_the_ring_replayed_with_sleeps_finishes_where_notebook_14s_recurrence_says():
    """Contiguous causal, L = 37, W = 4: the forward ends at the slowest rank's total (333 units), not at the
    per-step-barrier bound (370); rank 0, whose own work is 100, finishes at 171, held by its neighbours;
    the backward, whose dK/dV hop waits at once, reaches the barrier bound."""
    from ring_replay import replay_worker

    from selfattn_lite.exercises.nb14 import _work_table
    work = _work_table(37, 4, "contiguous")
    totals = [sum(col) for col in zip(*work)]
    barrier = sum(max(row) for row in work)
    forward, backward = _forward_finish(work), _backward_finish(work)
    assert forward == [171, 171, 252, 333] and max(forward) == max(totals) == 333 and totals[0] == 100
    assert barrier == 370 and max(backward) == barrier
    unit = 2e-3                                                      # seconds per tile score
    measured = D.launch(replay_worker, 4, work, unit, 3)
    _no_children_left()
    fwd, bwd = [m[0] / unit for m in measured], [m[1] / unit for m in measured]
    slack = 0.1 * barrier                                            # gloo's own time per step, the scheduler
    assert all(abs(got - want) < slack for got, want in zip(fwd, forward)), (fwd, forward)
    assert max(fwd) < (max(forward) + barrier) / 2, (fwd, barrier)   # nearer the recurrence than the barrier
    assert all(abs(got - want) < slack for got, want in zip(bwd, backward)), (bwd, backward)
    assert max(bwd) > (max(forward) + barrier) / 2, (bwd, forward)
