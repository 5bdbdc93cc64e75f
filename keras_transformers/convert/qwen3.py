"""Hugging Face Qwen3 (`model_type: "qwen3"`) <-> `GPTBackbone`.

Llama's layout and weight names (`keras_transformers.convert.llama`) with
query / key normalisation: an RMSNorm over each head's `head_dim` features
on queries and keys before rotary positions (`self_attn.q_norm.weight`,
`self_attn.k_norm.weight`, `[H]`): the config's `qk_norm`. `head_dim` is
explicit (it may differ from hidden / heads). `attention_bias=true` (biases
on all four attention projections but none in the MLP) and sliding-window
attention are not supported.
"""

from __future__ import annotations

from functools import partial

from keras_transformers.convert import llama, qwen2
from keras_transformers.convert.protocol import decoder
from keras_transformers.registry import register_converter

MODEL_TYPE = "qwen3"
BASE_ARCHITECTURE = "Qwen3Model"
ARCHITECTURE = "Qwen3ForCausalLM"
PREFIXES = llama.PREFIXES
PROBE = llama.PROBE
# Qwen3Config defaults where they differ from Llama's.
DEFAULTS = {**qwen2.DEFAULTS, "head_dim": 128}


def config_from_hf(hf: dict) -> dict:
    """TransformerConfig fields for an HF Qwen3 `config.json` dict.

    Raises:
        ValueError: an option we cannot reproduce (`attention_bias`,
            `use_sliding_window`, activation other than silu, rope scaling
            other than linear).
    """
    if hf.get("attention_bias", False):
        raise ValueError(
            "Qwen3 config has attention_bias=True (biases on the q, k, v and o "
            "projections, none in the MLP), which keras_transformers cannot "
            "represent; only attention_bias=false converts."
        )
    qwen2.check_full_attention(hf, "Qwen3")
    fields = llama.derived_config(hf, "Qwen3", DEFAULTS, **qwen2.NO_BIAS)
    return {**fields, "qk_norm": True}


load_weights = partial(llama.load_weights, model_type=MODEL_TYPE)
export_weights = llama.export_weights


def hf_config(config) -> dict:
    """The HF `config.json` dict (without `architectures`) for `config`."""
    hf = llama.hf_config(config, MODEL_TYPE, use_bias=False, qk_norm=True)
    del hf["mlp_bias"]
    return {**hf, **qwen2.full_attention_keys(config)}


def exports(config) -> bool:
    """Whether a config of this family with no `model_type` asked for
    exports as qwen3: q/k norms."""
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
        export_order=40,  # the family's default: registry.export_converter
    )
)

__all__ = ["config_from_hf", "export_weights", "hf_config", "load_weights"]
