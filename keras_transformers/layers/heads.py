"""Task heads shared by the families."""

from __future__ import annotations

import keras
from keras import ops

from keras_transformers.layers.core import Dense
from keras_transformers.layers.feed_forward import activation_fn, make_norm
from keras_transformers.layers.serializable import serializable


@serializable
class MaskedLMHead(keras.layers.Layer):
    """BERT's masked-LM head: dense -> activation -> norm -> tied projection.

    Gathers the hidden states at `mask_positions` first, so the vocabulary
    projection costs `P` rows per sequence, not `T`.

    Args:
        vocabulary_size: V.
        activation: activation name of the transform ("gelu" for BERT).
        norm_type: "layer", "rms" or "layer_no_bias".
        norm_epsilon: epsilon of the norm.
        kernel_initializer: initializer of the transform kernel.
        embedding_dim: the transform's output width E, the token
            embedding's (factorised embeddings: ALBERT, ELECTRA's
            generator); None = the hidden width D.
        transform_bias: a bias on the transform (ModernBERT's head has
            none: `classifier_bias=False`).

    Call arguments:
        hidden: `[B, T, D]` final hidden states.
        mask_positions: `[B, P]` int positions to predict.
        token_embedding: the backbone's `TokenEmbedding`, whose reverse call
            is the output projection (weight tying).

    Returns:
        `[B, P, V]` logits.

    Examples:
        >>> head = MaskedLMHead(100, embedding_dim=8)
        >>> embedding = keras_transformers.layers.TokenEmbedding(100, 8)
        >>> embedding.build((None, None))
        >>> hidden, positions = keras.ops.ones((2, 5, 16)), np.zeros((2, 3), "int32")
        >>> tuple(head(hidden, positions, token_embedding=embedding).shape)
        (2, 3, 100)
    """

    # Logical axes of each weight (see keras_transformers.distribution).
    weight_axes = {"bias": ("vocab",), "transform/kernel": None, "transform/bias": None}

    def __init__(
        self,
        vocabulary_size,
        activation="gelu",
        norm_type="layer",
        norm_epsilon=1e-12,
        kernel_initializer="glorot_uniform",
        embedding_dim=None,
        transform_bias=True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.transform_bias = transform_bias
        self.vocabulary_size = vocabulary_size
        self.activation = activation
        self.norm_type = norm_type
        self.norm_epsilon = norm_epsilon
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.embedding_dim = embedding_dim

    def build(self, hidden_shape, mask_positions_shape=None):
        dim = self.embedding_dim or hidden_shape[-1]
        self.transform = Dense(
            dim,
            use_bias=self.transform_bias,
            kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy,
            name="transform",
        )
        self.transform.build((None, None, hidden_shape[-1]))
        self.norm = make_norm(
            self.norm_type, self.norm_epsilon, self.dtype_policy, "norm"
        )
        self.norm.build((None, None, dim))
        self.bias = self.add_weight(
            name="bias", shape=(self.vocabulary_size,), initializer="zeros"
        )
        self.built = True

    def call(self, hidden, mask_positions, token_embedding):
        positions = ops.cast(mask_positions, "int32")[:, :, None]  # [B, P, 1]
        positions = ops.repeat(positions, hidden.shape[-1], axis=-1)  # [B, P, D]
        gathered = ops.take_along_axis(hidden, positions, axis=1)  # [B, P, D]
        # [B, P, E]
        h = self.norm(activation_fn(self.activation)(self.transform(gathered)))
        logits = token_embedding(h, reverse=True)  # [B, P, V]
        return logits + ops.cast(self.bias, logits.dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            vocabulary_size=self.vocabulary_size,
            activation=self.activation,
            norm_type=self.norm_type,
            norm_epsilon=self.norm_epsilon,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            embedding_dim=self.embedding_dim,
            transform_bias=self.transform_bias,
        )
        return config
