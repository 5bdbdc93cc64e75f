"""Hugging Face Gemma 4 text (`model_type: "gemma4_text"`) <-> `GPTBackbone`.

Gemma 3's layout (sandwich norms, q/k norms, GeGLU, scaled embeddings,
sliding and full layers with a rotary each) with:

- plain RMSNorm weights (`x * w`, not Gemma 3's offsets from 1), and a
  scale-free RMSNorm on each value head (`value_norm`);
- attention logits unscaled (`attention_scale=1.0`), no attention
  soft-capping; `final_logit_softcapping` -> `logit_softcap`;
- full-attention layers with their own head size and key/value heads
  (`global_head_dim`, `num_global_key_value_heads`, or transformers 5's
  `per_layer_config`), values taken from the keys (`attention_k_eq_v`),
  and a "proportional" partial rotary (`rope_parameters["full_attention"]`):
  `layer_settings["full_attention"]` and the config's own rotary fields;
- per-layer input embeddings (`hidden_size_per_layer_input`:
  `per_layer_input_dim`, see `keras_transformers.layers.per_layer_inputs`);
- the last `num_kv_shared_layers` layers reusing the keys and values of
  the last earlier layer of their type (`num_kv_shared_layers`), with a
  twice-wide feed-forward there under `use_double_wide_mlp`;
- a constant `layer_scalar` on each block's output (`layer_output_scale`);
- the MoE block (`enable_moe_block`: `moe` with `router_input_norm` and
  `dense_alongside`, see `keras_transformers.layers.moe_parallel`): the
  dense GeGLU beside `num_experts` experts (top `top_k_experts`, width
  `moe_intermediate_size`), tensors mapped in
  `keras_transformers.convert.gemma4_weights`.

The last layer is full attention, as transformers forces it. The
multimodal wrapper (`model_type: "gemma4"`, a `text_config`) loads its
text model (`keras_transformers.convert.gemma4_multimodal`; the vision and
audio towers are not converted and are reported unused); exporting as
"gemma4" is refused in favour of "gemma4_text".
`use_bidirectional_attention="all"`, `attention_bias` and rotary types
other than "default" and "proportional" are refused as well.
"""

from __future__ import annotations

from keras_transformers.config import MoEConfig
from keras_transformers.convert import gemma4_weights
from keras_transformers.convert.common import DECODER, check_exportable, special_ids
from keras_transformers.convert.gemma2 import alternating
from keras_transformers.convert.gemma4_weights import export_weights, load_weights
from keras_transformers.convert.protocol import decoder
from keras_transformers.registry import register_converter

MODEL_TYPE = "gemma4_text"
NAME = "Gemma4"
BASE_ARCHITECTURE = "Gemma4TextModel"
ARCHITECTURE = "Gemma4ForCausalLM"
PREFIXES = gemma4_weights.PREFIXES
PROBE = gemma4_weights.PROBE
FULL, SLIDING = "full_attention", "sliding_attention"
# Gemma4TextConfig's defaults.
DEFAULTS = dict(
    vocab_size=262144,
    hidden_size=2304,
    intermediate_size=9216,
    num_hidden_layers=30,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=256,
    hidden_activation="gelu_pytorch_tanh",
    max_position_embeddings=131072,
    rms_norm_eps=1e-6,
    pad_token_id=0,
    eos_token_id=1,
    bos_token_id=2,
    tie_word_embeddings=True,
    sliding_window=512,
    vocab_size_per_layer_input=262144,
    hidden_size_per_layer_input=256,
    global_head_dim=512,
)
ROPE_DEFAULTS = {
    SLIDING: {"rope_type": "default", "rope_theta": 10000.0},
    FULL: {
        "rope_type": "proportional",
        "partial_rotary_factor": 0.25,
        "rope_theta": 1e6,
    },
}
ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_approximate", "gelu": "gelu"}


def _refuse(option: str, value, fix: str):
    raise ValueError(
        f"{NAME} config has {option}={value!r}, which keras_transformers cannot "
        f"convert; {fix}."
    )


