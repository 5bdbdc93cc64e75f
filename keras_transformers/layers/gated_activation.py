"""The gated unit of a GLU feed-forward (`act(gate) * up`, e.g. SwiGLU)
with a hand-written backward pass that keeps only `gate` and `up`.

Differentiated op by op, `act(gate) * up` keeps `gate`, `act(gate)`, `up`
and the activation's own intermediates (SwiGLU on JAX: five `[B, T, F]`
tensors); here the backward recomputes `act(gate)` and its derivative from
`gate` (a SmolLM2 training step at 2,048 tokens on JAX: XLA temporaries
186 -> 160 MB per layer). The forward is the same expression, so outputs
are unchanged; gradients are the exact derivatives to float32 rounding
(for the tanh GELU closer than automatic differentiation, whose
`1 - tanh^2` cancels for large |x|).

`gated_projection` also takes the output projection into the same
backward pass: the product's input `act(gate) * up` is computed again
there instead of being kept for the kernel's gradient (TensorFlow, one
SmolLM2 feed-forward at 2,048 tokens: 45 -> 31 MB kept for the backward).
"""

from __future__ import annotations

import math

from keras import ops

from keras_transformers import backend
from keras_transformers.backend.custom_vjp import custom_vjp

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _silu(g):
    s = ops.sigmoid(g)
    return s * (1.0 + g * (1.0 - s))


def _quick_gelu(g):
    s = ops.sigmoid(1.702 * g)
    return s + 1.702 * g * s * (1.0 - s)


def _gelu_tanh(g):
    # 0.5 (1 + tanh(u)) = sigmoid(2u), 1 - tanh(u)^2 = 4 sigmoid(2u)
    # sigmoid(-2u): no cancellation where tanh nears -1 or 1.
    u = 2.0 * _SQRT_2_OVER_PI * (g + 0.044715 * g * g * g)
    s = ops.sigmoid(u)
    slope = _SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * g * g)
    return s + 2.0 * g * s * ops.sigmoid(-u) * slope


def _gelu(g):
    return (
        0.5 * (1.0 + ops.erf(g * _INV_SQRT_2))
        + g * ops.exp(-0.5 * g * g) * _INV_SQRT_2PI
    )


def _relu(g):
    return ops.cast(g > 0, g.dtype)


# d act(g) / dg per activation name of `feed_forward.activation_fn`.
DERIVATIVES = {
    "silu": _silu,
    "quick_gelu": _quick_gelu,
    "gelu_approximate": _gelu_tanh,
    "gelu": _gelu,
    "relu": _relu,
}


def gated_unit(name, act):
    """The function `(gate, up) -> act(gate) * up`, `[..., F]` each,
    keeping only `gate` and `up` for the backward pass. Made once per layer,
    outside any compiled function (`torch.compile` cannot trace the
    definition of PyTorch's `autograd.Function` class).

    Args:
        name: the activation's config name (a key of `DERIVATIVES`).
        act: the activation function itself (the forward's exact op).

    Examples:
        >>> from keras import ops
        >>> unit = gated_unit("relu", ops.relu)
        >>> g = ops.convert_to_tensor([[-1.0, 2.0]])
        >>> out = unit(g, ops.ones_like(g))  # relu(gate) * 1
        >>> [round(float(v), 1) for v in ops.convert_to_numpy(out)[0]]
        [0.0, 2.0]
    """
    derivative = DERIVATIVES[name]

    def forward(gate, up):
        return act(gate) * up, (gate, up)

    def backward(residuals, grad):
        gate, up = residuals
        return grad * up * derivative(gate), grad * act(gate)

    unit = custom_vjp(forward, backward)
    return lambda gate, up: unit(ops.convert_to_tensor(gate), ops.convert_to_tensor(up))


def gated_projection(name, act):
    """The function `(gate, up, kernel, bias) -> (act(gate) * up) @ kernel
    + bias` (`gate`, `up` `[..., F]`, `kernel [F, D]`, `bias [D]` or None)
    keeping only `gate` and `up` for the backward pass: the product's input
    `act(gate) * up` `[..., F]` is computed again there, not kept (one
    `[B, T, F]` tensor less per feed-forward layer in a training step: 12.6
    MB per layer for SmolLM2's 1,536 hidden units at 2,048 tokens).

    Args:
        name: the activation's config name (a key of `DERIVATIVES`).
        act: the activation function itself (the forward's exact op).

    Examples:
        >>> from keras import ops
        >>> project = gated_projection("relu", ops.relu)
        >>> g = ops.convert_to_tensor([[-1.0, 2.0]])
        >>> out = project(g, ops.ones_like(g), ops.ones((2, 1)), None)
        >>> [round(float(v), 1) for v in ops.convert_to_numpy(out)[0]]
        [2.0]
    """
    derivative = DERIVATIVES[name]

    def forward(gate, up, kernel, *bias):
        hidden = act(gate) * up
        out = backend.linear(hidden, kernel, bias[0] if bias else None, 1)
        if out is None:  # the caller's Keras ops
            out = ops.matmul(hidden, kernel)
            out = out + bias[0] if bias else out
        return out, (gate, up, kernel)

    def backward(residuals, grad, bias=False):
        gate, up, kernel = residuals
        a = act(gate)
        # [N, F]: the product's input again, and the gradient [N, D]
        hidden = ops.reshape(a * up, (-1, kernel.shape[0]))
        flat = ops.reshape(grad, (-1, kernel.shape[1]))
        d_hidden = ops.matmul(grad, ops.transpose(kernel))  # [..., F]
        grads = [
            d_hidden * up * derivative(gate),
            d_hidden * a,
            ops.matmul(ops.transpose(hidden), flat),
        ]
        return grads + [ops.sum(flat, axis=0)] if bias else grads

    without_bias = custom_vjp(forward, backward)
    with_bias = custom_vjp(forward, lambda r, g: backward(r, g, bias=True))

    def project(gate, up, kernel, bias=None):
        tensors = [ops.convert_to_tensor(t) for t in (gate, up, kernel)]
        if bias is None:
            return without_bias(*tensors)
        return with_bias(*tensors, ops.convert_to_tensor(bias))

    return project
