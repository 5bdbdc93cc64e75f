"""Position information: sinusoidal and learned embeddings, T5's relative
position bias, and rotary positions (`keras_transformers.layers.rotary`,
re-exported here)."""

from __future__ import annotations

import functools

import keras
import numpy as np
from keras import ops

from keras_transformers import backend
from keras_transformers.backend.compiled import slice_rows
from keras_transformers.layers.rotary import RotaryEmbedding  # noqa: F401 (re-export)
from keras_transformers.layers.serializable import serializable


@serializable
class SinusoidalPositionEncoding(keras.layers.Layer):
    """Fixed sinusoidal positions of "Attention Is All You Need".

    PE(pos, 2i) = sin(pos / max_wavelength^(2i/D)), PE(pos, 2i+1) = cos(...).
    With `interleave=False` the sines fill the first half of the features and
    the cosines the second half (the layout of Marian / fairseq).

    Args:
        max_wavelength: base of the wavelengths. Defaults to 10000.
        interleave: sin/cos interleaved (paper) or concatenated halves.

    Call arguments:
        x: `[B, T, D]` embeddings (only the shape and dtype are used).
        start_index: position of the first token (an int or scalar tensor).

    Returns:
        `[1, T, D]` position encodings, to be added to `x`.
    """

    def __init__(self, max_wavelength=10000.0, interleave=True, **kwargs):
        super().__init__(**kwargs)
        self.max_wavelength = max_wavelength
        self.interleave = interleave
        self.built = True

    def call(self, x, start_index=0):
        length, dim = ops.shape(x)[1], x.shape[-1]
        positions = ops.cast(ops.arange(length) + start_index, "float32")[:, None]
        i = ops.arange(dim // 2, dtype="float32")[None, :]
        angles = positions / ops.power(self.max_wavelength, 2.0 * i / dim)  # [T, D/2]
        if self.interleave:
            pe = ops.reshape(
                ops.stack([ops.sin(angles), ops.cos(angles)], axis=-1), (length, -1)
            )
        else:
            pe = ops.concatenate([ops.sin(angles), ops.cos(angles)], axis=-1)
        return ops.cast(pe[None], x.dtype)

    def get_config(self):
        config = super().get_config()
        config.update(max_wavelength=self.max_wavelength, interleave=self.interleave)
        return config


@serializable
class PositionEmbedding(keras.layers.Layer):
    """Learned absolute position embedding.

    Args:
        sequence_length: number of positions (the maximum sequence length).
        initializer: embedding initializer.

    Call arguments:
        x: `[B, T, D]` embeddings (only the shape is used).
        start_index: position of the first token (an int or scalar tensor).
        positions: `[B, T]` int positions instead (e.g. restarting at each
            document of packed rows).

    Returns:
        `[1, T, D]` position embeddings (`[B, T, D]` with `positions`), to
        be added to `x`.
    """

    weight_axes = {"embeddings": None}  # replicated

    def __init__(self, sequence_length, initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.sequence_length = int(sequence_length)
        self.initializer = keras.initializers.get(initializer)

    def build(self, input_shape):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.sequence_length, input_shape[-1]),
            initializer=self.initializer,
        )
        self.built = True

    def call(self, x, start_index=0, positions=None):
        length = ops.shape(x)[1]
        table = backend.value(self.embeddings)
        if positions is not None:
            return ops.cast(ops.take(table, positions, axis=0), x.dtype)
        rows = slice_rows(table, start_index, length)  # [T, D]
        return ops.cast(rows[None], x.dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            sequence_length=self.sequence_length,
            initializer=keras.initializers.serialize(self.initializer),
        )
        return config


@functools.cache
def bucket_table(bidirectional: bool, num_buckets: int, max_distance: int):
    """T5's bucket of every relative position `key - query` in
    `[-max_distance, max_distance]` (row `max_distance + r` for `r`): `[2 *
    max_distance + 1]` int32, in float32 arithmetic as Hugging Face's
    `T5Attention._relative_position_bucket` (a constant: no ops per call).
    Farther positions share the end buckets."""
    relative = np.arange(-max_distance, max_distance + 1)
    buckets = np.zeros_like(relative)
    if bidirectional:  # the second half of the buckets for later keys
        num_buckets //= 2
        buckets += (relative > 0) * num_buckets
        relative = np.abs(relative)
    else:  # later keys (masked) share bucket 0
        relative = -np.minimum(relative, 0)
    exact = num_buckets // 2  # one bucket per distance below this
    with np.errstate(divide="ignore", invalid="ignore"):  # log(0): unused
        ratio = np.log(relative.astype("float32") / np.float32(exact))
        ratio = ratio / np.float32(np.log(max_distance / exact))
        large = exact + (ratio * (num_buckets - exact)).astype("int64")
    large = np.minimum(large, num_buckets - 1)
    buckets += np.where(relative < exact, relative, large)
    return buckets.astype("int32")


