"""Tests for `keras_transformers.training`: loss, metrics, callback, `fit`
(schedules: test_schedules.py).

Every check runs on the backend named by `KERAS_BACKEND`; values are compared
with float64 numpy references or closed forms.
"""

import math

import keras
import numpy as np
import pytest
from contracts import round_trip, to_float
from keras import ops

from keras_transformers.config import TransformerConfig
from keras_transformers.training import (
    InverseSquareRootSchedule,
    MaskedAccuracy,
    MaskedSparseCategoricalCrossentropy,
    Perplexity,
    ThroughputCallback,
    WarmupCosineDecay,
    training_flops_per_token,
)

VOCAB = 50


# ----------------------------------------------------------------- references
def np_log_softmax(logits):
    logits = np.asarray(logits, dtype=np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def np_token_ce(labels, logits, eps=0.0):
    """Per-position smoothed cross-entropy (labels must be in range)."""
    log_probs = np_log_softmax(logits)
    nll = -np.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]
    return (1.0 - eps) * nll + eps * (-log_probs.mean(axis=-1))


def padded_batch(rng, batch=4, length=7, vocab=VOCAB, pad=0):
    """Labels in [1, vocab) with right padding `pad`; at least 1 real token."""
    labels = rng.integers(1, vocab, size=(batch, length))
    lengths = rng.integers(1, length + 1, size=batch)
    lengths[0] = length  # one full row
    mask = np.arange(length)[None, :] < lengths[:, None]
    labels = np.where(mask, labels, pad)
    logits = rng.normal(size=(batch, length, vocab)).astype("float32") * 3
    return labels.astype("int32"), logits, mask


