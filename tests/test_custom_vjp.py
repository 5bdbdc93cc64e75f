"""`backend.custom_vjp`: a hand-written backward pass, the same gradient on
every backend, computed only once the output's gradient exists."""

import re

import keras
import numpy as np
from contracts import gradients, graph_ancestors
from keras import ops

from keras_transformers.backend.custom_vjp import custom_vjp


def _exp_square():
    """`x * x` whose backward pass recomputes `exp(x)` from its residual (a
    stand-in for attention's scores, recomputed from the queries and keys)
    and returns `2 x g exp(x) / exp(x)`, the exact derivative."""
    calls = []

    def backward(residuals, grad):
        calls.append("backward")
        (x,) = residuals
        recomputed = ops.exp(x)
        return (2.0 * x * grad * recomputed / recomputed,)

    return custom_vjp(lambda x: (x * x, (x,)), backward), calls


def test_the_gradient_is_what_the_backward_pass_returns():
    square, _ = _exp_square()
    x = keras.Variable(np.array([0.5, -1.0, 2.0], "float32"))
    w = np.array([1.0, 2.0, 3.0], "float32")
    (grad,) = gradients(lambda: ops.sum(ops.multiply(square(x.value), w)), [x])
    np.testing.assert_allclose(grad, 2 * x.numpy() * w, rtol=1e-6)


def test_the_backward_pass_waits_for_the_output_gradient():
    """What the backward pass recomputes from the residuals alone must not
    be computed during the forward pass and kept (every layer's recomputed
    attention scores at once): it depends on the output's gradient."""
    square, calls = _exp_square()
    x = np.array([0.5, -1.0, 2.0], "float32")
    backend = keras.config.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        @tf.function
        def step(t):
            with tf.GradientTape() as tape:
                tape.watch(t)
                loss = tf.reduce_sum(square(t))
            return tape.gradient(loss, t)

        graph = step.get_concrete_function(tf.TensorSpec([3], tf.float32)).graph
        (exp,) = [op for op in graph.get_operations() if op.type == "Exp"]
        assert any("gradient_tape" in op.name for op in graph_ancestors(exp)), (
            "the recomputation runs without waiting for the gradient"
        )
    elif backend == "jax":
        import jax

        jaxpr = str(jax.make_jaxpr(jax.grad(lambda t: ops.sum(square(t))))(x))
        barrier = re.search(r"\boptimization_barrier\b", jaxpr)
        exp = re.search(r"\bexp\b", jaxpr)
        assert barrier and exp and barrier.start() < exp.start()
    else:
        import torch

        t = torch.tensor(x, requires_grad=True)
        loss = square(t).sum()
        assert calls == []  # the forward pass ran, the backward not yet
        loss.backward()
        assert calls == ["backward"]
