"""Hugging Face Marian conversion: seq2seq logits, encoder and decoder
hidden states match `transformers` (torch, float32, eager attention) on tiny
random-init models with padded sources and targets; export round-trips
through `MarianMTModel` / `MarianModel`; errors name the problem."""

import json
import shutil

import keras
import numpy as np
import pytest
from contracts import edited_hf_dir, randomize_weights

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")
from hf_parity import seq2seq_batch  # noqa: E402

import keras_transformers  # noqa: E402
from keras_transformers import TransformerConfig  # noqa: E402
from keras_transformers.convert import export_hf, hf_preset_data, marian  # noqa: E402
from keras_transformers.layers import SinusoidalPositionEncoding  # noqa: E402
from keras_transformers.models import Seq2SeqBackbone, Seq2SeqLM  # noqa: E402

TOLERANCE = 1e-4
VOCAB, PAD, EOS = 100, 99, 0
MARIAN = dict(
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
    eos_token_id=EOS,
    decoder_start_token_id=PAD,
)
# kind -> (HF class, config changes)
KINDS = {
    "mt": ("MarianMTModel", dict(activation_function="swish", scale_embedding=True)),
    "untied": (
        "MarianMTModel",
        dict(activation_function="gelu_new", tie_word_embeddings=False),
    ),
    "base": ("MarianModel", dict(activation_function="relu", scale_embedding=True)),
}


