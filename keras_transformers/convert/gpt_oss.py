"""Hugging Face gpt-oss (`model_type: "gpt_oss"`) <-> the mixtral family.

`GptOssForCausalLM` loads as `MixtralCausalLM`, `GptOssModel` as
`MixtralBackbone`, `GptOssForSequenceClassification` as `MixtralClassifier`
(its `score` head), and each exports back as that class. Embeddings, norms and the q / k / v / o projections are
Llama's (`keras_transformers.convert.llama`; `attention_bias` -> `use_bias`,
as the MoE blocks have no dense feed-forward); in addition:

- `self_attn.sinks` `[N]` -> the attention's `sinks` (`attention_sinks`: a
  learned logit per head joins each query's scores before the softmax);
- `layer_types` (sliding and full layers alternating) -> `layer_types`,
  `sliding_window` -> `sliding_window`; the YaRN rotary (`truncate` too) ->
  `rope_scaling`;
- under `model.layers.{i}.mlp.`: `router.weight` `[E, D]` / `router.bias`
  `[E]` -> `router_kernel` `[D, E]` / `router_bias` (`moe.router_bias`);
  `experts.gate_up_proj` `[E, D, 2F]` with gate and up columns interleaved
  (gate even, up odd) and its bias `[E, 2F]` -> `expert_gate_up` (gate
  half, then up half) and `expert_gate_up_bias`; `experts.down_proj`
  `[E, F, D]` and its bias `[E, D]` -> `expert_down`, `expert_down_bias`
  (`moe.expert_bias`).

The router takes the top-k logits and a softmax over those k: the same
weights as a softmax over all experts renormalised over the top k
(`moe.normalize_router_weights`). The experts' clamped SwiGLU,
`(clip(up, -L, L) + 1) * g * sigmoid(1.702 g)` with `g = min(gate, L)`,
`L = swiglu_limit`: `activation="quick_gelu"`, `moe.glu_limit`. Only
`swiglu_alpha=1.702` converts. Experts stored as MXFP4 (`gate_up_proj_blocks`
/ `_scales`, as gpt-oss is published) are dequantised to float32 on load
(`keras_transformers.convert.mxfp4`); `export_hf` writes float experts.
`output_router_logits` is ignored; HF pools the load-balancing loss over all
layers, ours adds one term per MoE layer (the same formula).
"""

from __future__ import annotations

import numpy as np

from keras_transformers.config.layer_types import layer_type
from keras_transformers.convert import llama, mixtral, mxfp4
from keras_transformers.convert.common import (
    DECODER,
    assign,
    check_exportable,
    check_shape,
    fetch,
)
from keras_transformers.convert.protocol import decoder
from keras_transformers.registry import register_converter

MODEL_TYPE = "gpt_oss"
FAMILY = "mixtral"
BASE_ARCHITECTURE = "GptOssModel"
ARCHITECTURE = "GptOssForCausalLM"
PREFIXES = llama.PREFIXES
PROBE = llama.PROBE
NAME = "gpt-oss"
# GptOssConfig defaults where they differ from Llama's.
DEFAULTS = dict(
    vocab_size=201088,
    hidden_size=2880,
    intermediate_size=2880,
    num_hidden_layers=36,
    num_attention_heads=64,
    num_key_value_heads=8,
    head_dim=64,
    max_position_embeddings=131072,
    rms_norm_eps=1e-5,
    rope_theta=150000.0,
    sliding_window=128,
    num_local_experts=128,
    num_experts_per_tok=4,
    swiglu_alpha=1.702,
    swiglu_limit=7.0,
    router_aux_loss_coef=0.001,
    attention_bias=True,
)
# GptOssConfig's rotary when the config has none.
ROPE = dict(
    rope_type="yarn",
    factor=32.0,
    beta_fast=32.0,
    beta_slow=1.0,
    truncate=False,
    original_max_position_embeddings=4096,
)
ALPHA = 1.702  # the gain of `quick_gelu`
# MoE options HF gpt-oss always has: field -> value.
MOE_LAYOUT = dict(
    normalize_router_weights=True,
    capacity_factor=None,
    every_k_layers=1,
    num_shared_experts=0,
    router_bias=True,
    expert_bias=True,
)
SLIDING, FULL = "sliding_attention", "full_attention"


