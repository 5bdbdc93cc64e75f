"""The 2017 encoder-decoder Transformer: shapes, the paper's architecture
choices, causality, padding on both sides, cached decoding, saving, fit and
input errors."""

import math

import keras
import numpy as np
import pytest
from contracts import (
    assert_close,
    compiled_cached_call,
    run_fit_test,
    run_saving_test,
    to_numpy,
)

import keras_transformers as kt
from keras_transformers.models import Seq2SeqBackbone, Seq2SeqLM
from keras_transformers.preset_io import read_builtin
from keras_transformers.training import MaskedSparseCategoricalCrossentropy

V = 512


@pytest.fixture(scope="module")
def lm():
    keras.utils.set_random_seed(0)
    return Seq2SeqLM.from_preset("transformer_tiny")


@pytest.fixture
def batch(rng):
    return {
        "encoder_token_ids": rng.integers(3, V, (2, 9)).astype("int32"),
        "encoder_padding_mask": np.ones((2, 9), bool),
        "decoder_token_ids": rng.integers(3, V, (2, 6)).astype("int32"),
        "decoder_padding_mask": np.ones((2, 6), bool),
    }


def test_shapes_and_param_count(lm, batch):
    hidden = lm.backbone(batch)
    assert tuple(hidden.shape) == (2, 6, 64)
    assert tuple(lm(batch).shape) == (2, 6, V)
    assert tuple(lm.backbone.encode(batch["encoder_token_ids"]).shape) == (2, 9, 64)
    # transformer_tiny is transformer_base's layout at a small size: the
    # closed form counted at the paper's sizes (below) is this one.
    assert lm.count_params() == lm.config.num_params()


@pytest.mark.parametrize(
    "name, paper", [("transformer_base", 65e6), ("transformer_big", 213e6)]
)
def test_paper_presets_match_table_3(name, paper):
    config = kt.load_config(name)
    assert config.stacks == "encoder_decoder" and config.norm_position == "post"
    assert config.position_embedding == "sinusoidal" and config.scale_embeddings
    assert config.tie_embeddings and config.vocabulary_size == 37000
    assert abs(config.num_params() - paper) / paper < 0.05
    assert kt.list_presets("transformer")[name]["params"] == config.num_params()
    assert "counting" in read_builtin(name)["metadata"]


def test_embeddings_are_shared_and_scaled(lm, batch):
    """One matrix for encoder input, decoder input and output; inputs scaled
    by sqrt(d_model), then sinusoidal positions added."""
    backbone = lm.backbone
    assert len([w for w in lm.weights if "embeddings" in w.path]) == 1
    ids = batch["encoder_token_ids"][:1, :4]
    table = to_numpy(backbone.token_embedding.embeddings)
    x = to_numpy(backbone.embed(ids))
    pos = np.arange(4)[:, None] / 10000 ** (2 * np.arange(32)[None] / 64)
    pe = np.stack([np.sin(pos), np.cos(pos)], -1).reshape(4, 64)  # interleaved
    np.testing.assert_allclose(x[0], table[ids[0]] * math.sqrt(64) + pe, atol=1e-5)
    hidden = backbone(batch)
    assert_close(lm(batch), to_numpy(hidden) @ table.T, atol=1e-4)


def test_encoder_is_independent_of_decoder_inputs(lm, batch):
    encoded = to_numpy(lm.backbone.encode(batch["encoder_token_ids"]))
    other = dict(batch, decoder_token_ids=batch["decoder_token_ids"][:, ::-1].copy())
    assert_close(lm.backbone.encode(other["encoder_token_ids"]), encoded)
    # Changing the decoder inputs changes the decoder output, not the encoder.
    assert not np.allclose(to_numpy(lm(batch)), to_numpy(lm(other)), atol=1e-3)


def test_decoder_is_causal(lm, batch):
    changed = dict(batch, decoder_token_ids=batch["decoder_token_ids"].copy())
    changed["decoder_token_ids"][:, 4:] = 7
    assert_close(to_numpy(lm(batch))[:, :4], to_numpy(lm(changed))[:, :4])
    assert not np.allclose(to_numpy(lm(batch))[:, 4:], to_numpy(lm(changed))[:, 4:])


def test_source_padding_reaches_encoder_and_cross_attention(lm, batch):
    """Changing padded source positions changes no real output."""
    mask = batch["encoder_padding_mask"].copy()
    mask[0, 5:] = False
    padded = dict(batch, encoder_padding_mask=mask)
    changed = dict(padded, encoder_token_ids=batch["encoder_token_ids"].copy())
    changed["encoder_token_ids"][0, 5:] = 11
    assert_close(lm(padded), lm(changed), atol=1e-5)
    enc = lm.backbone.encode(padded["encoder_token_ids"], mask)
    enc2 = lm.backbone.encode(changed["encoder_token_ids"], mask)
    assert_close(to_numpy(enc)[0, :5], to_numpy(enc2)[0, :5])
    # ... and equals running the unpadded source alone.
    alone = {k: v[:1] for k, v in padded.items()}
    alone["encoder_token_ids"] = alone["encoder_token_ids"][:, :5]
    alone["encoder_padding_mask"] = alone["encoder_padding_mask"][:, :5]
    assert_close(to_numpy(lm(padded))[:1], lm(alone), atol=1e-5)


def test_target_padding_changes_no_real_position(lm, batch):
    mask = batch["decoder_padding_mask"].copy()
    mask[1, 4:] = False
    padded = dict(batch, decoder_padding_mask=mask)
    changed = dict(padded, decoder_token_ids=batch["decoder_token_ids"].copy())
    changed["decoder_token_ids"][1, 4:] = 0
    assert_close(to_numpy(lm(padded))[1, :4], to_numpy(lm(changed))[1, :4])