def _randomize(model):
    """Large random weights (LayerNorm scales near 1) and a random
    `final_logits_bias`, so that mapping mistakes show."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" in name:  # the fixed sinusoidal tables
                continue
            noise = torch.randn(p.shape, generator=generator)
            scale = "layer_norm.weight" in name
            p.copy_(1 + 0.2 * noise if scale else 0.1 * noise)
        if not model.config.tie_word_embeddings:  # transformers 5 then unties
            base = getattr(model, "model", model)  # the stacks' copies too
            for stack in (base.encoder, base.decoder):
                stack.embed_tokens.weight.copy_(base.shared.weight)
        if hasattr(model, "final_logits_bias"):
            bias = model.final_logits_bias
            bias.copy_(torch.randn(bias.shape, generator=generator))
    return model.eval()


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root, dirs = tmp_path_factory.mktemp("hf_marian"), {}
    for kind, (name, changes) in KINDS.items():
        config = transformers.MarianConfig(**MARIAN, **changes)
        dirs[kind] = root / kind
        _randomize(getattr(transformers, name)(config)).save_pretrained(dirs[kind])
    return dirs


def _batch():
    """Sources `[2, 9]` and targets `[2, 7]` (starting with the decoder start
    token); the second pair is right-padded on both sides."""
    return seq2seq_batch(1, PAD, PAD, PAD)


def _hf(path, cls):
    """Outputs of HF `cls` (e.g. "MarianMTModel") loaded from `path` on `_batch()`."""
    model = getattr(transformers, cls).from_pretrained(
        path, attn_implementation="eager", dtype=torch.float32
    )
    source, source_mask, target, target_mask = (
        torch.tensor(x.astype("int64")) for x in _batch()
    )
    with torch.no_grad():
        return model.eval()(
            input_ids=source,
            attention_mask=source_mask,
            decoder_input_ids=target,
            decoder_attention_mask=target_mask,
        )


def _inputs(source=None, target=None):
    batch = _batch()
    source = batch[0] if source is None else source
    target = batch[2] if target is None else target
    return {
        "encoder_token_ids": source,
        "encoder_padding_mask": batch[1],
        "decoder_token_ids": target,
        "decoder_padding_mask": batch[3],
    }


def _ours(model, **kwargs):
    return keras.ops.convert_to_numpy(model(_inputs(**kwargs)))


def _check(case, ours, theirs, mask=None):
    """Max |ours - theirs| over the real positions (`mask [B, L]`)."""
    diff = np.abs(np.asarray(ours) - np.asarray(theirs))
    diff = float((diff if mask is None else diff[mask]).max())
    print(f"[{keras.config.backend()}] {case}: max |diff| = {diff:.2e}")
    assert diff <= TOLERANCE, f"{case}: max |diff| {diff} > {TOLERANCE}"


@pytest.mark.parametrize("kind", ["mt", "untied"])
def test_logits_match(hf_dirs, kind, recwarn):
    model = keras_transformers.from_preset(hf_dirs[kind])
    assert type(model) is Seq2SeqLM
    assert model.backbone.token_embedding.tie_weights == (kind == "mt")
    assert not [w for w in recwarn if "not used" in str(w.message)]
    bias = keras.ops.convert_to_numpy(model.backbone.logits_bias)
    assert np.abs(bias).min() > 0  # the random final_logits_bias was loaded
    target_mask = _batch()[3]
    ours = _ours(model)
    _check(
        f"{kind} logits", ours, _hf(hf_dirs[kind], "MarianMTModel").logits, target_mask
    )
    # Padded source and target tokens change no real output.
    source, _, target, _ = _batch()
    source[1, 6:], target[1, 5:] = 3, 4
    np.testing.assert_allclose(
        _ours(model, source=source, target=target)[target_mask],
        ours[target_mask],
        atol=1e-5,
    )


def test_hidden_states_match(hf_dirs, recwarn):
    source_mask, target_mask = _batch()[1], _batch()[3]
    base = keras_transformers.from_preset(hf_dirs["base"])
    assert type(base) is Seq2SeqBackbone
    assert not [w for w in recwarn if "not used" in str(w.message)]
    reference = _hf(hf_dirs["base"], "MarianModel")
    _check("MarianModel hidden", _ours(base), reference.last_hidden_state, target_mask)
    encoded = base.encode(_batch()[0], source_mask)
    expected = reference.encoder_last_hidden_state
    _check(
        "MarianModel encoder",
        keras.ops.convert_to_numpy(encoded),
        expected,
        source_mask,
    )
    # A backbone from an MT checkpoint; an MT model from a base checkpoint
    # (tied head, zero logits bias, as transformers does).
    backbone = Seq2SeqBackbone.from_preset(hf_dirs["mt"])
    expected = _hf(hf_dirs["mt"], "MarianModel").last_hidden_state
    _check("MarianMTModel hidden", _ours(backbone), expected, target_mask)
    lm = Seq2SeqLM.from_preset(hf_dirs["base"])
    expected = _hf(hf_dirs["base"], "MarianMTModel").logits
    _check("MarianModel as MT logits", _ours(lm), expected, target_mask)


def test_positions_match_hf():
    hf_layer = (
        transformers.models.marian.modeling_marian.MarianSinusoidalPositionalEmbedding
    )
    table = hf_layer(64, 32).create_weight().numpy()
    np.testing.assert_allclose(marian.sinusoidal_table(64, 32), table, atol=1e-6)
    layer = SinusoidalPositionEncoding(interleave=False)
    ours = layer(keras.ops.zeros((1, 64, 32)))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(ours)[0], table, atol=1e-5)
    step = layer(keras.ops.zeros((1, 5, 32)), start_index=10)  # cached decoding
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(step)[0], table[10:15], atol=1e-5
    )


def test_config_mapping(hf_dirs):
    data = hf_preset_data(hf_dirs["mt"])
    assert (data["family"], data["class_name"]) == ("transformer", "Seq2SeqLM")
    config = TransformerConfig.from_dict(data["config"])
    expected = dict(
        stacks="encoder_decoder",
        norm_position="post",
        final_norm=False,
        position_embedding="sinusoidal",
        sinusoidal_interleave=False,
        scale_embeddings=True,
        logits_bias=True,
        activation="silu",
        num_layers=2,
        num_decoder_layers=2,
        max_sequence_length=64,
        pad_token_id=PAD,
        bos_token_id=PAD,  # decoder_start_token_id
        eos_token_id=EOS,
        norm_epsilon=1e-5,
    )
    assert {key: getattr(config, key) for key in expected} == expected
    untied = keras_transformers.load_config(hf_dirs["untied"])
    assert (untied.activation, untied.tie_embeddings) == ("gelu_approximate", False)
    assert hf_preset_data(hf_dirs["base"])["class_name"] == "Seq2SeqBackbone"


def _random_keras(cls, **fields):
    config = keras_transformers.load_config("transformer_tiny").replace(
        vocabulary_size=VOCAB,
        hidden_dim=32,
        num_heads=4,
        intermediate_dim=64,
        max_sequence_length=64,
        num_decoder_layers=3,
        norm_epsilon=1e-5,
        sinusoidal_interleave=False,
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=PAD,
    )
    model = cls(config=config.replace(**fields))
    randomize_weights(model)
    return model


@pytest.mark.parametrize(
    "cls, fields",
    [
        (Seq2SeqLM, dict(logits_bias=True)),
        (Seq2SeqLM, dict(tie_embeddings=False, activation="gelu_approximate")),
        (Seq2SeqLM, dict(activation="silu", scale_embeddings=False, bos_token_id=None)),
        (Seq2SeqBackbone, dict(activation="gelu")),
    ],
)
def test_export_round_trip(tmp_path, cls, fields):
    model = _random_keras(cls, **fields)
    export_hf(model, tmp_path)
    name = "MarianMTModel" if cls is Seq2SeqLM else "MarianModel"
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"] == [name]
    assert saved["decoder_start_token_id"] == PAD
    reference = _hf(tmp_path, name)
    expected = reference.logits if cls is Seq2SeqLM else reference.last_hidden_state
    ours = _ours(model)
    _check(f"export {name} {sorted(fields)}", ours, expected, _batch()[3])
    back = keras_transformers.from_preset(tmp_path)
    assert type(back) is cls
    np.testing.assert_allclose(_ours(back), ours, atol=1e-5)


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(decoder_attention_heads=2), "decoder_attention_heads=2"),
        (dict(decoder_ffn_dim=128), "decoder_ffn_dim=128"),
        (dict(share_encoder_decoder_embeddings=False), "share_encoder_decoder"),
        (dict(decoder_vocab_size=50), "decoder_vocab_size=50"),
        (dict(activation_function="gelu_10"), "gelu_10"),
        (dict(architectures=["MarianForCausalLM"]), "MarianForCausalLM"),
        (dict(decoder_layers=3), "decoder.layers.2"),
        (dict(d_model=64), "shared.weight"),
    ],
)
def test_errors_name_the_problem(hf_dirs, tmp_path, changes, match):
    path = edited_hf_dir(hf_dirs["mt"], tmp_path / "edited", **changes)
    with pytest.raises(ValueError, match=match):
        keras_transformers.from_preset(path)


def test_foreign_position_table_is_rejected(hf_dirs, tmp_path):
    from safetensors.numpy import load_file, save_file

    path = shutil.copytree(hf_dirs["base"], tmp_path / "interleaved")
    tensors = load_file(path / "model.safetensors")
    name = "encoder.embed_positions.weight"
    table = tensors[name]
    tensors[name] = np.stack([table[:, :16], table[:, 16:]], -1).reshape(table.shape)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="encoder.embed_positions"):
        keras_transformers.from_preset(path)


def test_separate_embeddings_are_rejected(hf_dirs, tmp_path):
    from safetensors.numpy import load_file, save_file

    path = shutil.copytree(hf_dirs["untied"], tmp_path / "separate")
    tensors = load_file(path / "model.safetensors")
    tensors["model.decoder.embed_tokens.weight"] = tensors["lm_head.weight"]
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="decoder.embed_tokens.weight'\\] differ"):
        keras_transformers.from_preset(path)


def test_export_rejects_unrepresentable(tmp_path):
    for fields, match in (
        (dict(sinusoidal_interleave=True), "sinusoidal_interleave"),
        (dict(norm_epsilon=1e-6), "norm_epsilon"),
        (dict(norm_position="pre", final_norm=True), "norm_position"),
        (dict(num_kv_heads=2), "resolved_num_kv_heads"),
    ):
        with pytest.raises(ValueError, match=match):
            export_hf(_random_keras(Seq2SeqLM, **fields), tmp_path)
    with pytest.raises(ValueError, match="export the Seq2SeqLM"):
        export_hf(_random_keras(Seq2SeqBackbone, tie_embeddings=False), tmp_path)
