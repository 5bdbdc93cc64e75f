"""The attention of `MultiHeadAttention` once queries, keys and values are
projected: fused (`keras.ops.dot_product_attention`, or the backend's own
kernel), blockwise (memory-efficient, `blockwise_attention`) or explicit
(float32 scores and softmax), chosen per call.

Fused by default unless attention dropout is active, the backend would have
to repeat K/V heads (TensorFlow with GQA), or on JAX in float16 or for a
single query token (decoding), where explicit is the faster; blockwise by
default for long sequences (`_block_size`) unless the fused kernel already
keeps no `[T, S]` scores (PyTorch's).

Shape letters as in `keras_transformers.layers.attention`.
"""

from __future__ import annotations

import math

import keras
from keras import ops

from keras_transformers import backend
from keras_transformers.backend.choices import (
    explicit_attention_faster,
    fused_attention_saves_memory,
    one_query_by_reduction,
)
from keras_transformers.layers.blockwise_attention import (
    BLOCK_SIZE,
    blockwise_attention,
)
from keras_transformers.layers.masks import attention_mask

# Automatic blockwise attention: from `LONG_SEQUENCE` query positions (from
# `LONG_CAUSAL` for causal self-attention, whose blocks skip the keys after
# them), in blocks of `BLOCK_SIZE`. Measured on a 2-core CPU (2026-12-03,
# `benchmarks/bench_attention.py`), one SmolLM2 layer's attention forward
# and backward (projections included; 9 / 3 heads of 64), causal, default
# path / blockwise in blocks of 128: at 256 tokens JAX 11.6 / 9.4 ms,
# TensorFlow 11.3 / 12.6 ms; at 512, JAX 43.3 / 21.8 ms, TensorFlow 24.4 /
# 27.9 ms (32.7 / 25.1 in another run); at 2,048, JAX 811 / 242 ms,
# TensorFlow 261 / 216 ms (blocks of 64 within 10%). Ungrouped heads without
# a causal mask (an earlier layout of the blocks): at 512, JAX 51 ms fused,
# 64 ms blockwise, at 1,024, 261 / 226 ms.
LONG_SEQUENCE = 1024
LONG_CAUSAL = 512


def attend(layer, q, k, v, mask, is_causal, training, bias=None, aligned=False):
    """`[B, T, N, H]` attention outputs of `q [B, T, N, H]` over `k`, `v`
    `[B, S, K, H]`: fused, blockwise or explicit.

    Args:
        layer: the `MultiHeadAttention` (its heads, scale, soft cap, sinks,
            dropout, `fused` and `block_size` choices).
        mask: `[B|1, 1, T, S]` booleans (True: attend), or None.
        is_causal: a plain causal mask (no `mask`), for the fused kernels.
        training: dropout switch.
        bias: an additive `[B|1, N|1, T, S]` logits bias, or None.
        aligned: queries and keys are the positions `0 .. T - 1` (self
            attention without memory, and without a cache or filling one
            from position 0, its later slots masked): blockwise attention
            then skips the keys the layer's causal mask or window hides.
    """
    scale = layer.attention_scale
    if scale is None:
        scale = 1.0 / math.sqrt(layer.head_dim)
    # The dropout layer's own rate: `DPOModel(disable_dropout=True)` zeroes it.
    dropout_active = layer.dropout_layer.rate > 0 and bool(training)
    half = keras.backend.standardize_dtype(q.dtype) == "float16"
    grouped = layer.num_heads != layer.num_kv_heads
    fused = layer.fused
    if layer.softcap is not None or layer.sinks:  # no fused kernel takes them
        fused = False
    elif fused is None:  # fused unless it would need dropout or repeated K/V
        fused = not dropout_active and (not grouped or backend.supports_native_gqa())
        fused = fused and not explicit_attention_faster(
            half, q.shape[1] == 1, not grouped and backend.xla_cpu()
        )
    block = 0
    if not dropout_active and bias is None:
        block = _block_size(layer, q, k, fused, half, aligned)
    if block:
        if is_causal and not aligned:  # aligned: each block's from positions
            mask = attention_mask(q.shape[1], k.shape[1], causal=True)
        return blockwise_attention(
            q,
            k,
            v,
            mask,
            scale=scale,
            softcap=layer.softcap,
            sinks=ops.convert_to_tensor(layer.sink_logits) if layer.sinks else None,
            causal=layer.causal,
            window=layer.sliding_window,
            aligned=aligned,
            block_size=block,
        )
    if fused and not dropout_active and bias is None:
        return backend.dot_product_attention(
            q, k, v, mask=mask, scale=scale, is_causal=is_causal
        )
    if fused and not dropout_active and not half:
        # Keras' op takes a bias or a mask, not both: the mask is folded
        # into the bias (a float16 bias would overflow: explicit path).
        bias = ops.cast(bias, "float32")
        if mask is not None:
            bias = ops.where(mask, bias, -1e9)
        return ops.dot_product_attention(q, k, v, bias=bias, scale=scale)
    if q.shape[1] == 1 and not dropout_active and one_query_by_reduction():
        if is_causal:
            mask = attention_mask(1, ops.shape(k)[1], causal=True)
        return _one_query(layer, q, k, v, mask, scale, bias)
    return _grouped(layer, q, k, v, mask, is_causal, scale, training, bias)


