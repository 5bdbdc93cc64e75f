"""Hugging Face BART conversion: encoder states, decoder states and logits
match `transformers` (torch, float32, eager attention) on tiny random-init
models with right-padded sources and targets; cached decoding equals the
full forward; greedy decoding (ids and text, through a byte-level BPE
`tokenizer.json`) equals `transformers`' `generate`; export round-trips
through `BartForConditionalGeneration` / `BartModel`; errors name the
problem."""

import json
import shutil
import warnings

import keras
import numpy as np
import pytest
from contracts import compiled_cached_call, edited_hf_dir, randomize_weights

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("safetensors")

from hf_parity import (  # noqa: E402
    our_outputs,
    randomize,
    record,
    reference,
    seq2seq_batch,
    seq2seq_outputs,
)

import keras_transformers  # noqa: E402
from keras_transformers import TransformerConfig  # noqa: E402
from keras_transformers.convert import bart, export_hf, hf_preset_data  # noqa: E402
from keras_transformers.models import Seq2SeqBackbone, Seq2SeqLM  # noqa: E402

VOCAB, BOS, PAD, EOS = 100, 0, 1, 2
BART = dict(
    vocab_size=VOCAB,
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=64,
    pad_token_id=PAD,
    bos_token_id=BOS,
    eos_token_id=EOS,
    decoder_start_token_id=EOS,
    forced_bos_token_id=BOS,
)
# kind -> (HF class, config changes)
KINDS = {
    "lm": ("BartForConditionalGeneration", {}),
    "untied": (
        "BartForConditionalGeneration",
        dict(
            activation_function="relu", scale_embedding=True, tie_word_embeddings=False
        ),
    ),
    "base": ("BartModel", dict(activation_function="gelu_new")),
}
TEXTS = [
    "the quick brown fox jumps over the lazy dog and the cat sat on the mat",
    "a tiny model reads some text and writes more text back",
] * 3


