"""Memory-efficient attention: queries in blocks, scores never stored.

Explicit attention keeps the float32 scores and probabilities `[B, N, T, S]`
of every layer for the backward pass (2 x 151 MB per layer for 9 heads at
2,048 tokens). Here the queries go through in blocks of `block_size`
positions: each block's scores `[B, N, block, S']` exist only while the
block is computed, and only the output and each query's log-sum-exp
`[B, N, T]` are kept. The backward pass (a hand-written gradient,
`backend.custom_vjp`) recomputes each block's scores from the queries and
keys, as flash attention does. Keys a block cannot see (after it under a
causal mask, outside a sliding window) are skipped, not masked: causal
attention at T = S computes about half the scores of the explicit form.

Same numbers as explicit attention (`attention_scores._grouped`), masks,
grouped K/V heads, soft-capping and attention sinks included: masked scores
are -1e9 before the softmax, so a query whose keys are all masked attends
uniformly to every key, as there. No attention dropout and no additive
bias (those layers stay explicit).

Shape letters as in `keras_transformers.layers.attention`.
"""

from __future__ import annotations

from dataclasses import dataclass

from keras import ops

from keras_transformers import backend
from keras_transformers.backend.custom_vjp import custom_vjp

MASKED = -1e9  # the masked score of the explicit path
BLOCK_SIZE = 128  # query positions per block by default


