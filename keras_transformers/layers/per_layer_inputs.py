"""Per-layer input embeddings (Gemma 4's PLE): each block of a stack gets
an input vector of its own, gated into its residual stream.

`PerLayerInputs` (once per stack) maps token ids and the input states to
`[B, T, L, P]`: a token table `[V', L * P]` (scaled by `sqrt(P)`) plus a
projection of the input states (`[D, L * P]`, scaled by `D**-0.5`, RMS-normed
over P), their sum times `2**-0.5`. `PerLayerInputGate` (one per block)
adds `norm(project(act(gate(x)) * input))` to the block's output.
"""

from __future__ import annotations

import math

import keras
from keras import ops

from keras_transformers.backend import call_layer
from keras_transformers.layers.core import Dense, RMSNormalization
from keras_transformers.layers.feed_forward import activation_fn
from keras_transformers.layers.serializable import (
    argument_config,
    serializable,
    store_arguments,
)


@serializable
class PerLayerInputs(keras.layers.Layer):
    """The per-layer inputs `[B, T, L, P]` of a stack of L blocks.

    Args:
        vocabulary_size: V', rows of the per-layer token table.
        num_layers: L.
        dim: P, each layer's input width.
        norm_epsilon: epsilon of the RMSNorm over P.
        embeddings_initializer: initializer of the token table and projection.

    Call arguments:
        token_ids: `[B, T]` ints.
        x: `[B, T, D]` input states (the scaled token embeddings).

    Returns:
        `[B, T, L, P]`.

    Examples:
        >>> layer = PerLayerInputs(100, num_layers=2, dim=4)
        >>> ids = keras.ops.ones((1, 3), "int32")
        >>> tuple(layer(ids, keras.ops.ones((1, 3, 8))).shape)
        (1, 3, 2, 4)
    """

    # Logical axes of each weight (see keras_transformers.distribution).
    weight_axes = {"embedding/embeddings": ("vocab", None), "projection/kernel": None}

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        dim,
        norm_epsilon=1e-6,
        embeddings_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        store_arguments(self, locals(), skip=("embeddings_initializer",))
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)

    def build(self, token_ids_shape=None, x_shape=None):
        width = self.num_layers * self.dim
        self.embedding = keras.layers.Embedding(
            self.vocabulary_size,
            width,
            embeddings_initializer=self.embeddings_initializer,
            dtype=self.dtype_policy,
            name="embedding",
        )
        self.embedding.build((None, None))
        self.projection = Dense(
            width,
            use_bias=False,
            kernel_initializer=self.embeddings_initializer,
            dtype=self.dtype_policy,
            name="projection",
        )
        self.projection.build((None, None, (x_shape or (None,))[-1]))
        self.norm = RMSNormalization(
            epsilon=self.norm_epsilon, dtype=self.dtype_policy, name="norm"
        )
        self.norm.build((None, None, None, self.dim))
        self.built = True

    def call(self, token_ids, x):
        shape = (ops.shape(token_ids)[0], ops.shape(token_ids)[1])
        split = (*shape, self.num_layers, self.dim)  # [B, T, L, P]
        tokens = call_layer(self.embedding, token_ids) * math.sqrt(self.dim)
        projected = call_layer(self.projection, x) * (ops.shape(x)[-1] ** -0.5)
        projected = call_layer(self.norm, ops.reshape(projected, split))
        return (projected + ops.reshape(tokens, split)) * (2.0**-0.5)

    def get_config(self):
        config = super().get_config()
        config.update(
            argument_config(self, skip=("embeddings_initializer",)),
            embeddings_initializer=keras.initializers.serialize(
                self.embeddings_initializer
            ),
        )
        return config


@serializable
class PerLayerInputGate(keras.layers.Layer):
    """What a block adds for its per-layer input: `norm(project(act(gate(x))
    * input))`, gate `[D, P]`, projection `[P, D]`, an RMSNorm over D.

    Args:
        dim: P, the per-layer input width.
        activation: the gate's activation (the feed-forward's).
        norm_epsilon: epsilon of the norm.
        kernel_initializer: initializer of the kernels.

    Call arguments:
        x: `[B, T, D]` the block's output so far.
        per_layer_input: `[B, T, P]`.

    Returns:
        `[B, T, D]`, added to `x` by the block.

    Examples:
        >>> gate = PerLayerInputGate(4)
        >>> tuple(gate(keras.ops.ones((1, 3, 8)), keras.ops.ones((1, 3, 4))).shape)
        (1, 3, 8)
    """

    # Logical axes of each weight (see keras_transformers.distribution).
    weight_axes = {"input_gate/kernel": None, "projection/kernel": None}

    def __init__(
        self,
        dim,
        activation="gelu_approximate",
        norm_epsilon=1e-6,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        store_arguments(self, locals(), skip=("kernel_initializer",))
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

    def build(self, x_shape, per_layer_input_shape=None):
        d = x_shape[-1]
        dense = lambda units, name: Dense(  # noqa: E731
            units,
            use_bias=False,
            kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy,
            name=name,
        )
        self.gate = dense(self.dim, "input_gate")
        self.gate.build((None, None, d))
        self.projection = dense(d, "projection")
        self.projection.build((None, None, self.dim))
        self.norm = RMSNormalization(
            epsilon=self.norm_epsilon, dtype=self.dtype_policy, name="norm"
        )
        self.norm.build((None, None, d))
        self.built = True

    def call(self, x, per_layer_input):
        h = activation_fn(self.activation)(call_layer(self.gate, x))  # [B, T, P]
        h = call_layer(self.projection, h * ops.cast(per_layer_input, h.dtype))
        return call_layer(self.norm, h)

    def get_config(self):
        config = super().get_config()
        config.update(
            argument_config(self, skip=("kernel_initializer",)),
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
        )
        return config


__all__ = ["PerLayerInputGate", "PerLayerInputs"]