def layer_types(hf: dict) -> list[str]:
    """The checkpoint's `layer_types`, or GptOssConfig's default (sliding
    first, then alternating)."""
    layers = hf["num_hidden_layers"]
    default = [SLIDING if i % 2 == 0 else FULL for i in range(layers)]
    return list(hf.get("layer_types") or default)


def config_from_hf(hf: dict) -> dict:
    """TransformerConfig fields for an HF gpt-oss `config.json` dict.

    Raises:
        ValueError: an option we cannot reproduce (`swiglu_alpha` other than
            1.702, a rope scaling we lack, sliding layers without a window)
            or an invalid expert count.
    """
    hf = {**DEFAULTS, **hf}
    if not (hf.get("rope_scaling") or hf.get("rope_parameters")):
        hf["rope_parameters"] = ROPE
    if float(hf["swiglu_alpha"]) != ALPHA:
        raise ValueError(
            f"{NAME} config has swiglu_alpha={hf['swiglu_alpha']}; keras_transformers "
            f"computes the experts' gate as quick_gelu, x * sigmoid({ALPHA} x), so "
            f"only swiglu_alpha={ALPHA} (every published checkpoint) converts."
        )
    bias = bool(hf["attention_bias"])
    fields = llama.derived_config(hf, NAME, {}, mlp_bias=bias, hidden_act="silu")
    experts, top_k = hf["num_local_experts"], hf["num_experts_per_tok"]
    if not 1 <= top_k <= experts:
        raise ValueError(
            f"{NAME} config has num_experts_per_tok={top_k} and num_local_experts="
            f"{experts}; num_experts_per_tok must be between 1 and num_local_experts."
        )
    types = layer_types(hf)
    if SLIDING in types and hf.get("sliding_window") is None:
        raise ValueError(
            f"{NAME} config has sliding_attention layers but sliding_window=None; "
            "give the window (GptOssConfig's default is 128)."
        )
    fields.update(
        activation="quick_gelu",
        attention_sinks=True,
        layer_types=types,
        sliding_window=hf["sliding_window"] if SLIDING in types else None,
        moe=dict(
            num_experts=experts,
            num_experts_per_token=top_k,
            router_aux_loss_coef=float(hf["router_aux_loss_coef"]),
            router_z_loss_coef=0.0,
            glu_limit=float(hf["swiglu_limit"]),
            **MOE_LAYOUT,
        ),
    )
    return fields


def _interleaved(x: np.ndarray) -> np.ndarray:
    """`[..., 2F]` gate / up columns interleaved -> gate half, then up half."""
    return np.concatenate([x[..., ::2], x[..., 1::2]], axis=-1)


def _interleave(x: np.ndarray) -> np.ndarray:
    """Inverse of `_interleaved`."""
    f = x.shape[-1] // 2
    out = np.empty_like(x)
    out[..., ::2], out[..., 1::2] = x[..., :f], x[..., f:]
    return out


def _expert_tensor(checkpoint, name: str) -> np.ndarray:
    """The float tensor `name`, or, where the checkpoint stores it as MXFP4
    (`{name}_blocks` / `{name}_scales`, as gpt-oss is published), its
    dequantised values in float32 (`keras_transformers.convert.mxfp4`)."""
    if name in checkpoint or name + "_blocks" not in checkpoint:
        return checkpoint.get(name)
    # A copy: the next `get` unmaps the pages of the tensors returned before.
    blocks = np.array(checkpoint.get(name + "_blocks"))
    return mxfp4.dequantize(blocks, checkpoint.get(name + "_scales"))


def _load_block(block, checkpoint, name: str) -> None:
    """One block's sinks, router and experts (`name`: `...layers.{i}.`)."""
    attention, moe, get = block.self_attention, block.feed_forward, checkpoint.get
    sinks = name + "self_attn.sinks"
    assign(attention.sink_logits, get(sinks), sinks)
    experts = name + "mlp.experts."
    e, f, d = tuple(moe.expert_down.shape)
    router = name + "mlp.router."
    assign(moe.router_kernel, get(router + "weight"), router + "weight", transpose=True)
    assign(moe.router_bias_weight, get(router + "bias"), router + "bias")
    for part, shape, bias_shape, layout in (
        ("gate_up_proj", (e, d, 2 * f), (e, 2 * f), _interleaved),
        ("down_proj", (e, f, d), (e, d), lambda x: x),
    ):
        target = "expert_gate_up" if part == "gate_up_proj" else "expert_down"
        for suffix, expected, variable in (
            ("", shape, getattr(moe, target)),
            ("_bias", bias_shape, getattr(moe, target + "_bias")),
        ):
            tensor = _expert_tensor(checkpoint, experts + part + suffix)
            check_shape(tensor, expected, experts + part + suffix, moe.path)
            assign(variable, layout(tensor), experts + part + suffix)


