"""Gated DeltaNet: the linear-attention token mixer of Qwen3-Next and
Qwen3.5's "linear_attention" layers.

Each value head keeps a state `S [Dk, Dv]` (a fast-weight memory from keys
to values). Per token: the state decays by `exp(g)` (`g <= 0`), then the
delta rule writes the value's error, with strength `beta`:

    S <- exp(g) S
    S <- S + beta k (v - S^T k)^T
    o  = S^T q

with `q` and `k` L2-normalised (and `q` scaled by `Dk ** -0.5`). Queries,
keys and values come from one projection through a causal depthwise
convolution with SiLU; `beta = sigmoid(x W_b)`, `g = -exp(A_log) *
softplus(x W_a + dt_bias)` per value head; the output goes through an
RMSNorm over each head, times `silu(x W_z)` (the output gate), then the
output projection.

Two equal forms: `chunked_delta_rule` (training and prefill: within chunks
of `chunk_size` tokens the recurrence is solved in closed form, a
triangular system per chunk, and a scan carries the state from chunk to
chunk) and `recurrent_delta_rule` (decoding: one token at a time from the
cached state). The layer's cache (`init_cache`) is `(conv_state [B, K-1,
C], state [B, Hv, Dk, Dv])`: the last `K - 1` projected inputs and the
delta-rule state (float32), both of fixed size, so a compiled decoding
loop keeps static shapes.

Reference: Yang et al., "Gated Delta Networks: Improving Mamba2 with Delta
Rule" (2024), https://arxiv.org/abs/2412.06464.
"""

from __future__ import annotations

import math

import keras
from keras import ops

from keras_transformers.backend import call_layer
from keras_transformers.layers.core import Dense, RMSNormalization
from keras_transformers.layers.serializable import (
    argument_config,
    serializable,
    store_arguments,
)


def l2_normalize(x, epsilon=1e-6):
    """`x / sqrt(sum(x^2) + epsilon)` over the last axis (float32 in, out)."""
    return x * ops.rsqrt(ops.sum(x * x, axis=-1, keepdims=True) + epsilon)


def recurrent_delta_rule(q, k, v, g, beta, state):
    """The gated delta rule one token at a time.

    Args:
        q, k: `[B, T, H, Dk]` float32 (normalised; `q` scaled).
        v: `[B, T, H, Dv]` float32.
        g: `[B, T, H]` log decay (<= 0); beta: `[B, T, H]` write strength.
        state: `[B, H, Dk, Dv]` the state before the first token.

    Returns:
        `(out [B, T, H, Dv], state [B, H, Dk, Dv])`.

    Examples:
        >>> q = k = keras.ops.ones((1, 2, 1, 4)) * 0.5
        >>> v, g, beta = keras.ops.ones((1, 2, 1, 3)), keras.ops.zeros((1, 2, 1)), keras.ops.ones((1, 2, 1))
        >>> out, state = recurrent_delta_rule(q, k, v, g, beta, keras.ops.zeros((1, 1, 4, 3)))
        >>> tuple(out.shape), tuple(state.shape)
        ((1, 2, 1, 3), (1, 1, 4, 3))
    """
    outputs = []
    for t in range(q.shape[1]):
        state = state * ops.exp(g[:, t])[..., None, None]
        k_t = k[:, t]  # [B, H, Dk]
        read = ops.einsum("bhkv,bhk->bhv", state, k_t)
        delta = (v[:, t] - read) * beta[:, t][..., None]  # [B, H, Dv]
        state = state + k_t[..., :, None] * delta[..., None, :]
        outputs.append(ops.einsum("bhkv,bhk->bhv", state, q[:, t]))
    return ops.stack(outputs, axis=1), state


def _to_chunks(x, size):
    """`[B, n * size, H, ...]` -> `[n, B, H, size, ...]`."""
    shape = ops.shape(x)
    x = ops.reshape(x, (shape[0], -1, size, *shape[2:]))  # [B, n, C, H, ...]
    axes = (1, 0, 3, 2, *range(4, len(x.shape)))
    return ops.transpose(x, axes)


