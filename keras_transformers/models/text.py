"""Token-input backbones share their embedding stage: token embedding
(optionally scaled), positions (learned, sinusoidal, rotary-in-attention or
none), segments, an optional norm and dropout."""

from __future__ import annotations

import math

import keras

from keras_transformers.backend import call_layer
from keras_transformers.layers import (
    PositionEmbedding,
    SinusoidalPositionEncoding,
    TokenEmbedding,
    make_norm,
)
from keras_transformers.models.base import ConfiguredModel, initializer


class TextBackbone(ConfiguredModel):
    """Base of backbones that read token ids (GPT, BERT, seq2seq).

    `_build_embeddings()` creates `token_embedding`, `position_embedding`,
    `segment_embedding`, `embedding_norm` and `embedding_dropout` from the
    config; `embed()` applies them; `logits()` is the (tied or untied) LM head.
    """

    def _build_embeddings(self):
        c, d, dtype = self.config, self.config.hidden_dim, self.dtype_policy
        self.token_embedding = TokenEmbedding(
            c.vocabulary_size,
            d,
            tie_weights=c.tie_embeddings,
            scale=math.sqrt(d) if c.scale_embeddings else 1.0,
            embeddings_initializer=initializer(c),
            dtype=dtype,
            name="token_embedding",
        )
        self.token_embedding.build((None, None))
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
                dtype=dtype, name="position_embedding"
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
        self.embedding_dropout = keras.layers.Dropout(c.dropout, dtype=dtype)

    def _norm(self, name):
        """A built norm of the config's type over `hidden_dim` features."""
        c = self.config
        norm = make_norm(c.norm_type, c.norm_epsilon, self.dtype_policy, name)
        norm.build((None, None, c.hidden_dim))
        return norm

    def embed(self, token_ids, segment_ids=None, start_index=0, training=None):
        """`[B, T]` ids (and segment ids) -> `[B, T, D]` input states."""
        x = call_layer(self.token_embedding, token_ids)
        if self.position_embedding is not None:
            x = x + call_layer(self.position_embedding, x, start_index=start_index)
        if self.segment_embedding is not None:
            if segment_ids is None:
                segment_ids = keras.ops.zeros_like(token_ids)
            x = x + self.segment_embedding(segment_ids)
        if self.embedding_norm is not None:
            x = call_layer(self.embedding_norm, x)
        if training and self.config.dropout > 0:
            x = self.embedding_dropout(x, training=training)
        return x

    def logits(self, hidden):
        """Projects hidden states `[B, T, D]` to logits `[B, T, V]`."""
        return call_layer(self.token_embedding, hidden, reverse=True)
