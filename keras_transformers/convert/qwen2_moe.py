"""Hugging Face Qwen2-MoE (`model_type: "qwen2_moe"`, Qwen1.5-MoE) <-> the
mixtral family.

`Qwen2MoeForCausalLM` loads as `MixtralCausalLM`, `Qwen2MoeModel` as
`MixtralBackbone`, `Qwen2MoeForSequenceClassification` as `MixtralClassifier`
(its `score` head), and each exports back as that class. Attention is Qwen2's (`keras_transformers.convert.qwen2`:
Llama's layout with q / k / v biases, the config's `qkv_bias`, HF
`qkv_bias`); the routed experts are Mixtral's mapping
(`keras_transformers.convert.mixtral.load_routed`) under Qwen's names. Under
`model.layers.{i}.mlp.` of a sparse layer:

- `gate.weight` `[E, D]` -> `router_kernel` `[D, E]`;
- `experts.{e}.gate_proj` / `up_proj` / `down_proj` -> `expert_gate_up[e]`
  (gate then up) / `expert_down[e]` (transformers 5's fused
  `experts.gate_up_proj` `[E, 2F, D]` and `experts.down_proj` `[E, D, F]`
  load too);
- `shared_expert.{gate,up,down}_proj` -> `shared_experts` (one expert of
  `shared_expert_intermediate_size`: `moe.num_shared_experts=1`,
  `moe.shared_expert_intermediate_dim`);
- `shared_expert_gate.weight` `[1, D]` -> `shared_gate` (`moe.shared_expert_gate`:
  the shared output times `sigmoid(x @ w)` per token).

A dense layer's `mlp.{gate,up,down}_proj` (of `intermediate_size`) load as
Llama's. The router is the same as ours: softmax over all experts (float32),
then top-k, renormalised only with `norm_topk_prob`
(`moe.normalize_router_weights`; False in Qwen1.5-MoE).

Config: `num_experts` -> `moe.num_experts`, `num_experts_per_tok` ->
`moe.num_experts_per_token`, `moe_intermediate_size` ->
`moe.expert_intermediate_dim`, `intermediate_size` -> `intermediate_dim`
(dense layers), `router_aux_loss_coef` -> `moe.router_aux_loss_coef`; the
sparse layers (`decoder_sparse_step`, minus `mlp_only_layers`) must be every
k-th one (`moe.every_k_layers`; anything else is refused, naming both
options). `use_sliding_window` is refused as in Qwen2; `output_router_logits`
is ignored. Training-only options without a Qwen counterpart
(`moe.router_z_loss_coef`, `moe.router_jitter`) and `moe.dispatch` are not
exported; HF pools the load-balancing loss over all layers, ours adds one
term per MoE layer (the same formula).
"""

from __future__ import annotations

import numpy as np

from keras_transformers.convert import llama, mixtral, qwen2
from keras_transformers.convert.common import export_layer, load_layer
from keras_transformers.convert.protocol import decoder
from keras_transformers.registry import register_converter

MODEL_TYPE = "qwen2_moe"
FAMILY = "mixtral"
BASE_ARCHITECTURE = "Qwen2MoeModel"
ARCHITECTURE = "Qwen2MoeForCausalLM"
PREFIXES = llama.PREFIXES
PROBE = llama.PROBE
# Qwen2MoeConfig defaults where they differ from Llama's.
DEFAULTS = dict(
    vocab_size=151936,
    hidden_size=2048,
    intermediate_size=5632,
    num_hidden_layers=24,
    num_attention_heads=16,
    num_key_value_heads=16,
    max_position_embeddings=32768,
    num_experts=60,
    num_experts_per_tok=4,
    moe_intermediate_size=1408,
    shared_expert_intermediate_size=5632,
    norm_topk_prob=False,
    router_aux_loss_coef=0.001,
)
# Qwen-MoE's per-expert tensor names (see `mixtral.EXPERT_NAMES`).
EXPERT_NAMES = ("mlp.", "gate_proj", "up_proj", "down_proj")
# MoE options HF Qwen-MoE always has (Qwen2-MoE adds its shared expert).
MOE_LAYOUT = dict(capacity_factor=None)
SHARED = dict(num_shared_experts=1, shared_expert_gate=True)