def chunked_delta_rule(q, k, v, g, beta, state, chunk_size=64):
    """The gated delta rule over chunks: equal to `recurrent_delta_rule`.

    Within a chunk with cumulative log decays `c_i`, the written values `u`
    solve `(I + A) u = beta (v - exp(c) k S0)`, `A_ij = beta_i
    exp(c_i - c_j) k_i.k_j` (j < i); outputs are `exp(c_i) q_i S0 +
    sum_{j<=i} exp(c_i - c_j) (q_i.k_j) u_j`, and the state moves on to
    `exp(c_C) S0 + sum_j exp(c_C - c_j) k_j u_j^T`. Padding the sequence
    to whole chunks with zeros (`g = 0`, `beta = 0`) leaves the state as
    it is.

    Args:
        as `recurrent_delta_rule`; `chunk_size`: tokens per chunk (the
            whole sequence when shorter).

    Returns:
        `(out [B, T, H, Dv], state [B, H, Dk, Dv])`.

    Examples:
        >>> q = k = keras.ops.ones((1, 5, 1, 4)) * 0.5
        >>> v, g, beta = keras.ops.ones((1, 5, 1, 3)), keras.ops.zeros((1, 5, 1)), keras.ops.ones((1, 5, 1))
        >>> out, _ = chunked_delta_rule(q, k, v, g, beta, keras.ops.zeros((1, 1, 4, 3)), 2)
        >>> tuple(out.shape)
        (1, 5, 1, 3)
    """
    length = ops.shape(q)[1]
    size = min(chunk_size, length) if isinstance(length, int) else chunk_size
    pad = (-length) % size
    if not isinstance(pad, int) or pad:
        widths = lambda x: [(0, 0), (0, pad)] + [(0, 0)] * (len(x.shape) - 2)  # noqa: E731
        q, k, v, g, beta = (ops.pad(x, widths(x)) for x in (q, k, v, g, beta))
    q, k, v = (_to_chunks(x, size) for x in (q, k, v))  # [n, B, H, C, D]
    g, beta = (
        _to_chunks(x[..., None], size)[..., 0] for x in (g, beta)
    )  # [n, B, H, C]
    c = ops.cumsum(g, axis=-1)
    lower = ops.tril(ops.ones((size, size), "bool"))  # j <= i
    strict = ops.tril(ops.ones((size, size), "float32"), -1)  # j < i
    diff = c[..., :, None] - c[..., None, :]  # [n, B, H, C, C]: c_i - c_j
    decay = ops.where(lower, ops.exp(ops.where(lower, diff, 0.0)), 0.0)
    keys = ops.matmul(k, ops.swapaxes(k, -1, -2))  # [n, B, H, C, C]
    system = ops.eye(size) + beta[..., :, None] * keys * decay * strict
    rhs = ops.concatenate([v, k * ops.exp(c)[..., None]], axis=-1) * beta[..., None]
    solved = ops.solve_triangular(system, rhs, lower=True)
    dv = v.shape[-1]
    values, keys_read = solved[..., :dv], solved[..., dv:]
    scores = ops.matmul(q, ops.swapaxes(k, -1, -2)) * decay  # [n, B, H, C, C]
    q_read = q * ops.exp(c)[..., None]
    k_write = k * ops.exp(c[..., -1:] - c)[..., None]
    chunk_decay = ops.exp(c[..., -1])[..., None, None]  # [n, B, H, 1, 1]

    def step(s, chunk):  # the state on to the next chunk, and this one's
        values, keys_read, k_write, decay = chunk
        u = values - ops.matmul(keys_read, s)  # [B, H, C, Dv]
        return s * decay + ops.matmul(ops.swapaxes(k_write, -1, -2), u), s

    # Only the states go through the scan (outputs of the carry's shape, as
    # Keras' TensorFlow scan takes, differentiable on every backend); the
    # chunks' reads are then batched products over all chunks at once.
    chunks = (values, keys_read, k_write, chunk_decay)
    state, starts = ops.scan(step, state, chunks)  # [n, B, H, Dk, Dv]
    u = values - ops.matmul(keys_read, starts)
    out = ops.matmul(q_read, starts) + ops.matmul(scores, u)  # [n, B, H, C, Dv]
    out = ops.transpose(out, (1, 0, 3, 2, 4))  # [B, n, C, H, Dv]
    shape = ops.shape(out)
    out = ops.reshape(out, (shape[0], -1, shape[3], shape[4]))
    return out[:, :length], state


