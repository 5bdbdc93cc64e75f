"""Token-input backbones share their embedding stage: token embedding
(optionally scaled), positions (learned, sinusoidal, rotary-in-attention or
none), segments, an optional norm and dropout."""

from __future__ import annotations

import math

import keras

from keras_transformers.backend import call_layer
from keras_transformers.config.validation import check_dtype
from keras_transformers.layers import (
    PositionEmbedding,
    SinusoidalPositionEncoding,
    TokenEmbedding,
    make_norm,
)
from keras_transformers.layers.core import Dense, seeded_dropout
from keras_transformers.layers.kv_sharing import SharedKeyValues
from keras_transformers.layers.per_layer_inputs import PerLayerInputs
from keras_transformers.models.base import (
    ConfiguredModel,
    initializer,
    make_blocks,
    resolve_config,
    token_initializer,
)


class TextBackbone(ConfiguredModel):
    """Base of backbones that read token ids (GPT, BERT, seq2seq).

    `__init__` validates the config (`stacks` must equal the class's
    `stacks`) and creates the embeddings (`token_embedding`,
    `position_embedding`, `segment_embedding`, `embedding_norm`,
    `embedding_dropout`), the `blocks` (causal when `causal`) and
    `final_norm`; subclasses add their own layers in `_build_extras()`.
    `embed()` applies the embeddings; `logits()` is the (tied or untied) LM head.
    """

    # Logical axes of each weight (see keras_transformers.distribution).
    weight_axes = {
        "logits_bias": ("vocab",),
        "segment_embedding/embeddings": None,
        "embedding_projection/kernel": None,
        "embedding_projection/bias": None,
    }

    stacks = "decoder"
    causal = True

    def __init__(self, config=None, *, dtype=None, name=None, **fields):
        config = resolve_config(config, fields)
        if config.stacks != self.stacks:
            raise ValueError(
                f"{type(self).__name__} needs stacks={self.stacks!r}. "
                f"Received: stacks={config.stacks!r}"
            )
        super().__init__(dtype=check_dtype(dtype), name=name)
        self.config = config
        self._build_embeddings()
        self.blocks = make_blocks(
            config, config.num_layers, "block", self.dtype_policy, causal=self.causal
        )
        self.final_norm = self._norm("final_norm") if config.final_norm else None
        self._build_extras()
        self.built = True

    def _build_extras(self):
        """Hook for layers beyond the shared ones (e.g. BERT's pooler)."""

    def layer_extras(self, token_ids, x) -> dict:
        """The blocks' extra call arguments for ids `[B, T]` embedded as
        `x [B, T, D]`: `per_layer_inputs` `[B, T, L, P]` (per-layer input
        embeddings) and a fresh `SharedKeyValues` (KV sharing), where the
        config has them."""
        extra = {}
        if self.per_layer_inputs is not None:
            layer = self.per_layer_inputs
            extra["per_layer_inputs"] = call_layer(layer, token_ids, x)
        if self.config.num_kv_shared_layers:
            extra["shared_key_values"] = SharedKeyValues()
        return extra

    def _build_embeddings(self):
        c, dtype = self.config, self.dtype_policy
        d = c.embedding_dim or c.hidden_dim  # factorised embeddings: narrower
        self.token_embedding = TokenEmbedding(
            c.vocabulary_size,
            d,
            tie_weights=c.tie_embeddings,
            scale=math.sqrt(d) if c.scale_embeddings else 1.0,
            embeddings_initializer=token_initializer(c),
            dtype=dtype,
            name="token_embedding",
        )
        self.token_embedding.build((None, None))
        self.logits_bias = None
        if c.logits_bias:
            self.logits_bias = self.add_weight(
                name="logits_bias", shape=(c.vocabulary_size,), initializer="zeros"
            )
        self.position_embedding = None
        if c.position_embedding == "learned":
            self.position_embedding = PositionEmbedding(
                c.max_sequence_length,
                initializer(c),
                dtype=dtype,
                name="position_embedding",
            )
            self.position_embedding.build((None, None, d))
        elif c.position_embedding == "sinusoidal":
            self.position_embedding = SinusoidalPositionEncoding(
                interleave=c.sinusoidal_interleave,
                dtype=dtype,
                name="position_embedding",
            )
        self.segment_embedding = None
        if c.num_segments:
            self.segment_embedding = keras.layers.Embedding(
                c.num_segments,
                d,
                embeddings_initializer=initializer(c),
                dtype=dtype,
                name="segment_embedding",
            )
            self.segment_embedding.build((None, None))
        self.embedding_norm = None
        if c.embedding_norm:
            self.embedding_norm = make_norm(
                c.norm_type, c.norm_epsilon, dtype, "embedding_norm"
            )
            self.embedding_norm.build((None, None, d))
        self.embedding_dropout = seeded_dropout(c.dropout, dtype=dtype)
        self.per_layer_inputs = None
        if c.per_layer_input_dim:
            self.per_layer_inputs = PerLayerInputs(
                c.per_layer_vocabulary_size or c.vocabulary_size,
                c.num_layers,
                c.per_layer_input_dim,
                norm_epsilon=c.norm_epsilon,
                embeddings_initializer=initializer(c),
                dtype=dtype,
                name="per_layer_inputs",
            )
            self.per_layer_inputs.build((None, None), (None, None, d))
        self.embedding_projection = None  # `embedding_dim` -> `hidden_dim`
        if c.embedding_dim is not None:
            self.embedding_projection = Dense(
                c.hidden_dim,
                kernel_initializer=initializer(c),
                dtype=dtype,
                name="embedding_projection",
            )
            self.embedding_projection.build((None, None, d))

    def embed(
        self,
        token_ids,
        segment_ids=None,
        start_index=0,
        training=None,
        norm=None,
        positions=None,
        padding_mask=None,
        token_positions=None,
    ):
        """`[B, T]` ids (and segment ids) -> `[B, T, D]` input states (embedded
        `embedding_dim` wide, then projected, with factorised embeddings).
        `norm` replaces `embedding_norm` (the seq2seq decoder has its own),
        `positions` replaces `position_embedding` (a seq2seq decoder's own
        table, `separate_decoder_positions`); `padding_mask` `[B, T]` counts
        the real tokens for `token_dropout_mask_id`; `token_positions`
        `[B, T]` gives each token's position (packed rows) instead of
        `start_index + arange(T)`."""
        x = call_layer(self.token_embedding, token_ids)
        mask_id = self.config.token_dropout_mask_id
        if mask_id is not None:
            x = token_dropout(x, token_ids, padding_mask, mask_id)
        positions = positions or self.position_embedding
        if positions is not None:
            given = {} if token_positions is None else {"positions": token_positions}
            x = x + call_layer(positions, x, start_index=start_index, **given)
        if self.segment_embedding is not None:
            if segment_ids is None:
                segment_ids = keras.ops.zeros_like(token_ids)
            x = x + self.segment_embedding(segment_ids)
        norm = norm or self.embedding_norm
        if norm is not None:
            x = call_layer(norm, x)
        if training and self.config.dropout > 0:
            x = self.embedding_dropout(x, training=training)
        if self.embedding_projection is not None:  # [B, T, E] -> [B, T, D]
            x = self.embedding_projection(x)
        return x

    def logits(self, hidden, vocabulary_first=False):
        """Projects hidden states `[B, T, D]` to logits `[B, T, V]` (first
        scaled by `hidden_dim**-0.5` with `scale_logits`; soft-capped to
        `logit_softcap * tanh(logits / logit_softcap)` with `logit_softcap`).
        With `vocabulary_first`, `hidden [N, D]` gives the transposed logits
        `[V, N]` (`TokenEmbedding.reverse_columns`: a greedy step of a few
        rows takes their argmax over axis 0)."""
        if self.config.scale_logits:
            hidden = hidden * self.config.hidden_dim**-0.5
        if vocabulary_first:
            logits = self.token_embedding.reverse_columns(hidden)  # [V, N]
        else:
            logits = call_layer(self.token_embedding, hidden, reverse=True)
        if self.logits_bias is not None:
            bias = keras.ops.cast(self.logits_bias, logits.dtype)
            logits = logits + (bias[:, None] if vocabulary_first else bias)
        cap = self.config.logit_softcap
        if cap is not None:
            logits = keras.ops.tanh(logits / cap) * cap
        return logits