# ----------------------------------------------------------------------- loss
class TestMaskedSparseCategoricalCrossentropy:
    def test_matches_keras_without_padding(self, rng):
        labels = rng.integers(0, VOCAB, size=(3, 5))
        logits = rng.normal(size=(3, 5, VOCAB)).astype("float32")
        ours = MaskedSparseCategoricalCrossentropy()(labels, logits)
        theirs = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(
            labels, logits
        )
        np.testing.assert_allclose(to_float(ours), to_float(theirs), rtol=1e-5)
        np.testing.assert_allclose(
            to_float(ours), np_token_ce(labels, logits).mean(), rtol=1e-5
        )

    def test_padding_is_exact_mean_over_real_tokens(self, rng):
        labels, logits, mask = padded_batch(rng)
        loss = MaskedSparseCategoricalCrossentropy(ignore_class=0)
        padded = to_float(loss(labels, logits))
        # The same tokens, unpadded, as a flat [N] / [N, V] batch.
        unpadded = to_float(loss(labels[mask], logits[mask]))
        reference = np_token_ce(labels[mask], logits[mask]).mean()
        np.testing.assert_allclose(padded, unpadded, rtol=1e-6)
        np.testing.assert_allclose(padded, reference, rtol=1e-5)
        # Dividing by all positions (Keras' built-in) would dilute it.
        assert reference * mask.mean() < padded

    def test_sample_weight_mask_and_ignore_class(self, rng):
        labels, logits, mask = padded_batch(rng)
        reference = np_token_ce(np.where(mask, labels, 1), logits)
        plain = MaskedSparseCategoricalCrossentropy()
        got = to_float(plain(labels, logits, sample_weight=mask.astype("float32")))
        np.testing.assert_allclose(got, reference[mask].mean(), rtol=1e-5)
        # Combined: the weight mask also drops the first token of each row.
        weights = mask.copy()
        weights[:, 0] = False
        ignoring = MaskedSparseCategoricalCrossentropy(ignore_class=0)
        got = to_float(
            ignoring(labels, logits, sample_weight=weights.astype("float32"))
        )
        np.testing.assert_allclose(got, reference[weights].mean(), rtol=1e-5)

    def test_per_sequence_sample_weight(self, rng):
        labels, logits, mask = padded_batch(rng)
        row_weight = np.array([1.0, 0.5, 2.0, 0.0], dtype="float32")
        loss = MaskedSparseCategoricalCrossentropy(ignore_class=0)
        got = to_float(loss(labels, logits, sample_weight=row_weight))
        w = mask * row_weight[:, None]
        reference = np_token_ce(np.where(mask, labels, 1), logits)
        np.testing.assert_allclose(got, (w * reference).sum() / w.sum(), rtol=1e-5)

    def test_label_smoothing(self, rng):
        labels, logits, mask = padded_batch(rng)
        loss = MaskedSparseCategoricalCrossentropy(ignore_class=0, label_smoothing=0.1)
        reference = np_token_ce(labels, logits, eps=0.1)[mask].mean()
        np.testing.assert_allclose(to_float(loss(labels, logits)), reference, rtol=1e-5)
        # Same as Keras' dense loss with smoothed one-hot targets.
        flat_labels, flat_logits = labels[mask], logits[mask]
        dense = keras.losses.CategoricalCrossentropy(
            from_logits=True, label_smoothing=0.1
        )(np.eye(VOCAB, dtype="float32")[flat_labels], flat_logits)
        np.testing.assert_allclose(
            to_float(loss(labels, logits)), to_float(dense), rtol=1e-5
        )

    @pytest.mark.parametrize("eps", [0.0, 0.1])
    def test_gradient_is_softmax_minus_target(self, rng, eps):
        """d loss / d logits = (softmax - (1 - eps) onehot - eps / V) * w / sum(w)
        at real tokens, 0 at ignored ones (PyTorch computes it in place)."""
        from contracts import gradients

        labels, logits, mask = padded_batch(rng)
        variable = keras.Variable(logits)
        loss = MaskedSparseCategoricalCrossentropy(ignore_class=0, label_smoothing=eps)
        (grad,) = gradients(lambda: loss(labels, variable), [variable])
        probs = np.exp(np_log_softmax(logits.astype("float64")))
        target = (1 - eps) * np.eye(VOCAB)[labels] + eps / VOCAB
        expected = (probs - target) * (mask / mask.sum())[..., None]
        np.testing.assert_allclose(grad, expected, atol=1e-6)

    def test_probabilities_input(self, rng):
        labels, logits, mask = padded_batch(rng)
        probs = np.exp(np_log_softmax(logits)).astype("float32")
        loss = MaskedSparseCategoricalCrossentropy(
            from_logits=False, ignore_class=0, label_smoothing=0.2
        )
        # Probabilities are clipped to [1e-7, 1] before the log, like Keras.
        log_probs = np.log(np.clip(probs.astype("float64"), 1e-7, 1.0))
        nll = -np.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]
        reference = (0.8 * nll + 0.2 * -log_probs.mean(-1))[mask].mean()
        np.testing.assert_allclose(to_float(loss(labels, probs)), reference, rtol=1e-5)
        # Without clipping in play, it is the same as the logits path.
        soft = np.exp(np_log_softmax(logits / 4)).astype("float32")
        reference = np_token_ce(labels, logits / 4, eps=0.2)[mask].mean()
        np.testing.assert_allclose(to_float(loss(labels, soft)), reference, rtol=1e-5)

    @pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
    def test_mixed_precision_logits(self, rng, dtype):
        labels, logits, _ = padded_batch(rng)
        loss = MaskedSparseCategoricalCrossentropy(ignore_class=0, label_smoothing=0.1)
        full = loss(labels, logits)
        low = loss(labels, ops.cast(logits, dtype))
        assert keras.backend.standardize_dtype(low.dtype) == "float32"
        np.testing.assert_allclose(to_float(low), to_float(full), rtol=1e-2)

    def test_reductions_and_shapes(self, rng):
        labels, logits, mask = padded_batch(rng)
        reference = np.where(mask, np_token_ce(np.where(mask, labels, 1), logits), 0)
        per_token = MaskedSparseCategoricalCrossentropy(ignore_class=0, reduction=None)
        got = ops.convert_to_numpy(per_token(labels, logits))
        assert got.shape == labels.shape
        np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-6)
        total = MaskedSparseCategoricalCrossentropy(ignore_class=0, reduction="sum")
        np.testing.assert_allclose(
            to_float(total(labels, logits)), reference.sum(), rtol=1e-5
        )
        # Trailing label axis of size 1 is accepted.
        mean = MaskedSparseCategoricalCrossentropy(ignore_class=0)
        np.testing.assert_allclose(
            to_float(mean(labels[..., None], logits)), reference[mask].mean(), rtol=1e-5
        )

    def test_out_of_range_ignore_class_and_empty_batch(self, rng):
        labels, logits, mask = padded_batch(rng, pad=-100)
        loss = MaskedSparseCategoricalCrossentropy(ignore_class=-100)
        reference = np_token_ce(labels[mask], logits[mask]).mean()
        np.testing.assert_allclose(to_float(loss(labels, logits)), reference, rtol=1e-5)
        empty = np.full_like(labels, -100)
        assert to_float(loss(empty, logits)) == 0.0

    def test_validation_and_serialization(self):
        with pytest.raises(ValueError, match="Received: label_smoothing=1.5"):
            MaskedSparseCategoricalCrossentropy(label_smoothing=1.5)
        with pytest.raises(ValueError, match="Received: ignore_class=0.5"):
            MaskedSparseCategoricalCrossentropy(ignore_class=0.5)
        loss = MaskedSparseCategoricalCrossentropy(
            from_logits=False, label_smoothing=0.1, ignore_class=-100, reduction="sum"
        )
        restored = round_trip(loss)
        assert restored.ignore_class == -100 and restored.reduction == "sum"


