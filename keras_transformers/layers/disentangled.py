"""DeBERTa's disentangled attention: position terms added to the content
logits of every self-attention of an encoder stack.

For a query at position i and a key at position j, with `d = bucket(i - j)`
and `r = clip(d + span, 0, 2 * span - 1)` a row of the relative-embedding
table `P [2 * span, D]`:

    logits[i, j] = (q_i . k_j + q_i . Kp[r] + k_j . Qp[r]) / sqrt(H * (1 + terms))

"c2p" is the `q_i . Kp[r]` term, "p2c" the `k_j . Qp[r]` term; `Kp` and `Qp`
are `P` through a key / query projection (each block's own ones with
`share_att_key`, else separate per-block ones). The content term is the
block's attention with `attention_scale` at the same factor (see
`TransformerConfig.resolved_attention_scale`); the position terms reach it
as a callable `attention_bias` (see `MultiHeadAttention`).

Shape letters: B batch, T query length, S key length, D width, N heads,
H head size, R = 2 * span table rows, L = max_sequence_length.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from keras_transformers.backend import call_layer
from keras_transformers.layers.core import EinsumDense, seeded_dropout
from keras_transformers.layers.feed_forward import make_norm
from keras_transformers.layers.serializable import serializable


def log_buckets(distance: np.ndarray, buckets: int, max_distance: int) -> np.ndarray:
    """DeBERTa's bucket of each relative distance `i - j` (an int array):
    distances below `buckets // 2` are kept, longer ones map to
    `sign * (ceil(log(|d| / mid) / log((max_distance - 1) / mid) * (mid - 1)) + mid)`
    with `mid = buckets // 2`, computed in float32 as Hugging Face does."""
    distance = np.asarray(distance, np.int64)
    mid = buckets // 2
    inside = (distance < mid) & (distance > -mid)
    size = np.where(inside, mid - 1, np.abs(distance)).astype(np.float32)
    base = np.log(np.float32((max_distance - 1) / mid))
    log = np.log(size / np.float32(mid)) / base * np.float32(mid - 1)
    log = np.ceil(log) + np.float32(mid)
    out = np.where(size <= mid, distance.astype(np.float32), log * np.sign(distance))
    return out.astype(np.int64)


def relative_rows(max_length: int, span: int, buckets: int, max_distance: int):
    """`[2 * max_length - 1]` int32: the table row of each distance
    `i - j` in `[-(max_length - 1), max_length - 1]` (index `i - j +
    max_length - 1`), `clip(bucket(i - j) + span, 0, 2 * span - 1)`."""
    distance = np.arange(-(max_length - 1), max_length)
    if buckets:
        distance = log_buckets(distance, buckets, max_distance)
    return np.clip(distance + span, 0, 2 * span - 1).astype("int32")


@serializable
class DisentangledAttention(keras.layers.Layer):
    """The relative-position part of DeBERTa's attention for one encoder
    stack: the relative embeddings `[2 * span, D]` (and their LayerNorm),
    per-block position projections without `share_att_key`, and the
    per-block `attention_bias` callables.

    Args:
        num_layers: blocks of the stack.
        num_heads: N.
        head_dim: H.
        max_length: L, the longest sequence.
        position_buckets: log buckets per side (0: none; see
            `DisentangledConfig`).
        max_relative_positions: the longest distance told apart.
        share_att_key: read the position queries / keys with each block's
            own query / key projections.
        attention_terms: "c2p" and / or "p2c".
        norm_relative_embeddings: a LayerNorm on the table.
        norm_epsilon: its epsilon.
        dropout: dropout on the table in training (DeBERTa's `pos_dropout`).
        kernel_initializer: initializer of the table and projections.

    Call arguments: none; see `biases`.
    """

    def weight_axes(self):
        """Logical axes of each weight (see keras_transformers.distribution)."""
        axes = {"embeddings": None}  # the relative embeddings: replicated
        for kind in ("key", "query"):
            for i in range(self.num_layers):
                name = f"position_{kind}_{i}"
                axes[name + "/kernel"] = ("embed", "heads", "head_dim")
                axes[name + "/bias"] = ("heads", "head_dim")
        return axes

    def __init__(
        self,
        num_layers,
        num_heads,
        head_dim,
        max_length,
        position_buckets=256,
        max_relative_positions=512,
        share_att_key=True,
        attention_terms=("c2p", "p2c"),
        norm_relative_embeddings=True,
        norm_epsilon=1e-7,
        dropout=0.0,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.max_length = max_length
        self.position_buckets = position_buckets
        self.max_relative_positions = max_relative_positions
        self.share_att_key = share_att_key
        self.attention_terms = tuple(attention_terms)
        self.norm_relative_embeddings = norm_relative_embeddings
        self.norm_epsilon = norm_epsilon
        self.dropout = dropout
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.span = position_buckets or max_relative_positions
        self.rows = relative_rows(
            max_length, self.span, position_buckets, max_relative_positions
        )
        self.dropout_layer = seeded_dropout(dropout, dtype=self.dtype_policy)

    def build(self, input_shape):
        dim = input_shape[-1]
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(2 * self.span, dim),
            initializer=self.kernel_initializer,
        )
        self.norm = None
        if self.norm_relative_embeddings:
            self.norm = make_norm("layer", self.norm_epsilon, self.dtype_policy, "norm")
            self.norm.build((None, dim))
        self.position_keys, self.position_queries = [], []
        if not self.share_att_key:  # per block: separate projections
            for kind, term, into in (
                ("key", "c2p", self.position_keys),
                ("query", "p2c", self.position_queries),
            ):
                if term not in self.attention_terms:
                    continue
                for i in range(self.num_layers):
                    layer = EinsumDense(
                        "btd,dnh->btnh",
                        output_shape=(None, self.num_heads, self.head_dim),
                        bias_axes="nh",
                        kernel_initializer=self.kernel_initializer,
                        dtype=self.dtype_policy,
                        name=f"position_{kind}_{i}",
                    )
                    layer.build((None, None, dim))
                    into.append(layer)
        self.built = True

    def table(self, training=None):
        """The relative embeddings `[R, D]`, normed, with dropout in training."""
        table = ops.cast(self.embeddings, self.compute_dtype)
        if self.norm is not None:
            table = call_layer(self.norm, table)
        if training and self.dropout > 0:
            table = self.dropout_layer(table, training=training)
        return table

    def biases(self, attentions, training=None) -> list:
        """One `attention_bias(query, key)` callable per block (see
        `MultiHeadAttention`): the position terms `[B, N, T, S]` of the
        block whose attention is `attentions[i]`, on the scaled logits."""
        table = self.table(training)[None]  # [1, R, D]
        out = []
        for i, attention in enumerate(attentions):
            if self.share_att_key:
                keys, queries = attention.key_dense, attention.query_dense
            else:
                keys = self.position_keys[i] if self.position_keys else None
                queries = self.position_queries[i] if self.position_queries else None
            scale = attention.attention_scale
            scale = self.head_dim**-0.5 if scale is None else scale
            out.append(self._bias(table, keys, queries, scale))
        return out

    def _bias(self, table, keys, queries, scale):
        def bias(query, key):  # [B, T, N, H], [B, S, N, H] -> [B, N, T, S]
            rows = self._rows(ops.shape(query)[1], ops.shape(key)[1])  # [T, S]
            score = 0.0
            if "c2p" in self.attention_terms:
                position_keys = ops.cast(call_layer(keys, table)[0], query.dtype)
                c2p = ops.einsum("btnh,rnh->bntr", query, position_keys)
                score = score + _take(c2p, rows)
            if "p2c" in self.attention_terms:
                position_queries = ops.cast(call_layer(queries, table)[0], key.dtype)
                p2c = ops.einsum("bsnh,rnh->bnsr", key, position_queries)
                p2c = _take(p2c, ops.transpose(rows))  # [B, N, S, T]
                score = score + ops.transpose(p2c, (0, 1, 3, 2))
            return ops.cast(score, "float32") * scale

        return bias

    def _rows(self, query_length, key_length):
        """`[T, S]` table rows of each query-key pair."""
        distance = ops.arange(query_length)[:, None] - ops.arange(key_length)[None]
        return ops.take(
            ops.convert_to_tensor(self.rows), distance + self.max_length - 1
        )

    def compute_output_shape(self, input_shape):
        return (2 * self.span, input_shape[-1])

    def get_config(self):
        config = super().get_config()
        config.update(
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            head_dim=self.head_dim,
            max_length=self.max_length,
            position_buckets=self.position_buckets,
            max_relative_positions=self.max_relative_positions,
            share_att_key=self.share_att_key,
            attention_terms=list(self.attention_terms),
            norm_relative_embeddings=self.norm_relative_embeddings,
            norm_epsilon=self.norm_epsilon,
            dropout=self.dropout,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
        )
        return config


def _take(scores, rows):
    """`scores [B, N, X, R]` at table rows `rows [X, Y]`: `[B, N, X, Y]`."""
    shape = ops.shape(scores)
    index = ops.broadcast_to(rows[None, None], (shape[0], shape[1], *ops.shape(rows)))
    return ops.take_along_axis(scores, index, axis=-1)
