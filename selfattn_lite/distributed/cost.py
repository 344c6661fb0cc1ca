"""The formulas the counters are checked against: the ring's schedule, the bytes each rank sends,
the K/V it holds, the causal work per rank, and how long a sequence N devices can hold.

Taught in notebook 14, "What each rank sends" to "At scale, on paper".
"""

from __future__ import annotations

import math

from .._checks import check_bool, check_positive_int, check_real
from .ring import ring_tiles
from .sharding import shard_lengths, shard_segments
from .ulysses import kv_replication

__all__ = ["ring_schedule", "ring_bytes_per_rank", "ring_kv_held_bytes", "ulysses_bytes_per_rank", "causal_work",
           "max_sequence_length"]


def _check_sizes(**sizes) -> None:
    """Each named size (None skipped) is a positive int."""
    for name, n in sizes.items():
        if n is not None:
            check_positive_int(name, n)


def ring_schedule(world_size: int) -> list[list[int]]:
    """schedule[step][rank]: whose K/V block ``rank`` holds at ``step``, i.e. (rank - step) mod W."""
    check_positive_int("world_size", world_size)
    return [[(r - s) % world_size for r in range(world_size)] for s in range(world_size)]


def ring_bytes_per_rank(L: int, world_size: int, *, layout: str = "contiguous", batch_heads: int = 1,
                        head_dim: int, value_dim: int | None = None, itemsize: int = 4,
                        grad_itemsize: int | None = None) -> list[dict]:
    """Bytes each rank sends in one ``ring_attention`` call, forward ("kv") and backward ("kv_bwd", "dkv").

    Forward: at steps 0 .. W-2 rank r forwards the block it holds, the blocks of ranks
    r, r-1, ..., r-W+2: every K/V block but that of rank r+1. Each block of n rows costs
    batch_heads * n * (E + Ev) * itemsize bytes. With L divisible by W that is
    2 (W - 1) (L / W) * batch_heads * d * itemsize for E = Ev = d. The backward sends the same
    K/V blocks again, and the gradient accumulators (dK, dV) of all W blocks, one hop each.

    Returns:
        One dict per rank: {"kv": bytes, "kv_bwd": bytes, "dkv": bytes}.
    """
    _check_sizes(batch_heads=batch_heads, head_dim=head_dim, value_dim=value_dim, itemsize=itemsize,
                 grad_itemsize=grad_itemsize)
    value_dim = head_dim if value_dim is None else value_dim
    grad_itemsize = itemsize if grad_itemsize is None else grad_itemsize
    lengths = shard_lengths(L, world_size, layout=layout)
    row = batch_heads * (head_dim + value_dim)
    result = []
    for r in range(world_size):
        forwarded = sum(lengths[(r - s) % world_size] for s in range(world_size - 1))
        result.append({"kv": forwarded * row * itemsize, "kv_bwd": forwarded * row * itemsize,
                       "dkv": (L * row * grad_itemsize) if world_size > 1 else 0})
    return result


def ring_kv_held_bytes(L: int, world_size: int, *, layout: str = "contiguous", batch_heads: int = 1,
                       head_dim: int, value_dim: int | None = None, itemsize: int = 4) -> list[int]:
    """The most bytes of K/V a rank holds at once in the ``ring_attention`` forward (``counters.kv_held``).

    At step s < W - 1 rank r holds its own shard (the caller keeps it; the backward needs it), the
    block of rank r - s it computes with (its own at s = 0) and the buffer of rank r - s - 1's block
    arriving; at the last step no buffer. Per rank: the largest over the steps of the sum of those
    distinct blocks, each n rows x batch_heads x (E + Ev) x itemsize. Equal shards: 3 blocks for W >= 3
    (3/W of the whole K/V), 2 for W = 2, 1 for W = 1.
    """
    _check_sizes(batch_heads=batch_heads, head_dim=head_dim, value_dim=value_dim, itemsize=itemsize)
    value_dim = head_dim if value_dim is None else value_dim
    lengths = shard_lengths(L, world_size, layout=layout)
    row = batch_heads * (head_dim + value_dim) * itemsize
    held = []
    for r in range(world_size):
        steps = []
        for s in range(world_size):
            blocks = {r, (r - s) % world_size} | ({(r - s - 1) % world_size} if s < world_size - 1 else set())
            steps.append(sum(lengths[b] for b in blocks) * row)
        held.append(max(steps))
    return held


