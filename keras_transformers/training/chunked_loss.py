"""Cross-entropy of an LM head computed chunk by chunk: the float32 logits
`[B, T, V]` never exist at once.

At 2,048 tokens and SmolLM2's 49,152-token vocabulary the logits are
403 MB in float32, and a plain loss keeps several tensors of that size
(the logits, their log-softmax, the gradients of both). Here the head's
matrix product, the softmax, the loss and the gradients of the hidden
states and of the head's weights are computed together for `chunk_size`
positions at a time, in one loop (the same program for any length), and
only those gradients are kept for the backward pass (a hand-written
gradient, `backend.custom_vjp`): no extra matrix product is spent on a
recomputation.

Shape letters: N positions (batch times length, flattened), D hidden
width, V vocabulary, C positions per chunk.
"""

from __future__ import annotations

from keras import ops

from keras_transformers import backend
from keras_transformers.backend.custom_vjp import custom_vjp

# Positions per chunk: about 2^23 float32 logits (32 MB) per chunk, and at
# least MIN_CHUNK positions: every chunk adds its part of the head's
# gradient to the whole `[D, V]` sum, so chunks of few positions spend
# their time on that sum (Gemma 3's 262,144 x 640 head, 2,048 positions,
# JAX, 2-core CPU: chunks of 32 positions 17.2 s forward and backward and
# 6.4 GB peak, of 256 positions 8.8 s and 5.8 GB, of 512 8.4 s and 7.2 GB).
CHUNK_ELEMENTS = 2**23
MIN_CHUNK = 256


