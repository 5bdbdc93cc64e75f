"""Position-wise feed-forward networks: plain and gated (GLU, e.g. SwiGLU)."""

from __future__ import annotations

import keras
from keras import ops

from keras_transformers.backend import call_layer
from keras_transformers.backend.choices import exact_gelu
from keras_transformers.layers.core import (
    Dense,
    LayerNormalization,
    RMSNormalization,
    seeded_dropout,
)
from keras_transformers.layers.gated_activation import gated_projection, gated_unit
from keras_transformers.layers.serializable import serializable

_ACTIVATIONS = {
    "gelu": exact_gelu,
    "gelu_approximate": lambda x: keras.activations.gelu(x, approximate=True),
    "relu": keras.activations.relu,
    "silu": keras.activations.silu,
    "quick_gelu": lambda x: x * keras.ops.sigmoid(1.702 * x),
}


def activation_fn(name: str):
    """Returns the activation function for a config name (see ACTIVATIONS)."""
    if name not in _ACTIVATIONS:
        raise ValueError(
            f"Unknown activation {name!r}. Expected one of {sorted(_ACTIVATIONS)}."
        )
    return _ACTIVATIONS[name]


@serializable
class FeedForward(keras.layers.Layer):
    """Two-layer feed-forward network, optionally gated.

    plain: `out(act(inner(x)))`; gated: `out(act(gate(x)) * inner(x))`
    (SwiGLU with `activation="silu"`).

    Args:
        intermediate_dim: F, the hidden size.
        activation: "gelu", "gelu_approximate", "relu", "silu" or
            "quick_gelu" (`x * sigmoid(1.702 x)`).
        gated: use a gated linear unit. Defaults to False.
        use_bias: biases on the projections. Defaults to True.
        dropout: dropout on the hidden activations (0 by default).
        kernel_initializer: initializer of the kernels.

    Call arguments:
        x: `[B, T, D]`.

    Returns:
        `[B, T, D]`.
    """

    # Logical axes of each weight (see keras_transformers.distribution).
    weight_axes = {
        "intermediate/kernel": ("embed", "mlp"),
        "intermediate/bias": ("mlp",),
        "gate/kernel": ("embed", "mlp"),
        "gate/bias": ("mlp",),
        "output/kernel": ("mlp", "embed"),
        "output/bias": None,
    }

    def __init__(
        self,
        intermediate_dim,
        activation="gelu",
        gated=False,
        use_bias=True,
        dropout=0.0,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.intermediate_dim = intermediate_dim
        self.activation = activation
        self.activation_fn = activation_fn(activation)
        self.gated = gated
        # `act(gate) * up` with a backward pass that keeps only gate and up
        self._gated_unit = self._gated_projection = None
        if gated:
            self._gated_unit = gated_unit(activation, self.activation_fn)
            self._gated_projection = gated_projection(activation, self.activation_fn)
        self.use_bias = use_bias
        self.dropout = dropout
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.dropout_layer = seeded_dropout(dropout, dtype=self.dtype_policy)

    def _dense(self, units, name):
        return Dense(
            units,
            use_bias=self.use_bias,
            kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy,
            name=name,
        )

    def build(self, input_shape):
        dim = input_shape[-1]
        self.inner_dense = self._dense(self.intermediate_dim, "intermediate")
        self.inner_dense.build(input_shape)
        self.gate_dense = None
        if self.gated:
            self.gate_dense = self._dense(self.intermediate_dim, "gate")
            self.gate_dense.build(input_shape)
        self.output_dense = self._dense(dim, "output")
        self.output_dense.build((*input_shape[:-1], self.intermediate_dim))
        self.built = True

    def call(self, x, training=None):
        hidden = call_layer(self.inner_dense, x)  # [B, T, F]
        if self.gated:
            gate = call_layer(self.gate_dense, x)
            if training and self._projects_gated():
                # the unit and the output product at once, keeping only
                # gate and up (the product's input is computed again)
                out = self.output_dense
                kernel = ops.cast(out._kernel, out.compute_dtype)
                bias = None if out.bias is None else ops.cast(out.bias, kernel.dtype)
                return self._gated_projection(gate, hidden, kernel, bias)
            if training:  # the same product, keeping only gate and up
                hidden = self._gated_unit(gate, hidden)
            else:
                hidden = self.activation_fn(gate) * hidden
        else:
            hidden = self.activation_fn(hidden)
        if training and self.dropout > 0:
            hidden = self.dropout_layer(hidden, training=training)
        return call_layer(self.output_dense, hidden)

    def _projects_gated(self):
        """Whether a training call may fuse the gated unit with the output
        projection: a plain output `Dense` (not quantized, no LoRA, no
        activation) and no dropout between them."""
        out = self.output_dense
        return (
            self.dropout == 0
            and out.quantization_mode is None
            and not out.lora_enabled
            and out.activation in (None, keras.activations.linear)
        )

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            intermediate_dim=self.intermediate_dim,
            activation=self.activation,
            gated=self.gated,
            use_bias=self.use_bias,
            dropout=self.dropout,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
        )
        return config


def make_norm(norm_type: str, epsilon: float, dtype=None, name=None):
    """A LayerNorm (`"layer"`), one without bias (`"layer_no_bias"`) or an
    RMSNorm (`"rms"`); all compute in float32."""
    if norm_type == "rms":
        return RMSNormalization(epsilon=epsilon, dtype=dtype, name=name)
    if norm_type in ("layer", "layer_no_bias"):
        center = norm_type == "layer"
        return LayerNormalization(
            epsilon=epsilon, center=center, dtype=dtype, name=name
        )
    raise ValueError(
        f"Unknown norm_type {norm_type!r}. Expected 'layer', 'rms' or 'layer_no_bias'."
    )
