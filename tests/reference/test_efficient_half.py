"""bf16 / fp16 accuracy of the tiled kernel: no worse than torch's own SDPA (issue 12, item 1).

Both are measured against float64 attention of the *same* rounded inputs, so the only error
counted is the kernel's. The bound: the tiled kernel's max error is at most twice torch SDPA's
on the same inputs, plus a quarter of an ulp of the output's magnitude (for shapes where torch
happens to be nearly exact). Random shapes, causal and windowed, block sizes that do not divide
the lengths, the default scale and scale = 1 (large scores, where rounding them hurts most).
"""

import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from selfattn_lite.course import bench
from selfattn_lite.efficient import flash_attention, sliding_window_mask

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@st.composite
def half_case(draw):
    B, H = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    L = draw(st.integers(1, 160))
    S = L if draw(st.booleans()) else draw(st.integers(1, 160))
    D = draw(st.sampled_from([8, 16, 32, 64]))
    dtype = draw(st.sampled_from([torch.bfloat16, torch.float16]))
    mode = draw(st.sampled_from(["none", "causal", "window"]))
    window = draw(st.integers(1, 48)) if mode == "window" else None
    block = (draw(st.integers(3, 67)), draw(st.integers(3, 67)))      # rarely divides L or S
    scale = draw(st.sampled_from([None, 1.0]))
    device = draw(st.sampled_from(DEVICES))
    seed = draw(st.integers(0, 2**31 - 1))
    return B, H, L, S, D, dtype, mode, window, block, scale, device, seed


def errors(case):
    """(tiled error, torch SDPA error, output magnitude), both errors against float64."""
    B, H, L, S, D, dtype, mode, window, block, scale, device, seed = case
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, n, D, generator=g).to(device, dtype) for n in (L, S, S))
    causal = mode == "causal"
    mask = None
    if mode == "window":
        mask = sliding_window_mask(L, window, S, is_causal=True, device=device)      # (L, S), True = attend
    kw = dict(attn_mask=mask) if mask is not None else dict(is_causal=causal)
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), scale=scale, **kw)
    theirs = F.scaled_dot_product_attention(q, k, v, scale=scale, **kw)
    ours = flash_attention(q, k, v, is_causal=mode != "none", window=window, block_size=block, scale=scale)
    if mask is not None:                       # rows that see no key: torch >= 2.5 gives 0, so do we
        seen = mask.any(-1)
        ref, theirs, ours = ref[..., seen, :], theirs[..., seen, :], ours[..., seen, :]
    if ref.numel() == 0:
        return 0.0, 0.0, 1.0
    err = lambda out: (out.double() - ref).abs().max().item()      # noqa: E731
    return err(ours), err(theirs), ref.abs().max().item()


@given(half_case())
def test_tiled_half_error_is_at_most_twice_torch_sdpa(case):
    ours, theirs, magnitude = errors(case)
    dtype = case[5]
    atol = 0.25 * bench.ulp(dtype, magnitude)
    assert ours <= 2 * theirs + atol, (f"tiled error {ours:.3g} > 2 x torch SDPA's {theirs:.3g} + {atol:.3g} "
                                       f"({ours / bench.ulp(dtype, magnitude):.1f} ulps of {dtype}) for {case}")