# -------------------------------------------------------------------- metrics
class TestMetrics:
    def test_masked_accuracy_accumulates(self, rng):
        metric = MaskedAccuracy(ignore_class=0)
        correct = total = 0.0
        for _ in range(3):
            labels, logits, mask = padded_batch(rng)
            hints = rng.random(labels.shape) < 0.5  # make about half correct
            logits = logits + 20 * hints[..., None] * np.eye(VOCAB)[labels]
            weights = rng.uniform(0.5, 2.0, size=labels.shape).astype("float32")
            metric.update_state(labels, logits, sample_weight=weights)
            hit = logits.argmax(-1) == labels
            correct += (hit * mask * weights).sum()
            total += (mask * weights).sum()
        np.testing.assert_allclose(
            to_float(metric.result()), correct / total, rtol=1e-5
        )
        metric.reset_state()
        assert to_float(metric.result()) == 0.0

    def test_perplexity_is_exact_across_batches(self, rng):
        metric = Perplexity(ignore_class=0)
        nll_sum, count, per_batch = 0.0, 0, []
        for scale in (0.2, 3.0):  # two batches with different NLL and padding
            labels, logits, mask = padded_batch(rng)
            logits = logits * scale
            metric.update_state(labels, logits)
            nll = np_token_ce(labels[mask], logits[mask])
            nll_sum, count = nll_sum + nll.sum(), count + nll.size
            per_batch.append(math.exp(nll.mean()))
        expected = math.exp(nll_sum / count)
        got = to_float(metric.result())
        np.testing.assert_allclose(got, expected, rtol=1e-5)
        assert abs(got - np.mean(per_batch)) > 1e-3 * expected
        metric.reset_state()
        assert to_float(metric.result()) == 1.0

    def test_perplexity_probabilities_and_weights(self, rng):
        labels, logits, mask = padded_batch(rng)
        probs = np.exp(np_log_softmax(logits)).astype("float32")
        metric = Perplexity(from_logits=False)
        metric.update_state(labels, probs, sample_weight=mask.astype("float32"))
        expected = math.exp(np_token_ce(labels[mask], logits[mask]).mean())
        np.testing.assert_allclose(to_float(metric.result()), expected, rtol=1e-4)

    def test_serialization(self):
        accuracy = round_trip(MaskedAccuracy(ignore_class=3, name="acc"))
        assert accuracy.name == "acc" and accuracy.ignore_class == 3
        perplexity = round_trip(Perplexity(from_logits=False, ignore_class=0))
        assert perplexity.from_logits is False and perplexity.ignore_class == 0


