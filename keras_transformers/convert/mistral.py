"""Hugging Face Mistral (`model_type: "mistral"`) <-> `GPTBackbone`.

Llama's layout and weight names (`keras_transformers.convert.llama`) with
a sliding window: `sliding_window` (null: full attention) maps to the
config's `sliding_window`; `head_dim` may differ from hidden / heads.
Mistral has no attention or MLP biases.
"""

from __future__ import annotations

from functools import partial

from keras_transformers.convert import llama
from keras_transformers.convert.protocol import decoder
from keras_transformers.registry import register_converter

MODEL_TYPE = "mistral"
BASE_ARCHITECTURE = "MistralModel"
ARCHITECTURE = "MistralForCausalLM"
PREFIXES = llama.PREFIXES
PROBE = llama.PROBE
# MistralConfig defaults where they differ from Llama's.
DEFAULTS = dict(
    intermediate_size=14336,
    num_key_value_heads=8,
    max_position_embeddings=4096 * 32,
    sliding_window=4096,
)
NO_BIAS = dict(attention_bias=False, mlp_bias=False)


def config_from_hf(hf: dict) -> dict:
    """TransformerConfig fields for an HF Mistral `config.json` dict.

    Raises:
        ValueError: an option we cannot reproduce (activation other than
            silu, rope scaling other than linear, llama3, yarn
            or longrope).
    """
    fields = llama.derived_config(hf, "Mistral", DEFAULTS, **NO_BIAS)
    fields["sliding_window"] = {**DEFAULTS, **hf}["sliding_window"]
    return fields


load_weights = partial(llama.load_weights, model_type=MODEL_TYPE)
export_weights = llama.export_weights


def hf_config(config) -> dict:
    """The HF `config.json` dict (without `architectures`) for `config`."""
    hf = llama.hf_config(
        config, MODEL_TYPE, sliding_window=config.sliding_window, use_bias=False
    )
    del hf["attention_bias"], hf["mlp_bias"]
    return {**hf, "sliding_window": config.sliding_window}


def exports(config) -> bool:
    """Whether a config of this family with no `model_type` asked for
    exports as mistral: a sliding window without biases."""
    return bool(config.sliding_window is not None and not config.use_bias)


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
        export_order=60,  # the family's default: registry.export_converter
    )
)

__all__ = ["config_from_hf", "export_weights", "hf_config", "load_weights"]