def _check(hf: dict) -> None:
    """Raises a ValueError naming the first option we cannot reproduce."""
    if hf.get("model_type") == "gemma4" or "text_config" in hf:
        _refuse(
            "model_type",
            hf.get("model_type", "gemma4"),
            "this is the multimodal Gemma4ForConditionalGeneration wrapper; "
            "vision and audio towers are not converted: load a text-only "
            "Gemma4ForCausalLM checkpoint (its text_config as config.json)",
        )
    if hf.get("attention_bias"):
        _refuse("attention_bias", True, "only attention_bias=false converts")
    for option in ("num_experts", "top_k_experts", "moe_intermediate_size"):
        if hf.get("enable_moe_block") and not hf.get(option):
            _refuse(option, hf.get(option), "enable_moe_block needs it set")
    if hf.get("use_bidirectional_attention") == "all":
        _refuse("use_bidirectional_attention", "all", "only causal decoders convert")
    if hf["hidden_activation"] not in ACTIVATIONS:
        _refuse(
            "hidden_activation",
            hf["hidden_activation"],
            f"use one of {sorted(ACTIVATIONS)}",
        )


def _rotary(params: dict | None, kind: str) -> dict:
    """Our rotary settings of one layer type's rope_parameters."""
    params = dict(params or ROPE_DEFAULTS[kind])
    rope_type = params.get("rope_type", "default")
    theta = float(params.get("rope_theta", ROPE_DEFAULTS[kind]["rope_theta"]))
    if rope_type not in ("default", "proportional"):
        _refuse(
            f"rope_parameters[{kind!r}]['rope_type']",
            rope_type,
            "only 'default' and 'proportional' convert",
        )
    scaling = None
    if rope_type == "proportional":
        scaling = {
            "rope_type": "proportional",
            "partial_rotary_factor": float(params.get("partial_rotary_factor", 1.0)),
        }
        if float(params.get("factor", 1.0)) != 1.0:
            scaling["factor"] = float(params["factor"])
    return {"rope_max_wavelength": theta, "rope_scaling": scaling}


def _full_overrides(hf: dict, types: list) -> dict:
    """`{"head_dim", "num_kv_heads"}` of the full-attention layers: from
    `per_layer_config` (transformers 5's saved form: the same overrides for
    every full layer, none for sliding ones) or `global_head_dim` and
    `num_global_key_value_heads`."""
    per_layer = hf.get("per_layer_config")
    if per_layer is None:
        out = {"head_dim": hf["global_head_dim"]}
        if hf.get("attention_k_eq_v") and hf.get("num_global_key_value_heads"):
            out["num_key_value_heads"] = hf["num_global_key_value_heads"]
    else:
        # Keyed by layer index (transformers writes them zero-padded).
        by_index = {int(i): dict(v or {}) for i, v in per_layer.items()}
        found = {
            kind: [by_index.get(i, {}) for i, k in enumerate(types) if k == kind]
            for kind in (FULL, SLIDING)
        }
        same = all(o == found[FULL][0] for o in found[FULL]) if found[FULL] else True
        if not same or any(found[SLIDING]):
            _refuse(
                "per_layer_config",
                per_layer,
                "only one override for all full-attention layers converts",
            )
        out = found[FULL][0] if found[FULL] else {}
    known = {"head_dim", "num_key_value_heads"}
    if set(out) - known:
        _refuse(
            "per_layer_config", per_layer, f"only {sorted(known)} overrides convert"
        )
    return {
        "head_dim": out.get("head_dim", hf["head_dim"]),
        "num_kv_heads": out.get("num_key_value_heads", hf["num_key_value_heads"]),
    }