@dataclass(frozen=True)
class _Spec:
    """The static description of one call: shapes, options, blocks."""

    scale: float
    groups: int  # G = N // K
    softcap: float | None
    has_mask: bool
    has_sinks: bool
    empty_rows: bool  # the mask may mask every key of a query
    blocks: tuple  # ((query start, stop, key start, stop), ...)

    @property
    def heads(self):
        """Einsum letters of the head axes: "n", or "kg" when grouped."""
        return "n" if self.groups == 1 else "kg"

    def unpack(self, tensors):
        """`(q, k, v, mask | None, sinks | None)` from the call's tensors."""
        q, k, v, *rest = tensors
        mask = rest.pop(0) if self.has_mask else None
        sinks = rest.pop(0) if self.has_sinks else None
        return q, k, v, mask, sinks

    def grouped(self, x):
        """`[B, T, N, H]` -> `[B, T, K, G, H]` when grouped."""
        if self.groups == 1:
            return x
        b, t, n, h = ops.shape(x)
        return ops.reshape(x, (b, t, n // self.groups, self.groups, h))

    def masks(self, mask):
        """A `[B|1, 1, Tb, Sb]` mask against the scores."""
        return mask if self.groups == 1 else mask[:, :, None]

    def sinks(self, sinks):
        """`[N]` sink logits as `[1, N, 1, 1]` or `[1, K, G, 1, 1]`, float32."""
        shape = (1, -1, self.groups, 1, 1) if self.groups > 1 else (1, -1, 1, 1)
        return ops.reshape(ops.cast(sinks, "float32"), shape)

    def rows(self, rows):
        """`[B|1, T]` per-query values against the grouped heads
        `[B, T, heads..., H]`."""
        return ops.reshape(rows, tuple(ops.shape(rows)) + (1,) * (len(self.heads) + 1))


def blockwise_attention(
    q,
    k,
    v,
    mask=None,
    *,
    scale,
    softcap=None,
    sinks=None,
    causal=False,
    window=None,
    aligned=False,
    block_size=BLOCK_SIZE,
):
    """`[B, T, N, H]` attention outputs of `q [B, T, N, H]` over `k`, `v`
    `[B, S, K, H]`, computed and differentiated block by block.

    Args:
        mask: `[B|1, 1, T, S]` booleans (True: attend), or None.
        scale: factor on the query-key products.
        softcap: `softcap * tanh(scores / softcap)` before the mask, or None.
        sinks: `[N]` float attention-sink logits (one more column per head,
            dropped after the softmax), or None.
        causal, window: the layer's structure (a causal mask, a sliding
            window: causal, the `window` latest keys; otherwise the keys at
            most `window // 2` away). With `aligned`, blocks skip the keys
            it masks; `mask` must mask them too.
        aligned: queries and keys share positions `0 .. T - 1` (self
            attention without a cache or memory).
        block_size: query positions per block.

    Returns:
        `[B, T, N, H]` in `v`'s dtype.

    Examples:
        >>> q = keras.random.normal((1, 8, 4, 16))
        >>> kv = keras.random.normal((1, 8, 2, 16))
        >>> out = blockwise_attention(q, kv, kv, scale=0.25, block_size=4)
        >>> tuple(out.shape)
        (1, 8, 4, 16)
    """
    t, s = q.shape[1], k.shape[1]
    blocks = tuple(
        (
            a,
            min(a + block_size, t),
            *_key_range(a, min(a + block_size, t), s, causal, window, aligned),
        )
        for a in range(0, t, block_size)
    )
    spec = _Spec(
        scale=float(scale),
        groups=q.shape[2] // k.shape[2],
        softcap=softcap,
        has_mask=mask is not None,
        has_sinks=sinks is not None,
        empty_rows=mask is not None and sinks is None,
        blocks=blocks,
    )
    tensors = [
        ops.convert_to_tensor(x) for x in (q, k, v, mask, sinks) if x is not None
    ]
    forward = lambda *x: _forward(spec, *x)  # noqa: E731
    backward = lambda r, g: _backward(spec, r, g)  # noqa: E731
    return custom_vjp(forward, backward)(*tensors)


def _key_range(start, stop, length, causal, window, aligned):
    """The keys `[lo, hi)` that queries `start .. stop - 1` may see."""
    if not aligned:
        return 0, length
    if causal:
        lo = 0 if window is None else max(0, start - window + 1)
        return lo, stop
    if window is None:
        return 0, length
    return max(0, start - window // 2), min(length, stop - 1 + window // 2 + 1)


def _scores(spec, q, k, mask):
    """Float32 scores `[B, heads..., Tb, Sb]` of a block, soft-capped and
    masked, and the tanh of the soft cap (None without one)."""
    h = spec.heads
    scores = ops.cast(ops.einsum(f"bt{h}d,bs{h[0]}d->b{h}ts", q, k), "float32")
    scores = scores * spec.scale
    capped = None
    if spec.softcap is not None:
        capped = ops.tanh(scores / spec.softcap)
        scores = capped * spec.softcap
    if mask is not None:
        scores = ops.where(spec.masks(mask), scores, MASKED)
    return scores, capped


def _slices(spec, block, q, k, v, mask):
    """One block's queries, keys, values and mask."""
    a, z, lo, hi = block
    if mask is not None:  # a query or key axis of size 1 broadcasts
        mask = mask if mask.shape[2] == 1 else mask[:, :, a:z]
        mask = mask if mask.shape[3] == 1 else mask[..., lo:hi]
    return q[:, a:z], k[:, lo:hi], v[:, lo:hi], mask


def _forward(spec, *tensors):
    q, k, v, mask, sinks = spec.unpack(tensors)
    h = spec.heads
    qg = spec.grouped(q)
    sink = None if sinks is None else spec.sinks(sinks)
    outs, lses = [], []
    for block in spec.blocks:
        qb, kb, vb, mb = _slices(spec, block, qg, k, v, mask)
        if outs:  # one block at a time (`backend.after`)
            qb = backend.after(qb, outs[-1])
        scores, _ = _scores(spec, qb, kb, mb)
        top = ops.max(scores, axis=-1, keepdims=True)
        if sink is not None:
            top = ops.maximum(top, sink)
        e = ops.exp(scores - top)
        total = ops.sum(e, axis=-1, keepdims=True)
        if sink is not None:
            total = total + ops.exp(sink - top)
        probs = ops.cast(e / total, v.dtype)
        outs.append(ops.einsum(f"b{h}ts,bs{h[0]}d->bt{h}d", probs, vb))
        lses.append(ops.squeeze(top + ops.log(total), -1))  # [B, heads..., Tb]
    out = ops.concatenate(outs, axis=1) if len(outs) > 1 else outs[0]
    lse = ops.concatenate(lses, axis=-1) if len(lses) > 1 else lses[0]
    if spec.empty_rows:  # every key masked: uniform over all S keys
        rows = spec.rows(ops.any(mask, axis=-1)[:, 0])
        uniform = ops.mean(v, axis=1, keepdims=True)  # [B, 1, K, H]
        if spec.groups > 1:
            uniform = uniform[:, :, :, None]
        out = ops.where(rows, out, ops.cast(uniform, out.dtype))
    out = ops.reshape(out, ops.shape(q))
    return out, (q, k, v, mask, sinks, out, lse)


def _backward(spec, residuals, grad):
    q, k, v, mask, sinks, out, lse = residuals
    h, kh = spec.heads, spec.heads[0]
    qg, dout = spec.grouped(q), spec.grouped(grad)
    f32 = lambda x: ops.cast(x, "float32")  # noqa: E731
    # D = rowsum(dO * O): the softmax backward's per-query term.
    delta = ops.einsum(f"bt{h}d,bt{h}d->b{h}t", f32(dout), f32(spec.grouped(out)))
    sink = None if sinks is None else spec.sinks(sinks)
    dk = ops.zeros(ops.shape(k), "float32")
    dv = ops.zeros(ops.shape(v), "float32")
    dqs, dsink = [], None
    for block in spec.blocks:
        a, z, lo, hi = block
        qb, kb, vb, mb = _slices(spec, block, qg, k, v, mask)
        qb, db = backend.after(qb, dk), dout[:, a:z]  # one block at a time
        lse_b, delta_b = lse[..., a:z, None], delta[..., a:z, None]
        scores, capped = _scores(spec, qb, kb, mb)
        p = ops.exp(scores - lse_b)
        if spec.empty_rows:  # a query with every key masked gets no key gradient
            p = ops.where(spec.masks(mb), p, 0.0)
        dv = _add_rows(
            dv, lo, ops.einsum(f"b{h}ts,bt{h}d->bs{kh}d", ops.cast(p, v.dtype), db)
        )
        dp = f32(ops.einsum(f"bt{h}d,bs{kh}d->b{h}ts", db, vb))
        ds = p * (dp - delta_b)
        if capped is not None:
            ds = ds * (1.0 - capped * capped)
        ds = ops.cast(ds * spec.scale, q.dtype)
        dqs.append(ops.einsum(f"b{h}ts,bs{kh}d->bt{h}d", ds, kb))
        dk = _add_rows(dk, lo, ops.einsum(f"b{h}ts,bt{h}d->bs{kh}d", ds, qb))
        if sink is not None:  # d sink = -sum_t p_sink * D
            term = -ops.exp(sink[..., 0] - lse[..., a:z]) * delta[..., a:z]
            term = ops.sum(term, axis=(0, len(h) + 1))  # [heads...]
            dsink = term if dsink is None else dsink + term
    if spec.empty_rows:  # their uniform weights: dO / S on every value
        empty = f32(ops.logical_not(ops.any(mask, axis=-1)[:, 0]))  # [B|1, T]
        empty = spec.rows(empty) * f32(dout) / ops.shape(v)[1]
        summed = ops.sum(empty, axis=1)  # [B, K, G, H] or [B, N, H]
        if spec.groups > 1:
            summed = ops.sum(summed, axis=2)
        dv = dv + summed[:, None]
    dq = ops.concatenate(dqs, axis=1) if len(dqs) > 1 else dqs[0]
    grads = [
        ops.reshape(dq, ops.shape(q)),
        ops.cast(dk, k.dtype),
        ops.cast(dv, v.dtype),
    ]
    if mask is not None:
        grads.append(None)
    if sinks is not None:
        grads.append(ops.cast(ops.reshape(dsink, ops.shape(sinks)), sinks.dtype))
    return grads


def _add_rows(total, start, rows):
    """`total [B, S, ...]` with `rows [B, Sb, ...]` added at `start`."""
    stop = start + rows.shape[1]
    if start == 0 and stop == total.shape[1]:
        return total + ops.cast(rows, total.dtype)
    index = (0, start) + (0,) * (len(total.shape) - 2)
    current = total[:, start:stop]
    return ops.slice_update(total, index, current + ops.cast(rows, total.dtype))


__all__ = ["blockwise_attention"]
