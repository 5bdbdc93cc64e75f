"""Hugging Face Qwen2 (`model_type: "qwen2"`) <-> `GPTBackbone`.

Llama's layout and weight names (`keras_transformers.convert.llama`) with
biases on the query, key and value projections only (`q_proj.bias`
`[N * H]`, `k_proj.bias` / `v_proj.bias` `[K * H]`): the config's
`qkv_bias`. Sliding-window attention (`use_sliding_window`, which Qwen2
applies to the layers from `max_window_layers` on) is not supported.
"""

from __future__ import annotations

from functools import partial

from keras_transformers.convert import llama
from keras_transformers.convert.protocol import decoder
from keras_transformers.registry import register_converter

MODEL_TYPE = "qwen2"
BASE_ARCHITECTURE = "Qwen2Model"
ARCHITECTURE = "Qwen2ForCausalLM"
PREFIXES = llama.PREFIXES
PROBE = llama.PROBE
# Qwen2Config defaults where they differ from Llama's.
DEFAULTS = dict(
    vocab_size=151936,
    intermediate_size=22016,
    max_position_embeddings=32768,
)
NO_BIAS = dict(attention_bias=False, mlp_bias=False)


def check_full_attention(hf: dict, name: str) -> None:
    """Raises a ValueError naming `use_sliding_window` when a Qwen config
    asks for sliding-window attention in any layer."""
    window = hf.get("sliding_window")
    sliding = "sliding_attention" in (hf.get("layer_types") or ())
    if sliding or (hf.get("use_sliding_window") and window is not None):
        raise ValueError(
            f"{name} config has use_sliding_window=True (sliding_window={window}, "
            f"max_window_layers={hf.get('max_window_layers')}): sliding-window "
            "attention in some layers is not supported; only use_sliding_window="
            "false converts."
        )


def config_from_hf(hf: dict) -> dict:
    """TransformerConfig fields for an HF Qwen2 `config.json` dict.

    Raises:
        ValueError: an option we cannot reproduce (`use_sliding_window`,
            activation other than silu, rope scaling other than linear, llama3, yarn
            or longrope).
    """
    check_full_attention(hf, "Qwen2")
    fields = llama.derived_config(hf, "Qwen2", DEFAULTS, **NO_BIAS)
    return {**fields, "qkv_bias": True}


load_weights = partial(llama.load_weights, model_type=MODEL_TYPE)
export_weights = llama.export_weights


def full_attention_keys(config) -> dict:
    """The sliding-window keys of a Qwen config without one."""
    return dict(
        use_sliding_window=False,
        sliding_window=None,
        max_window_layers=config.num_layers,
        layer_types=["full_attention"] * config.num_layers,
    )


def hf_config(config) -> dict:
    """The HF `config.json` dict (without `architectures`) for `config`."""
    hf = llama.hf_config(config, MODEL_TYPE, use_bias=False, qkv_bias=True)
    del hf["attention_bias"], hf["mlp_bias"]
    return {**hf, **full_attention_keys(config)}


def exports(config) -> bool:
    """Whether a config of this family with no `model_type` asked for
    exports as qwen2: query/key/value biases alone."""
    return bool(config.qkv_bias and not config.use_bias)


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
        export_order=50,  # the family's default: registry.export_converter
    )
)

__all__ = ["config_from_hf", "export_weights", "hf_config", "load_weights"]
