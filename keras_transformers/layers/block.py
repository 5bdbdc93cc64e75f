"""The transformer block shared by every family."""

from __future__ import annotations

import keras
from keras import ops

from keras_transformers.backend import call_layer
from keras_transformers.layers.attention import MultiHeadAttention
from keras_transformers.layers.core import seeded_dropout
from keras_transformers.layers.feed_forward import FeedForward, make_norm
from keras_transformers.layers.per_layer_inputs import PerLayerInputGate
from keras_transformers.layers.serializable import (
    argument_config,
    serializable,
    store_arguments,
)
from keras_transformers.memory import rematerialized

NORM_POSITIONS = ("pre", "post", "sandwich", "output", "parallel")
# Arguments with their own serialisation (sub-layers, an initializer).
_OWN_SERIALISATION = ("token_mixer", "feed_forward", "kernel_initializer")


@serializable
class TransformerBlock(keras.layers.Layer):
    """Self-attention, optional cross-attention, then a feed-forward (or MoE).

    Pre-norm:  `x = x + drop(f(norm(x)))`;  post-norm: `x = norm(x + drop(f(x)))`;
    sandwich: `x = x + drop(norm'(f(norm(x))))` (Gemma 2 and 3: a second norm,
    `{part}_post_norm`, on each sub-layer's output); output:
    `x = x + drop(norm(f(x)))` (OLMo 2) for each sub-layer f in turn;
    parallel: `x = x + drop(attn(norm(x))) + drop(ff(norm'(x)))` (GPT-NeoX:
    both read the block's input). The placement of the norms is the only
    branch. With
    `layer_scale`, f's output is first multiplied by a learned per-channel
    scale (LayerScale, as DINOv2).

    Args:
        num_heads: N, query heads.
        intermediate_dim: F, feed-forward hidden size.
        num_kv_heads: K, key/value heads (GQA). Defaults to N.
        head_dim: H. Defaults to D // N.
        norm_position: "pre", "post", "sandwich", "output" or "parallel"
            (not with `cross_attention`).
        norm_type: "layer", "rms" or "layer_no_bias".
        norm_epsilon: epsilon of the norms.
        activation: feed-forward activation name.
        gated: gated (GLU) feed-forward.
        use_bias: biases in attention and feed-forward projections.
        qkv_bias: query / key / value biases; None follows `use_bias`.
        qk_norm: RMS-normalise queries and keys: True per head,
            "projection" over all heads (see `MultiHeadAttention`).
        layer_scale: LayerScale: a learned `[D]` scale per sub-layer
            (`self_attention_scale`, `cross_attention_scale`,
            `feed_forward_scale`) on its output, initialised to this value;
            None for none.
        dropout: dropout on each sub-layer output.
        attention_dropout: dropout on attention probabilities.
        causal: causal self-attention (decoders).
        cross_attention: add an encoder-decoder attention sub-layer.
        sliding_window: local attention span (causal: the most recent
            positions; not causal: `sliding_window // 2` on either side).
        rope_max_wavelength: rotary base; None for no rotary positions.
        rope_scaling_factor: rotary position interpolation.
        rope_scaling: a Hugging Face rotary scaling dict (`llama3`, `yarn`,
            `longrope`, `dynamic`; see `RotaryEmbedding`), or None.
        rotary_dim: features of each head that rotary positions rotate;
            None: all.
        attention_scale: factor on the query-key logits of both attentions;
            None is `1 / sqrt(head_dim)` (T5: 1.0).
        attention_softcap: soft-capping of the self-attention logits (see
            `MultiHeadAttention`'s `softcap`); None for none.
        attention_sinks: a learned sink logit per head in self-attention
            (see `MultiHeadAttention`'s `sinks`).
        attention_block_size: `block_size` of both attentions (memory-
            efficient attention; None: automatic, 0: never).
        attention_norm: False: no norm before the self-attention (pre-norm
            only; ModernBERT's first block, whose input is the embedding
            norm's output).
        per_layer_input_dim: P: after the feed-forward, the block adds
            `PerLayerInputGate`'s output for its per-layer input (Gemma 4's
            per-layer embeddings); None for none.
        output_scale: multiply the block's output by a constant `[1]`
            weight `output_scale` (loaded, not trained; Gemma 4's
            `layer_scalar`).
        token_mixer: a layer that replaces the self-attention (it is called
            as `MultiHeadAttention` is, and owns its cache: `init_cache`);
            None builds a `MultiHeadAttention` from the arguments above.
        feed_forward: a layer that replaces the dense feed-forward (e.g.
            `SparseMoE`); it maps `[B, T, D]` to `[B, T, D]` and may accept
            `padding_mask` and `training`.
        kernel_initializer: initializer of all kernels.

    Call arguments:
        x: `[B, T, D]`.
        padding_mask: `[B, T]` (or `[B, S_max]` with a cache), 1 for real tokens.
        encoder_outputs: `[B, S, D]` for cross-attention.
        encoder_padding_mask: `[B, S]`.
        cache: the token mixer's cache (from `init_cache`; self-attention:
            `(key, value)`, each `[B, S, K, H]`).
        cache_index: position of the first token of `x` in the cache.
        cross_cache: `(key, value)` projected encoder states, each `[B, S, K, H]`.
        attention_bias: additive self-attention logits bias broadcastable to
            `[B, N, T, S]` (see `MultiHeadAttention`; e.g. a stack's
            `RelativePositionBias`, computed once and shared by its blocks);
            cross-attention gets none.
        memory: `[B, M, D]` earlier input states of this block (Transformer-XL
            memory, without gradient): self-attention also attends to them
            (normed as `x` is, with pre-norm; see `MultiHeadAttention`).
        memory_mask: `[B, M]`, True where a memory slot is valid.
        positions: the self-attention's positions, passed on when given
            (e.g. `PatchRotaryAttention`'s `[P, 2]` patch coordinates).
        per_layer_input: `[B, T, P]` with `per_layer_input_dim`.
        shared_key_values: the stack's `SharedKeyValues`, passed on to the
            self-attention when given (KV sharing across layers).
        document_ids: `[B, T]` int, each token's document in packed rows,
            passed on to the self-attention when given.
        training: dropout switch.

    Returns:
        `[B, T, D]`, or `(output, cache)` when `cache` is given.
    """

    # Logical axes of each weight (see keras_transformers.distribution).
    weight_axes = dict.fromkeys(
        ("self_attention_scale", "cross_attention_scale", "feed_forward_scale")
        + ("output_scale",)
    )  # replicated

    def __init__(
        self,
        num_heads,
        intermediate_dim,
        num_kv_heads=None,
        head_dim=None,
        norm_position="pre",
        norm_type="layer",
        norm_epsilon=1e-5,
        activation="gelu",
        gated=False,
        use_bias=True,
        qkv_bias=None,
        qk_norm=False,
        layer_scale=None,
        dropout=0.0,
        attention_dropout=0.0,
        causal=False,
        cross_attention=False,
        sliding_window=None,
        rope_max_wavelength=None,
        rope_scaling_factor=1.0,
        rope_scaling=None,
        rotary_dim=None,
        attention_scale=None,
        attention_softcap=None,
        attention_sinks=False,
        attention_block_size=None,
        attention_norm=True,
        per_layer_input_dim=None,
        output_scale=False,
        token_mixer=None,
        feed_forward=None,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if norm_position not in NORM_POSITIONS:
            raise ValueError(
                f"`norm_position` must be one of {NORM_POSITIONS}. Received: "
                f"norm_position={norm_position!r}"
            )
        if norm_position == "parallel" and cross_attention:
            raise ValueError(
                "`norm_position='parallel'` runs self-attention and the "
                "feed-forward side by side, which leaves no place for "
                "cross-attention: use another norm_position with "
                "cross_attention=True."
            )
        if not attention_norm and norm_position != "pre":
            raise ValueError(
                "`attention_norm=False` (self-attention reads the block input as "
                "is) needs norm_position='pre'. Received: "
                f"norm_position={norm_position!r}"
            )
        store_arguments(self, locals(), skip=_OWN_SERIALISATION)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        if isinstance(feed_forward, dict):
            feed_forward = keras.layers.deserialize(feed_forward)
        if isinstance(token_mixer, dict):
            token_mixer = keras.layers.deserialize(token_mixer)
        self.feed_forward = feed_forward
        self.token_mixer = token_mixer
        if getattr(token_mixer, "float32_state", False):
            # Keras casts floating call arguments to the compute dtype; a
            # mixer's float32 recurrent state (its cache) must pass uncast
            # (the block's own LayerScale weights are cast where read).
            self.autocast = False

    def build(self, x_shape, encoder_outputs_shape=None):
        input_shape, encoder_shape = x_shape, encoder_outputs_shape
        dim = input_shape[-1]
        head_dim = self.head_dim or dim // self.num_heads
        common = dict(
            num_heads=self.num_heads,
            head_dim=head_dim,
            num_kv_heads=self.num_kv_heads,
            use_bias=self.use_bias,
            qkv_bias=self.qkv_bias,
            qk_norm=self.qk_norm,
            norm_epsilon=self.norm_epsilon,
            dropout=self.attention_dropout,
            attention_scale=self.attention_scale,
            block_size=self.attention_block_size,
            kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy,
        )
        norm = lambda name: make_norm(
            self.norm_type, self.norm_epsilon, self.dtype_policy, name
        )  # noqa: E731
        self.self_attention = self.token_mixer or MultiHeadAttention(
            causal=self.causal,
            sliding_window=self.sliding_window,
            rope_max_wavelength=self.rope_max_wavelength,
            rope_scaling_factor=self.rope_scaling_factor,
            rope_scaling=self.rope_scaling,
            rotary_dim=self.rotary_dim,
            softcap=self.attention_softcap,
            sinks=self.attention_sinks,
            name="self_attention",
            **common,
        )
        if not self.self_attention.built:
            self.self_attention.build(input_shape)
        self.self_attention_norm = None
        if self.attention_norm:
            self.self_attention_norm = norm("self_attention_norm")
            self.self_attention_norm.build(input_shape)
        if self.cross_attention:
            self.cross_attention_layer = MultiHeadAttention(
                name="cross_attention", **common
            )
            self.cross_attention_layer.build(input_shape, encoder_shape or input_shape)
            self.cross_attention_norm = norm("cross_attention_norm")
            self.cross_attention_norm.build(input_shape)
        if self.feed_forward is None:
            self.feed_forward = FeedForward(
                self.intermediate_dim,
                activation=self.activation,
                gated=self.gated,
                use_bias=self.use_bias,
                kernel_initializer=self.kernel_initializer,
                dtype=self.dtype_policy,
                name="feed_forward",
            )
        if not self.feed_forward.built:
            self.feed_forward.build(input_shape)
        self.feed_forward_norm = norm("feed_forward_norm")
        self.feed_forward_norm.build(input_shape)
        self.dropout_layer = seeded_dropout(self.dropout, dtype=self.dtype_policy)
        self.per_layer_gate = self.output_scale_weight = None
        if self.per_layer_input_dim:
            self.per_layer_gate = PerLayerInputGate(
                self.per_layer_input_dim,
                activation=self.activation,
                norm_epsilon=self.norm_epsilon,
                kernel_initializer=self.kernel_initializer,
                dtype=self.dtype_policy,
                name="per_layer_gate",
            )
            self.per_layer_gate.build(input_shape)
        if self.output_scale:
            self.output_scale_weight = self.add_weight(
                name="output_scale", shape=(1,), initializer="ones", trainable=False
            )
        parts = ["self_attention", "feed_forward"]
        parts += ["cross_attention"] if self.cross_attention else []
        for part in parts:  # `{part}_post_norm`, LayerScale's `{part}_scale`
            post = None
            if self.norm_position == "sandwich":
                post = norm(part + "_post_norm")
                post.build(input_shape)
            setattr(self, part + "_post_norm", post)
            scale = None
            if self.layer_scale is not None:
                scale = self.add_weight(
                    name=part + "_scale",
                    shape=(dim,),
                    initializer=keras.initializers.Constant(self.layer_scale),
                )
            setattr(self, part + "_scale", scale)
        self.built = True

    def _branch(self, x, part, sublayer, training):
        """What sub-layer `part` ("self_attention", "cross_attention" or
        "feed_forward") adds to the residual stream `x` `[B, T, D]`: the
        sub-layer on `x`, normed before and/or after as `norm_position`
        says ("post": neither, see `_residual`), scaled (LayerScale),
        dropped out."""
        norm = getattr(self, part + "_norm")
        before, after = norm, getattr(self, part + "_post_norm")
        if self.norm_position in ("post", "output"):
            before, after = None, (norm if self.norm_position == "output" else None)
        h = sublayer(x if before is None else call_layer(before, x))
        if after is not None:
            h = call_layer(after, h)
        scale = getattr(self, part + "_scale")
        if scale is not None:
            h = h * ops.cast(scale, x.dtype)
        return self._dropout(h, training)

    def _residual(self, x, part, sublayer, training):
        """`x` after residual sub-layer `part` (see `_branch`)."""
        x = x + self._branch(x, part, sublayer, training)
        if self.norm_position == "post":
            return call_layer(getattr(self, part + "_norm"), x)
        return x

    def init_cache(self, batch_size, max_length, dtype):
        """The token mixer's zero cache for decoding up to `max_length`
        positions (self-attention: a `(key, value)` pair; a sliding window's
        holds only the window, see `MultiHeadAttention.init_cache`)."""
        return self.self_attention.init_cache(batch_size, max_length, dtype)

    def _dropout(self, x, training):
        if not training or self.dropout == 0:
            return x
        return self.dropout_layer(x, training=training)

    def rematerialized_call(self, layer_call, *args, **kwargs):
        """Under a `keras.RematScope` that selects this block (the config's
        `remat`), the whole block is one rematerialised unit (see
        `keras_transformers.memory.rematerialized`); cached decoding, which
        needs no gradients, runs as usual."""
        call = super().rematerialized_call(layer_call, *args, **kwargs)
        if call is layer_call or kwargs.get("cache") is not None:
            return layer_call
        return rematerialized(self, layer_call)

    def call(
        self,
        x,
        padding_mask=None,
        encoder_outputs=None,
        encoder_padding_mask=None,
        cache=None,
        cache_index=None,
        cross_cache=None,
        attention_bias=None,
        training=None,
        memory=None,
        memory_mask=None,
        positions=None,
        per_layer_input=None,
        shared_key_values=None,
        document_ids=None,
    ):
        new_cache = []
        given = {} if positions is None else {"positions": positions}
        if shared_key_values is not None:
            given["shared_key_values"] = shared_key_values
        if document_ids is not None:  # packed rows
            given["document_ids"] = document_ids
        pre = self.norm_position not in ("post", "output")
        if memory is not None and pre and self.self_attention_norm is not None:
            memory = call_layer(self.self_attention_norm, memory)

        def attend(h):
            out = call_layer(
                self.self_attention,
                h,
                key_padding_mask=padding_mask,
                cache=cache,
                cache_index=cache_index,
                attention_bias=attention_bias,
                training=training,
                memory=memory,
                memory_mask=memory_mask,
                **given,
            )
            if cache is None:
                return out
            new_cache.append(out[1])
            return out[0]

        ff_kwargs = {"training": training}
        if getattr(self.feed_forward, "accepts_padding_mask", False):
            ff_kwargs["padding_mask"] = padding_mask

        def feed_forward(h):
            return call_layer(self.feed_forward, h, **ff_kwargs)

        if self.norm_position == "parallel":  # both sub-layers read x
            attended = self._branch(x, "self_attention", attend, training)
            x = x + attended + self._branch(x, "feed_forward", feed_forward, training)
            return x if cache is None else (x, new_cache[0])
        x = self._residual(x, "self_attention", attend, training)
        if self.cross_attention:

            def cross(h):
                out = call_layer(
                    self.cross_attention_layer,
                    h,
                    key_value=encoder_outputs,
                    key_padding_mask=encoder_padding_mask,
                    cache=cross_cache,
                    training=training,
                )
                return out if cross_cache is None else out[0]

            x = self._residual(x, "cross_attention", cross, training)
        if getattr(self.feed_forward, "reads_residual", False):
            ff_kwargs["residual"] = x  # the sub-layer's input before its norm
        x = self._residual(x, "feed_forward", feed_forward, training)
        if self.per_layer_gate is not None:
            x = x + call_layer(self.per_layer_gate, x, per_layer_input)
        if self.output_scale_weight is not None:
            x = x * ops.cast(self.output_scale_weight, x.dtype)
        return x if cache is None else (x, new_cache[0])

    def compute_output_shape(self, x_shape, *args, **kwargs):
        return x_shape

    def get_config(self):
        config = super().get_config()
        custom_ff = self.feed_forward is not None and not (
            isinstance(self.feed_forward, FeedForward)
            and self.feed_forward.name == "feed_forward"
        )
        config.update(
            argument_config(self, skip=_OWN_SERIALISATION),
            token_mixer=keras.layers.serialize(self.token_mixer)
            if self.token_mixer is not None
            else None,
            feed_forward=keras.layers.serialize(self.feed_forward)
            if custom_ff
            else None,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
        )
        return config
