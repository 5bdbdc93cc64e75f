"""Token embeddings that double as the (tied) output projection."""

from __future__ import annotations

import keras
from keras import ops

from keras_transformers.layers.serializable import serializable


@serializable
class TokenEmbedding(keras.layers.ReversibleEmbedding):
    """Token embedding whose reverse call is the LM head.

    `layer(ids)` embeds `[B, T]` ids to `[B, T, D]`; `layer(hidden, reverse=True)`
    projects `[B, T, D]` to `[B, T, V]` logits, with the transposed embedding
    matrix when `tie_weights=True` (GPT-2, BERT, the 2017 paper) or with a
    separate `reverse_embeddings` matrix `[D, V]` otherwise (Llama).

    Args:
        input_dim: V, vocabulary size.
        output_dim: D, embedding width.
        tie_weights: share the input and output matrices. Defaults to True.
        scale: multiply embeddings by this factor (sqrt(D) in the 2017 paper).
        embeddings_initializer: initializer of the matrices.

    Example:
    >>> emb = TokenEmbedding(100, 16)
    >>> tuple(emb(emb(keras.ops.ones((2, 3), "int32")), reverse=True).shape)
    (2, 3, 100)
    """

    def __init__(self, input_dim, output_dim, tie_weights=True, scale=1.0, **kwargs):
        super().__init__(input_dim, output_dim, tie_weights=tie_weights, **kwargs)
        self.scale = scale

    def call(self, inputs, reverse=False):
        out = super().call(inputs, reverse=reverse)
        if not reverse and self.scale != 1.0:
            out = out * ops.cast(self.scale, out.dtype)
        return out

    def get_config(self):
        config = super().get_config()
        config["scale"] = self.scale
        return config
