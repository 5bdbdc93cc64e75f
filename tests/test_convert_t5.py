"""Hugging Face T5 conversion: v1.0-style (ReLU, tied, scaled output) and
v1.1-style (gated GELU, untied) tiny random-init models give the logits,
encoder and decoder states of `transformers` (torch, float32, eager
attention) on right-padded batches long enough to reach the logarithmic
relative position buckets; cached decoding and greedy generation (text
through a Unigram `tokenizer.json`) match; export round-trips through
`T5ForConditionalGeneration` / `T5Model`; errors name the problem."""

import json
import shutil

import keras
import numpy as np
import pytest
from contracts import compiled_cached_call, edited_hf_dir, randomize_weights

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")

from hf_parity import (  # noqa: E402
    our_outputs,
    randomize,
    record,
    reference,
    seq2seq_batch,
    seq2seq_outputs,
)
from safetensors.numpy import load_file, save_file  # noqa: E402

import keras_transformers  # noqa: E402
from keras_transformers import TransformerConfig  # noqa: E402
from keras_transformers.convert import export_hf, hf_preset_data, t5  # noqa: E402
from keras_transformers.models import Seq2SeqBackbone, Seq2SeqLM  # noqa: E402

VOCAB, PAD, EOS = 100, 0, 1
T5 = dict(
    vocab_size=VOCAB,
    d_model=32,
    d_kv=8,
    d_ff=64,
    num_layers=2,
    num_decoder_layers=2,
    num_heads=4,
    relative_attention_num_buckets=8,
    relative_attention_max_distance=16,
    pad_token_id=PAD,
    eos_token_id=EOS,
    decoder_start_token_id=PAD,
)
# kind -> (HF class, config changes)
KINDS = {
    "v1.0": ("T5ForConditionalGeneration", dict(feed_forward_proj="relu")),
    "v1.1": (
        "T5ForConditionalGeneration",
        dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False),
    ),
    "base": ("T5Model", dict(feed_forward_proj="gated-gelu")),
}
TEXTS = ["translate English to German: the house is small and the cat is old"] * 4


