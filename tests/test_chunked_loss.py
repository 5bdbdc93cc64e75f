"""The plain cross-entropy (a backend's fused kernel where it has one)
equals NumPy's, loss and gradient. Chunked cross-entropy equals the plain
loss and its gradients (ignored
positions, sample weights, label smoothing, soft-capped logits, a bias,
tied and untied heads, lengths that are not a multiple of the chunk), and
`fit()` of a causal LM trains the same with and without it."""

import keras
import numpy as np
import pytest
from contracts import assert_close, gradients, graph_ancestors, to_numpy

import keras_transformers as kt
from keras_transformers.training import head_loss
from keras_transformers.training.chunked_loss import chunked_cross_entropy
from keras_transformers.training.losses import (
    MaskedSparseCategoricalCrossentropy,
    token_cross_entropy,
)

N, D, V = 13, 8, 37


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_token_cross_entropy_equals_numpy(smoothing):
    rng = np.random.default_rng(3)
    logits = keras.Variable(rng.normal(size=(2, 5, V)).astype("float32") * 3)
    labels = rng.integers(0, V, size=(2, 5))
    labels[1, 3] = -100  # ignored: any value, even out of range

    def loss():
        losses = token_cross_entropy(
            keras.ops.array(labels),
            logits.value,
            label_smoothing=smoothing,
            ignore_class=-100,
        )
        return keras.ops.sum(losses * keras.ops.arange(1, 6, dtype="float32"))

    x = to_numpy(logits).astype("float64")
    shifted = x - x.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    safe = np.where(labels == -100, 0, labels)
    nll = -np.take_along_axis(log_probs, safe[..., None], -1)[..., 0]
    want = (1 - smoothing) * nll - smoothing * log_probs.mean(-1)
    valid = labels != -100
    weight = np.arange(1, 6)[None, :] * valid
    onehot = np.eye(V)[safe]
    grad = np.exp(log_probs) - (1 - smoothing) * onehot - smoothing / V
    assert_close(to_numpy(loss()), (want * weight).sum(), atol=1e-4)
    (got,) = gradients(loss, [logits])
    assert_close(got, grad * weight[..., None], atol=1e-6)


@pytest.mark.parametrize(
    "tied, softcap, smoothing, with_bias",
    [(False, None, 0.0, False), (True, 3.0, 0.1, True), (False, 3.0, 0.0, True)],
)
def test_chunked_equals_plain(tied, softcap, smoothing, with_bias):
    rng = np.random.default_rng(0)
    hidden = keras.Variable(rng.normal(size=(1, N, D)).astype("float32"))
    kernel = keras.Variable(
        rng.normal(size=(V, D) if tied else (D, V)).astype("float32")
    )
    bias = keras.Variable(rng.normal(size=(V,)).astype("float32"))
    labels = rng.integers(0, V, size=(1, N))
    weights = (rng.random((1, N)) > 0.3).astype("float32")

    def plain():
        logits = keras.ops.matmul(
            hidden, keras.ops.transpose(kernel) if tied else kernel
        )
        if with_bias:
            logits = logits + bias
        if softcap:
            logits = keras.ops.tanh(logits / softcap) * softcap
        losses = token_cross_entropy(
            keras.ops.array(labels), logits, label_smoothing=smoothing
        )
        return keras.ops.sum(losses * keras.ops.array(weights))

    def chunked():
        return chunked_cross_entropy(
            hidden,
            kernel,
            labels,
            weights,
            bias=bias if with_bias else None,
            transposed=tied,
            softcap=softcap,
            label_smoothing=smoothing,
            chunk_size=4,  # 13 positions: 4 chunks, the last one padded
        )

    variables = [hidden, kernel] + ([bias] if with_bias else [])
    assert_close(to_numpy(chunked()), to_numpy(plain()), atol=2e-5)
    for got, want in zip(gradients(chunked, variables), gradients(plain, variables)):
        assert np.abs(want).max() > 0
        assert_close(got, want, atol=2e-6)