# ----------------------------------------------------------- callback & flops
class TestFlopsAndCallback:
    def test_flops_gpt2_small(self):
        config = TransformerConfig(
            vocabulary_size=50257,
            num_layers=12,
            hidden_dim=768,
            num_heads=12,
            intermediate_dim=3072,
            max_sequence_length=1024,
        )
        non_embedding = config.num_params() - 50257 * 768 - 1024 * 768
        assert non_embedding == 85_056_000  # GPT-2 small's well-known ~85M
        expected = 6 * non_embedding + 12 * 12 * 768 * 1024
        assert training_flops_per_token(config, 1024) == expected

    def test_flops_untied_head_and_rotary(self):
        base = dict(
            vocabulary_size=1000,
            num_layers=2,
            hidden_dim=64,
            num_heads=4,
            intermediate_dim=128,
        )
        tied = TransformerConfig(**base, position_embedding="rotary")
        untied = tied.replace(tie_embeddings=False)
        # An untied LM head is a matmul: it adds 6 * V * D.
        delta = training_flops_per_token(untied, 32) - training_flops_per_token(
            tied, 32
        )
        assert delta == 6 * 1000 * 64
        # Rotary has no position table to subtract.
        expected = 6 * (tied.num_params() - 1000 * 64) + 12 * 2 * 64 * 32
        assert training_flops_per_token(tied, 32) == expected
        with pytest.raises(ValueError, match="Received: sequence_length=0"):
            training_flops_per_token(tied, 0)

    def test_callback_validation(self):
        with pytest.raises(ValueError, match="tokens_per_step"):
            ThroughputCallback()
        with pytest.raises(ValueError, match="not both"):
            ThroughputCallback(tokens_per_step=8, batch_size=2, sequence_length=4)
        with pytest.raises(ValueError, match="go together"):
            ThroughputCallback(tokens_per_step=8, flops_per_token=1.0)
        with pytest.raises(ValueError, match="Received: tokens_per_step=0"):
            ThroughputCallback(tokens_per_step=0)

    def test_callback_serialization(self):
        callback = ThroughputCallback(
            batch_size=4, sequence_length=16, flops_per_token=1e6, peak_flops=1e12
        )
        assert callback.tokens_per_step == 64
        restored = round_trip(callback)
        assert restored.tokens_per_step == 64 and restored.peak_flops == 1e12
        assert round_trip(ThroughputCallback(tokens_per_step=10)).tokens_per_step == 10


# ---------------------------------------------------------------- end to end
def lm_data(rng, samples=64, length=12):
    tokens = rng.integers(1, VOCAB, size=(samples, length))
    lengths = rng.integers(3, length + 1, size=samples)
    mask = np.arange(length)[None, :] < lengths[:, None]
    x = np.where(mask, tokens, 0).astype("int32")
    y = np.where(mask, (tokens * 7) % (VOCAB - 1) + 1, 0).astype("int32")
    return x, y, mask


def tiny_model():
    model = keras.Sequential(
        [
            keras.Input((None,), dtype="int32"),
            keras.layers.Embedding(VOCAB, 16),
            keras.layers.Dense(VOCAB),
        ]
    )
    schedule = WarmupCosineDecay(
        1e-2, warmup_steps=2, decay_steps=20, min_learning_rate=1e-4
    )
    model.compile(
        optimizer=keras.optimizers.AdamW(learning_rate=schedule),
        loss=MaskedSparseCategoricalCrossentropy(ignore_class=0, label_smoothing=0.05),
        metrics=[MaskedAccuracy(ignore_class=0), Perplexity(ignore_class=0)],
    )
    return model