def _tokenizer():
    """A small Unigram `tokenizer.json` (T5's kind: Metaspace, `</s>`
    appended), `<pad>`, `</s>`, `<unk>` first, as a `transformers` tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers import trainers as tr

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    specials = ["<pad>", "</s>", "<unk>"]
    trainer = tr.UnigramTrainer(
        vocab_size=60, special_tokens=specials, unk_token="<unk>", show_progress=False
    )
    tok.train_from_iterator(TEXTS, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", EOS)]
    )
    assert tok.get_vocab_size() <= VOCAB
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )


def _edit_checkpoint(path, **tensors):
    """Adds (or replaces) tensors of the checkpoint at `path`."""
    saved = load_file(path / "model.safetensors")
    saved.update(tensors)
    save_file(saved, str(path / "model.safetensors"), metadata={"format": "pt"})


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root, dirs = tmp_path_factory.mktemp("hf_t5"), {}
    for kind, (name, changes) in KINDS.items():
        config = transformers.T5Config(**T5, **changes)
        dirs[kind] = root / kind
        randomize(getattr(transformers, name)(config)).save_pretrained(dirs[kind])
    # v1.1 as published: its own lm_head.weight, tie_word_embeddings=False.
    head = np.random.default_rng(3).normal(0, 0.1, (VOCAB, 32)).astype("float32")
    _edit_checkpoint(dirs["v1.1"], **{"lm_head.weight": head})
    file = dirs["v1.1"] / "config.json"
    config = json.loads(file.read_text())
    config.pop("scale_decoder_outputs", None)
    file.write_text(json.dumps({**config, "tie_word_embeddings": False}))
    # Early checkpoints hold an unused cross-attention table.
    _edit_checkpoint(dirs["v1.0"], **{t5.UNUSED: np.ones((8, 4), "float32")})
    _tokenizer().save_pretrained(dirs["v1.0"])
    return dirs


@pytest.fixture(scope="module")
def lms(hf_dirs):
    """The v1.0 and v1.1 LMs for the tests that only read them: loaded once,
    and each compiled generation loop serves every test that reuses it."""
    return {
        kind: keras_transformers.from_preset(hf_dirs[kind]) for kind in ("v1.0", "v1.1")
    }


def _batch():
    """Sources `[2, 22]` and targets `[2, 20]` (starting with the decoder
    start token); the second pair is right-padded on both sides."""
    return seq2seq_batch(2, VOCAB, PAD, PAD, shape=(22, 20), real=(15, 12))


def _load_hf(path, cls):
    return reference(path, getattr(transformers, cls))


def _hf(path, cls):
    """Outputs (numpy) of HF `cls` loaded from `path` on `_batch()`."""
    return seq2seq_outputs(path, cls, _batch())


def _ours(model):
    """`model`'s output on `_batch()`; on JAX one compiled forward pass per
    architecture (`hf_parity.our_outputs`), shared by the copies loaded."""
    source, source_mask, target, target_mask = _batch()
    inputs = {
        "encoder_token_ids": source,
        "encoder_padding_mask": source_mask,
        "decoder_token_ids": target,
        "decoder_padding_mask": target_mask,
    }
    return our_outputs(model, inputs)


def _encoded(model):
    source, source_mask = _batch()[:2]
    backbone = getattr(model, "backbone", model)
    return keras.ops.convert_to_numpy(backbone.encode(source, source_mask))


@pytest.mark.parametrize("kind", ["v1.0", "v1.1"])
def test_logits_match(hf_dirs, kind, recwarn):
    model = keras_transformers.from_preset(hf_dirs[kind])
    assert type(model) is Seq2SeqLM
    assert model.backbone.token_embedding.tie_weights == (kind == "v1.0")
    assert model.config.scale_logits == (kind == "v1.0")
    assert not [w for w in recwarn if "not used" in str(w.message)]
    reference = _hf(hf_dirs[kind], "T5ForConditionalGeneration")
    source_mask, target_mask = _batch()[1], _batch()[3]
    record(f"T5 {kind} logits", _ours(model), reference["logits"], target_mask)
    expected = reference["encoder_last_hidden_state"]
    record(f"T5 {kind} encoder", _encoded(model), expected, source_mask)


def test_keras_preset_round_trip(lms, tmp_path):
    lm = lms["v1.0"]
    lm.save_to_preset(tmp_path / "preset")
    back = keras_transformers.from_preset(tmp_path / "preset")
    assert back.config == lm.config
    np.testing.assert_allclose(_ours(back), _ours(lm), atol=1e-6)
    text = "the house is old"  # as test_generate_text: lm's loop compiled once
    assert back.generate(text, max_new_tokens=8) == lm.generate(text, max_new_tokens=8)


def test_hidden_states_match(hf_dirs, recwarn):
    source_mask, target_mask = _batch()[1], _batch()[3]
    base = keras_transformers.from_preset(hf_dirs["base"])
    assert type(base) is Seq2SeqBackbone
    assert not [w for w in recwarn if "not used" in str(w.message)]
    reference = _hf(hf_dirs["base"], "T5Model")
    record("T5Model decoder", _ours(base), reference["last_hidden_state"], target_mask)
    expected = reference["encoder_last_hidden_state"]
    record("T5Model encoder", _encoded(base), expected, source_mask)
    # A backbone from an LM checkpoint; an LM from a base checkpoint (tied
    # and scaled, as transformers does).
    backbone = Seq2SeqBackbone.from_preset(hf_dirs["v1.1"])
    expected = _hf(hf_dirs["v1.1"], "T5Model")["last_hidden_state"]
    record("T5 LM as T5Model", _ours(backbone), expected, target_mask)
    lm = Seq2SeqLM.from_preset(hf_dirs["base"])
    expected = _hf(hf_dirs["base"], "T5ForConditionalGeneration")["logits"]
    record("T5Model as LM logits", _ours(lm), expected, target_mask)


def test_missing_lm_head_is_tied(hf_dirs, tmp_path):
    """`tie_word_embeddings=False` without an `lm_head.weight`: transformers
    ties the output layer to `shared` (unscaled), and so do we."""
    path = edited_hf_dir(hf_dirs["base"], tmp_path / "v1.1", tie_word_embeddings=False)
    config = json.loads((path / "config.json").read_text())
    config.pop("scale_decoder_outputs")  # as published: tie_word_embeddings decides
    (path / "config.json").write_text(json.dumps(config))
    lm = Seq2SeqLM.from_preset(path)
    assert lm.config.tie_embeddings and not lm.config.scale_logits
    expected = _hf(path, "T5ForConditionalGeneration")["logits"]
    record("T5 v1.1 without lm_head", _ours(lm), expected, _batch()[3])


@pytest.mark.parametrize("kind", ["v1.0", "v1.1"])
def test_cached_decoding_equals_full_forward(lms, kind):
    lm = lms[kind]
    source, source_mask, target, _ = _batch()
    inputs = {
        "encoder_token_ids": source,
        "encoder_padding_mask": source_mask,
        "decoder_token_ids": target,
    }
    full = keras.ops.convert_to_numpy(lm(inputs))
    cache = lm.backbone.init_cache(lm.backbone.encode(source, source_mask), 24)
    step = compiled_cached_call(lm, encoder_padding_mask=source_mask)
    for i in range(target.shape[1]):
        logits, cache = step(target[:, i : i + 1], cache, i)
        got = keras.ops.convert_to_numpy(logits)[:, 0]
        np.testing.assert_allclose(got, full[:, i], atol=1e-4)


def _hf_generate(path, ids, **kwargs):
    """`transformers`' greedy decoding of `ids` `[B, S]` (all real) from the
    decoder start token; drops the start token."""
    with torch.no_grad():
        out = _load_hf(path, "T5ForConditionalGeneration").generate(
            torch.tensor(ids, dtype=torch.long),
            attention_mask=torch.ones(np.shape(ids), dtype=torch.long),
            do_sample=False,
            num_beams=1,
            decoder_start_token_id=PAD,
            pad_token_id=PAD,
            **kwargs,
        )
    return out.numpy()[:, 1:]


@pytest.mark.parametrize("kind", ["v1.0", "v1.1"])
def test_greedy_matches_transformers(hf_dirs, lms, kind):
    lm = lms[kind]
    prompt = _batch()[0][:1]
    expected = _hf_generate(hf_dirs[kind], prompt, max_new_tokens=20, eos_token_id=None)
    ours = lm.generate(prompt, max_new_tokens=20, stop_token_ids=None)
    np.testing.assert_array_equal(np.asarray(ours), expected)


def test_generate_text(hf_dirs, lms):
    """Text in, text out, through the checkpoint's Unigram tokenizer.json."""
    lm = lms["v1.0"]
    text = "the house is old"
    ids = _tokenizer()(text)["input_ids"]  # ends with </s>
    expected = _hf_generate(hf_dirs["v1.0"], [ids], max_new_tokens=8, eos_token_id=EOS)
    out = lm.generate(text, max_new_tokens=8)
    assert isinstance(out, str)
    assert out == _tokenizer().decode(expected[0], skip_special_tokens=True)