def load_weights(backbone, checkpoint, require_head: bool) -> None:
    """Copies a gpt-oss checkpoint into `backbone` (a `MixtralBackbone`):
    Llama's mapping, plus each block's sinks, router and experts."""
    llama.load_weights(
        backbone, checkpoint, require_head, MODEL_TYPE, feed_forward=_load_block
    )


def _export_block(out: dict, block, prefix: str) -> None:
    """Inverse of `_load_block`."""
    moe = block.feed_forward
    out[prefix + "self_attn.sinks"] = fetch(block.self_attention.sink_logits)
    router, experts = prefix + "mlp.router.", prefix + "mlp.experts."
    out[router + "weight"] = fetch(moe.router_kernel, transpose=True)
    out[router + "bias"] = fetch(moe.router_bias_weight)
    out[experts + "gate_up_proj"] = _interleave(fetch(moe.expert_gate_up))
    out[experts + "gate_up_proj_bias"] = _interleave(fetch(moe.expert_gate_up_bias))
    out[experts + "down_proj"] = fetch(moe.expert_down)
    out[experts + "down_proj_bias"] = fetch(moe.expert_down_bias)


def export_weights(backbone) -> dict[str, np.ndarray]:
    """The backbone's weights under GptOssForCausalLM names."""
    return llama.export_weights(backbone, feed_forward=_export_block)


def hf_config(config) -> dict:
    """The HF `config.json` dict (without `architectures`) for `config`."""
    if config.moe is None:
        raise ValueError(
            "A config without a `moe` group cannot be exported as Hugging Face "
            "'gpt_oss'; export a dense decoder as 'llama' (GPTCausalLM)."
        )
    skip = ("moe", "sliding_window", "layer_types")  # written below
    required = {k: v for k, v in DECODER.items() if k not in skip}
    required.update(
        norm_type="rms",
        position_embedding="rotary",
        activation="quick_gelu",
        gated_feed_forward=True,
        attention_sinks=True,
    )
    check_exportable(config, required, MODEL_TYPE)
    moe = config.moe
    mixtral.check_moe_layout(moe, MOE_LAYOUT, MODEL_TYPE)
    types = [layer_type(config, i) for i in range(config.num_layers)]
    if moe.glu_limit is None or not set(types) <= {SLIDING, FULL}:
        raise ValueError(
            "This model cannot be exported as Hugging Face 'gpt_oss': it has "
            f"moe.glu_limit={moe.glu_limit} and layer types {sorted(set(types))}, but "
            f"gpt_oss needs a limit (its swiglu_limit) and only {SLIDING!r} and "
            f"{FULL!r} layers."
        )
    expert_dim = moe.expert_intermediate_dim or config.intermediate_dim
    dense = config.replace(
        moe=None,
        sliding_window=None,
        layer_types=None,
        attention_sinks=False,
        activation="silu",
        intermediate_dim=expert_dim,
    )
    hf = llama.hf_config(dense, MODEL_TYPE, use_bias=config.use_bias)
    del hf["mlp_bias"]
    hf.update(
        num_local_experts=moe.num_experts,
        num_experts_per_tok=moe.num_experts_per_token,
        router_aux_loss_coef=moe.router_aux_loss_coef,
        output_router_logits=False,
        swiglu_alpha=ALPHA,
        swiglu_limit=moe.glu_limit,
        sliding_window=config.sliding_window,
        layer_types=types,
    )
    return hf


def exports(config) -> bool:
    """Whether a config of this family with no `model_type` asked for
    exports as gpt_oss: attention sinks."""
    return bool(config.attention_sinks)


CONVERTER = register_converter(
    decoder(
        MODEL_TYPE,
        architectures=(BASE_ARCHITECTURE, ARCHITECTURE),
        config_from_hf=config_from_hf,
        hf_config=hf_config,
        load_weights=load_weights,
        export_weights=export_weights,
        prefixes=PREFIXES,
        probe=PROBE,
        exports=exports,
        export_order=5,  # the family's default: registry.export_converter
        family=FAMILY,
    )
)

__all__ = ["config_from_hf", "export_weights", "hf_config", "load_weights"]