def config_from_hf(hf: dict) -> dict:
    """TransformerConfig fields for an HF Gemma 4 text `config.json` dict.

    Raises:
        ValueError: an option we cannot reproduce (named), or layer types
            that do not match the layer count.
    """
    hf = {**DEFAULTS, **{k: v for k, v in hf.items() if v is not None}}
    _check(hf)
    layers = hf["num_hidden_layers"]
    types = list(hf.get("layer_types") or alternating(layers, 6))
    if len(types) != layers:
        raise ValueError(
            f"{NAME} config has {len(types)} layer_types for num_hidden_layers="
            f"{layers}; list one type per layer."
        )
    types[-1] = FULL  # as transformers forces it
    rope = hf.get("rope_parameters") or {}
    full, sliding = _rotary(rope.get(FULL), FULL), _rotary(rope.get(SLIDING), SLIDING)
    overrides = _full_overrides(hf, types)
    full_settings = {"value_from_key": bool(hf.get("attention_k_eq_v"))}
    for key, value in overrides.items():
        own = hf["head_dim"] if key == "head_dim" else hf["num_key_value_heads"]
        if value != own:
            full_settings[key] = value
    shared = int(hf.get("num_kv_shared_layers") or 0)
    per_layer = hf.get("hidden_size_per_layer_input") or None
    vocab = hf["vocab_size"]
    cap = hf.get("final_logit_softcapping")
    moe = None
    if hf.get("enable_moe_block"):
        moe = dict(
            num_experts=hf["num_experts"],
            num_experts_per_token=hf["top_k_experts"],
            expert_intermediate_dim=hf["moe_intermediate_size"],
            router_aux_loss_coef=0.0,
            router_input_norm=True,
            dense_alongside=True,
        )
    return dict(
        vocabulary_size=vocab,
        num_layers=layers,
        hidden_dim=hf["hidden_size"],
        num_heads=hf["num_attention_heads"],
        num_kv_heads=hf["num_key_value_heads"],
        head_dim=hf["head_dim"],
        intermediate_dim=hf["intermediate_size"],
        max_sequence_length=hf["max_position_embeddings"],
        norm_position="sandwich",
        norm_type="rms",
        norm_epsilon=float(hf["rms_norm_eps"]),
        position_embedding="rotary",
        **full,
        activation=ACTIVATIONS[hf["hidden_activation"]],
        gated_feed_forward=True,
        use_bias=False,
        qk_norm=True,
        value_norm=True,
        scale_embeddings=True,
        attention_scale=1.0,
        sliding_window=hf["sliding_window"] if SLIDING in types else None,
        layer_types=types,
        layer_settings={SLIDING: sliding, FULL: full_settings},
        logit_softcap=None if cap is None else float(cap),
        num_kv_shared_layers=shared,
        kv_shared_intermediate_dim=(
            2 * hf["intermediate_size"]
            if shared and hf.get("use_double_wide_mlp")
            else None
        ),
        per_layer_input_dim=per_layer,
        per_layer_vocabulary_size=(
            hf["vocab_size_per_layer_input"] if per_layer else None
        ),
        layer_output_scale=True,
        moe=moe,
        tie_embeddings=bool(hf["tie_word_embeddings"]),
        dropout=0.0,
        attention_dropout=float(hf.get("attention_dropout") or 0.0),
        initializer_range=float(hf.get("initializer_range", 0.02)),
        **special_ids(hf, vocab),
    )


def _hf_rope(theta, scaling) -> dict:
    rope = {"rope_type": "default", "rope_theta": float(theta)}
    return {**rope, **(scaling or {})}


