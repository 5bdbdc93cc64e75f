"""The gated unit of GLU feed-forwards (`act(gate) * up` with a hand-written
backward pass) equals automatic differentiation of the plain expression,
for every activation; a gated `FeedForward` trains the same through it."""

import math

import keras
import numpy as np
import pytest
from contracts import assert_close, gradients, to_numpy

from keras_transformers.layers.feed_forward import FeedForward, activation_fn
from keras_transformers.layers.gated_activation import DERIVATIVES, gated_unit

# The activations in float64, for numerical derivatives.
_FLOAT64 = {
    "silu": lambda x: x / (1 + np.exp(-x)),
    "quick_gelu": lambda x: x / (1 + np.exp(-1.702 * x)),
    "gelu": lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2))),
    "gelu_approximate": lambda x: (
        0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    ),
    "relu": lambda x: np.maximum(x, 0),
}


@pytest.mark.parametrize("name", sorted(DERIVATIVES))
def test_gated_activation_gradients(name):
    """Same forward as the plain expression; gradients equal the float64
    derivative (central differences) to float32 rounding (automatic
    differentiation of the tanh GELU is off by up to 4e-6 on JAX near
    |tanh| = 1, where `1 - t^2` cancels)."""
    rng = np.random.default_rng(0)
    # Values across each activation's curved part, none at relu's kink.
    g64 = rng.uniform(-5, 5, size=(2, 5, 16))
    g64[np.abs(g64) < 1e-3] = 0.5
    gate = keras.Variable(g64.astype("float32"))
    up = keras.Variable(rng.normal(size=(2, 5, 16)).astype("float32"))
    act = activation_fn(name)

    def plain():
        return keras.ops.sum(act(gate) * up)

    def custom():
        return keras.ops.sum(gated_unit(name, act)(gate, up))

    assert_close(custom(), plain(), atol=0)
    g64, up64, h = to_numpy(gate).astype("f8"), to_numpy(up).astype("f8"), 1e-6
    act64 = _FLOAT64[name]
    want = [
        (act64(g64 + h) - act64(g64 - h)) / (2 * h) * up64,
        act64(g64),
    ]
    for got, w in zip(gradients(custom, [gate, up]), want):
        assert_close(got, w, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("use_bias", [False, True])
def test_gated_feed_forward_gradients_match_inference_path(use_bias):
    """`training=True` (the gated unit and the output projection with one
    hand-written backward) and `training=False` (plain ops) give the same
    outputs and gradients, biases included."""
    rng = np.random.default_rng(1)
    layer = FeedForward(32, activation="silu", gated=True, use_bias=use_bias)
    x = keras.ops.convert_to_tensor(rng.normal(size=(2, 6, 8)).astype("float32"))
    layer.build(x.shape)
    for weight in layer.trainable_weights:  # nonzero biases too
        weight.assign(rng.normal(size=weight.shape).astype("float32") * 0.3)
    assert layer._projects_gated()
    outs = {t: to_numpy(layer(x, training=t)) for t in (True, False)}
    assert_close(outs[True], outs[False], atol=0)
    grads = {
        t: gradients(
            lambda t=t: keras.ops.sum(layer(x, training=t) ** 2),
            layer.trainable_weights,
        )
        for t in (True, False)
    }
    for got, want in zip(grads[True], grads[False]):  # float32 rounding
        assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_gated_feed_forward_with_lora_keeps_the_output_layer():
    """With LoRA on the output projection the training call goes through
    the output `Dense` (its adapter included), not the fused product."""
    rng = np.random.default_rng(2)
    layer = FeedForward(16, activation="silu", gated=True, use_bias=False)
    x = keras.ops.convert_to_tensor(rng.normal(size=(1, 4, 8)).astype("float32"))
    layer.build(x.shape)
    layer.output_dense.enable_lora(2)
    layer.output_dense.lora_kernel_b.assign(np.ones((2, 8), "float32"))
    assert not layer._projects_gated()
    assert_close(layer(x, training=True), layer(x, training=False), atol=1e-6)
    plain = FeedForward(16, activation="silu", gated=True, use_bias=False)
    plain.build(x.shape)
    for a, b in zip(plain.weights, layer.weights):
        a.assign(b)
    delta = to_numpy(layer(x, training=True)) - to_numpy(plain(x, training=True))
    assert np.abs(delta).max() > 1e-3  # the adapter's update is there