def relative_position_bucket(
    relative_position, bidirectional, num_buckets, max_distance
):
    """T5's bucket of each relative position (`key - query`, an int tensor
    of any shape): below `num_buckets // 2` (a quarter with `bidirectional`,
    whose other half holds later keys) one bucket per distance, then
    logarithmically wider buckets up to `max_distance`, beyond which all
    share the last one. Causal (`bidirectional=False`): later keys share
    bucket 0. Returns int32 buckets in `[0, num_buckets)`, the shape of
    `relative_position`."""
    table = bucket_table(bool(bidirectional), int(num_buckets), int(max_distance))
    index = ops.clip(relative_position, -max_distance, max_distance) + max_distance
    return ops.take(backend.from_numpy(table), ops.cast(index, "int32"))


def _toeplitz(values, t, s):
    """`[N, T, S]` with `out[:, i, j] = values[:, j - i + T - 1]`, from
    `values [N, T + S - 1]`, by reshapes only: row `i` of the tiled values
    read with a stride of one less than their period starts one earlier."""
    period = t + s  # one padding column: rows of T + S - 1 >= S values
    values = ops.pad(values, ((0, 0), (0, 1)))
    flat = ops.reshape(ops.tile(values, (1, t)), (ops.shape(values)[0], t * period))
    rows = ops.reshape(flat[:, t - 1 : t - 1 + t * (period - 1)], (-1, t, period - 1))
    return rows[:, :, :s]


@serializable
class RelativePositionBias(keras.layers.Layer):
    """T5's bucketed relative position bias: a learned `[num_buckets, N]`
    table read at the bucket of each query-key distance, added to the
    attention logits (`attention_bias` of `MultiHeadAttention`). A model
    computes it once per stack and hands it to every block.

    Args:
        num_heads: N, attention heads.
        num_buckets: rows of the table (HF `relative_attention_num_buckets`).
        max_distance: distance from which all positions share the end
            buckets (HF `relative_attention_max_distance`).
        bidirectional: separate buckets for earlier and later keys
            (encoders); False for causal self-attention (decoders).
        embeddings_initializer: initializer of the table.

    Call arguments:
        query_positions: `[T]` consecutive int positions of the queries
            (`arange(T)`; with a cache, `cache_index + arange(T)`).
        key_positions: `[S]` consecutive int positions of the keys
            (`arange(S)`; with a cache, `arange(S_max)`).

    Returns:
        `[1, N, T, S]` bias, in the layer's compute dtype.

    Reference:
        Raffel et al., "Exploring the Limits of Transfer Learning with a
        Unified Text-to-Text Transformer", 2020.
    """

    weight_axes = {"embeddings": None}  # replicated

    def __init__(
        self,
        num_heads,
        num_buckets=32,
        max_distance=128,
        bidirectional=True,
        embeddings_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.num_buckets = int(num_buckets)
        self.max_distance = int(max_distance)
        self.bidirectional = bool(bidirectional)
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)

    def build(self, input_shape=None, key_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.num_buckets, self.num_heads),
            initializer=self.embeddings_initializer,
        )
        self.built = True

    def call(self, query_positions, key_positions):
        t, s = ops.shape(query_positions)[0], ops.shape(key_positions)[0]
        # Consecutive positions make the bias Toeplitz: one value per
        # distance key - query, T + S - 1 of them from the first key less the
        # last query. Those are read from the table by a one-hot product and
        # laid out as [T, S] by a tile and reshapes. No gather: its gradient
        # is a scatter-add of every (query, key) pair into `num_buckets`
        # rows, which XLA:GPU serialises on atomics (T5-small on JAX: 0.8 s
        # per step on an H200, against 0.05 s for transformers).
        first = key_positions[0] - query_positions[-1]
        buckets = relative_position_bucket(
            first + ops.arange(t + s - 1),
            self.bidirectional,
            self.num_buckets,
            self.max_distance,
        )
        table = ops.cast(backend.value(self.embeddings), self.compute_dtype)
        one_hot = ops.one_hot(buckets, self.num_buckets, dtype=self.compute_dtype)
        values = ops.einsum("db,bn->nd", one_hot, table)  # [N, T + S - 1]
        return _toeplitz(values, t, s)[None]

    def compute_output_shape(self, query_shape, key_shape):
        return (1, self.num_heads, query_shape[0], key_shape[0])

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
            bidirectional=self.bidirectional,
            embeddings_initializer=keras.initializers.serialize(
                self.embeddings_initializer
            ),
        )
        return config