def every_k_layers(hf: dict, name: str) -> int:
    """`moe.every_k_layers` for the sparse layers of an HF Qwen-MoE config:
    layer i is sparse when `(i + 1) % decoder_sparse_step == 0` and i is not
    in `mlp_only_layers`; that set must be blocks k-1, 2k-1, ... for some k.

    Raises:
        ValueError: naming `decoder_sparse_step` and `mlp_only_layers` when
            no k gives that set (or no layer is sparse).
    """
    layers, step = hf["num_hidden_layers"], hf.get("decoder_sparse_step", 1)
    dense = hf.get("mlp_only_layers") or []
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(
            f"{name} config has decoder_sparse_step={step!r}; expected an integer >= 1."
        )
    sparse = [i for i in range(layers) if (i + 1) % step == 0 and i not in dense]
    for k in range(1, layers + 1):
        if sparse and sparse == list(range(k - 1, layers, k)):
            return k
    raise ValueError(
        f"{name} config has decoder_sparse_step={step} and mlp_only_layers={dense}: "
        f"sparse layers {sparse} of {layers}. keras_transformers puts MoE layers in "
        "every k-th block only (moe.every_k_layers: blocks k-1, 2k-1, ...); these "
        "cannot be converted."
    )


def moe_fields(hf: dict, name: str, defaults: dict) -> dict:
    """The `moe` group of an HF Qwen-MoE config without its shared expert
    (`defaults`: the HF config class's; the expert count is `num_experts`,
    or `num_local_experts` as transformers 5 saves Qwen3-MoE's)."""
    experts = hf.get("num_experts", hf.get("num_local_experts"))
    hf = {**defaults, **hf}
    experts = hf["num_experts"] if experts is None else experts
    top_k = hf["num_experts_per_tok"]
    if not 1 <= top_k <= experts:
        raise ValueError(
            f"{name} config has num_experts_per_tok={top_k} and num_experts={experts}; "
            "num_experts_per_tok must be between 1 and num_experts."
        )
    return dict(
        num_experts=experts,
        num_experts_per_token=top_k,
        expert_intermediate_dim=hf["moe_intermediate_size"],
        normalize_router_weights=bool(hf["norm_topk_prob"]),
        router_aux_loss_coef=float(hf["router_aux_loss_coef"]),
        router_z_loss_coef=0.0,
        every_k_layers=every_k_layers(hf, name),
    )


def config_from_hf(hf: dict) -> dict:
    """TransformerConfig fields for an HF Qwen2-MoE `config.json` dict.

    Raises:
        ValueError: an option we cannot reproduce (`use_sliding_window`,
            sparse layers not every k-th, activation other than silu, rope
            scaling other than linear) or an invalid expert count.
    """
    qwen2.check_full_attention(hf, "Qwen2-MoE")
    fields = llama.derived_config(hf, "Qwen2-MoE", DEFAULTS, **qwen2.NO_BIAS)
    moe = moe_fields(hf, "Qwen2-MoE", DEFAULTS)
    shared = {**DEFAULTS, **hf}["shared_expert_intermediate_size"]
    moe.update(SHARED, shared_expert_intermediate_dim=shared)
    return {**fields, "qkv_bias": bool(hf.get("qkv_bias", True)), "moe": moe}


