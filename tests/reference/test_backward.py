"""Attention's backward pass: attention_backward by hand and flash_attention's tiled backward,
both against autograd through torch's F.scaled_dot_product_attention."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from selfattn_lite.attention import attention_backward
from selfattn_lite.efficient import flash_attention, flash_attention_backward, sliding_window_mask

TIGHT = dict(atol=1e-10, rtol=1e-8)      # float64


def autograd_grads(q, k, v, grad_out, **kwargs):
    """(dq, dk, dv) of torch SDPA by autograd."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, **kwargs)
    return torch.autograd.grad(out, (q, k, v), grad_out)


def flash_grads(q, k, v, grad_out, **kwargs):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = flash_attention(q, k, v, **kwargs)
    return torch.autograd.grad(out, (q, k, v), grad_out)


@st.composite
def problems(draw, dtype=torch.float64):
    """Random q, k, v, grad_out and masking: lead dims (k may broadcast), GQA, L, S, E, Ev."""
    batch = draw(st.integers(1, 2))
    hkv = draw(st.integers(1, 3))
    group = draw(st.integers(1, 3))
    gqa = group > 1
    hq = hkv * group
    k_batch = draw(st.sampled_from([1, batch]))          # a broadcast batch dim on k, v
    L, S = draw(st.integers(1, 20)), draw(st.integers(1, 20))
    E, Ev = draw(st.integers(1, 8)), draw(st.integers(1, 8))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    q = torch.randn(batch, hq, L, E, generator=g, dtype=dtype)
    k = torch.randn(k_batch, hkv, S, E, generator=g, dtype=dtype)
    v = torch.randn(k_batch, hkv, S, Ev, generator=g, dtype=dtype)
    grad_out = torch.randn(batch, hq, L, Ev, generator=g, dtype=dtype)
    scale = draw(st.sampled_from([None, 0.3, 1.7]))
    return q, k, v, grad_out, gqa, scale, g


@settings(max_examples=60, deadline=None)
@given(problem=problems(), mask_kind=st.sampled_from(["none", "causal", "bool", "float"]))
def test_attention_backward_matches_autograd(problem, mask_kind):
    q, k, v, grad_out, gqa, scale, g = problem
    L, S = q.shape[-2], k.shape[-2]
    kwargs = dict(scale=scale, enable_gqa=gqa)
    if mask_kind == "causal":
        kwargs["is_causal"] = True
    elif mask_kind == "bool":
        mask = torch.rand(L, S, generator=g) > 0.4
        mask[0] = False                                    # one fully masked row, always
        kwargs["attn_mask"] = mask
    elif mask_kind == "float":
        kwargs["attn_mask"] = torch.randn(q.shape[0], 1, L, S, generator=g, dtype=q.dtype)
    expected = autograd_grads(q, k, v, grad_out, **kwargs)
    got = attention_backward(q, k, v, grad_out, **kwargs)
    for name, a, b, t in zip("qkv", got, expected, (q, k, v), strict=True):
        assert a.shape == t.shape, name
        torch.testing.assert_close(a, b, **TIGHT, msg=lambda m, n=name: f"d{n}: {m}")


def test_fully_masked_rows_get_zero_gradient_and_no_nan():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 3, generator=g, dtype=torch.float64) for _ in range(3))
    grad_out = torch.randn(1, 2, 4, 3, generator=g, dtype=torch.float64)
    mask = torch.ones(4, 4, dtype=torch.bool)
    mask[2] = False                                        # query 2 sees nothing
    dq, dk, dv = attention_backward(q, k, v, grad_out, attn_mask=mask)
    assert not any(t.isnan().any() for t in (dq, dk, dv))
    assert dq[..., 2, :].abs().max() == 0
    for a, b in zip((dq, dk, dv), autograd_grads(q, k, v, grad_out, attn_mask=mask), strict=True):
        torch.testing.assert_close(a, b, **TIGHT)


def test_gqa_key_gradient_is_the_sum_over_its_query_heads():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 4, 5, 3, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 5, 3, generator=g, dtype=torch.float64) for _ in range(2))
    grad_out = torch.randn(1, 4, 5, 3, generator=g, dtype=torch.float64)
    _, dk, dv = attention_backward(q, k, v, grad_out, enable_gqa=True)
    k4, v4 = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)   # MHA with copied heads
    _, dk4, dv4 = attention_backward(q, k4, v4, grad_out)
    torch.testing.assert_close(dk, dk4[:, 0::2] + dk4[:, 1::2], **TIGHT)   # heads 0,1 -> 0; 2,3 -> 1
    torch.testing.assert_close(dv, dv4[:, 0::2] + dv4[:, 1::2], **TIGHT)