def test_fit_evaluate_save_and_load(rng, tmp_path):
    x, y, mask = lm_data(rng)
    model = tiny_model()
    callback = ThroughputCallback(
        batch_size=16, sequence_length=12, flops_per_token=1e3, peak_flops=1e9
    )
    history = model.fit(x, y, batch_size=16, epochs=2, callbacks=[callback], verbose=0)
    logs = history.history
    assert len(logs["loss"]) == 2 and logs["loss"][1] < logs["loss"][0]
    for key in ("masked_accuracy", "perplexity", "tokens_per_second", "mfu"):
        assert len(logs[key]) == 2 and all(np.isfinite(logs[key])), key
    assert all(t > 0 for t in logs["tokens_per_second"])
    np.testing.assert_allclose(
        logs["mfu"], np.array(logs["tokens_per_second"]) * 1e3 / 1e9, rtol=1e-9
    )
    assert int(ops.convert_to_numpy(model.optimizer.iterations)) == 8

    # evaluate() matches numpy on the model's own logits: the loss on one
    # batch, and accuracy / perplexity accumulated exactly over 4 batches.
    logits = ops.convert_to_numpy(model(x)).astype("float64")
    ce = np_token_ce(np.where(mask, y, 1), logits, eps=0.05)[mask]
    nll = np_token_ce(np.where(mask, y, 1), logits)[mask]
    accuracy = (logits.argmax(-1) == y)[mask].mean()
    one_batch = model.evaluate(x, y, batch_size=64, verbose=0, return_dict=True)
    np.testing.assert_allclose(one_batch["loss"], ce.mean(), rtol=1e-4)
    batched = model.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)
    np.testing.assert_allclose(batched["perplexity"], math.exp(nll.mean()), rtol=1e-4)
    np.testing.assert_allclose(batched["masked_accuracy"], accuracy, rtol=1e-5)

    path = str(tmp_path / "tiny.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(
        ops.convert_to_numpy(loaded(x)),
        ops.convert_to_numpy(model(x)),
        rtol=1e-6,
        atol=1e-6,
    )
    schedule = loaded.optimizer._learning_rate
    assert isinstance(schedule, WarmupCosineDecay)
    assert schedule.get_config() == model.optimizer._learning_rate.get_config()
    assert isinstance(loaded.loss, MaskedSparseCategoricalCrossentropy)
    assert loaded.loss.get_config() == model.loss.get_config()
    reloaded = loaded.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)
    for key in ("loss", "masked_accuracy", "perplexity"):
        np.testing.assert_allclose(reloaded[key], batched[key], rtol=1e-5)


def test_fit_with_sample_weight_padding_mask(rng):
    """Padding marked only by a sample-weight mask, with weighted metrics,
    under mixed precision (bfloat16 logits, float32 loss)."""
    keras.config.set_dtype_policy("mixed_bfloat16")  # conftest resets it
    x, y, mask = lm_data(rng, samples=32)
    model = keras.Sequential(
        [
            keras.Input((None,), dtype="int32"),
            keras.layers.Embedding(VOCAB, 8),
            keras.layers.Dense(VOCAB),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(InverseSquareRootSchedule(8, warmup_steps=4)),
        loss=MaskedSparseCategoricalCrossentropy(),
        weighted_metrics=[MaskedAccuracy(), Perplexity()],
    )
    weights = mask.astype("float32")
    model.fit(x, y, sample_weight=weights, batch_size=16, epochs=1, verbose=0)
    logits = model(x)
    assert keras.backend.standardize_dtype(logits.dtype) == "bfloat16"
    logits = ops.convert_to_numpy(ops.cast(logits, "float32")).astype("float64")
    nll = np_token_ce(np.where(mask, y, 1), logits)[mask]
    result = model.evaluate(
        x, y, sample_weight=weights, batch_size=32, verbose=0, return_dict=True
    )
    # Compiled bfloat16 matmuls may round differently from eager ones.
    np.testing.assert_allclose(result["loss"], nll.mean(), rtol=1e-3)
    np.testing.assert_allclose(result["perplexity"], math.exp(nll.mean()), rtol=1e-3)
