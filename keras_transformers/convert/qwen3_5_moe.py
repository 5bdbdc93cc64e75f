"""Hugging Face Qwen3.5-MoE (`model_type: "qwen3_5_moe_text"`, and the text
model of a `"qwen3_5_moe"` checkpoint) <-> the mixtral family.

`Qwen3_5MoeForCausalLM` loads as `MixtralCausalLM`, `Qwen3_5MoeTextModel`
as `MixtralBackbone`. transformers has no Qwen3.5-MoE sequence classifier: a
`MixtralClassifier` built on such a checkpoint gets a new `score` head, and
exporting it is refused (export its backbone). The token mixers, norms and config keys are Qwen3.5's
(`keras_transformers.convert.qwen3_5`: Gated DeltaNet "linear_attention"
layers, gated full attention, norms stored as offsets from 1); every
layer's feed-forward is a sparse MoE with Qwen2-MoE's gated shared expert
(`keras_transformers.convert.qwen2_moe`): router `mlp.gate`, experts
`mlp.experts.{e}.{gate,up,down}_proj` as `save_pretrained` writes them
(transformers 5's fused in-memory `mlp.experts.gate_up_proj` / `down_proj`
load too), `mlp.shared_expert.{gate,up,down}_proj` and
`mlp.shared_expert_gate`. The
top-k router weights are always renormalised
(`moe.normalize_router_weights`).

Config: `num_experts` -> `moe.num_experts`, `num_experts_per_tok` ->
`moe.num_experts_per_token`, `moe_intermediate_size` ->
`moe.expert_intermediate_dim`, `shared_expert_intermediate_size` ->
`moe.shared_expert_intermediate_dim`, `router_aux_loss_coef` ->
`moe.router_aux_loss_coef`. A `"qwen3_5_moe"` checkpoint's text model
loads (its vision tower is reported unused); exporting it is refused:
vision parts are not supported.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import numpy as np

from keras_transformers.convert import mixtral, qwen2_moe, qwen3_5
from keras_transformers.convert.protocol import decoder
from keras_transformers.registry import register_converter

MODEL_TYPE = "qwen3_5_moe_text"
WRAPPER_TYPE = "qwen3_5_moe"
NAME = "Qwen3.5-MoE"
FAMILY = "mixtral"
BASE_ARCHITECTURE = "Qwen3_5MoeTextModel"
ARCHITECTURE = "Qwen3_5MoeForCausalLM"
PREFIXES = qwen3_5.PREFIXES
PROBE = qwen3_5.PROBE
# Qwen3_5MoeTextConfig's defaults where they differ from Llama's.
DEFAULTS = dict(
    {k: v for k, v in qwen3_5.DEFAULTS.items() if k != "intermediate_size"},
    hidden_size=2048,
    num_hidden_layers=40,
    num_key_value_heads=2,
    num_experts=256,
    num_experts_per_tok=8,
    moe_intermediate_size=512,
    shared_expert_intermediate_size=512,
    router_aux_loss_coef=0.001,
)
# The MoE options every Qwen3.5-MoE layer has.
LAYOUT = dict(
    normalize_router_weights=True,
    every_k_layers=1,
    num_shared_experts=1,
    shared_expert_gate=True,
    router_bias=False,
    expert_bias=False,
    glu_limit=None,
)


def config_from_hf(hf: dict) -> dict:
    """TransformerConfig fields for an HF Qwen3.5-MoE `config.json` dict
    (the text model's, or a multimodal one's `text_config`).

    Raises:
        ValueError: an option we cannot reproduce (see
            `qwen3_5.attention_fields`) or an invalid expert count.
    """
    hf = {**DEFAULTS, **qwen3_5.text_config(hf, NAME)}
    hf.setdefault("intermediate_size", hf["moe_intermediate_size"])  # no dense layer
    fields = qwen3_5.attention_fields(hf, NAME, {})
    moe = qwen2_moe.moe_fields({**hf, "norm_topk_prob": True}, NAME, DEFAULTS)
    moe.update(
        qwen2_moe.SHARED,
        capacity_factor=None,
        shared_expert_intermediate_dim=hf["shared_expert_intermediate_size"],
    )
    return {**fields, "moe": moe}


load_weights = partial(
    qwen3_5.load_weights,
    model_type=MODEL_TYPE,
    feed_forward=qwen2_moe.load_feed_forward,
)


def export_weights(backbone) -> dict[str, np.ndarray]:
    """The backbone's weights under Qwen3_5MoeForCausalLM names."""
    return qwen3_5.export_weights(backbone, feed_forward=qwen2_moe.export_feed_forward)


def hf_config(config) -> dict:
    """The HF `config.json` dict (without `architectures`) for `config`."""
    if config.moe is None:
        raise ValueError(
            f"A config without a `moe` group cannot be exported as Hugging Face "
            f"{MODEL_TYPE!r}; export a dense Qwen3.5 as 'qwen3_5_text' (GPTCausalLM)."
        )
    moe = config.moe
    mixtral.check_moe_layout(moe, {**qwen2_moe.MOE_LAYOUT, **LAYOUT}, MODEL_TYPE)
    hf = qwen3_5.text_hf_config(config, MODEL_TYPE, moe=moe)
    del hf["intermediate_size"]
    return {
        **hf,
        **qwen3_5.linear_keys(config),
        "num_experts": moe.num_experts,
        "num_experts_per_tok": moe.num_experts_per_token,
        "moe_intermediate_size": moe.expert_intermediate_dim or config.intermediate_dim,
        "shared_expert_intermediate_size": (
            moe.shared_expert_intermediate_dim
            or moe.expert_intermediate_dim
            or config.intermediate_dim
        ),
        "router_aux_loss_coef": moe.router_aux_loss_coef,
        "output_router_logits": False,
    }


def exports(config) -> bool:
    """Whether a config of this family with no `model_type` asked for
    exports as qwen3_5_moe_text: gated attention."""
    return bool(config.attention_output_gate)


def _refuse_wrapper(model, model_type: str) -> tuple:
    raise ValueError(
        f"Exporting as Hugging Face {WRAPPER_TYPE!r} "
        "(Qwen3_5MoeForConditionalGeneration) needs its vision tower, and vision "
        f"parts are not supported by keras_transformers: export the text model as "
        f"{MODEL_TYPE!r} ({ARCHITECTURE}), e.g. "
        f"export_hf(model, path, model_type={MODEL_TYPE!r})."
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
        export_order=2,  # before gpt_oss, qwen3_moe, qwen2_moe and mixtral
        sequence_classifier=False,  # transformers has none for Qwen3.5-MoE
        family=FAMILY,
    )
)
# The multimodal checkpoint type: its text model loads; exporting it fails.
WRAPPER = register_converter(
    dataclasses.replace(
        CONVERTER.as_type(WRAPPER_TYPE), export=_refuse_wrapper, exports=None
    )
)

__all__ = ["config_from_hf", "export_weights", "hf_config", "load_weights"]