def test_half_inputs_are_computed_in_float32():
    g = torch.Generator().manual_seed(2)
    q, k, v, do = (torch.randn(2, 6, 8, generator=g) for _ in range(4))
    ref = attention_backward(q.double(), k.double(), v.double(), do.double(), is_causal=True)
    got = attention_backward(*(t.bfloat16() for t in (q, k, v, do)), is_causal=True)
    torch_bf16 = autograd_grads(*(t.bfloat16() for t in (q, k, v, do)), is_causal=True)
    for a, b, r in zip(got, torch_bf16, ref, strict=True):
        assert a.dtype == torch.bfloat16
        ours, theirs = (a.double() - r).abs().max(), (b.double() - r).abs().max()
        assert ours <= 2 * theirs + 1e-3, (ours, theirs)


@pytest.mark.parametrize("call, fragment", [
    (lambda q, k, v, do: attention_backward(q, k, v, do[..., :2, :]), "(2, 3, 5, 4)"),
    (lambda q, k, v, do: attention_backward(q, k, v, do.float()), "dtype"),
    (lambda q, k, v, do: attention_backward(q, k, v, do.numpy()), "torch.Tensor"),
    (lambda q, k, v, do: attention_backward(q, k[..., :2], v, do), "last dim"),
    (lambda q, k, v, do: attention_backward(q, k[:, :2], v[:, :2], do, enable_gqa=True), "multiple"),
    (lambda q, k, v, do: attention_backward(q, k, v, do, attn_mask=torch.ones(3, 3, dtype=torch.bool)),
     "does not broadcast"),
    (lambda q, k, v, do: attention_backward(q, k, v, do, attn_mask=torch.ones(5, 6, dtype=torch.long)), "bool"),
])
def test_attention_backward_bad_input(call, fragment):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 3, 6, 4, generator=g, dtype=torch.float64) for _ in range(2))
    do = torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64)
    with pytest.raises(ValueError) as info:
        call(q, k, v, do)
    assert fragment in str(info.value)


# ----------------------------------------------------------------------------- flash_attention's backward

@settings(max_examples=60, deadline=None)
@given(problem=problems(), is_causal=st.booleans(), window=st.sampled_from([None, 1, 3, 7]),
       block_q=st.integers(1, 24), block_k=st.integers(1, 24))
def test_flash_backward_matches_autograd_float64(problem, is_causal, window, block_q, block_k):
    q, k, v, grad_out, gqa, scale, _ = problem
    L, S = q.shape[-2], k.shape[-2]
    kwargs = dict(scale=scale, enable_gqa=gqa)
    if window is None:
        expected = autograd_grads(q, k, v, grad_out, is_causal=is_causal, **kwargs)
    else:   # windows may leave rows with no key (L > S): SDPA gives them zero output and gradient
        expected = autograd_grads(q, k, v, grad_out, attn_mask=sliding_window_mask(L, window, S, is_causal=is_causal),
                                  **kwargs)
    got = flash_grads(q, k, v, grad_out, is_causal=is_causal, window=window, block_size=(block_q, block_k), **kwargs)
    for name, a, b, t in zip("qkv", got, expected, (q, k, v), strict=True):
        assert a.shape == t.shape, name
        assert not a.isnan().any(), name
        torch.testing.assert_close(a, b, **TIGHT, msg=lambda m, n=name: f"d{n}: {m}")


@settings(max_examples=30, deadline=None)
@given(problem=problems(dtype=torch.float32), is_causal=st.booleans(), block=st.integers(1, 16))
def test_flash_backward_matches_autograd_float32(problem, is_causal, block):
    """float32: our error against a float64 reference stays within a small multiple of torch's own."""
    q, k, v, grad_out, gqa, scale, _ = problem
    kwargs = dict(is_causal=is_causal, scale=scale, enable_gqa=gqa)
    ref = autograd_grads(q.double(), k.double(), v.double(), grad_out.double(), **kwargs)
    theirs = autograd_grads(q, k, v, grad_out, **kwargs)
    ours = flash_grads(q, k, v, grad_out, block_size=block, **kwargs)
    for a, b, r in zip(ours, theirs, ref, strict=True):
        assert a.dtype == torch.float32
        err_ours, err_torch = (a.double() - r).abs().max().item(), (b.double() - r).abs().max().item()
        assert err_ours <= 8 * err_torch + 1e-5 * (1 + r.abs().max().item()), (err_ours, err_torch)


