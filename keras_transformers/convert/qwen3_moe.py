"""Hugging Face Qwen3-MoE (`model_type: "qwen3_moe"`) <-> the mixtral family.

`Qwen3MoeForCausalLM` loads as `MixtralCausalLM`, `Qwen3MoeModel` as
`MixtralBackbone`, `Qwen3MoeForSequenceClassification` as `MixtralClassifier`
(its `score` head), and each exports back as that class. Attention is Qwen3's (`keras_transformers.convert.qwen3`:
no biases, per-head `q_norm` / `k_norm`, the config's `qk_norm`; `head_dim`
explicit); the sparse layers are Qwen2-MoE's without the shared expert
(`keras_transformers.convert.qwen2_moe`: router `mlp.gate`, experts
`mlp.experts.{e}.{gate,up,down}_proj` or the fused layout, dense layers from
`decoder_sparse_step` / `mlp_only_layers` when every k-th layer is sparse).
`norm_topk_prob` (True in Qwen3-30B-A3B) -> `moe.normalize_router_weights`.
The expert count is read from `num_experts` (the published configs) or
`num_local_experts` (what transformers 5 saves) and exported as
`num_experts`. `attention_bias=true` and `use_sliding_window` are refused.
"""

from __future__ import annotations

from functools import partial

from keras_transformers.convert import llama, qwen2, qwen2_moe
from keras_transformers.convert.protocol import decoder
from keras_transformers.registry import register_converter

MODEL_TYPE = "qwen3_moe"
FAMILY = "mixtral"
BASE_ARCHITECTURE = "Qwen3MoeModel"
ARCHITECTURE = "Qwen3MoeForCausalLM"
PREFIXES = llama.PREFIXES
PROBE = llama.PROBE
# Qwen3MoeConfig defaults where they differ from Llama's.
DEFAULTS = dict(
    vocab_size=151936,
    hidden_size=2048,
    intermediate_size=6144,
    num_hidden_layers=24,
    num_attention_heads=32,
    num_key_value_heads=4,
    max_position_embeddings=32768,
    num_experts=128,
    num_experts_per_tok=8,
    moe_intermediate_size=768,
    norm_topk_prob=False,
    router_aux_loss_coef=0.001,
)
# No shared expert.
LAYOUT = dict(
    num_shared_experts=0, shared_expert_intermediate_dim=None, shared_expert_gate=False
)


def config_from_hf(hf: dict) -> dict:
    """TransformerConfig fields for an HF Qwen3-MoE `config.json` dict.

    Raises:
        ValueError: an option we cannot reproduce (`attention_bias`,
            `use_sliding_window`, sparse layers not every k-th, activation
            other than silu, rope scaling other than linear, llama3, yarn
            or longrope) or an invalid
            expert count.
    """
    if hf.get("attention_bias", False):
        raise ValueError(
            "Qwen3-MoE config has attention_bias=True (biases on the q, k, v and o "
            "projections), which keras_transformers cannot represent; only "
            "attention_bias=false converts."
        )
    qwen2.check_full_attention(hf, "Qwen3-MoE")
    fields = llama.derived_config(hf, "Qwen3-MoE", DEFAULTS, **qwen2.NO_BIAS)
    moe = qwen2_moe.moe_fields(hf, "Qwen3-MoE", DEFAULTS)
    return {**fields, "qk_norm": True, "moe": moe}


load_weights = partial(qwen2_moe.load_weights, model_type=MODEL_TYPE)
export_weights = qwen2_moe.export_weights


def hf_config(config) -> dict:
    """The HF `config.json` dict (without `architectures`) for `config`."""
    hf = qwen2_moe.moe_hf_config(config, MODEL_TYPE, LAYOUT, qk_norm=True)
    return {**hf, "attention_bias": False, "use_sliding_window": False}


def exports(config) -> bool:
    """Whether a config of this family with no `model_type` asked for
    exports as qwen3_moe: q/k norms."""
    return bool(config.qk_norm)


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
        export_order=10,  # the family's default: registry.export_converter
        family=FAMILY,
    )
)

__all__ = ["config_from_hf", "export_weights", "hf_config", "load_weights"]
