"""Multi-head and grouped-query attention with an optional KV cache.

Shape letters: B batch, T query length, S key length, D model width,
N query heads, K key/value heads, G = N // K query heads per KV head,
H head size.
"""

from __future__ import annotations

import keras
from keras import ops

from keras_transformers import backend
from keras_transformers.backend import call_layer
from keras_transformers.layers import core, kv_sharing, ring_cache, row_cache
from keras_transformers.layers.attention_scores import attend
from keras_transformers.layers.core import EinsumDense, RMSNormalization, seeded_dropout
from keras_transformers.layers.kv_sharing import scale_free_rms
from keras_transformers.layers.masks import attention_mask, sliceable_bias
from keras_transformers.layers.positions import RotaryEmbedding
from keras_transformers.layers.segment_memory import with_memory
from keras_transformers.layers.serializable import (
    argument_config,
    serializable,
    store_arguments,
)


@serializable
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head (MHA) or grouped-query (GQA) attention, self or cross.

    One `call()` serves training, full-sequence inference and cached
    decoding. Keys and values are never repeated to match the query heads:
    the fused path hands K/V heads to `keras.ops.dot_product_attention`
    (native GQA on JAX), and the explicit path groups the query heads.

    Args:
        num_heads: N, query heads.
        head_dim: H, size of each head.
        num_kv_heads: K, key/value heads (must divide N). Defaults to N (MHA).
        output_dim: width of the output; defaults to the query width D.
        use_bias: biases on the projections. Defaults to True.
        qkv_bias: biases on the query, key and value projections (not the
            output); None (default) follows `use_bias`.
        key_bias: a bias on the key projection; None (default) follows
            `qkv_bias` (DINOv3: query and value biases, no key bias).
        qk_norm: RMS-normalise queries and keys before rotary positions:
            True: each head over its H features (learned scales `[H]`, as
            Qwen3); "projection": all heads' features together (scales
            `[N * H]` and `[K * H]`, as OLMo 2); False: none.
        norm_epsilon: epsilon of the `qk_norm` norms (and `value_norm`'s).
        value_norm: RMS-normalise each value head over its H features,
            without learned scales (Gemma 4).
        value_from_key: no value projection: the values are the key
            projection's output, before `qk_norm` and rotary positions
            (Gemma 4's `attention_k_eq_v`).
        key_value_store: a name: the keys, values and mask this layer
            attends to are stored under it in the call's
            `shared_key_values` (see `keras_transformers.layers.kv_sharing`).
        key_value_reuse: a name: this layer has no key or value projection
            and no cache; it attends to the keys, values and mask stored
            under that name by an earlier layer of the same kind (Gemma 4's
            KV-shared layers).
        dropout: dropout rate on attention probabilities.
        causal: mask future keys (decoder self-attention).
        sliding_window: causal: attend only to this many most recent
            positions; not causal (an encoder): only to positions at most
            `sliding_window // 2` away on either side.
        rope_max_wavelength: if set, rotary positions with this base are
            applied to queries and keys (see `process_heads`).
        rope_scaling_factor: rotary position interpolation factor.
        rope_scaling: a Hugging Face rotary scaling dict (`llama3`, `yarn`,
            `longrope`, `dynamic`; see `RotaryEmbedding`), or None.
        rotary_dim: features of each head that rotary positions rotate (the
            first ones); None: all `head_dim`.
        attention_scale: factor on the query-key logits; None (default) is
            `1 / sqrt(head_dim)` (T5: 1.0, its scale folded into the weights).
        softcap: soft-capping of the scaled logits, `softcap * tanh(logits /
            softcap)` before the masks (Gemma 2); None (default) for none.
            Attention is then explicit (no fused kernel takes it).
        sinks: attention sinks (gpt-oss): a learned logit per query head,
            `sinks [N]`, joins each query's scores as one more column before
            the softmax and is dropped after it (the probabilities of the
            real keys then sum to less than one). Attention is then explicit.
        output_gate: multiply each head's attention output by
            `sigmoid(query @ W_gate)`, `W_gate [D, N, H]` (the `output_gate`
            projection, with a bias as the query's), before the output
            projection (Qwen3-Next, Qwen3.5's gated attention).
        fused: use fused attention (`keras.ops.dot_product_attention`, or
            torch's SDPA); None (default): where it is the faster (see
            `keras_transformers.layers.attention_scores`).
        block_size: memory-efficient attention in blocks of this many
            queries (`blockwise_attention`); 0: never; None: by length.
        kernel_initializer: initializer of the projection kernels.

    Call arguments:
        query: `[B, T, D]`.
        key_value: `[B, S, D]` for cross-attention; None for self-attention.
        key_padding_mask: `[B, S]`, True/1 where the key is real. With a
            self-attention cache, S is the cache length (None with a
            sliding-window ring cache, whose slots are all real).
        cache: for self-attention, a `(key, value)` pair of `[B, S_max, K, H]`
            tensors holding earlier positions, updated at `cache_index`; for
            cross-attention (no `cache_index`), the projected encoder pair from
            `project_key_value`. With `causal` and `sliding_window`, the
            self-attention cache is a ring of `L` slots instead (`L >=
            sliding_window`, or one per position written), position `p` in
            slot `p % L` (see `keras_transformers.layers.ring_cache`).
        cache_index: position of the first query token in the cache (scalar).
        positions: `[T]` or `[B, T]` rotary positions, or the `RotaryAngles`
            a backbone computed once for its blocks; default `cache_index + arange(T)`.
        attention_bias: an additive bias on the scaled logits, broadcastable
            to `[B, N, T, S]` (e.g. `RelativePositionBias`, T5), applied
            before the masks and the softmax: the query axis covers the `T`
            query positions (`cache_index + arange(T)` with a cache), the key
            axis every key attended, `S` (the whole cache `S_max` with a
            cache; an eager decoding loop then keeps the bias columns of the
            filled part, as it does the keys). The padding and causal masks
            still apply. Fused attention takes it as its `bias` argument
            (folded with the mask), the explicit path adds it in float32.
            It may also be a callable `bias(query, key)` of the projected
            heads, `query [B, T, N, H]` (after `process_heads`) and the keys
            attended `[B, S, K, H]` (the cache included), returning such a
            bias: a score term that depends on the queries or keys, as
            Transformer-XL's and DeBERTa's relative attention.
        memory: `[B, M, D]` hidden states of earlier positions (Transformer-XL
            segment memory; self-attention only, no rotary positions): keys
            and values are projected from `concat(memory, query)`, or
            prepended to the cache's, and the queries sit at positions
            `M + arange(T)` (`M + cache_index + arange(T)` with a cache). The
            caller stops its gradient.
        memory_mask: `[B, M]`, True/1 where a memory slot holds a state of the
            same document (None: all).
        shared_key_values: a `SharedKeyValues` of this forward pass, for
            `key_value_store` / `key_value_reuse`.
        document_ids: `[B, T]` int, the document of each token of packed
            rows (self-attention without a cache): a token attends only to
            its own document's.
        training: dropout switch.

    Returns:
        `[B, T, output_dim]`, or `(output, cache)` when `cache` is given.

    Examples:
        >>> layer = MultiHeadAttention(num_heads=4, head_dim=8, num_kv_heads=2, causal=True)
        >>> tuple(layer(keras.ops.ones((2, 5, 32))).shape)
        (2, 5, 32)
    """

    # Logical axes of each weight (see keras_transformers.distribution).
    weight_axes = core.ATTENTION_WEIGHT_AXES

    def __init__(
        self,
        num_heads,
        head_dim,
        num_kv_heads=None,
        output_dim=None,
        use_bias=True,
        qkv_bias=None,
        qk_norm=False,
        norm_epsilon=1e-6,
        key_bias=None,
        value_norm=False,
        value_from_key=False,
        key_value_store=None,
        key_value_reuse=None,
        dropout=0.0,
        causal=False,
        sliding_window=None,
        rope_max_wavelength=None,
        rope_scaling_factor=1.0,
        rope_scaling=None,
        rotary_dim=None,
        attention_scale=None,
        softcap=None,
        sinks=False,
        output_gate=False,
        fused=None,
        block_size=None,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        num_kv_heads = num_kv_heads or num_heads
        if num_heads % num_kv_heads:
            raise ValueError(
                "`num_heads` must be a multiple of `num_kv_heads`. "
                f"Received: num_heads={num_heads}, num_kv_heads={num_kv_heads}"
            )
        if qk_norm not in (False, True, "projection") or not isinstance(
            qk_norm, (bool, str)
        ):
            raise ValueError(
                "`qk_norm` must be True (per head), 'projection' or False. "
                f"Received: qk_norm={qk_norm!r}"
            )
        store_arguments(self, locals(), skip=("kernel_initializer",))
        self.qkv_bias = use_bias if qkv_bias is None else qkv_bias
        self.key_bias = self.qkv_bias if key_bias is None else key_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.rotary = None
        if rope_max_wavelength is not None:
            self.rotary = RotaryEmbedding(
                rope_max_wavelength,
                rope_scaling_factor,
                scaling=rope_scaling,
                rotary_dim=rotary_dim,
                dtype=self.dtype_policy,
                name="rotary",
            )
        self.dropout_layer = seeded_dropout(dropout, dtype=self.dtype_policy)

    def _projection(self, name, heads, bias=None):
        return EinsumDense(
            "btd,dnh->btnh",
            output_shape=(None, heads, self.head_dim),
            bias_axes="nh" if (self.qkv_bias if bias is None else bias) else None,
            kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy,
            name=name,
        )

    def build(self, query_shape, key_value_shape=None):
        key_value_shape = key_value_shape or query_shape
        self.query_dense = self._projection("query", self.num_heads)
        self.query_dense.build(query_shape)
        self.key_dense = self.value_dense = None
        if self.key_value_reuse is None:  # a consumer projects queries only
            self.key_dense = self._projection("key", self.num_kv_heads, self.key_bias)
            self.key_dense.build(key_value_shape)
        if self.key_value_reuse is None and not self.value_from_key:
            self.value_dense = self._projection("value", self.num_kv_heads)
            self.value_dense.build(key_value_shape)
        out_dim = self.output_dim or query_shape[-1]
        self.output_dense = EinsumDense(
            "btnh,nhd->btd",
            output_shape=(None, out_dim),
            bias_axes="d" if self.use_bias else None,
            kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy,
            name="attention_output",
        )
        self.output_dense.build((None, None, self.num_heads, self.head_dim))
        self.query_norm = self.key_norm = None
        heads = {"query_norm": self.num_heads, "key_norm": self.num_kv_heads}
        if self.key_value_reuse is not None:
            heads.pop("key_norm")
        for name in heads if self.qk_norm else ():
            norm = RMSNormalization(
                epsilon=self.norm_epsilon, dtype=self.dtype_policy, name=name
            )
            if self.qk_norm == "projection":  # [N * H] / [K * H] scales
                norm.build((None, None, heads[name] * self.head_dim))
            else:  # [H] scales shared by the heads
                norm.build((None, None, None, self.head_dim))
            setattr(self, name, norm)
        self.gate_dense = None
        if self.output_gate:  # [D, N, H], biased as the query
            self.gate_dense = self._projection("output_gate", self.num_heads)
            self.gate_dense.build(query_shape)
        self.sink_logits = None
        if self.sinks:  # [N], one logit per query head
            self.sink_logits = self.add_weight(
                name="sinks", shape=(self.num_heads,), initializer="zeros"
            )
        self.built = True

    def init_cache(self, batch_size, max_length, dtype):
        """A zero self-attention cache for decoding up to `max_length`
        positions: `(key, value)`, each `[B, S, K, H]`, with `S = max_length`,
        or for a causal sliding window `min(max_length, sliding_window)` (a
        ring of the most recent positions, see `call`); `()` for a layer
        that reuses another's keys and values (`key_value_reuse`)."""
        if self.key_value_reuse is not None:
            return ()
        if self.causal and self.sliding_window is not None:
            max_length = min(max_length, self.sliding_window)
        shape = (batch_size, max_length, self.num_kv_heads, self.head_dim)
        return ops.zeros(shape, dtype=dtype), ops.zeros(shape, dtype=dtype)

    # ------------------------------------------------------------ extension
    def process_heads(self, query, key, positions):
        """Hook applied to `query [B, T, N, H]` and `key [B, T, K, H]` before
        attention; rotary positions by default. Override to plug in other
        relative-position schemes (`positions [T]` or `[B, T]` is then always
        given; without rotary embedding and an override it may be None)."""
        if self.rotary is None:
            return query, key
        return tuple(self.rotary.rotate((query, key), positions))

    def project_key_value(self, key_value):
        """Projects `[B, S, D]` encoder states once into the `(key, value)`
        cross-attention cache, each `[B, S, K, H]`."""
        raw = self.key_dense(key_value)
        return self._normed(self.key_norm, raw), self._values(key_value, raw)

    def _values(self, source, key):
        """The value heads `[B, S, K, H]` of `source` `[B, S, D]` (`key`:
        its raw key projection, the values with `value_from_key`)."""
        v = key if self.value_from_key else call_layer(self.value_dense, source)
        return scale_free_rms(v, self.norm_epsilon) if self.value_norm else v

    def _normed(self, norm, heads):
        """`heads` `[B, T, N|K, H]` through the `qk_norm` norm, if any (over
        `[B, T, N|K * H]` with `qk_norm="projection"`)."""
        if norm is None:
            return heads
        if self.qk_norm != "projection":
            return call_layer(norm, heads)
        shape = ops.shape(heads)
        flat = ops.reshape(heads, (shape[0], shape[1], -1))  # [B, T, N|K * H]
        return ops.reshape(call_layer(norm, flat), shape)

    # ----------------------------------------------------------------- call
    def call(
        self,
        query,
        key_value=None,
        key_padding_mask=None,
        cache=None,
        cache_index=None,
        positions=None,
        attention_bias=None,
        training=None,
        memory=None,
        memory_mask=None,
        shared_key_values=None,
        document_ids=None,
    ):
        if self.key_value_reuse is not None:
            out = kv_sharing.reuse(
                self, query, shared_key_values, cache_index, positions, training
            )
            return out if cache is None else (out, cache)
        static_cache = cache is not None and cache_index is None
        self_attention = key_value is None and not static_cache
        if memory is not None and (not self_attention or self.rotary is not None):
            raise ValueError(
                "`memory` is for self-attention without rotary positions "
                "(Transformer-XL uses relative position biases instead)."
            )
        q = self._normed(self.query_norm, call_layer(self.query_dense, query))
        if static_cache:  # projected encoder states (cross-attention)
            k, v = cache  # [B, S, K, H] each
        else:
            source = query if self_attention else key_value
            if memory is not None and cache is None:  # [B, M + T, D]
                source = ops.concatenate([ops.cast(memory, query.dtype), query], 1)
            raw = call_layer(self.key_dense, source)  # [B, S, K, H]
            k = self._normed(self.key_norm, raw)
            v = self._values(source, raw)
        offset = 0 if cache_index is None else cache_index
        if self_attention and memory is None:
            custom = type(self).process_heads is not MultiHeadAttention.process_heads
            if positions is None and (self.rotary is not None or custom):
                positions = self._positions(ops.shape(query)[1], offset)
            q, k = self.process_heads(q, k, positions)
        causal = self.causal and self_attention
        key_positions, from_start = None, False  # from_start: keys = the queries
        if cache is not None and row_cache.is_row_index(cache_index):
            window = causal and self.sliding_window  # None / False: no window
            k, v, cache, key_padding_mask = row_cache.update(
                cache, k, v, cache_index, window, key_padding_mask
            )
            causal = False  # the mask holds each row's own keys
        elif cache is not None and cache_index is not None:
            if causal and self.sliding_window is not None:
                window = self.sliding_window
                k, v, cache, key_positions = ring_cache.update(
                    cache, k, v, cache_index, window
                )
                causal = key_positions is not None  # None: one query sees all
            else:
                # K and V are written separately (XLA then updates in place).
                k = backend.update_cache(cache[0], k, cache_index)  # [B, S_max, K, H]
                v = backend.update_cache(cache[1], v, cache_index)
                cache = (k, v)
                if backend.eager_loops() and isinstance(cache_index, int):
                    # An eager loop's position is a Python int: attend to the
                    # filled part of the cache only (no mask for one query).
                    filled = cache_index + ops.shape(q)[1]
                    k, v = k[:, :filled], v[:, :filled]
                    if key_padding_mask is not None:
                        key_padding_mask = key_padding_mask[:, :filled]
                    if sliceable_bias(attention_bias):
                        attention_bias = attention_bias[..., :filled]
                    causal = causal and ops.shape(q)[1] > 1
                    from_start = cache_index == 0
        if memory is not None:
            k, v, key_padding_mask = with_memory(
                self, memory, memory_mask, k, v, key_padding_mask, cache is not None
            )
            offset = offset + ops.shape(memory)[1]
        if callable(attention_bias):  # a score term that reads q and k
            attention_bias = attention_bias(q, k)
        use_is_causal = (
            causal
            and (cache is None or from_start)
            and memory is None
            and key_padding_mask is None
            and self.sliding_window is None
            and attention_bias is None
            and document_ids is None
        )
        mask, window = None, None
        if causal or (self_attention and not self.causal):  # encoders: symmetric
            window = self.sliding_window
        if not use_is_causal:
            mask = attention_mask(
                ops.shape(q)[1],
                ops.shape(k)[1],
                key_padding_mask=key_padding_mask,
                causal=causal,
                sliding_window=window,
                query_offset=offset,
                key_positions=key_positions,
                documents=document_ids,
            )
        if self.key_value_store is not None:
            shared_key_values.store(self.key_value_store, (k, v, mask, use_is_causal))
        first = cache is None or (isinstance(cache_index, int) and cache_index == 0)
        aligned = self_attention and memory is None and key_positions is None and first
        out = attend(
            self, q, k, v, mask, use_is_causal, training, attention_bias, aligned
        )
        if self.gate_dense is not None:  # [B, T, N, H]
            gate = ops.sigmoid(call_layer(self.gate_dense, query))
            out = out * ops.cast(gate, out.dtype)
        out = call_layer(self.output_dense, out)  # [B, T, D]
        return out if cache is None else (out, cache)

    @staticmethod
    def _positions(length, offset):
        """`arange(length) + offset` (`[B, T]` for a `[B]` offset); shared by the
        layers of an eager decoding step (`backend.memo`) for an int offset."""
        if row_cache.is_row_index(offset):
            return row_cache.row_positions(offset, length)
        compute = lambda: ops.arange(length) + offset  # noqa: E731
        key = ("positions", length, offset)
        return backend.memo(key, compute) if isinstance(offset, int) else compute()

    def get_config(self):
        config = super().get_config()
        config.update(
            argument_config(self, skip=("kernel_initializer",)),
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
        )
        return config