def chunk_size_for(vocabulary_size: int) -> int:
    """Positions per chunk at this vocabulary size (a multiple of 8)."""
    return max(MIN_CHUNK, CHUNK_ELEMENTS // vocabulary_size // 8 * 8)


def chunked_cross_entropy(
    hidden,
    kernel,
    labels,
    weights,
    *,
    bias=None,
    transposed=False,
    softcap=None,
    label_smoothing=0.0,
    chunk_size=None,
):
    """`sum(weights * cross_entropy(logits, labels))`, float32, where
    `logits = softcap(hidden @ kernel + bias)`, computed and differentiated
    `chunk_size` positions at a time.

    Args:
        hidden: `[..., D]` hidden states (any float dtype; the product runs
            in it, the softmax in float32).
        kernel: `[D, V]`, or `[V, D]` with `transposed` (a tied embedding
            table), of `hidden`'s dtype.
        labels: int `[...]`, each in `[0, V)` where its weight is non-zero.
        weights: float `[...]` per-position weights (0: ignored).
        bias: `[V]` logits bias, or None.
        softcap: `softcap * tanh(logits / softcap)`, or None.
        label_smoothing: `eps`: the per-position loss is `(1 - eps) * nll +
            eps * mean_v(-log softmax)`, as `token_cross_entropy`.
        chunk_size: positions per chunk; None: `chunk_size_for(V)`.

    Returns:
        The float32 scalar weighted sum (no gradient for labels or weights).

    Examples:
        >>> h = keras.random.normal((2, 5, 8))
        >>> w = keras.random.normal((8, 11))
        >>> labels = keras.ops.ones((2, 5), "int32")
        >>> loss = chunked_cross_entropy(h, w, labels, keras.ops.ones((2, 5)), chunk_size=4)
        >>> tuple(loss.shape)
        ()
    """
    width = hidden.shape[-1]
    vocabulary = kernel.shape[0 if transposed else 1]
    size = chunk_size or chunk_size_for(vocabulary)
    hidden = ops.reshape(hidden, (-1, width))  # [N, D]
    labels = ops.reshape(ops.cast(labels, "int32"), (-1,))
    weights = ops.reshape(ops.cast(weights, "float32"), (-1,))
    n = ops.shape(hidden)[0]  # a tensor in a TensorFlow trace of unknown batch
    chunks = (n + size - 1) // size
    pad = chunks * size - n
    if not isinstance(pad, int) or pad:  # whole chunks: zero-weight rows at the end
        hidden = ops.pad(hidden, ((0, pad), (0, 0)))
        labels = ops.pad(labels, ((0, pad),))
        weights = ops.pad(weights, ((0, pad),))
    options = (size, chunks, transposed, softcap, float(label_smoothing))
    tensors = [hidden, kernel, labels, weights] + ([bias] if bias is not None else [])

    forward = lambda *x: _forward(options, *x)  # noqa: E731
    function = custom_vjp(forward, _backward)
    return function(*[ops.convert_to_tensor(t) for t in tensors])


def _forward(options, hidden, kernel, labels, weights, bias=None):
    """The loss, and the gradients of the hidden states `[N, D]`, of the
    kernel and of the bias, all for an upstream gradient of 1."""
    size, chunks, transposed, softcap, eps = options
    width = hidden.shape[1]
    vocabulary = kernel.shape[0 if transposed else 1]
    kernel_axes = "vd" if transposed else "dv"
    head = f"cd,{kernel_axes}->cv"  # [C, D] -> [C, V]
    back = f"cv,{kernel_axes}->cd"  # [C, V] -> [C, D]
    kernel_grad = f"cv,cd->{kernel_axes}"

    def chunk(i, carry):
        loss, d_hidden, d_kernel, d_bias = carry
        # One chunk at a time: TensorFlow's loop would otherwise run up to
        # ten iterations' logits at once (its `parallel_iterations`).
        h = backend.after(ops.slice(hidden, (i * size, 0), (size, width)), d_kernel)
        y = ops.slice(labels, (i * size,), (size,))
        w = ops.slice(weights, (i * size,), (size,))[:, None]
        logits = ops.cast(ops.einsum(head, h, kernel), "float32")  # [C, V]
        if bias is not None:
            logits = logits + ops.cast(bias, "float32")
        capped = None
        if softcap is not None:
            capped = ops.tanh(logits / softcap)
            logits = capped * softcap
        lse = ops.logsumexp(logits, axis=-1, keepdims=True)  # [C, 1]
        target = ops.arange(vocabulary, dtype="int32")[None, :] == y[:, None]
        picked = ops.sum(ops.where(target, logits, 0.0), axis=-1, keepdims=True)
        ce = lse - picked
        # d loss / d logits = w * (softmax - (1 - eps) onehot - eps / V)
        grad = ops.exp(logits - lse) - eps / vocabulary
        grad = ops.where(target, grad - (1.0 - eps), grad) * w
        if eps:
            mean = ops.mean(logits, axis=-1, keepdims=True)
            ce = (1.0 - eps) * ce + eps * (lse - mean)
        loss = loss + ops.sum(w * ce)
        if capped is not None:
            grad = grad * (1.0 - capped * capped)
        if bias is not None:
            d_bias = d_bias + ops.sum(grad, axis=0)
        grad = ops.cast(grad, hidden.dtype)
        d_h = ops.cast(ops.einsum(back, grad, kernel), "float32")
        d_hidden = ops.slice_update(d_hidden, (i * size, 0), d_h)
        d_kernel = d_kernel + ops.cast(ops.einsum(kernel_grad, grad, h), "float32")
        return loss, d_hidden, d_kernel, d_bias

    init = (
        ops.zeros((), "float32"),
        ops.zeros(ops.shape(hidden), "float32"),
        ops.zeros(ops.shape(kernel), "float32"),
        ops.zeros((vocabulary,), "float32"),
    )
    loss, d_hidden, d_kernel, d_bias = ops.fori_loop(0, chunks, chunk, init)
    residuals = (
        ops.cast(d_hidden, hidden.dtype),
        ops.cast(d_kernel, kernel.dtype),
        None if bias is None else ops.cast(d_bias, bias.dtype),
    )
    return loss, residuals


def _backward(residuals, grad):
    """The forward's gradients times the scalar upstream gradient."""
    d_hidden, d_kernel, d_bias = (
        None if g is None else g * ops.cast(grad, g.dtype) for g in residuals
    )
    return [d_hidden, d_kernel, None, None] + ([d_bias] if d_bias is not None else [])