def test_config_mapping(hf_dirs):
    data = hf_preset_data(hf_dirs["v1.0"])
    assert (data["family"], data["class_name"]) == ("transformer", "Seq2SeqLM")
    config = TransformerConfig.from_dict(data["config"])
    expected = dict(
        stacks="encoder_decoder",
        norm_position="pre",
        norm_type="rms",
        norm_epsilon=1e-6,
        final_norm=True,
        position_embedding="relative",
        relative_attention_buckets=8,
        relative_attention_max_distance=16,
        attention_scale=1.0,
        use_bias=False,
        activation="relu",
        gated_feed_forward=False,
        tie_embeddings=True,
        scale_logits=True,
        hidden_dim=32,
        head_dim=8,
        intermediate_dim=64,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        dropout=0.1,
        attention_dropout=0.1,
        pad_token_id=PAD,
        bos_token_id=PAD,  # decoder_start_token_id
        eos_token_id=EOS,
    )
    assert {key: getattr(config, key) for key in expected} == expected
    v11 = keras_transformers.load_config(hf_dirs["v1.1"])
    assert (v11.activation, v11.gated_feed_forward) == ("gelu_approximate", True)
    assert (v11.tie_embeddings, v11.scale_logits) == (False, False)
    assert hf_preset_data(hf_dirs["base"])["class_name"] == "Seq2SeqBackbone"


