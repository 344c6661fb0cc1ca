"""selfattn_lite.explore: the per-head weights of the pretrained encoder and of the tiny decoder, and the scores."""

import pytest
import torch

from selfattn_lite import encoder as enc
from selfattn_lite import explore as ex
from selfattn_lite.models import CharTokenizer, DecoderConfig, TinyDecoder


@pytest.fixture(scope="module")
def model():
    return enc.load_minilm()


# ----------------------------------------------------------------------------- explore


def test_explore_returns_every_head_with_tokens():
    maps = ex.explore("The cat sat on the mat because it was tired")
    T = len(maps.tokens)
    assert maps.tokens == ["[CLS]", "the", "cat", "sat", "on", "the", "mat", "because", "it", "was", "tired",
                           "[SEP]"]
    assert maps.weights.shape == (6, 12, T, T) and (maps.n_layers, maps.n_heads) == (6, 12)
    torch.testing.assert_close(maps.weights.sum(-1), torch.ones(6, 12, T))
    torch.testing.assert_close(maps.head(3), maps.weights[3].mean(0))
    assert torch.equal(maps.head(5, 11), maps.weights[5, 11])
    assert ex.explore("The cat sat on the mat because it was tired") is maps      # cached per text


def test_explore_with_explicit_model_equals_the_cached_path(model):
    fresh = ex.explore("The cat sat on it", model=model, tokenizer=enc.load_tokenizer())
    cached = ex.explore("The cat sat on it")
    assert fresh.tokens == cached.tokens
    torch.testing.assert_close(fresh.weights, cached.weights)


def test_scores_follow_their_formulas():
    maps = ex.explore("The cat sat on the mat because it was tired")
    i, j = maps.tokens.index("it"), maps.tokens.index("cat")
    assert torch.equal(ex.token_scores(maps, "it", "cat"), maps.weights[:, :, i, j])
    assert torch.equal(ex.column_scores(maps, "[SEP]"), maps.weights[..., -1].mean(-1))
    T = len(maps.tokens)
    expected = torch.stack([maps.weights[:, :, t, t - 1] for t in range(1, T)], -1).mean(-1)
    torch.testing.assert_close(ex.previous_token_scores(maps.weights), expected)
    shift = torch.zeros(5, 5)
    shift[0, 0] = 1.0
    shift[torch.arange(1, 5), torch.arange(0, 4)] = 1.0                  # row t puts all weight on t - 1
    assert ex.previous_token_scores(shift).item() == 1.0
    torch.testing.assert_close(ex.previous_token_scores(torch.full((4, 4), 0.25)), torch.tensor(0.25))


def test_token_index_finds_occurrences():
    tokens = ["[CLS]", "the", "cat", "the", "[SEP]"]
    assert ex.token_index(tokens, "the") == 1 and ex.token_index(tokens, "the", occurrence=1) == 3
    assert ex.token_index(tokens, -1) == 4


# ----------------------------------------------------------------------------- the tiny decoder


@pytest.fixture(scope="module")
def decoder():
    torch.manual_seed(0)
    model = TinyDecoder(DecoderConfig(vocab_size=30, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_len=64))
    model.tokenizer = CharTokenizer(" abcdefghijklmnopqrstuvwxyz.\n,")
    return model.eval()


def test_decoder_attention_is_what_each_attention_computes(decoder):
    """The weights equal those each layer's attention returns when hooks ask it (need_weights=True)."""
    ids = decoder.tokenizer.encode("to be or not")[None]
    hooked, handles = [], []
    for block in decoder.blocks:
        handles.append(block.attn.register_forward_pre_hook(
            lambda m, args, kwargs: (args, {**kwargs, "need_weights": True}), with_kwargs=True))
        handles.append(block.attn.register_forward_hook(lambda m, args, out: hooked.append(out[1])))
    with torch.no_grad():
        plain = decoder(ids)
        for handle in handles:
            handle.remove()
        logits, weights = ex.decoder_attention(decoder, ids)
    torch.testing.assert_close(logits, plain, atol=1e-5, rtol=1e-5)
    assert len(weights) == len(hooked) == 2 and weights[0].shape == (1, 4, 12, 12)
    for ours, theirs in zip(weights, hooked, strict=True):
        torch.testing.assert_close(ours, theirs, atol=0, rtol=0)


def test_explore_decoder_is_causal_with_readable_tokens(decoder):
    maps = ex.explore_decoder("to be\nor", model=decoder)
    assert maps.tokens == ["t", "o", "\u2423", "b", "e", "\\n", "o", "r"]
    assert maps.weights.shape == (2, 4, 8, 8)
    upper = torch.ones(8, 8, dtype=torch.bool).triu(1)
    assert torch.all(maps.weights[..., upper] == 0)                       # no look at the future
    torch.testing.assert_close(maps.weights.sum(-1), torch.ones(2, 4, 8))
    assert torch.all(maps.weights[:, :, 0, 0] == 1)


# ----------------------------------------------------------------------------- bad input


def test_bad_input_raises_value_errors(decoder):
    with pytest.raises(ValueError, match="non-empty string"):
        ex.explore("   ")
    with pytest.raises(ValueError, match="non-empty string"):
        ex.explore_decoder("", model=decoder)
    with pytest.raises(ValueError, match=r"not in the vocabulary"):
        ex.explore_decoder("CAPS", model=decoder)
    maps = ex.explore("The cat sat on it")
    with pytest.raises(ValueError, match=r"layer must be an int in \[0, 5\], got 6"):
        maps.head(6, 0)
    with pytest.raises(ValueError, match=r"head must be an int in \[0, 11\], got 12"):
        maps.head(0, 12)
    with pytest.raises(ValueError, match=r"'dog'.*not among the tokens"):
        ex.token_scores(maps, "it", "dog")
    with pytest.raises(ValueError, match="token index 9 is out of range for 7 tokens"):
        ex.token_index(maps.tokens, 9)
    with pytest.raises(ValueError, match=r"\(n_layers, n_heads, T, T\), got \(2, 3, 3\)"):
        ex.AttentionMaps(["a", "b", "c"], torch.zeros(2, 3, 3))
    with pytest.raises(ValueError, match="2 tokens for weights over T = 3"):
        ex.AttentionMaps(["a", "b"], torch.zeros(1, 1, 3, 3))
    with pytest.raises(ValueError, match=r"T >= 2, got \(1, 1\)"):
        ex.previous_token_scores(torch.ones(1, 1))


