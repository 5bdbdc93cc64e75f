"""From the config to each layer's block: `block_spec(config, i)` is the one
place that decides what block `i` of a stack is.

A spec is a frozen `BlockSpec`: the layer's type (see
`keras_transformers.config.layer_types`), the keyword arguments of its
`TransformerBlock` (the per-layer attention settings resolved: window,
rotary base and scaling) and whether its feed-forward is the config's
sparse MoE. `make_blocks` builds a stack from the specs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from types import MappingProxyType

import keras

from keras_transformers.config import TransformerConfig
from keras_transformers.config.layer_types import (
    kv_sharing,
    layer_settings,
    layer_type,
    typed,
)
from keras_transformers.layers import MultiHeadAttention, SparseMoE, TransformerBlock
from keras_transformers.layers.gated_deltanet import GatedDeltaNet
from keras_transformers.layers.moe_parallel import DenseAndExperts, NormedRouterMoE
from keras_transformers.layers.patch_rotary import PatchRotaryAttention


def initializer(config: TransformerConfig):
    return keras.initializers.TruncatedNormal(stddev=config.initializer_range)


@dataclasses.dataclass(frozen=True)
class BlockSpec:
    """What block `index` of a stack is.

    Attributes:
        index: the block's position in its stack (0-based).
        layer_type: "full_attention", "sliding_attention",
            "no_rope_attention" or "linear_attention" (a seq2seq encoder's
            blocks are "full_attention").
        block: the `TransformerBlock` keyword arguments (read-only).
        moe: whether the feed-forward is the config's `SparseMoE`.
        attention: self-attention arguments beyond the block's (value
            norms, values from keys, KV sharing; read-only), which then
            build the block's `MultiHeadAttention` as its token mixer.
    """

    index: int
    layer_type: str
    block: MappingProxyType
    moe: bool
    attention: MappingProxyType = dataclasses.field(
        default_factory=lambda: MappingProxyType({})
    )

    def build(self, config: TransformerConfig, name: str, dtype) -> TransformerBlock:
        """The block, built for `[B, T, hidden_dim]` inputs (under the
        config's `remat` scope: Keras rematerialises the block as one unit)."""
        ff = moe_feed_forward(config, dtype) if self.moe else None
        remat = keras.RematScope("list_of_layers", layer_names=[name])
        with remat if config.remat else contextlib.nullcontext():
            mixer = token_mixer(
                config, self.block, dtype, self.layer_type, self.attention
            )
            block = TransformerBlock(
                **self.block, token_mixer=mixer, feed_forward=ff, dtype=dtype, name=name
            )
        # What the rematerialised block keeps (`backend.remat`): its input
        # only (True) or the weight products' outputs too ("matmuls").
        block.remat_keep = "matmuls" if config.remat == "matmuls" else None
        width = (None, None, config.hidden_dim)
        block.build(width, width)
        return block


def block_spec(
    config: TransformerConfig, index: int, causal: bool = True, cross_attention=False
) -> BlockSpec:
    """The spec of block `index` of a stack of `config`: a causal one
    (decoders: per-layer types and settings, MoE spacing) or not (an
    encoder's: per-layer types, symmetric sliding windows; a seq2seq
    encoder's: every block alike), with or without cross-attention."""
    kind = layer_type(config, index) if typed(config, causal) else "full_attention"
    attention = layer_settings(config, index, causal)
    head_dim = attention["head_dim"] if causal else config.resolved_head_dim
    fraction = attention["rotary_fraction"]
    rotary_dim = None if fraction == 1.0 else int(head_dim * fraction)
    kwargs = dict(
        num_heads=config.num_heads,
        intermediate_dim=config.intermediate_dim,
        num_kv_heads=attention["num_kv_heads"]
        if causal
        else config.resolved_num_kv_heads,
        head_dim=head_dim,
        norm_position=config.norm_position,
        norm_type=config.norm_type,
        norm_epsilon=config.norm_epsilon,
        activation=config.activation,
        gated=config.gated_feed_forward,
        use_bias=config.use_bias,
        qkv_bias=config.use_bias or config.qkv_bias,
        qk_norm=config.qk_norm,
        layer_scale=config.layer_scale,
        dropout=config.dropout,
        attention_dropout=config.attention_dropout,
        causal=causal,
        cross_attention=cross_attention,
        sliding_window=attention["sliding_window"],
        rope_max_wavelength=attention["rope_max_wavelength"],
        rope_scaling_factor=attention["rope_scaling_factor"],
        rope_scaling=attention["rope_scaling"],
        rotary_dim=rotary_dim,
        attention_scale=config.resolved_attention_scale,
        attention_softcap=config.attention_softcap,
        attention_sinks=config.attention_sinks,
        attention_block_size=config.attention_block_size,
        attention_norm=index > 0 or config.first_attention_norm,
        per_layer_input_dim=config.per_layer_input_dim if causal else None,
        output_scale=config.layer_output_scale,
        kernel_initializer=initializer(config),
    )
    store, reuse = kv_sharing(config, index) if causal else (None, None)
    if reuse is not None and config.kv_shared_intermediate_dim:
        kwargs["intermediate_dim"] = config.kv_shared_intermediate_dim
    extra = dict(
        value_norm=config.value_norm,
        value_from_key=causal and attention["value_from_key"],
        key_value_store=store,
        key_value_reuse=reuse,
    )
    extra = {k: v for k, v in extra.items() if v}
    moe = causal and config.moe_layer(index)
    return BlockSpec(
        index, kind, MappingProxyType(kwargs), moe, MappingProxyType(extra)
    )


# A block argument -> its self-attention argument (None: the block's own).
_ATTENTION_ARGUMENT = dict(
    dropout=None,
    attention_dropout="dropout",
    attention_softcap="softcap",
    attention_sinks="sinks",
    attention_block_size="block_size",
)


def token_mixer(
    config: TransformerConfig, block, dtype, kind: str = "full_attention", extra=None
):
    """The token mixer of a block of layer type `kind` with arguments
    `block` when the default self-attention does not fit: a
    `GatedDeltaNet` for "linear_attention" (the config's
    `linear_attention` group), `PatchRotaryAttention` for 2-D rotary patch
    positions (`vision` with "rotary"), a `MultiHeadAttention` without key
    bias for `key_bias=False`, with `attention_output_gate` or with the
    `extra` arguments (see `BlockSpec.attention`); None otherwise."""
    if kind == "linear_attention":
        group = config.linear_attention
        return GatedDeltaNet(
            num_key_heads=group.num_key_heads,
            num_value_heads=group.num_value_heads,
            key_head_dim=group.key_head_dim,
            value_head_dim=group.value_head_dim,
            conv_kernel_size=group.conv_kernel_size,
            norm_epsilon=config.norm_epsilon,
            kernel_initializer=block["kernel_initializer"],
            dtype=dtype,
            name="self_attention",
        )
    patch_rotary = config.vision is not None and config.rotary
    if (
        not patch_rotary
        and config.key_bias
        and not config.attention_output_gate
        and not extra
    ):
        return None
    cls = PatchRotaryAttention if patch_rotary else MultiHeadAttention
    names = inspect.signature(MultiHeadAttention.__init__).parameters
    kwargs = {_ATTENTION_ARGUMENT.get(k, k): v for k, v in block.items()}
    kwargs = {k: v for k, v in kwargs.items() if k in names}
    kwargs["key_bias"] = None if config.key_bias else False  # None: as qkv_bias
    if config.attention_output_gate:
        kwargs["output_gate"] = True
    kwargs.update(extra or {})
    return cls(**kwargs, dtype=dtype, name="self_attention")


def moe_feed_forward(config: TransformerConfig, dtype):
    """The config's `SparseMoE` feed-forward (a `NormedRouterMoE` with
    `moe.router_input_norm`; beside a dense one in `DenseAndExperts` with
    `moe.dense_alongside`)."""
    moe = config.moe
    cls, extra = SparseMoE, {}
    if moe.router_input_norm:
        cls, extra = NormedRouterMoE, {"norm_epsilon": config.norm_epsilon}
    experts = cls(
        num_experts=moe.num_experts,
        num_experts_per_token=moe.num_experts_per_token,
        intermediate_dim=moe.expert_intermediate_dim or config.intermediate_dim,
        activation=config.activation,
        gated=config.gated_feed_forward,
        normalize_router_weights=moe.normalize_router_weights,
        router_aux_loss_coef=moe.router_aux_loss_coef,
        router_z_loss_coef=moe.router_z_loss_coef,
        router_jitter=moe.router_jitter,
        capacity_factor=moe.capacity_factor,
        dispatch=moe.dispatch,
        num_shared_experts=moe.num_shared_experts,
        shared_expert_intermediate_dim=moe.shared_expert_intermediate_dim,
        shared_expert_gate=moe.shared_expert_gate,
        router_bias=moe.router_bias,
        expert_bias=moe.expert_bias,
        glu_limit=moe.glu_limit,
        kernel_initializer=initializer(config),
        dtype=dtype,
        name="moe",
        **extra,
    )
    if not moe.dense_alongside:
        return experts
    return DenseAndExperts(
        config.intermediate_dim,
        experts,
        activation=config.activation,
        norm_epsilon=config.norm_epsilon,
        kernel_initializer=initializer(config),
        dtype=dtype,
        name="dense_and_experts",
    )


def make_blocks(
    config: TransformerConfig,
    num: int,
    prefix: str,
    dtype,
    causal: bool = False,
    cross_attention: bool = False,
) -> list:
    """`num` built `TransformerBlock`s named `{prefix}_{i}`, block `i` as
    `block_spec(config, i, causal, cross_attention)` says. With
    `num_layer_groups` (a stack of `num_layers`), the list holds each of
    the G distinct blocks `num // G` times in a row (one set of weights per
    group)."""
    groups = config.num_layer_groups or num  # only encoders share
    distinct = [
        block_spec(config, g * num // groups, causal, cross_attention).build(
            config, f"{prefix}_{g}", dtype
        )
        for g in range(groups)
    ]
    return [distinct[i * groups // num] for i in range(num)]


__all__ = [
    "BlockSpec",
    "block_spec",
    "initializer",
    "make_blocks",
    "moe_feed_forward",
    "token_mixer",
]