def _tokenizer():
    """A byte-level BPE `tokenizer.json` (BART's kind) of VOCAB tokens,
    `<s>`, `<pad>`, `</s>`, `<unk>` first, as a `transformers` tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers import trainers as tr

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    trainer = tr.BpeTrainer(
        vocab_size=VOCAB, special_tokens=specials, show_progress=False
    )
    tok.train_from_iterator(TEXTS, trainer)
    tok.post_processor = processors.RobertaProcessing(("</s>", EOS), ("<s>", BOS))
    assert tok.get_vocab_size() == VOCAB
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
    )


def _randomize(model):
    """`hf_parity.randomize` (the 2 offset position rows too), the stacks'
    embedding copies equal to `shared` (transformers 5 unties them without
    `tie_word_embeddings`) and a random `final_logits_bias`."""
    randomize(model)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        if not model.config.tie_word_embeddings:
            base = getattr(model, "model", model)
            for stack in (base.encoder, base.decoder):
                stack.embed_tokens.weight.copy_(base.shared.weight)
        if hasattr(model, "final_logits_bias"):
            bias = model.final_logits_bias
            bias.copy_(torch.randn(bias.shape, generator=generator))
    return model


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root, dirs = tmp_path_factory.mktemp("hf_bart"), {}
    tokenizer = _tokenizer()
    for kind, (name, changes) in KINDS.items():
        config = transformers.BartConfig(**BART, **changes)
        dirs[kind] = root / kind
        _randomize(getattr(transformers, name)(config)).save_pretrained(dirs[kind])
        tokenizer.save_pretrained(dirs[kind])
    return dirs


@pytest.fixture(scope="module")
def converted(hf_dirs):
    """`converted(kind) -> (model, warnings its loading gave)`: the
    checkpoint's conversion, loaded once per kind and shared by the tests
    that only read it (compiled generation loops are kept on the model, so
    its tests reuse them)."""
    models = {}

    def load(kind):
        if kind not in models:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                model = keras_transformers.from_preset(hf_dirs[kind])
            models[kind] = model, [str(w.message) for w in caught]
        return models[kind]

    return load


def _batch():
    """Sources `[2, 9]` and targets `[2, 7]` (starting with the decoder start
    token); the second pair is right-padded on both sides."""
    return seq2seq_batch(3, VOCAB, EOS, PAD)


def _load_hf(path, cls):
    return reference(path, getattr(transformers, cls))


def _hf(path, cls):
    """Outputs of HF `cls` loaded from `path` on `_batch()`, as NumPy arrays
    by name (`logits`, `last_hidden_state`, `encoder_last_hidden_state`)."""
    return seq2seq_outputs(path, cls, _batch())


def _inputs():
    source, source_mask, target, target_mask = _batch()
    return {
        "encoder_token_ids": source,
        "encoder_padding_mask": source_mask,
        "decoder_token_ids": target,
        "decoder_padding_mask": target_mask,
    }


def _ours(model):  # on JAX one compiled program per architecture
    return our_outputs(model, _inputs())


@pytest.mark.parametrize("kind", ["lm", "untied"])
def test_logits_match(hf_dirs, converted, kind):
    model, caught = converted(kind)
    assert type(model) is Seq2SeqLM
    assert model.backbone.token_embedding.tie_weights == (kind == "lm")
    assert not [w for w in caught if "not used" in w]
    bias = keras.ops.convert_to_numpy(model.backbone.logits_bias)
    assert np.abs(bias).min() > 0  # the random final_logits_bias was loaded
    expected = _hf(hf_dirs[kind], "BartForConditionalGeneration")
    record(f"bart {kind} logits", _ours(model), expected["logits"], _batch()[3])
    source, source_mask = _batch()[:2]
    encoded = model.backbone.encode(source, source_mask)
    record(
        f"bart {kind} encoder",
        keras.ops.convert_to_numpy(encoded),
        expected["encoder_last_hidden_state"],
        source_mask,
    )


def test_keras_preset_round_trip(converted, tmp_path):
    lm, _ = converted("untied")
    assert lm.generation_config.decoder_start_token_id == EOS
    lm.save_to_preset(tmp_path / "preset")
    back = keras_transformers.from_preset(tmp_path / "preset")
    assert back.config == lm.config
    np.testing.assert_allclose(_ours(back), _ours(lm), atol=1e-6)
    assert back.generate("some text", max_new_tokens=4) == lm.generate(
        "some text", max_new_tokens=4
    )


def test_hidden_states_match(hf_dirs, recwarn):
    source_mask, target_mask = _batch()[1], _batch()[3]
    base = keras_transformers.from_preset(hf_dirs["base"])
    assert type(base) is Seq2SeqBackbone
    assert not [w for w in recwarn if "not used" in str(w.message)]
    reference = _hf(hf_dirs["base"], "BartModel")
    record(
        "BartModel decoder", _ours(base), reference["last_hidden_state"], target_mask
    )
    encoded = keras.ops.convert_to_numpy(base.encode(_batch()[0], source_mask))
    expected = reference["encoder_last_hidden_state"]
    record("BartModel encoder", encoded, expected, source_mask)
    # A backbone from an LM checkpoint; an LM from a base checkpoint (tied
    # head, zero logits bias, as transformers does).
    backbone = Seq2SeqBackbone.from_preset(hf_dirs["lm"])
    expected = _hf(hf_dirs["lm"], "BartModel")["last_hidden_state"]
    record("BART LM as BartModel", _ours(backbone), expected, target_mask)
    lm = Seq2SeqLM.from_preset(hf_dirs["base"])
    expected = _hf(hf_dirs["base"], "BartForConditionalGeneration")["logits"]
    record("BartModel as LM logits", _ours(lm), expected, target_mask)


def test_cached_decoding_equals_full_forward(converted):
    lm, _ = converted("untied")
    source, source_mask, target, _ = _batch()
    full = keras.ops.convert_to_numpy(
        lm(
            {
                "encoder_token_ids": source,
                "encoder_padding_mask": source_mask,
                "decoder_token_ids": target,
            }
        )
    )
    encoded = lm.backbone.encode(source, source_mask)
    cache = lm.backbone.init_cache(encoded, target.shape[1])
    # On JAX one compiled program for every position (a traced index).
    step = compiled_cached_call(lm, encoder_padding_mask=source_mask)
    for i in range(target.shape[1]):
        logits, cache = step(target[:, i : i + 1], cache, i)
        got = keras.ops.convert_to_numpy(logits)[:, 0]
        np.testing.assert_allclose(got, full[:, i], atol=1e-4)


def _hf_generate(path, ids, **kwargs):
    """`transformers`' decoding of `ids` `[B, S]` (all real) from the decoder
    start token with the directory's generation config (greedy unless
    `kwargs` say otherwise; its `forced_eos_token_id`, no forced first token
    unless given); drops the start token."""
    model = _load_hf(path, "BartForConditionalGeneration")
    settings = dict(do_sample=False, num_beams=1, forced_bos_token_id=None)
    with torch.no_grad():
        out = model.generate(
            torch.tensor(ids, dtype=torch.long),
            attention_mask=torch.ones(np.shape(ids), dtype=torch.long),
            decoder_start_token_id=EOS,
            pad_token_id=PAD,
            **{**settings, **kwargs},
        )
    return out.numpy()[:, 1:]


@pytest.mark.parametrize("kind", ["lm", "untied"])
def test_greedy_matches_transformers(hf_dirs, converted, kind):
    lm, _ = converted(kind)
    prompt = _batch()[0][:1]
    expected = _hf_generate(hf_dirs[kind], prompt, max_new_tokens=8, eos_token_id=None)
    ours = lm.generate(prompt, max_new_tokens=8, stop_token_ids=None)
    np.testing.assert_array_equal(np.asarray(ours), expected)
    # Text in, text out, through the checkpoint's tokenizer.json.
    text = "some text"
    # As transformers' tokenizer(text) gives it: <s> text </s>.
    ids = list(lm.tokenizer.encode(text, add_special_tokens=True))
    assert (ids[0], ids[-1]) == (BOS, EOS)
    expected = _hf_generate(hf_dirs[kind], [ids], max_new_tokens=8, eos_token_id=EOS)
    decoded = _tokenizer().decode(expected[0], skip_special_tokens=True)
    out = lm.generate(text, max_new_tokens=8)
    assert isinstance(out, str) and out.strip()
    assert out == decoded


@pytest.mark.parametrize("num_beams", [1, 3])
def test_forced_first_and_last_tokens_match_transformers(hf_dirs, tmp_path, num_beams):
    """A generation config with `forced_bos_token_id` (as bart-base and
    bart-large ship) and `forced_eos_token_id`: the first generated token
    is `<s>`, the last allowed one `</s>`, scored 0 in beam search."""
    directory = tmp_path / "forced"
    shutil.copytree(hf_dirs["lm"], directory)
    path = directory / "generation_config.json"
    generation = json.loads(path.read_text())
    generation.update(forced_bos_token_id=BOS, forced_eos_token_id=EOS)
    path.write_text(json.dumps(generation))
    lm = keras_transformers.from_preset(directory)
    prompt = _batch()[0][:1]
    beams = dict(num_beams=num_beams, length_penalty=1.0, early_stopping=True)
    expected = _hf_generate(
        directory, prompt, max_new_tokens=6, forced_bos_token_id=BOS, **beams
    )
    ours = lm.generate(prompt, max_new_tokens=6, length_penalty_style="power", **beams)
    np.testing.assert_array_equal(np.asarray(ours), expected)
    assert expected[0, 0] == BOS
    # Saved with the model: a preset round trip keeps the forced tokens.
    lm.save_to_preset(tmp_path / "preset")
    again = keras_transformers.from_preset(tmp_path / "preset")
    assert again.generation_config.forced_bos_token_id == BOS
    np.testing.assert_array_equal(
        np.asarray(
            again.generate(
                prompt, max_new_tokens=6, length_penalty_style="power", **beams
            )
        ),
        expected,
    )


def test_config_mapping(hf_dirs):
    data = hf_preset_data(hf_dirs["lm"])
    assert (data["family"], data["class_name"]) == ("transformer", "Seq2SeqLM")
    config = TransformerConfig.from_dict(data["config"])
    expected = dict(
        stacks="encoder_decoder",
        vocabulary_size=VOCAB,
        hidden_dim=32,
        num_heads=4,
        intermediate_dim=64,
        num_layers=2,
        num_decoder_layers=2,
        max_sequence_length=64,  # the HF table's 66 rows less the offset
        norm_position="post",
        norm_type="layer",
        norm_epsilon=1e-5,
        final_norm=False,
        embedding_norm=True,
        position_embedding="learned",
        separate_decoder_positions=True,
        activation="gelu",
        scale_embeddings=False,
        tie_embeddings=True,
        logits_bias=True,
        use_bias=True,
        dropout=0.1,
        attention_dropout=0.0,
        pad_token_id=PAD,
        bos_token_id=EOS,  # decoder_start_token_id
        eos_token_id=EOS,
    )
    assert {key: getattr(config, key) for key in expected} == expected
    untied = keras_transformers.load_config(hf_dirs["untied"])
    assert (untied.activation, untied.scale_embeddings) == ("relu", True)
    assert untied.tie_embeddings is False
    base = hf_preset_data(hf_dirs["base"])
    assert base["class_name"] == "Seq2SeqBackbone"
    assert base["config"]["activation"] == "gelu_approximate"


def _random_keras(cls, **fields):
    config = TransformerConfig.from_dict(
        bart.config_from_hf({**BART, "dropout": 0.0})
    ).replace(num_decoder_layers=3)
    model = cls(config=config.replace(**fields))
    randomize_weights(model)
    return model


@pytest.mark.parametrize(
    "cls, fields",
    [
        (Seq2SeqLM, {}),
        (Seq2SeqLM, dict(tie_embeddings=False, activation="silu")),
        (Seq2SeqLM, dict(logits_bias=False, scale_embeddings=True, bos_token_id=None)),
        (Seq2SeqBackbone, dict(activation="gelu_approximate")),
    ],
)
def test_export_round_trip(tmp_path, cls, fields):
    model = _random_keras(cls, **fields)
    export_hf(model, tmp_path)
    name = "BartForConditionalGeneration" if cls is Seq2SeqLM else "BartModel"
    saved = json.loads((tmp_path / "config.json").read_text())
    assert (saved["model_type"], saved["architectures"]) == ("bart", [name])
    assert saved["decoder_start_token_id"] == EOS
    assert saved["max_position_embeddings"] == 64
    reference = _hf(tmp_path, name)
    expected = (
        reference["logits"] if cls is Seq2SeqLM else reference["last_hidden_state"]
    )
    ours = _ours(model)
    record(f"export {name} {sorted(fields)}", ours, expected, _batch()[3])
    back = keras_transformers.from_preset(tmp_path)
    assert type(back) is cls
    np.testing.assert_allclose(_ours(back), ours, atol=1e-6)


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(normalize_before=True), "normalize_before=True"),
        (dict(add_final_layer_norm=True), "add_final_layer_norm=True"),
        (dict(add_bias_logits=True), "add_bias_logits=True"),
        (dict(normalize_embedding=False), "normalize_embedding=False"),
        (dict(static_position_embeddings=True), "static_position_embeddings"),
        (dict(decoder_attention_heads=2), "decoder_attention_heads=2"),
        (dict(decoder_ffn_dim=128), "decoder_ffn_dim=128"),
        (dict(activation_function="gelu_10"), "gelu_10"),
        (dict(is_decoder=True), "is_decoder=True"),
        (dict(architectures=["BartForSequenceClassification"]), "BartForSequence"),
        (dict(decoder_layers=3), "decoder.layers.2"),
    ],
)
def test_errors_name_the_problem(hf_dirs, tmp_path, changes, match):
    path = edited_hf_dir(hf_dirs["lm"], tmp_path / "edited", **changes)
    with pytest.raises(ValueError, match=match):
        keras_transformers.from_preset(path)


def test_marian_weights_are_not_bart(tmp_path):
    marian = dict(BART, scale_embedding=True)
    del marian["forced_bos_token_id"], marian["bos_token_id"]
    model = transformers.MarianMTModel(transformers.MarianConfig(**marian))
    model.save_pretrained(tmp_path / "marian")
    path = edited_hf_dir(
        tmp_path / "marian",
        tmp_path / "as_bart",
        model_type="bart",
        architectures=["BartForConditionalGeneration"],
    )
    with pytest.raises(ValueError, match="not look like a bart checkpoint"):
        keras_transformers.from_preset(path)


def test_export_rejects_unrepresentable(tmp_path):
    for fields, match in (
        (dict(norm_epsilon=1e-6), "norm_epsilon"),
        (dict(embedding_norm=False), "embedding_norm"),
        (dict(separate_decoder_positions=False), "separate_decoder_positions"),
        (dict(norm_position="pre", final_norm=True), "norm_position"),
        (dict(num_kv_heads=2), "resolved_num_kv_heads"),
    ):
        with pytest.raises(ValueError, match=match):
            export_hf(_random_keras(Seq2SeqLM, **fields), tmp_path)
    with pytest.raises(ValueError, match="export the Seq2SeqLM"):
        export_hf(_random_keras(Seq2SeqBackbone, tie_embeddings=False), tmp_path)
