"""Hugging Face Gemma 2 (`model_type: "gemma2"`) <-> `GPTBackbone`.

Gemma's layout (`keras_transformers.convert.gemma`: scaled embeddings,
GeGLU, norm weights stored as offsets from 1) with, per block, a norm
before and after each sub-layer (`norm_position="sandwich"`:
`input_layernorm`, `post_attention_layernorm`, `pre_feedforward_layernorm`,
`post_feedforward_layernorm`), and:

- `layer_types`: sliding-window attention (`sliding_window`) on even
  layers, full attention on odd ones, unless the config lists them;
- `query_pre_attn_scalar` -> `attention_scale = query_pre_attn_scalar**-0.5`;
- `attn_logit_softcapping` -> `attention_softcap`, `final_logit_softcapping`
  -> `logit_softcap` (`cap * tanh(x / cap)`; null: none).
"""

from __future__ import annotations

from keras_transformers.convert import gemma, llama
from keras_transformers.convert.protocol import decoder
from keras_transformers.registry import register_converter

MODEL_TYPE = "gemma2"
NAME = "Gemma2"
BASE_ARCHITECTURE = "Gemma2Model"
ARCHITECTURE = "Gemma2ForCausalLM"
PREFIXES = llama.PREFIXES
PROBE = llama.PROBE
# Gemma2Config's defaults.
DEFAULTS = dict(
    vocab_size=256000,
    hidden_size=2304,
    intermediate_size=9216,
    num_hidden_layers=26,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=256,
    max_position_embeddings=8192,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    bos_token_id=2,
    eos_token_id=1,
    pad_token_id=0,
    query_pre_attn_scalar=256,
    sliding_window=4096,
    attn_logit_softcapping=50.0,
    final_logit_softcapping=30.0,
)


def alternating(num_layers: int, every: int) -> list[str]:
    """Transformers' default layer types: every `every`-th layer (1-based)
    full attention, the others sliding."""
    full, sliding = "full_attention", "sliding_attention"
    return [sliding if (i + 1) % every else full for i in range(num_layers)]


def sandwich_fields(hf: dict, name: str, rope_keys=None, every: int = 2) -> dict:
    """The TransformerConfig fields of a Gemma 2 / 3 text `config.json`
    (defaults filled in); `rope_keys` replaces its rotary keys (Gemma 3's
    per-type rotaries), `every` spaces its default full-attention layers."""
    flat = {**hf, **(rope_keys or {})}
    try:
        fields = gemma.config_from_hf(flat)
    except ValueError as error:
        raise ValueError(str(error).replace("Gemma", name, 1)) from None
    layers = fields["num_layers"]
    types = hf.get("layer_types") or alternating(layers, every)
    if len(types) != layers:
        raise ValueError(
            f"{name} config has {len(types)} layer_types for num_hidden_layers="
            f"{layers}; list one type per layer."
        )
    window = hf.get("sliding_window")
    return {
        **fields,
        "norm_position": "sandwich",
        "attention_scale": float(hf["query_pre_attn_scalar"]) ** -0.5,
        "sliding_window": window if "sliding_attention" in types else None,
        "layer_types": list(types),
    }


def config_from_hf(hf: dict) -> dict:
    """TransformerConfig fields for an HF Gemma 2 `config.json` dict.

    Raises:
        ValueError: an option we cannot reproduce (Gemma's, see
            `keras_transformers.convert.gemma`), or layer types that do not
            match the layer count.
    """
    hf = {**DEFAULTS, **hf}
    return {
        **sandwich_fields(hf, NAME),
        "attention_softcap": _cap(hf.get("attn_logit_softcapping")),
        "logit_softcap": _cap(hf.get("final_logit_softcapping")),
    }


def _cap(value):
    return None if value is None else float(value)


def load_weights(backbone, checkpoint, require_head: bool) -> None:
    """Copies a Gemma 2 checkpoint into `backbone` (a `GPTBackbone`)."""
    llama.load_weights(
        backbone, gemma.OffsetNorms(checkpoint), require_head, model_type=MODEL_TYPE
    )


def export_weights(backbone):
    """The backbone's weights under Gemma2ForCausalLM names."""
    return gemma.export_weights(backbone)


def sandwich_hf_config(config, model_type: str, **allowed) -> dict:
    """The `config.json` keys shared by Gemma 2 and 3 for `config`."""
    hf = llama.hf_config(
        config,
        model_type,
        activation="gelu_approximate",
        scale_embeddings=True,
        use_bias=False,
        norm_position="sandwich",
        sliding_window=config.sliding_window,
        layer_types=config.layer_types,
        attention_scale=config.attention_scale,
        **allowed,
    )
    del hf["mlp_bias"]
    scale = config.attention_scale or config.resolved_head_dim**-0.5
    scalar = round(scale**-2, 6)
    return {
        **hf,
        "hidden_act": gemma.GELU_TANH[0],
        "hidden_activation": gemma.GELU_TANH[0],
        "query_pre_attn_scalar": int(scalar) if scalar.is_integer() else scalar,
        "sliding_window": config.sliding_window,
        "layer_types": list(config.layer_types or alternating(config.num_layers, 2)),
    }


def hf_config(config) -> dict:
    """The HF `config.json` dict (without `architectures`) for `config`."""
    hf = sandwich_hf_config(
        config,
        MODEL_TYPE,
        attention_softcap=config.attention_softcap,
        logit_softcap=config.logit_softcap,
    )
    return {
        **hf,
        "attn_logit_softcapping": config.attention_softcap,
        "final_logit_softcapping": config.logit_softcap,
    }


def exports(config) -> bool:
    """Whether a config of this family with no `model_type` asked for
    exports as gemma2: sandwich norms."""
    return bool(config.norm_position == "sandwich")


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
    )
)

__all__ = ["config_from_hf", "export_weights", "hf_config", "load_weights"]