def _block_size(layer, q, k, fused, half, aligned):
    """Query positions per block of blockwise attention, or 0 (not
    blockwise): `layer.block_size` if set; by default `BLOCK_SIZE` from
    `LONG_SEQUENCE` queries on (`LONG_CAUSAL` for aligned causal ones),
    unless the backend's fused kernel already keeps no `[T, S]` scores
    (PyTorch's `scaled_dot_product_attention`). Never for lengths only
    known when the program runs."""
    t, s = q.shape[1], k.shape[1]
    size = layer.block_size
    if size == 0 or t is None or s is None:
        return 0
    if size is None:
        long = LONG_CAUSAL if aligned and layer.causal else LONG_SEQUENCE
        if t < long or (fused and fused_attention_saves_memory(half)):
            return 0
        size = BLOCK_SIZE
    return size if t > size else 0


def _grouped(layer, q, k, v, mask, is_causal, scale, training, bias=None):
    """Explicit attention, float32 softmax, K/V never repeated. Without
    grouping the heads keep their 4-D layout (no group axis: no extra
    head-layout copy under XLA)."""
    b, t = ops.shape(q)[0], ops.shape(q)[1]
    s = ops.shape(k)[1]
    groups = layer.num_heads // layer.num_kv_heads
    heads = "n"  # [B, N, T, S] scores
    if groups > 1:
        q = ops.reshape(q, (b, t, layer.num_kv_heads, groups, layer.head_dim))
        heads = "kg"  # [B, K, G, T, S] scores
    logits = ops.einsum(f"bt{heads}h,bs{heads[0]}h->b{heads}ts", q, k)
    logits = ops.cast(logits, "float32") * scale
    if layer.softcap is not None:
        logits = ops.tanh(logits / layer.softcap) * layer.softcap
    if bias is not None:  # [B|1, N|1, T, S] -> the scores' layout
        bias = ops.cast(bias, "float32")
        if groups > 1 and bias.shape[1] == 1:
            bias = bias[:, :, None]
        elif groups > 1:
            shape = ops.shape(bias)
            bias = ops.reshape(
                bias, (shape[0], layer.num_kv_heads, groups, shape[2], shape[3])
            )
        logits = logits + bias
    if is_causal:
        mask = attention_mask(t, s, causal=True)
    if mask is not None:  # [B|1, 1, T, S]
        mask = mask if groups == 1 else mask[:, :, None]
        logits = ops.where(mask, logits, -1e9)
    if layer.sinks:  # one more column per head, dropped after the softmax
        shape = (1, layer.num_kv_heads, groups, 1, 1) if groups > 1 else (1, -1, 1, 1)
        sinks = ops.reshape(ops.cast(layer.sink_logits, "float32"), shape)
        sinks = ops.zeros_like(logits[..., :1]) + sinks
        logits = ops.concatenate([logits, sinks], axis=-1)
        probs = ops.cast(ops.softmax(logits, axis=-1)[..., :-1], v.dtype)
    else:
        probs = ops.cast(ops.softmax(logits, axis=-1), v.dtype)
    probs = layer.dropout_layer(probs, training=training)
    out = ops.einsum(f"b{heads}ts,bs{heads[0]}h->bt{heads}h", probs, v)
    return ops.reshape(out, (b, t, layer.num_heads, layer.head_dim))


def _one_query(layer, q, k, v, mask, scale, bias=None):
    """Explicit attention of one query token (a decoding step), `q [B, 1,
    N, H]` over `k`, `v` `[B, S, K, H]`, as products summed over an axis
    rather than matrix products: the keys and values are read in their
    cache layout (a batched matrix product over the K heads would copy the
    cache into a `[B, K, S, H]` layout every step), in float32. `mask`
    `[B|1, 1, 1, S]`, `bias` `[B|1, N|1, 1, S]` as `attend` takes them."""
    b, s, dtype = ops.shape(q)[0], ops.shape(k)[1], v.dtype
    kv_heads = layer.num_kv_heads
    groups = layer.num_heads // kv_heads
    q = ops.reshape(ops.cast(q, "float32"), (b, 1, kv_heads, groups, layer.head_dim))
    k = ops.cast(k, "float32")[:, :, :, None, :]  # [B, S, K, 1, H]
    logits = ops.sum(q * k, axis=-1) * scale  # [B, S, K, G]
    if layer.softcap is not None:
        logits = ops.tanh(logits / layer.softcap) * layer.softcap
    if bias is not None:  # [B|1, N|1, 1, S] -> [B|1, S, K|1, G|1]
        bias = ops.transpose(ops.cast(bias, "float32")[:, :, 0, :], (0, 2, 1))
        heads = (kv_heads, groups) if bias.shape[-1] != 1 else (1, 1)
        bias = ops.reshape(bias, (ops.shape(bias)[0], ops.shape(bias)[1]) + heads)
        logits = logits + bias
    if mask is not None:  # [B|1, 1, 1, S] -> [B|1, S, 1, 1]
        logits = ops.where(mask[:, 0, 0, :, None, None], logits, -1e9)
    if layer.sinks:  # one more key per head, dropped after the softmax
        sinks = ops.reshape(
            ops.cast(layer.sink_logits, "float32"), (1, 1, kv_heads, groups)
        )
        logits = ops.concatenate(
            [logits, ops.zeros_like(logits[:, :1]) + sinks], axis=1
        )
        probs = ops.softmax(logits, axis=1)[:, :s]
    else:
        probs = ops.softmax(logits, axis=1)  # [B, S, K, G]
    v = ops.cast(v, "float32")[:, :, :, None, :]  # [B, S, K, 1, H]
    out = ops.sum(probs[..., None] * v, axis=1)  # [B, K, G, H]
    return ops.cast(ops.reshape(out, (b, 1, layer.num_heads, layer.head_dim)), dtype)
