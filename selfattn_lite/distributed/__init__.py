"""Attention across devices: ring attention and DeepSpeed-Ulysses on ``torch.distributed``.

Taught in notebook 14. When one sequence no longer fits one device, every device (a *rank*) holds a
shard of the sequence: some rows of q, k and v (dim -2). Two ways to still compute exact attention:

* **Ring attention** (``ring``, Liu et al. 2023): the K/V shards travel around a ring of ranks with
  point-to-point sends; each rank merges its partial results with the log-sum-exp rule.
* **Ulysses** (``ulysses``, Jacobs et al. 2023): an all-to-all turns "all heads, some rows" into
  "some heads, all rows"; each rank runs ordinary attention on its heads; a second all-to-all turns
  it back (K/V heads replicated when there are fewer than ranks).

The modules, in reading order:

* ``sharding``: which rows each rank holds (contiguous or zig-zag), ``shard`` / ``unshard``;
* ``ring``: ``block_attention``, ``merge_partials``, ``ring_attention``, ``ring_tiles``;
* ``ulysses``: ``ulysses_attention``, ``kv_replication``;
* ``cost``: the formulas (bytes sent, K/V held, causal work, the longest sequence that fits);
* ``comm``: counted point-to-point exchanges (``counters``) and the shape agreement;
* ``launch``: starting the processes (spawned, or under torchrun), ``attention_worker``.

The same code runs on CPU processes (gloo) and on GPUs (nccl, one per rank). The self-check
command line lives with the course machinery: ``python -m selfattn_lite.course.distributed_cli``.
"""

from .comm import Counters, counters, reset_counters
from .cost import (
    activation_values_per_token,
    causal_work,
    max_sequence_length,
    ring_bytes_per_rank,
    ring_kv_held_bytes,
    ring_schedule,
    ulysses_bytes_per_rank,
)
from .launch import METHODS, attention_worker, choose_backend, device, free_port, launch, under_torchrun
from .ring import RingTile, block_attention, block_attention_backward, merge_partials, ring_attention, ring_tiles
from .sharding import LAYOUTS, check_layout, shard, shard_indices, shard_lengths, shard_segments, split_sizes, unshard
from .ulysses import kv_replication, ulysses_attention

__all__ = [
    "LAYOUTS",
    "split_sizes",
    "shard_segments",
    "shard_indices",
    "shard_lengths",
    "shard",
    "unshard",
    "check_layout",
    "Counters",
    "counters",
    "reset_counters",
    "block_attention",
    "block_attention_backward",
    "merge_partials",
    "ring_attention",
    "RingTile",
    "ring_tiles",
    "ulysses_attention",
    "kv_replication",
    "ring_bytes_per_rank",
    "ring_kv_held_bytes",
    "ulysses_bytes_per_rank",
    "causal_work",
    "ring_schedule",
    "max_sequence_length",
    "activation_values_per_token",
    "launch",
    "device",
    "choose_backend",
    "free_port",
    "under_torchrun",
    "METHODS",
    "attention_worker",
]