# The fraction of tokens ESM masked in training (15%, 80% of them as <mask>).
ESM_MASK_RATIO = 0.15 * 0.8


def token_dropout(x, token_ids, padding_mask, mask_id: int):
    """ESM's token dropout at inference: embeddings `x` `[B, T, E]` of the
    `mask_id` tokens zeroed, all of a sequence scaled by `(1 - 0.12) / (1 -
    r)`, r its masked tokens over its real ones (`padding_mask` `[B, T]`,
    None: all real), as if the masks were input dropout.

    Examples:
        >>> x = keras.ops.ones((1, 4, 2))
        >>> out = token_dropout(x, np.array([[5, 9, 5, 5]]), None, mask_id=9)
        >>> [round(float(v), 4) for v in keras.ops.convert_to_numpy(out)[0, :, 0]]
        [1.1733, 0.0, 1.1733, 1.1733]
    """
    ops = keras.ops
    masked = ops.equal(token_ids, mask_id)  # [B, T]
    if padding_mask is None:
        real = ops.cast(ops.shape(token_ids)[1], "float32")
    else:
        real = ops.sum(ops.cast(padding_mask, "float32"), axis=-1)  # [B]
    ratio = ops.sum(ops.cast(masked, "float32"), axis=-1) / real  # [B]
    x = ops.where(masked[:, :, None], ops.zeros_like(x), x)
    scale = ops.cast(1.0 - ratio, x.dtype)[:, None, None]
    return x * ops.cast(1.0 - ESM_MASK_RATIO, x.dtype) / scale