@serializable
class GatedDeltaNet(keras.layers.Layer):
    """Gated DeltaNet token mixer (see the module docstring).

    Args:
        num_key_heads: Hk, query / key heads.
        num_value_heads: Hv, value heads (a multiple of Hk; each query / key
            head serves `Hv // Hk` consecutive value heads).
        key_head_dim: Dk.
        value_head_dim: Dv.
        conv_kernel_size: K, taps of the causal depthwise convolution.
        chunk_size: tokens per chunk of the parallel form.
        norm_epsilon: epsilon of the gated RMSNorm.
        kernel_initializer: initializer of the projection kernels.

    Call arguments:
        query: `[B, T, D]` (the name `MultiHeadAttention` uses: the block
            calls either alike).
        key_padding_mask: `[B, T]`, 1 where the token is real: other
            positions' inputs are zeroed (a left-padded row then gives
            the unpadded outputs; right padding never reaches earlier
            positions). Ignored with a cache (decoding feeds real tokens).
        cache: `(conv_state [B, K-1, C], state [B, Hv, Dk, Dv])` from
            `init_cache`: `x` continues the sequence the cache has seen.
        cache_index: unused (the state carries no positions).
        attention_bias, positions: unused (no attention scores).
        memory, memory_mask: not supported (None).
        training: unused.

    Returns:
        `[B, T, D]`, or `(output, cache)` when `cache` is given.

    Examples:
        >>> layer = GatedDeltaNet(num_key_heads=2, num_value_heads=4, key_head_dim=8, value_head_dim=8)
        >>> tuple(layer(keras.ops.ones((2, 5, 32))).shape)
        (2, 5, 32)
    """

    # Logical axes of each weight (see keras_transformers.distribution).
    # The q | k | v projection and its convolution are kept whole (their
    # concatenated width does not split by heads); the rest by value heads.
    weight_axes = {
        "qkv/kernel": ("embed", "linear_qkv"),
        "conv_kernel": (None, "linear_qkv"),
        "output_gate/kernel": ("embed", "linear_heads"),
        "beta/kernel": ("embed", "linear_heads"),
        "decay/kernel": ("embed", "linear_heads"),
        "dt_bias": ("linear_heads",),
        "a_log": ("linear_heads",),
        "attention_output/kernel": ("linear_heads", "embed"),
    }

    def __init__(
        self,
        num_key_heads,
        num_value_heads,
        key_head_dim,
        value_head_dim,
        conv_kernel_size=4,
        chunk_size=64,
        norm_epsilon=1e-6,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if num_value_heads % num_key_heads:
            raise ValueError(
                "`num_value_heads` must be a multiple of `num_key_heads`. Received: "
                f"num_key_heads={num_key_heads}, num_value_heads={num_value_heads}"
            )
        store_arguments(self, locals(), skip=("kernel_initializer",))
        # The cache's state stays float32 under mixed precision: Keras
        # would cast floating call arguments to the compute dtype (the
        # variables are cast where they are read).
        self.autocast = False
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.key_dim = num_key_heads * key_head_dim
        self.value_dim = num_value_heads * value_head_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim

    # A `TransformerBlock` holding this mixer passes its cache on uncast.
    float32_state = True

    def _dense(self, units, name):
        return Dense(
            units,
            use_bias=False,
            kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy,
            name=name,
        )

    def build(self, input_shape):
        dim = input_shape[-1]
        heads = self.num_value_heads
        self.qkv_dense = self._dense(self.conv_dim, "qkv")
        self.gate_dense = self._dense(self.value_dim, "output_gate")
        self.beta_dense = self._dense(heads, "beta")
        self.decay_dense = self._dense(heads, "decay")
        for layer in (self.qkv_dense, self.gate_dense, self.beta_dense):
            layer.build(input_shape)
        self.decay_dense.build(input_shape)
        self.conv_kernel = self.add_weight(
            name="conv_kernel",
            shape=(self.conv_kernel_size, self.conv_dim),
            initializer=self.kernel_initializer,
        )
        self.dt_bias = self.add_weight(
            name="dt_bias", shape=(heads,), initializer="ones"
        )
        # log(A), A uniform in (0, 16] as the reference initialises it.
        self.a_log = self.add_weight(
            name="a_log",
            shape=(heads,),
            initializer=keras.initializers.RandomUniform(math.log(0.01), math.log(16)),
        )
        self.norm = RMSNormalization(
            epsilon=self.norm_epsilon, dtype=self.dtype_policy, name="norm"
        )
        self.norm.build((None, None, heads, self.value_head_dim))
        self.output_dense = Dense(
            dim,
            use_bias=False,
            kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy,
            name="attention_output",
        )
        self.output_dense.build((None, None, self.value_dim))
        self.built = True

    def init_cache(self, batch_size, max_length, dtype):
        """A zero cache (its size does not depend on `max_length`):
        `(conv_state [B, K-1, C], state [B, Hv, Dk, Dv])`, the state in
        float32 (also under mixed precision: this layer and a block holding
        it keep their call arguments' dtypes, see `float32_state`)."""
        conv = (batch_size, self.conv_kernel_size - 1, self.conv_dim)
        state = (batch_size, self.num_value_heads, self.key_head_dim)
        state += (self.value_head_dim,)
        return ops.zeros(conv, dtype=dtype), ops.zeros(state, dtype="float32")

    def _convolve(self, mixed, conv_state):
        """The causal depthwise convolution with SiLU of `mixed [B, T, C]`
        after `conv_state [B, K-1, C]` (None: zeros): `(out [B, T, C], the
        new conv state)`."""
        taps = self.conv_kernel_size
        length = ops.shape(mixed)[1]
        if conv_state is None:
            batch = ops.shape(mixed)[0]
            conv_state = ops.zeros((batch, taps - 1, self.conv_dim), mixed.dtype)
        full = ops.concatenate([ops.cast(conv_state, mixed.dtype), mixed], axis=1)
        kernel = ops.cast(self.conv_kernel, mixed.dtype)  # [K, C]
        out = full[:, :length] * kernel[0]
        for j in range(1, taps):
            out = out + full[:, j : j + length] * kernel[j]
        return ops.silu(out), full[:, length:]

    def _heads(self, x, heads, size):
        """`[B, T, heads * size]` -> `[B, T, heads, size]` float32."""
        shape = ops.shape(x)
        return ops.cast(ops.reshape(x, (shape[0], shape[1], heads, size)), "float32")

    def call(
        self,
        query,
        key_padding_mask=None,
        cache=None,
        cache_index=None,
        attention_bias=None,
        positions=None,
        training=None,
        memory=None,
        memory_mask=None,
    ):
        if memory is not None:
            raise ValueError(
                "GatedDeltaNet has no segment memory (`memory`): its state is "
                "the memory; decode with `cache` instead."
            )
        x = ops.cast(query, self.compute_dtype)
        if key_padding_mask is not None and cache is None:
            x = x * ops.cast(key_padding_mask, x.dtype)[..., None]
        conv_state, state = (None, None) if cache is None else cache
        mixed = call_layer(self.qkv_dense, x)  # [B, T, C]
        mixed, conv_state = self._convolve(mixed, conv_state)
        hk, hv = self.num_key_heads, self.num_value_heads
        q = self._heads(mixed[..., : self.key_dim], hk, self.key_head_dim)
        k = self._heads(
            mixed[..., self.key_dim : 2 * self.key_dim], hk, self.key_head_dim
        )
        v = self._heads(mixed[..., 2 * self.key_dim :], hv, self.value_head_dim)
        if hv != hk:  # each query / key head serves hv // hk value heads
            q, k = (ops.repeat(t, hv // hk, axis=2) for t in (q, k))
        q = l2_normalize(q) * self.key_head_dim**-0.5
        k = l2_normalize(k)
        beta = ops.sigmoid(ops.cast(call_layer(self.beta_dense, x), "float32"))
        a = ops.cast(call_layer(self.decay_dense, x), "float32")
        g = -ops.exp(ops.cast(self.a_log, "float32")) * ops.softplus(
            a + ops.cast(self.dt_bias, "float32")
        )  # [B, T, Hv]
        if state is None:
            shape = ops.shape(q)
            state = ops.zeros((shape[0], hv, self.key_head_dim, self.value_head_dim))
        state = ops.cast(state, "float32")
        if cache is not None and query.shape[1] == 1:  # decoding: one token
            out, state = recurrent_delta_rule(q, k, v, g, beta, state)
        else:
            out, state = chunked_delta_rule(q, k, v, g, beta, state, self.chunk_size)
        out = call_layer(self.norm, ops.cast(out, self.compute_dtype))
        gate = self._heads(call_layer(self.gate_dense, x), hv, self.value_head_dim)
        out = ops.cast(ops.cast(out, "float32") * ops.silu(gate), self.compute_dtype)
        shape = ops.shape(out)
        out = ops.reshape(out, (shape[0], shape[1], self.value_dim))
        out = call_layer(self.output_dense, out)  # [B, T, D]
        return out if cache is None else (out, (conv_state, state))

    def get_config(self):
        config = super().get_config()
        config.update(
            argument_config(self, skip=("kernel_initializer",)),
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
        )
        return config


__all__ = ["GatedDeltaNet", "chunked_delta_rule", "recurrent_delta_rule"]
