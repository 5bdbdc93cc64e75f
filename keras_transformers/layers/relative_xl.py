"""Transformer-XL's relative positional attention terms.

Shape letters: B batch, T queries, S keys (memory, then the segment or the
cache), N query heads, K key/value heads, G = N // K, H head size, D width.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from keras_transformers.backend import call_layer, value
from keras_transformers.layers.serializable import serializable


def relative_sinusoid(distances, dim):
    """Transformer-XL's encodings of `distances` (`[S]`): `[S, D]`, the sines
    of `distance / 10000 ** (2i / D)` in the first half, their cosines in the
    second."""
    inverse = 1.0 / np.power(10000.0, np.arange(0, dim, 2, dtype="float64") / dim)
    angles = ops.multiply(
        ops.cast(distances, "float32")[:, None], inverse.astype("float32")
    )
    return ops.concatenate([ops.sin(angles), ops.cos(angles)], axis=-1)


def relative_shift(scores):
    """The paper's shift of `[B, N, T, S]` scores computed against distances
    `S - 1, ..., 0` (key axis): entry `(i, j)` becomes the score at distance
    `S - T + i - j`, i.e. for query `i` at position `S - T + i` and key `j`.
    Entries of later keys (negative distances) hold other scores: mask them.
    """
    b, n, t, s = (ops.shape(scores)[i] for i in range(4))
    padded = ops.pad(scores, ((0, 0), (0, 0), (0, 0), (1, 0)))  # [B, N, T, S + 1]
    padded = ops.reshape(padded, (b, n, s + 1, t))[:, :, 1:]  # [B, N, S, T]
    return ops.reshape(padded, (b, n, t, s))


@serializable
class TransformerXLBias(keras.layers.Layer):
    """One block's relative attention terms of Transformer-XL, as a callable
    `attention_bias(query, key)` for `MultiHeadAttention`: with the content
    term `q . k` computed by the attention, it adds the global content bias
    term `u . k` and the position term `(q + v) . W_r R(i - j)` (relative
    shift included), times the attention scale (the bias is added to
    scaled logits).

    Weights: `content_bias` u `[N, H]`, `position_bias` v `[N, H]` and the
    position projection `position_kernel` W_r `[D, N, H]` (no bias), all per
    block (Hugging Face's `untie_r=True`).

    Args:
        num_heads: N.
        head_dim: H.
        hidden_dim: D, width of the sinusoidal encodings.
        num_kv_heads: K (grouped queries); None = N.
        clamp_len: distances beyond this share its encoding; None = no clamp.
        attention_scale: the attention's scale; None = `1 / sqrt(H)`.
        kernel_initializer: initializer of the three weights.

    Call arguments (of `bias_fn(query_offset)(query, key)`):
        query: `[B, T, N, H]` projected queries.
        key: `[B, S, K, H]` projected keys (memory first).
        query_offset: key index of the first query; None = `S - T` (the
            queries are the last keys: training, or a cache cut to its
            filled part).

    Returns:
        `[B, N, T, S]` float32 bias.

    Reference:
        Dai et al., "Transformer-XL: Attentive Language Models Beyond a
        Fixed-Length Context", 2019 (section 3.3).
    """

    # Logical axes of each weight (see keras_transformers.distribution).
    weight_axes = {
        "content_bias": ("heads", "head_dim"),
        "position_bias": ("heads", "head_dim"),
        "position_kernel": ("embed", "heads", "head_dim"),
    }

    def __init__(
        self,
        num_heads,
        head_dim,
        hidden_dim,
        num_kv_heads=None,
        clamp_len=None,
        attention_scale=None,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.hidden_dim = hidden_dim
        self.num_kv_heads = num_kv_heads or num_heads
        self.clamp_len = clamp_len
        self.attention_scale = attention_scale
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

    def build(self, input_shape=None):
        heads = (self.num_heads, self.head_dim)
        init = self.kernel_initializer
        self.content_bias = self.add_weight(
            name="content_bias", shape=heads, initializer=init
        )
        self.position_bias = self.add_weight(
            name="position_bias", shape=heads, initializer=init
        )
        self.position_kernel = self.add_weight(
            name="position_kernel", shape=(self.hidden_dim, *heads), initializer=init
        )
        self.built = True

    def bias_fn(self, query_offset=None):
        """The callable `bias(query, key)` for `MultiHeadAttention`."""
        return lambda query, key: call_layer(
            self, query, key, query_offset=query_offset
        )

    def call(self, query, key, query_offset=None):
        t, s = ops.shape(query)[1], ops.shape(key)[1]
        n, k = self.num_heads, self.num_kv_heads
        scale = self.attention_scale or self.head_dim**-0.5
        dtype = query.dtype
        u = ops.cast(value(self.content_bias), dtype)
        v = ops.cast(value(self.position_bias), dtype)
        # Global content term u . k_j: [B, N, 1, S] (u grouped as the queries).
        u_grouped = ops.reshape(u, (k, n // k, self.head_dim))
        content = ops.einsum("kgh,bskh->bkgs", u_grouped, key)
        content = ops.reshape(content, (ops.shape(key)[0], n, 1, s))
        # Position term against distances S-1+c, ..., c, shifted: with the
        # queries at keys `offset + i`, c = S - T - offset (0 without offset).
        distances = ops.arange(s - 1, -1, -1, dtype="int32")
        if query_offset is not None:
            distances = distances - (s - t - ops.cast(query_offset, "int32"))
        distances = ops.maximum(distances, 0)
        if self.clamp_len is not None:
            distances = ops.minimum(distances, self.clamp_len)
        encodings = ops.cast(relative_sinusoid(distances, self.hidden_dim), dtype)
        kernel = ops.cast(value(self.position_kernel), dtype)
        r = ops.einsum("sd,dnh->snh", encodings, kernel)  # [S, N, H]
        position = ops.einsum("btnh,snh->bnts", query + v, r)  # [B, N, T, S]
        bias = ops.cast(content, "float32") + ops.cast(
            relative_shift(position), "float32"
        )
        return bias * scale

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            head_dim=self.head_dim,
            hidden_dim=self.hidden_dim,
            num_kv_heads=self.num_kv_heads,
            clamp_len=self.clamp_len,
            attention_scale=self.attention_scale,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
        )
        return config