def _random_keras(cls, **fields):
    config = TransformerConfig(
        **t5.LAYOUT,
        vocabulary_size=VOCAB,
        hidden_dim=32,
        num_heads=4,
        head_dim=6,
        intermediate_dim=64,
        num_layers=2,
        num_decoder_layers=3,
        max_sequence_length=64,
        relative_attention_buckets=8,
        relative_attention_max_distance=16,
        norm_epsilon=1e-6,
        activation="relu",
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=PAD,
    )
    model = cls(config=config.replace(**fields))
    randomize_weights(model)
    return model


GATED = dict(activation="gelu_approximate", gated_feed_forward=True)


@pytest.mark.parametrize(
    "cls, fields",
    [
        (Seq2SeqLM, dict(scale_logits=True)),
        (Seq2SeqLM, dict(tie_embeddings=False, **GATED)),
        (Seq2SeqLM, dict(tie_embeddings=False, scale_logits=True)),
        (Seq2SeqBackbone, GATED),
    ],
)
def test_export_round_trip(tmp_path, cls, fields):
    model = _random_keras(cls, **fields)
    export_hf(model, tmp_path)
    name = "T5ForConditionalGeneration" if cls is Seq2SeqLM else "T5Model"
    saved = json.loads((tmp_path / "config.json").read_text())
    assert (saved["model_type"], saved["architectures"]) == ("t5", [name])
    reference = _hf(tmp_path, name)
    expected = reference["logits" if cls is Seq2SeqLM else "last_hidden_state"]
    ours = _ours(model)
    record(f"export {name} {sorted(fields)}", ours, expected, _batch()[3])
    back = keras_transformers.from_preset(tmp_path)
    assert type(back) is cls
    assert back.config == model.config.replace(dropout=0.0, attention_dropout=0.0)
    np.testing.assert_allclose(_ours(back), ours, atol=1e-5)


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(feed_forward_proj="gated-silu"), "feed_forward_proj='gated-silu'"),
        (dict(feed_forward_proj="gelu"), "feed_forward_proj='gelu'"),
        (dict(is_decoder=True), "is_decoder=True"),
        (dict(architectures=["T5EncoderModel"]), "T5EncoderModel"),
        (dict(num_layers=3), "encoder.block.2"),
        (dict(d_model=64), "shared.weight"),
        (dict(relative_attention_num_buckets=16), "relative_attention_bias"),
        (dict(feed_forward_proj="gated-gelu"), "wi_0"),
    ],
)
def test_errors_name_the_problem(hf_dirs, tmp_path, changes, match):
    path = edited_hf_dir(hf_dirs["v1.0"], tmp_path / "edited", **changes)
    with pytest.raises(ValueError, match=match):
        keras_transformers.from_preset(path)


def test_separate_embeddings_are_rejected(hf_dirs, tmp_path):
    path = shutil.copytree(hf_dirs["v1.1"], tmp_path / "separate")
    other = np.zeros((VOCAB, 32), "float32")
    _edit_checkpoint(path, **{"decoder.embed_tokens.weight": other})
    with pytest.raises(ValueError, match="decoder.embed_tokens.weight'\\] differ"):
        keras_transformers.from_preset(path)


def test_export_rejects_unrepresentable(tmp_path):
    for fields, match in (
        (dict(norm_type="layer"), "norm_type"),
        (dict(attention_scale=None), "attention_scale"),
        (dict(num_kv_heads=2), "resolved_num_kv_heads"),
        (dict(activation="silu"), "gated_feed_forward=False"),
    ):
        with pytest.raises(ValueError, match=match):
            export_hf(_random_keras(Seq2SeqLM, **fields), tmp_path)
    with pytest.raises(ValueError, match="export the Seq2SeqLM"):
        export_hf(_random_keras(Seq2SeqBackbone, tie_embeddings=False), tmp_path)