def ulysses_bytes_per_rank(L: int, world_size: int, *, batch: int = 1, heads: int, kv_heads: int | None = None,
                           head_dim: int, value_dim: int | None = None, itemsize: int = 4) -> list[dict]:
    """Bytes each rank sends in one ``ulysses_attention`` call.

    Forward: rank r keeps 1/W of the heads of its n_r rows and sends the rest:
    (W-1)/W of its q, k and v shards; then it returns the output rows of the other ranks,
    h/W heads x (L - n_r) rows. The backward sends the same amounts in reverse. When W does not
    divide h_kv, the K/V heads are replicated R = ``kv_replication(h, h_kv, W)`` times first, and
    R h_kv heads take the place of h_kv: the K/V part of the all-to-all grows R-fold.

    Returns:
        One dict per rank: {"qkv": bytes, "out": bytes, "forward": bytes, "backward": bytes}.
    """
    _check_sizes(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=head_dim, value_dim=value_dim,
                 itemsize=itemsize)
    kv_heads = heads if kv_heads is None else kv_heads
    kv_heads *= kv_replication(heads, kv_heads, world_size)           # R h_kv heads are sent
    value_dim = head_dim if value_dim is None else value_dim
    lengths = shard_lengths(L, world_size)
    w = world_size
    result = []
    for n in lengths:
        qkv = batch * n * ((heads - heads // w) * head_dim + (kv_heads - kv_heads // w) * (head_dim + value_dim))
        out = batch * (heads // w) * (L - n) * value_dim
        bwd = batch * ((heads - heads // w) * n * value_dim
                       + (heads // w) * (L - n) * head_dim + (kv_heads // w) * (L - n) * (head_dim + value_dim))
        result.append({"qkv": qkv * itemsize, "out": out * itemsize, "forward": (qkv + out) * itemsize,
                       "backward": bwd * itemsize})
    return result


def causal_work(L: int, world_size: int, *, layout: str = "contiguous", is_causal: bool = True) -> list[int]:
    """Score entries (query row x key row, per batch-head) each rank computes in ``ring_attention``.

    A tile of (query run) x (key run) is skipped when every key comes after every query and
    computed in full (masked inside) otherwise. Contiguous: rank r computes the blocks of ranks
    0..r, so the last rank works about twice the average. Zigzag: every rank holds one early and
    one late chunk and the work is (nearly) equal.
    """
    check_positive_int("world_size", world_size)
    check_bool("is_causal", is_causal)
    segs = [shard_segments(L, r, world_size, layout=layout) for r in range(world_size)]
    return [sum((rows.stop - rows.start) * (cols.stop - cols.start)
                for src in range(world_size) for rows, cols, *_ in ring_tiles(segs[r], segs[src], is_causal=is_causal))
            for r in range(world_size)]


def activation_values_per_token(*, d_model: int, n_heads: int, n_kv_heads: int | None = None,
                                ffn_dim: int) -> int:
    """Values one Llama-style layer saves for its backward, per token (FlashAttention inside, no recompute).

    Counted tensor by tensor, as Korthikanti et al. (2022, section 4) count a GPT layer: the attention
    half keeps its RMSNorm's input, the normed input of the q, k, v projections, q, k, v and the output
    (FlashAttention keeps only those and a log-sum-exp; ``o_proj`` reuses the output): 4 d + 2 d_kv.
    The SwiGLU half keeps its RMSNorm's input, the normed input of the gate and up projections, the
    gate (for SiLU), SiLU(gate) and up (for the product) and the product (for the down projection):
    2 d + 4 f. In all 6 d + 2 d_kv + 4 f, with d_kv = d * n_kv_heads / n_heads.

    Taught in notebook 14, "At scale, on paper".
    """
    for name, n in (("d_model", d_model), ("n_heads", n_heads), ("ffn_dim", ffn_dim)):
        check_positive_int(name, n)
    n_kv_heads = n_heads if n_kv_heads is None else check_positive_int("n_kv_heads", n_kv_heads)
    d_kv = d_model * n_kv_heads // n_heads
    return 6 * d_model + 2 * d_kv + 4 * ffn_dim


def max_sequence_length(n_devices: int, gib_per_device: float, *, d_model: int, n_layers: int,
                        n_heads: int, n_kv_heads: int | None = None, ffn_dim: int, bytes_per_value: int = 2,
                        reserved_gib: float = 0.0, checkpoint: bool = True, vocab_size: int | None = None,
                        loss_itemsize: int | None = None) -> dict:
    """The longest training sequence that fits, per strategy, on paper: at the backward's peak.

    A model stated so it can be argued with, not a capacity. ``reserved_gib`` per device is what does
    not grow with the sequence (weights, gradients, optimizer state, as the other parallelisms leave
    them). There is no tensor or sequence parallelism (Korthikanti et al. 2022, section 4), so every
    device holds every layer's activations for its tokens in full. Everything else grows with the
    tokens a device holds, n = L / W for W = ``n_devices`` (L on one device), b bytes per value, with
    A = ``activation_values_per_token`` per layer (q, k, v and the output of its shard among them),
    d = d_model and d_kv = d * n_kv_heads / n_heads:

    * kept from the forward: checkpoint=True (activation checkpointing: the forward keeps only each
      layer's input and the backward recomputes the rest, the usual choice at these lengths):
      n_layers * d, plus the layer being recomputed, A; checkpoint=False: n_layers * A;
    * the backward's peak: the gradients of one layer's activations, A more;
    * what attention's parallelism holds beyond that, per token of the device's shard
      (W = 1, and ``single``: nothing):
      ring, as a ring on FlashAttention kernels holds it in the backward (zhuzilin's
      ring-flash-attention, ``ring_flash_attn_backward``): the K/V block in use and the one arriving,
      on top of the rank's own K/V (in A), 2 d_kv values each at b bytes; the one block's gradients
      the kernel writes (dq, dk, dv: d + 2 d_kv values at b bytes); and the float32 accumulators, dQ
      (d) and the dK, dV of the block in use and of the one arriving (4 d_kv):
      4 d_kv b + (d + 2 d_kv) b + (d + 4 d_kv) max(b, 4) bytes. Not this package's ``ring_attention``,
      which computes in float32 and, for half inputs, also holds float32 copies of q, the output,
      dO and each K/V block;
      Ulysses: after the all-to-all, q of h/W heads over all L rows (L d / W values, as many as the
      shard's own) and k, v of R h_kv / W heads *replace* the shard-local q, k, v as what the attention
      saves (the projections save their inputs, so the shard-local q, k, v are not needed for the
      backward): beyond A, the R - 1 extra K/V copies, 2 (R - 1) d_kv. The output is not replaced:
      the kernel saves its head-layout output (d values per token of the shard), and ``o_proj`` saves
      its own input, the shard-layout output the second all-to-all returns, a distinct tensor (on one
      device and in the ring the two are one tensor, counted once in A): d more. In the backward the
      head-layout dq, dk, dv are held while their all-to-all back fills the shard-layout ones (in A):
      d + 2 R d_kv more (the head-layout dO takes the place of the shard-layout one, which its
      all-to-all has consumed and freed). In all 2 d + (4 R - 2) d_kv, R = ``kv_replication``; None
      when W does not divide the query heads.

      Left out, for both: the attention kernel's workspace (FlashAttention-2's backward allocates
      its own float32 dQ accumulator, 4 d bytes per token), the layout copies around an all-to-all,
      and the allocator's rounding and fragmentation. Where the two strategies differ by less than
      such terms, the model does not rank them.

    * the LM head (``vocab_size`` n_vocab given; None leaves it out, as a chunked or fused linear
      cross-entropy does, whose logits never exist for all tokens at once): torch's unfused
      ``F.cross_entropy`` is ``log_softmax`` then ``nll_loss``. ``loss_itemsize`` b_loss is the bytes per
      value it computes in (None: b_loss = b; Hugging Face's ``ForCausalLMLoss`` calls ``logits.float()``
      first, b_loss = 4). At its peak, in ``LogSoftmaxBackward``, four (tokens, n_vocab) tensors are alive: the
      b-byte logits (the model's output holds them), the b_loss-byte log-probabilities ``log_softmax``
      saves (``nll_loss`` saves the same tensor), ``nll_loss``'s dense b_loss-byte gradient of them, and
      the b_loss-byte gradient of the logits being written: n_vocab (b + 3 b_loss) bytes per token (a float32 copy
      made by ``.float()`` is not saved, so it is gone by then). That is on top of what the forward
      kept (n_layers * d, or n_layers * A), before the first layer's backward; the peak is the larger
      of the two moments. Measured in notebook 14 with torch's profiler.

    Per device: n * max((kept + A + extra) b, kept_fwd b + LM head) <= (gib_per_device - reserved_gib) GiB.

    Returns:
        {"single": L, "ring": L, "ulysses": L or None, "bytes_per_token": {strategy: bytes per token of a
        device's shard}}, L rounded down to a multiple of 2W (single: of 2).

    Taught in notebook 14, "At scale, on paper".
    """
    check_positive_int("n_devices", n_devices)
    _check_sizes(d_model=d_model, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads,
                 bytes_per_value=bytes_per_value)
    check_positive_int("ffn_dim", ffn_dim)
    check_bool("checkpoint", checkpoint)
    if vocab_size is not None:
        check_positive_int("vocab_size", vocab_size)
    if loss_itemsize is not None:
        check_positive_int("loss_itemsize", loss_itemsize)
    gib_per_device = check_real("gib_per_device", gib_per_device, low=0, low_open=True, high=math.inf, high_open=True)
    reserved_gib = check_real("reserved_gib", reserved_gib, low=0, high=math.inf, high_open=True)
    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    d_kv = d_model * n_kv_heads // n_heads
    budget = (gib_per_device - reserved_gib) * 2**30
    if budget <= 0:
        raise ValueError(f"nothing left: {gib_per_device} GiB per device, {reserved_gib} GiB reserved")
    layer = activation_values_per_token(d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads, ffn_dim=ffn_dim)
    kept = n_layers * d_model + layer if checkpoint else n_layers * layer
    base = kept + layer                                                 # + one layer's gradients
    b = bytes_per_value
    if vocab_size is None:
        loss = 0
    else:                                                               # bytes: what the forward kept + the LM head
        b_loss = b if loss_itemsize is None else loss_itemsize         # the loss's bytes per value
        head = vocab_size * (b + 3 * b_loss)                            # logits, log-probs, two gradients
        loss = (kept - (layer if checkpoint else 0)) * b + head
    n = n_devices
    step = 2 * n

    def down(x: float) -> int:
        return int(x) // step * step

    try:
        copies = kv_replication(n_heads, n_kv_heads, n)
    except ValueError:
        copies = None                                                   # the query heads cap the degree
    spread = n > 1                                                      # one device: nothing travels
    per_token = {"single": max(base * b, loss),
                 "ring": max(base * b + spread * (4 * d_kv * b + (d_model + 2 * d_kv) * b
                                                  + (d_model + 4 * d_kv) * max(b, 4)), loss),
                 "ulysses": None if copies is None else
                 max((base + spread * (2 * d_model + (4 * copies - 2) * d_kv)) * b, loss)}
    return {"single": int(budget / per_token["single"]) // 2 * 2, "ring": down(budget * n / per_token["ring"]),
            "ulysses": None if copies is None else down(budget * n / per_token["ulysses"]),
            "bytes_per_token": per_token}