def hf_config(config) -> dict:
    """The HF `config.json` dict (without `architectures`) for `config`.

    Raises:
        ValueError: a field Gemma 4 cannot represent, named.
    """
    required = dict(
        DECODER,
        norm_position="sandwich",
        scale_embeddings=True,
        sliding_window=config.sliding_window,
        layer_types=config.layer_types,
        layer_settings=config.layer_settings,
        attention_scale=1.0,
        logit_softcap=config.logit_softcap,
        qk_norm=True,
        value_norm=True,
        layer_output_scale=True,
        num_kv_shared_layers=config.num_kv_shared_layers,
        kv_shared_intermediate_dim=config.kv_shared_intermediate_dim,
        per_layer_input_dim=config.per_layer_input_dim,
        per_layer_vocabulary_size=config.per_layer_vocabulary_size,
        norm_type="rms",
        position_embedding="rotary",
        gated_feed_forward=True,
        use_bias=False,
    )
    moe = config.moe
    if moe is not None:
        required["moe"] = MoEConfig(
            num_experts=moe.num_experts,
            num_experts_per_token=moe.num_experts_per_token,
            expert_intermediate_dim=moe.expert_intermediate_dim,
            router_aux_loss_coef=moe.router_aux_loss_coef,
            router_z_loss_coef=moe.router_z_loss_coef,
            router_jitter=moe.router_jitter,
            capacity_factor=moe.capacity_factor,
            dispatch=moe.dispatch,
            router_input_norm=True,
            dense_alongside=True,
        )
    check_exportable(config, required, MODEL_TYPE)
    types = list(config.layer_types or [FULL] * config.num_layers)
    settings = config.layer_settings or {}
    sliding, full = settings.get(SLIDING, {}), settings.get(FULL, {})
    double = config.kv_shared_intermediate_dim
    if double not in (None, 2 * config.intermediate_dim) or types[-1] != FULL:
        raise ValueError(
            f"This model cannot be exported as Hugging Face {MODEL_TYPE!r}: it needs "
            "kv_shared_intermediate_dim None or 2 * intermediate_dim and a last "
            "layer of type 'full_attention'."
        )
    head_dim = config.resolved_head_dim
    return {
        "model_type": MODEL_TYPE,
        "vocab_size": config.vocabulary_size,
        "hidden_size": config.hidden_dim,
        "intermediate_size": config.intermediate_dim,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.resolved_num_kv_heads,
        "head_dim": head_dim,
        "global_head_dim": full.get("head_dim", head_dim),
        "num_global_key_value_heads": full.get("num_kv_heads"),
        "attention_k_eq_v": bool(full.get("value_from_key", False)),
        "hidden_activation": {v: k for k, v in ACTIVATIONS.items()}[config.activation],
        "max_position_embeddings": config.max_sequence_length,
        "rms_norm_eps": config.norm_epsilon,
        "rope_parameters": {
            FULL: _hf_rope(config.rope_max_wavelength, config.rope_scaling),
            SLIDING: _hf_rope(
                sliding.get("rope_max_wavelength", config.rope_max_wavelength),
                sliding.get("rope_scaling"),
            ),
        },
        "sliding_window": config.sliding_window or DEFAULTS["sliding_window"],
        "layer_types": types,
        "final_logit_softcapping": config.logit_softcap,
        "attention_bias": False,
        "attention_dropout": config.attention_dropout,
        "num_kv_shared_layers": config.num_kv_shared_layers,
        "use_double_wide_mlp": double is not None,
        "hidden_size_per_layer_input": config.per_layer_input_dim or 0,
        "vocab_size_per_layer_input": config.per_layer_vocabulary_size
        or config.vocabulary_size,
        "enable_moe_block": moe is not None,
        "num_experts": moe and moe.num_experts,
        "top_k_experts": moe and moe.num_experts_per_token,
        "moe_intermediate_size": moe and moe.expert_intermediate_dim,
        "initializer_range": config.initializer_range,
        "tie_word_embeddings": config.tie_embeddings,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "pad_token_id": config.pad_token_id,
    }


def exports(config) -> bool:
    """Whether a config of this family with no `model_type` asked for
    exports as gemma4_text: value norms or per-layer constant scales."""
    return bool(config.value_norm and config.layer_output_scale)


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
        export_order=5,  # before gemma3's (10): registry.export_converter
        sequence_classifier=False,  # transformers has none for Gemma 4
    )
)

__all__ = ["config_from_hf", "export_weights", "hf_config", "load_weights"]