def test_cached_decoding_equals_full_forward(lm, batch):
    mask = batch["encoder_padding_mask"].copy()
    mask[1, 6:] = False
    batch = dict(batch, encoder_padding_mask=mask)
    full = to_numpy(lm(batch))
    backbone = lm.backbone
    encoded = backbone.encode(batch["encoder_token_ids"], mask)
    cache = backbone.init_cache(encoded, 8)
    steps, step = [], compiled_cached_call(lm, encoder_padding_mask=mask)
    for i in range(6):
        token = batch["decoder_token_ids"][:, i : i + 1]
        logits, cache = step(token, cache, i)
        steps.append(to_numpy(logits))
    assert_close(np.concatenate(steps, axis=1), full, atol=1e-4)
    # Cross-attention keys/values are projected once, [B, S, K, H].
    assert tuple(cache[1][0][0].shape) == (2, 9, 4, 16)


def test_dropout_on_embeddings_and_sublayers(batch):
    lm = Seq2SeqLM.from_preset("transformer_tiny", dropout=0.3)
    inference = to_numpy(lm(batch))
    assert_close(lm(batch, training=False), inference)
    assert not np.allclose(to_numpy(lm(batch, training=True)), inference, atol=1e-3)


def test_saving_round_trip(lm, batch, tmp_path):
    run_saving_test(lm, batch, tmp_path)
    assert Seq2SeqLM.from_config(lm.get_config()).config == lm.config
    assert type(kt.from_preset("transformer_tiny")) is Seq2SeqLM


def test_fit_with_label_smoothing_ignoring_padding(batch):
    lm = Seq2SeqLM.from_preset("transformer_tiny", dropout=0.1)
    labels = np.concatenate(
        [batch["decoder_token_ids"][:, 1:], np.full((2, 1), 2, "int32")], axis=1
    )
    labels[1, 4:] = 0
    x = {k: np.repeat(v, 4, axis=0) for k, v in batch.items()}
    loss = MaskedSparseCategoricalCrossentropy(ignore_class=0, label_smoothing=0.1)
    history = run_fit_test(lm, x, np.repeat(labels, 4, axis=0), loss=loss, steps=2)
    assert len(history.history["loss"]) == 1


def test_overfits_a_tiny_batch(batch):
    lm = Seq2SeqLM.from_preset("transformer_tiny")
    labels = np.concatenate(
        [batch["decoder_token_ids"][:, 1:], np.full((2, 1), 2, "int32")], axis=1
    )
    lm.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss=MaskedSparseCategoricalCrossentropy(ignore_class=0),
    )
    history = lm.fit(batch, labels, epochs=40, batch_size=2, verbose=0)
    assert history.history["loss"][-1] < 0.2 * history.history["loss"][0]


def test_backbone_rejects_other_stacks():
    with pytest.raises(ValueError, match="stacks='encoder_decoder'"):
        Seq2SeqBackbone(config=kt.load_config("gpt2_tiny"))


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda b: {"token_ids": b["encoder_token_ids"]}, "Missing"),
        (
            lambda b: dict(
                b,
                decoder_token_ids=b["decoder_token_ids"][:1],
                decoder_padding_mask=b["decoder_padding_mask"][:1],
            ),
            "batch size 2 but `decoder_token_ids` has 1",
        ),
        (
            lambda b: dict(b, encoder_padding_mask=b["encoder_padding_mask"][:, :3]),
            "`encoder_padding_mask` shape",
        ),
        (
            lambda b: dict(b, decoder_token_ids=b["decoder_token_ids"] + V),
            r"`decoder_token_ids` contains id \d+, outside \[0, vocabulary_size=512\)",
        ),
        (
            lambda b: dict(b, encoder_token_ids=b["encoder_token_ids"] * 1.0),
            "`encoder_token_ids` must be an integer tensor",
        ),
        (
            lambda b: dict(
                b,
                encoder_token_ids=np.ones((2, 200), "int32"),
                encoder_padding_mask=None,
            ),
            "longer than max_sequence_length=128",
        ),
        (lambda b: b["encoder_token_ids"], "take a dict"),
    ],
)
def test_input_errors_name_the_problem(lm, batch, change, match):
    inputs = change(batch)
    if isinstance(inputs, dict):
        inputs = {k: v for k, v in inputs.items() if v is not None}
    with pytest.raises(ValueError, match=match):
        lm(inputs)


def test_config_errors():
    with pytest.raises(ValueError, match="vocabulary_size"):
        Seq2SeqLM.from_preset("transformer_tiny", vocabulary_size=0)
    with pytest.raises(ValueError, match="num_decoder_layers"):
        Seq2SeqLM.from_preset("transformer_tiny", num_decoder_layers=0)


def test_t5_tied_table_is_initialised_with_unit_std():
    """T5 v1.0 scales its tied output by hidden_dim**-0.5, so its table is
    drawn with std 1 (truncated at 2 std: about 0.88); other tables keep
    `initializer_range` (here the 2017 Transformer's, also tied)."""
    dims = dict(num_layers=1, hidden_dim=64, num_heads=2, head_dim=32)
    dims.update(intermediate_dim=64, vocabulary_size=2000)
    t5 = Seq2SeqBackbone.from_preset("t5_small", **dims)
    base = Seq2SeqBackbone.from_preset("transformer_tiny", **dims)
    t5_std = float(np.std(keras.ops.convert_to_numpy(t5.token_embedding.embeddings)))
    base_std = float(
        np.std(keras.ops.convert_to_numpy(base.token_embedding.embeddings))
    )
    assert 0.8 < t5_std < 0.95, t5_std
    assert base_std < 0.05 * t5_std, base_std
