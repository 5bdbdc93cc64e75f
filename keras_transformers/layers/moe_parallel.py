"""A dense feed-forward and routed experts side by side (Gemma 4's MoE
block), each branch normed before and after.

`NormedRouterMoE` is a `SparseMoE` whose router reads its input
RMS-normalised (no learned scale), times a learned `router_scale [D]` and
`D**-0.5`, and whose top-k weights are multiplied by a learned
`expert_scale [E]`. `DenseAndExperts` sums `norm1(dense(h))` and
`norm2'(experts(norm2(x)))`, the router reading the block's residual `x`
(`h` is `x` after the block's own pre-norm).
"""

from __future__ import annotations

import keras
from keras import ops

from keras_transformers.backend import call_layer
from keras_transformers.layers.core import RMSNormalization
from keras_transformers.layers.feed_forward import FeedForward
from keras_transformers.layers.kv_sharing import scale_free_rms
from keras_transformers.layers.moe import SparseMoE
from keras_transformers.layers.serializable import serializable


@serializable
class NormedRouterMoE(SparseMoE):
    """`SparseMoE` with a normed, scaled router input and per-expert weight
    scales (see the module docstring); same arguments plus `norm_epsilon`.

    Examples:
        >>> moe = NormedRouterMoE(num_experts=4, num_experts_per_token=2, intermediate_dim=8)
        >>> tuple(moe(keras.ops.ones((2, 5, 16))).shape)
        (2, 5, 16)
    """

    # Logical axes of each weight (see keras_transformers.distribution).
    weight_axes = {**SparseMoE.weight_axes, "router_scale": None, "expert_scale": None}

    def __init__(self, *args, norm_epsilon=1e-6, **kwargs):
        super().__init__(*args, **kwargs)
        self.norm_epsilon = norm_epsilon

    def build(self, input_shape):
        super().build(input_shape)
        ones = dict(initializer="ones", autocast=False)
        self.router_scale = self.add_weight(
            name="router_scale", shape=(input_shape[-1],), **ones
        )
        self.expert_scale = self.add_weight(
            name="expert_scale", shape=(self.num_experts,), **ones
        )

    def route(self, tokens, training=None):
        d = ops.shape(tokens)[-1]
        x = scale_free_rms(ops.cast(tokens, "float32"), self.norm_epsilon)
        x = x * ops.cast(self.router_scale, "float32") * (d**-0.5)
        logits, probs, expert_ids, weights = super().route(x, training)
        scale = ops.take(ops.cast(self.expert_scale, "float32"), expert_ids)
        return logits, probs, expert_ids, weights * scale

    def get_config(self):
        return {**super().get_config(), "norm_epsilon": self.norm_epsilon}


@serializable
class DenseAndExperts(keras.layers.Layer):
    """A dense gated feed-forward and `NormedRouterMoE` experts side by side.

    Args:
        intermediate_dim: F, the dense feed-forward's width.
        moe: the `NormedRouterMoE` (or its config).
        activation: the dense feed-forward's activation.
        norm_epsilon: epsilon of the RMSNorms.
        kernel_initializer: initializer of the dense kernels.

    Call arguments:
        x: `[B, T, D]`, the block's normed input (the dense branch's).
        residual: `[B, T, D]`, the block's input before its norm (the
            router's, and the experts' through their own pre-norm).
        padding_mask: `[B, T]`, for the router's statistics.
        training: switch of the router's losses.

    Returns:
        `[B, T, D]`: `dense_post_norm(dense(x)) +
        experts_post_norm(experts(experts_norm(residual)))`.

    Examples:
        >>> moe = NormedRouterMoE(num_experts=4, num_experts_per_token=2, intermediate_dim=8)
        >>> layer = DenseAndExperts(16, moe)
        >>> x = keras.ops.ones((2, 5, 16))
        >>> tuple(layer(x, residual=x).shape)
        (2, 5, 16)
    """

    accepts_padding_mask = True
    reads_residual = True

    def __init__(
        self,
        intermediate_dim,
        moe,
        activation="gelu_approximate",
        norm_epsilon=1e-6,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.intermediate_dim, self.activation = intermediate_dim, activation
        self.norm_epsilon = norm_epsilon
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.moe = keras.layers.deserialize(moe) if isinstance(moe, dict) else moe

    def build(self, x_shape, residual_shape=None):
        self.dense = FeedForward(
            self.intermediate_dim,
            activation=self.activation,
            gated=True,
            use_bias=False,
            kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy,
            name="dense",
        )
        self.dense.build(x_shape)
        for name in ("dense_post_norm", "experts_norm", "experts_post_norm"):
            norm = RMSNormalization(
                epsilon=self.norm_epsilon, dtype=self.dtype_policy, name=name
            )
            norm.build(x_shape)
            setattr(self, name, norm)
        if not self.moe.built:
            self.moe.build(x_shape)
        self.built = True

    def call(self, x, residual=None, padding_mask=None, training=None):
        residual = x if residual is None else residual
        dense = call_layer(self.dense_post_norm, call_layer(self.dense, x))
        experts = call_layer(
            self.moe,
            call_layer(self.experts_norm, residual),
            padding_mask=padding_mask,
            training=training,
            router_input=residual,
        )
        return dense + call_layer(self.experts_post_norm, experts)

    def compute_output_shape(self, x_shape, *args, **kwargs):
        return x_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            intermediate_dim=self.intermediate_dim,
            moe=keras.layers.serialize(self.moe),
            activation=self.activation,
            norm_epsilon=self.norm_epsilon,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
        )
        return config


__all__ = ["DenseAndExperts", "NormedRouterMoE"]