def test_flash_returns_the_log_sum_exp_and_its_gradient():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 7, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out, lse = flash_attention(q, k, v, is_causal=True, block_size=3, return_lse=True)
    scores = (q @ k.transpose(-2, -1)) / 2.0
    scores = scores.masked_fill(~torch.ones(7, 7, dtype=torch.bool).tril(), float("-inf"))
    expected = torch.logsumexp(scores, dim=-1)                       # (2, 7)
    torch.testing.assert_close(lse, expected, **TIGHT)
    w = torch.randn(2, 7, generator=g, dtype=torch.float64)
    got = torch.autograd.grad((lse * w).sum() + out.sum(), (q, k, v))
    out_ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    want = torch.autograd.grad((expected * w).sum() + out_ref.sum(), (q, k, v))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, **TIGHT)


def test_flash_lse_of_a_row_with_no_key_is_minus_inf():
    g = torch.Generator().manual_seed(4)
    q = torch.randn(1, 8, 4, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, 3, 4, generator=g, dtype=torch.float64) for _ in range(2))
    out, lse = flash_attention(q, k, v, is_causal=True, window=2, block_size=2, return_lse=True)
    assert torch.isneginf(lse[0, 4:]).all() and torch.isfinite(lse[0, :4]).all()   # query i >= 4 sees no key
    assert out[0, 4:].abs().max() == 0


def test_flash_backward_through_a_model_layer():
    """Inside a tiny decoder the attention output feeds more layers; gradients still agree."""
    from selfattn_lite.models import DecoderConfig, TinyDecoder

    torch.manual_seed(0)
    model = TinyDecoder(DecoderConfig(vocab_size=11, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, max_len=24))
    model = model.double()
    ids = torch.randint(0, 11, (2, 20), generator=torch.Generator().manual_seed(0))
    grads = []
    for fn in (None, lambda *a, **kw: flash_attention(*a, block_size=(5, 7), **kw)):
        for block in model.blocks:
            block.attn.attn_fn = fn
        model.zero_grad()
        model.loss(ids).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, **TIGHT)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_flash_backward_half_precision_error_is_like_torchs(dtype):
    """Half inputs: softmax statistics in float32; the error against float64 stays near torch's own."""
    g = torch.Generator().manual_seed(5)
    q, k, v, do = (torch.randn(2, 4, 40, 16, generator=g) for _ in range(4))
    ref = autograd_grads(*(t.double() for t in (q, k, v, do)), is_causal=True)
    theirs = autograd_grads(*(t.to(dtype) for t in (q, k, v, do)), is_causal=True)
    ours = flash_grads(*(t.to(dtype) for t in (q, k, v, do)), is_causal=True, block_size=(16, 8))
    for a, b, r in zip(ours, theirs, ref, strict=True):
        assert a.dtype == dtype
        err_ours, err_torch = (a.double() - r).abs().max().item(), (b.double() - r).abs().max().item()
        assert err_ours <= 3 * err_torch, (err_ours, err_torch)


@pytest.mark.parametrize("is_causal, window, gqa", [(False, None, False), (True, None, True), (True, 3, False)])
def test_flash_attention_backward_takes_inputs_then_out_and_natural_lse_then_the_gradient(is_causal, window, gqa):
    """The public backward: (q, k, v, out, lse, grad_out, ...), lse in natural log, equals torch's autograd."""
    g = torch.Generator().manual_seed(11)
    Hkv = 1 if gqa else 2
    q = torch.randn(2, 2, 9, 4, dtype=torch.float64, generator=g)
    k, v = (torch.randn(2, Hkv, 7, 4, dtype=torch.float64, generator=g) for _ in range(2))
    grad_out = torch.randn(2, 2, 9, 4, dtype=torch.float64, generator=g)
    options = dict(is_causal=is_causal, window=window, enable_gqa=gqa, block_size=(4, 3))
    out, lse = flash_attention(q, k, v, return_lse=True, **options)
    grads = flash_attention_backward(q, k, v, out, lse, grad_out, **options)
    q_, k_, v_ = (t.clone().requires_grad_() for t in (q, k, v))
    mask = None
    if window is not None:
        mask = sliding_window_mask(9, window, 7, is_causal=is_causal)
    elif is_causal:
        mask = torch.ones(9, 7, dtype=torch.bool).tril()
    F.scaled_dot_product_attention(q_, k_, v_, attn_mask=mask, enable_gqa=gqa).backward(grad_out)
    for ours, theirs in zip(grads, (q_.grad, k_.grad, v_.grad), strict=True):
        torch.testing.assert_close(ours, theirs)
