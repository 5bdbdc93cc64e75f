"""A function with a hand-written backward pass, on every backend.

`keras.ops.custom_gradient` keeps whatever the forward closes over and, on
PyTorch, swallows errors of the forward (its backward then returns NaN).
`custom_vjp` states the residuals explicitly, as `jax.custom_vjp` does:
only they are kept for the backward pass (`jax.custom_vjp`,
`tf.custom_gradient`, a `torch.autograd.Function`).
"""

from __future__ import annotations

import keras

from keras_transformers.backend import after


def custom_vjp(forward, backward, primal=None):
    """`f(*tensors)` computing `forward` with `backward` as its gradient.

    Args:
        forward: `forward(*tensors) -> (output, residuals)`, one output
            tensor and a tuple of tensors kept for the backward pass.
        backward: `backward(residuals, output_gradient) -> gradients`, one
            per input tensor (None for an input without a gradient: a
            boolean mask).
        primal: `primal(*tensors) -> output`, the same output computed
            without residuals, for calls no gradient goes through (JAX: a
            call outside `jax.grad` and its kin; PyTorch: no input requires
            a gradient, or gradients are off), or None: `forward`'s output.
            TensorFlow always runs `forward`.

    Returns:
        A function of the same tensors returning `output`.

    Examples:
        >>> square = custom_vjp(lambda x: (x * x, (x,)), lambda r, g: (2 * r[0] * g,))
        >>> float(square(keras.ops.convert_to_tensor(3.0)))
        9.0
    """
    name = keras.config.backend()
    primal = primal or (lambda *tensors: forward(*tensors)[0])
    if name == "jax":
        return _jax(forward, backward, primal)
    if name == "tensorflow":
        return _tensorflow(forward, backward)
    if name == "torch":
        return _torch(forward, backward, primal)
    raise NotImplementedError(f"custom_vjp: no backward pass for backend {name!r}")


def _jax(forward, backward, primal):
    import jax

    @jax.custom_vjp
    def f(*tensors):
        return primal(*tensors)

    def bwd(residuals, grad):
        # What `backward` recomputes from the residuals alone could be
        # scheduled by XLA early, during the forward pass, and kept: as
        # `jax.checkpoint` does, the barrier ties the residuals to the
        # incoming gradient. XLA:CPU drops barriers before its last
        # common-subexpression pass, so a backward pass should not compute
        # a large tensor exactly as the forward did, or the two merge into
        # one kept from the forward on (see `blockwise_attention`).
        residuals, grad = jax.lax.optimization_barrier((residuals, grad))
        return tuple(backward(residuals, grad))

    f.defvjp(forward, bwd)
    return f


def _tensorflow(forward, backward):
    import tensorflow as tf

    def tied(residuals, grad):
        # TensorFlow's graph executor runs an op as soon as its inputs
        # exist: what `backward` recomputes from the residuals alone (the
        # gated unit's activation derivative, attention's first block)
        # would run during the forward pass and stay until the gradient
        # arrives. Tied to the gradient, as JAX's barrier ties them
        # (SmolLM2-135M shape, 2,048 tokens, training step: peak 10.3 ->
        # 9.2 GB).
        return tuple(None if r is None else after(r, grad) for r in residuals)

    @tf.custom_gradient
    def f(*tensors):
        out, residuals = forward(*tensors)
        return out, lambda grad: list(backward(tied(residuals, grad), grad))

    # Variables read before the call: inside, `tf.custom_gradient` would
    # want their gradients from `backward` separately.
    return lambda *tensors: f(*(tf.convert_to_tensor(t) for t in tensors))


def _torch(forward, backward, primal):
    import torch

    class Function(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *tensors):
            out, residuals = forward(*tensors)
            # Saved, not stored on `ctx`: `out` held by its own node would
            # be a reference cycle, freed only by the garbage collector.
            ctx.save_for_backward(*residuals)
            return out

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, grad):
            return tuple(backward(ctx.saved_tensors, grad))

    def f(*tensors):
        if torch.is_grad_enabled() and any(
            isinstance(t, torch.Tensor) and t.requires_grad for t in tensors
        ):
            return Function.apply(*tensors)
        return primal(*tensors)

    return f