def _fit(preset, chunked, **overrides):
    keras.utils.set_random_seed(0)
    lm = kt.from_preset(preset, **overrides)
    lm.chunked_loss = chunked
    loss = MaskedSparseCategoricalCrossentropy(ignore_class=0, label_smoothing=0.1)
    lm.compile(optimizer=keras.optimizers.SGD(0.5), loss=loss)
    ids = np.random.default_rng(1).integers(3, 512, size=(4, 13))
    labels = ids[:, 1:].copy()
    labels[2, :3] = 0  # ignored
    weights = np.ones((4, 12), "float32")
    weights[1, 8:] = 0.0
    x = {"token_ids": ids[:, :-1], "padding_mask": np.ones((4, 12), bool)}
    history = lm.fit(
        x,
        labels,
        sample_weight=weights,
        batch_size=2,
        epochs=2,
        shuffle=False,
        verbose=0,
    )
    return history.history["loss"], [to_numpy(w) for w in lm.trainable_weights]


@pytest.mark.parametrize(
    "preset, overrides",
    [("gpt2_tiny", {}), ("gpt_llama_tiny", {"logit_softcap": 30.0})],
    ids=["tied", "untied_softcapped"],
)
def test_fit_unchanged_by_chunked_loss(preset, overrides):
    plain_loss, plain_weights = _fit(preset, False, **overrides)
    chunked_loss, chunked_weights = _fit(preset, True, **overrides)
    np.testing.assert_allclose(chunked_loss, plain_loss, rtol=1e-6)
    # Adam divides by the gradients' root mean square: the rows of rarely
    # seen tokens' embeddings, whose gradients are tiny, carry float32
    # summation-order differences into whole steps (seen up to 4e-6).
    for got, want in zip(chunked_weights, plain_weights):
        assert_close(got, want, atol=1e-5)


def test_chunks_are_computed_one_after_another():
    """Each chunk's logits wait for the previous chunk's gradients: only one
    chunk's `[C, V]` tensors exist at a time (TensorFlow's graph loops would
    otherwise run up to ten iterations at once; JAX's loops and PyTorch run
    in order)."""
    if keras.config.backend() != "tensorflow":
        pytest.skip("JAX's loops and PyTorch's eager loop run in order")
    import tensorflow as tf

    hidden = keras.Variable(np.ones((8, 4), "float32"))
    kernel = keras.Variable(np.ones((4, 6), "float32"))
    labels, weights = tf.zeros((8,), tf.int32), tf.ones((8,))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = chunked_cross_entropy(
                hidden.value, kernel.value, labels, weights, chunk_size=2
            )
        return tape.gradient(loss, [hidden.value, kernel.value])

    graph = step.get_concrete_function().graph
    (loop,) = [op for op in graph.get_operations() if "While" in op.type]
    body = graph._get_function(loop.get_attr("body").name).graph
    # The kernel's gradient, carried from chunk to chunk (starts as zeros).
    (index,) = [
        i
        for i, t in enumerate(loop.inputs)
        if t.shape.as_list() == [4, 6] and t.op.type in ("Const", "Fill")
    ]
    carried = body.inputs[index].op
    products = [op for op in body.get_operations() if op.type in ("MatMul", "Einsum")]
    assert products and all(carried in graph_ancestors(op) for op in products)


def test_chunked_loss_where_it_pays_and_errors(monkeypatch):
    lm = kt.from_preset("gpt2_tiny", num_layers=1)
    lm.compile(optimizer="sgd", loss=MaskedSparseCategoricalCrossentropy())
    ids = np.random.default_rng(2).integers(3, 512, size=(2, 9))
    calls = []
    real = head_loss.chunked_cross_entropy
    monkeypatch.setattr(
        head_loss,
        "chunked_cross_entropy",
        lambda *a, **k: calls.append(1) or real(*a, **k),
    )
    lm.fit(ids[:, :-1], ids[:, 1:], epochs=1, verbose=0)
    assert calls == []  # 2 x 8 x 512 logits: too few to pay
    # (TensorFlow may trace an unknown batch size: the estimate counts 1 row;
    # off JAX it pays from 4x as many logits.)
    monkeypatch.setattr(head_loss, "PAYS_FROM", 8 * 512 // 4)
    lm.compile(optimizer="sgd", loss=MaskedSparseCategoricalCrossentropy())
    lm.fit(ids[:, :-1], ids[:, 1:], epochs=1, verbose=0)
    assert calls  # traced (JAX, TensorFlow) or run (PyTorch) with chunks
    lm.chunked_loss = True
    lm.compile(
        optimizer="sgd",
        loss=MaskedSparseCategoricalCrossentropy(),
        metrics=["accuracy"],
    )
    with pytest.raises(ValueError, match="compiled metrics read the logits"):
        lm.fit(ids[:, :-1], ids[:, 1:], epochs=1, verbose=0)
