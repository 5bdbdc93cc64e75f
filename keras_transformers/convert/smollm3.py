"""Hugging Face SmolLM3 (`model_type: "smollm3"`) <-> `GPTBackbone`.

Llama's layout and tensor names (`keras_transformers.convert.llama`) with
layers that have no rotary positions (NoPE): `no_rope_layers` lists, per
layer, 1 (rotary) or 0 (none); without it every `no_rope_layer_interval`-th
layer (1-based; 4 by default) has none. That is per-layer variety, so it
goes into the config's `layer_types`: a layer without rotary positions is
a "no_rope_attention" layer (full attention, `rotary: False`), or, where
the checkpoint gives the NoPE layers a sliding window (`use_sliding_window`
with `layer_types`), a "sliding_attention" layer whose type has
`layer_settings["sliding_attention"] = {"rotary": False}`.

Sliding layers some with and some without rotary positions are refused.
"""

from __future__ import annotations

from functools import partial

from keras_transformers.config.layer_types import layer_settings
from keras_transformers.convert import llama
from keras_transformers.convert.protocol import decoder
from keras_transformers.registry import register_converter

MODEL_TYPE = "smollm3"
NAME = "SmolLM3"
BASE_ARCHITECTURE = "SmolLM3Model"
ARCHITECTURE = "SmolLM3ForCausalLM"
PREFIXES = llama.PREFIXES
PROBE = llama.PROBE
# SmolLM3Config's defaults where they differ from Llama's.
DEFAULTS = dict(
    vocab_size=128256,
    hidden_size=2048,
    intermediate_size=11008,
    num_hidden_layers=36,
    num_attention_heads=16,
    num_key_value_heads=4,
    max_position_embeddings=32768,
    rope_theta=2000000.0,
    tie_word_embeddings=True,
    bos_token_id=128000,
    eos_token_id=128001,
    pad_token_id=128004,
    use_sliding_window=False,
    sliding_window=None,
    no_rope_layer_interval=4,
)
FULL, SLIDING, NO_ROPE = "full_attention", "sliding_attention", "no_rope_attention"


def _per_layer(hf: dict) -> tuple[list[int], list[str]]:
    """Each layer's rotary flag (1: rotary) and Hugging Face layer type,
    derived as transformers derives them when the file lacks them."""
    layers = hf["num_hidden_layers"]
    interval = hf["no_rope_layer_interval"]
    rope = hf.get("no_rope_layers") or [
        int((i + 1) % interval != 0) for i in range(layers)
    ]
    sliding = hf["use_sliding_window"] and hf["sliding_window"] is not None
    types = hf.get("layer_types") or [
        SLIDING if sliding and not rope[i] else FULL for i in range(layers)
    ]
    for key, value in (("no_rope_layers", rope), ("layer_types", types)):
        if len(value) != layers:
            raise ValueError(
                f"{NAME} config has {len(value)} {key} for num_hidden_layers="
                f"{layers}; list one entry per layer."
            )
    return list(rope), list(types)


def config_from_hf(hf: dict) -> dict:
    """TransformerConfig fields for an HF SmolLM3 `config.json` dict.

    Raises:
        ValueError: an option we cannot reproduce (Llama's: an activation
            other than silu, `attention_bias` != `mlp_bias`, a rotary scaling
            we lack; sliding layers some with and some without rotary
            positions), or per-layer lists
            that do not match the layer count.
    """
    hf = {**DEFAULTS, **hf}
    fields = llama.derived_config(hf, NAME, DEFAULTS)
    rope, types = _per_layer(hf)
    sliding_rope = {rope[i] for i, kind in enumerate(types) if kind == SLIDING}
    if len(sliding_rope) > 1:
        raise ValueError(
            f"{NAME} config has sliding-window layers both with and without "
            "rotary positions (no_rope_layers), which keras_transformers' layer "
            "types cannot tell apart; give all sliding layers the same."
        )
    ours = [
        kind if kind == SLIDING else (FULL if rope[i] else NO_ROPE)
        for i, kind in enumerate(types)
    ]
    settings = {SLIDING: {"rotary": False}} if sliding_rope == {0} else None
    return {
        **fields,
        "sliding_window": hf["sliding_window"] if SLIDING in ours else None,
        "layer_types": ours,
        "layer_settings": settings,
    }


load_weights = partial(llama.load_weights, model_type=MODEL_TYPE)
export_weights = llama.export_weights


def _check_settings(config) -> None:
    """Raises a ValueError unless `config.layer_settings` only turns rotary
    positions off (SmolLM3 has one rotary for all layers that have one)."""
    for kind, own in (config.layer_settings or {}).items():
        if set(own) - {"rotary"} or own.get("rotary") is not False:
            raise ValueError(
                f"This model cannot be exported as Hugging Face {MODEL_TYPE!r}: its "
                f"layer_settings[{kind!r}]={own}, but {MODEL_TYPE} layers only "
                "differ by having rotary positions or not ({'rotary': False})."
            )


def hf_config(config) -> dict:
    """The HF `config.json` dict (without `architectures`) for `config`."""
    _check_settings(config)
    hf = llama.hf_config(
        config,
        MODEL_TYPE,
        sliding_window=config.sliding_window,
        layer_types=config.layer_types,
        layer_settings=config.layer_settings,
    )
    layers = range(config.num_layers)
    rope = [
        int(layer_settings(config, i)["rope_max_wavelength"] is not None)
        for i in layers
    ]
    windows = [layer_settings(config, i)["sliding_window"] for i in layers]
    return {
        **hf,
        "no_rope_layers": rope,
        "use_sliding_window": config.sliding_window is not None,
        "sliding_window": config.sliding_window,
        "layer_types": [FULL if window is None else SLIDING for window in windows],
    }


def exports(config) -> bool:
    """Whether a config of this family with no `model_type` asked for
    exports as smollm3: rotary positions with some layers without them."""
    layers = range(config.num_layers)
    return config.rotary and any(
        layer_settings(config, i)["rope_max_wavelength"] is None for i in layers
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
        export_order=35,  # the family's default: registry.export_converter
    )
)

__all__ = ["config_from_hf", "export_weights", "hf_config", "load_weights"]