def load_feed_forward(block, checkpoint, name: str) -> None:
    """One block's feed-forward (`name`: `...layers.{i}.`): router, experts
    and the (gated) shared expert of a sparse layer, or a dense MLP."""
    moe = block.feed_forward
    if not hasattr(moe, "router_kernel"):
        return llama.load_mlp(moe, checkpoint, name + "mlp")
    mixtral.load_routed(moe, checkpoint, name, EXPERT_NAMES)
    if moe.shared_experts is not None:
        llama.load_mlp(moe.shared_experts, checkpoint, name + "mlp.shared_expert")
    if moe.shared_gate is not None:
        gate = name + "mlp.shared_expert_gate"
        load_layer(moe.shared_gate, checkpoint.get, gate, transpose=True)


def export_feed_forward(out: dict, block, prefix: str) -> None:
    """Inverse of `load_feed_forward`, under the per-expert names."""
    moe = block.feed_forward
    if not hasattr(moe, "router_kernel"):
        return llama.export_mlp(out, moe, prefix + "mlp")
    mixtral.export_routed(out, moe, prefix, EXPERT_NAMES)
    if moe.shared_experts is not None:
        llama.export_mlp(out, moe.shared_experts, prefix + "mlp.shared_expert")
    if moe.shared_gate is not None:
        gate = prefix + "mlp.shared_expert_gate"
        export_layer(out, moe.shared_gate, gate, transpose=True)


def load_weights(
    backbone, checkpoint, require_head: bool, model_type: str = MODEL_TYPE
) -> None:
    """Copies a Qwen-MoE checkpoint into `backbone` (a `MixtralBackbone`)."""
    llama.load_weights(
        backbone, checkpoint, require_head, model_type, feed_forward=load_feed_forward
    )


def export_weights(backbone) -> dict[str, np.ndarray]:
    """The backbone's weights under Qwen-MoE (per-expert) names."""
    return llama.export_weights(backbone, feed_forward=export_feed_forward)


def moe_hf_config(config, model_type: str, layout: dict, **allowed) -> dict:
    """The HF `config.json` dict of a Qwen-MoE type for `config`: Llama's
    keys for the attention (`allowed`: e.g. `qkv_bias=True`) and the MoE
    keys; `layout` holds the `moe` values the type needs."""
    if config.moe is None:
        raise ValueError(
            f"A config without a `moe` group cannot be exported as Hugging Face "
            f"{model_type!r}; export a dense decoder as 'qwen2' / 'qwen3' (GPTCausalLM)."
        )
    moe = config.moe
    mixtral.check_moe_layout(moe, {**MOE_LAYOUT, **layout}, model_type)
    hf = llama.hf_config(
        config.replace(moe=None), model_type, use_bias=False, **allowed
    )
    del hf["attention_bias"], hf["mlp_bias"]
    return {
        **hf,
        "num_experts": moe.num_experts,
        "num_experts_per_tok": moe.num_experts_per_token,
        "moe_intermediate_size": moe.expert_intermediate_dim or config.intermediate_dim,
        "norm_topk_prob": moe.normalize_router_weights,
        "decoder_sparse_step": moe.every_k_layers,
        "mlp_only_layers": [],
        "router_aux_loss_coef": moe.router_aux_loss_coef,
        "output_router_logits": False,
    }


def hf_config(config) -> dict:
    """The HF `config.json` dict (without `architectures`) for `config`."""
    allowed = dict(qkv_bias=config.qkv_bias)  # Qwen2-MoE's is a config option
    hf = moe_hf_config(config, MODEL_TYPE, SHARED, **allowed)
    shared = config.moe.shared_expert_intermediate_dim or hf["moe_intermediate_size"]
    hf.update(qkv_bias=config.qkv_bias, shared_expert_intermediate_size=shared)
    return {**hf, **qwen2.full_attention_keys(config)}


def exports(config) -> bool:
    """Whether a config of this family with no `model_type` asked for
    exports as qwen2_moe: a gated shared expert or query/key/value biases."""
    return bool(
        (config.moe is not None and config.moe.shared_expert_gate) or config.qkv_bias
    )


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
        export_order=20,  # the family's default: registry.export_converter
        family=FAMILY,
    )
)

__all__ = ["config_from_hf", "export_weights", "hf_config", "load_weights"]
