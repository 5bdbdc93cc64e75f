"""Hugging Face Gemma 3 text (`model_type: "gemma3_text"`) <-> `GPTBackbone`.

Gemma 2's layout (`keras_transformers.convert.gemma2`: sandwich norms,
`query_pre_attn_scalar`, sliding and full layers) with:

- `q_norm` / `k_norm` per head (`qk_norm`; Gemma norms, offsets from 1);
- a rotary per layer type: full-attention layers use `rope_theta` (1e6)
  and the checkpoint's `rope_scaling` (linear x8 for 4B and up), sliding
  layers `rope_local_base_freq` (1e4), unscaled: the config's own rotary
  fields and `layer_settings["sliding_attention"]`. transformers 5 writes
  them as `rope_parameters` keyed by layer type; both layouts load;
- five sliding layers to one full by default (`sliding_window_pattern`);
- no soft-capping (transformers' Gemma 3 ignores `attn_logit_softcapping`).

`use_bidirectional_attention` (EmbeddingGemma) is refused.
"""

from __future__ import annotations

from keras_transformers.convert import gemma, gemma2, llama
from keras_transformers.convert.protocol import decoder
from keras_transformers.registry import register_converter

MODEL_TYPE = "gemma3_text"
NAME = "Gemma3"
BASE_ARCHITECTURE = "Gemma3TextModel"
ARCHITECTURE = "Gemma3ForCausalLM"
PREFIXES = llama.PREFIXES
PROBE = llama.PROBE
# Gemma3TextConfig's defaults.
DEFAULTS = {
    **gemma2.DEFAULTS,
    "vocab_size": 262208,
    "max_position_embeddings": 131072,
    "attn_logit_softcapping": None,
    "final_logit_softcapping": None,
}
THETAS = {"full_attention": 1e6, "sliding_attention": 1e4}


def _rope_by_type(hf: dict) -> dict:
    """`{layer type: flat rope_parameters}` from either layout."""
    params = hf.get("rope_parameters") or {}
    if set(params) & set(THETAS):  # transformers 5: keyed by layer type
        by_type = {kind: dict(params.get(kind) or {}) for kind in THETAS}
    else:  # the hub's: rope_theta, rope_local_base_freq, rope_scaling
        full = {**params, **(hf.get("rope_scaling") or {})}
        if "rope_theta" in hf:
            full["rope_theta"] = hf["rope_theta"]
        sliding = {
            "rope_theta": hf.get("rope_local_base_freq", THETAS["sliding_attention"])
        }
        by_type = {"full_attention": full, "sliding_attention": sliding}
    for kind, theta in THETAS.items():
        by_type[kind].setdefault("rope_theta", theta)
        by_type[kind].setdefault("rope_type", "default")
    return by_type


def config_from_hf(hf: dict) -> dict:
    """TransformerConfig fields for an HF Gemma 3 text `config.json` dict.

    Raises:
        ValueError: an option we cannot reproduce (Gemma's, see
            `keras_transformers.convert.gemma`; a rope scaling we lack), or
            layer types that do not match the layer count.
    """
    hf = {**DEFAULTS, **hf}
    rope = _rope_by_type(hf)
    plain = dict(rope_scaling=None, rope_theta=None)
    fields = gemma2.sandwich_fields(
        hf,
        NAME,
        {**plain, "rope_parameters": rope["full_attention"]},
        every=hf.get("sliding_window_pattern", 6),
    )
    head_dim = fields["head_dim"] or fields["hidden_dim"] // fields["num_heads"]
    try:
        local = llama.rope_fields(
            {"rope_parameters": rope["sliding_attention"]}, head_dim
        )
    except ValueError as error:
        raise ValueError(str(error).replace("Llama", NAME)) from None
    keys = ("rope_max_wavelength", "rope_scaling_factor", "rope_scaling")
    settings = dict(zip(keys, local))
    return {
        **fields,
        "qk_norm": True,
        "layer_settings": {"sliding_attention": settings},
    }


def load_weights(backbone, checkpoint, require_head: bool) -> None:
    """Copies a Gemma 3 text checkpoint into `backbone` (a `GPTBackbone`)."""
    llama.load_weights(
        backbone, gemma.OffsetNorms(checkpoint), require_head, model_type=MODEL_TYPE
    )


def export_weights(backbone):
    """The backbone's weights under Gemma3ForCausalLM names."""
    return gemma.export_weights(backbone)


def hf_config(config) -> dict:
    """The HF `config.json` dict (without `architectures`) for `config`."""
    settings = (config.layer_settings or {}).get("sliding_attention", {})
    hf = gemma2.sandwich_hf_config(
        config, MODEL_TYPE, qk_norm=True, layer_settings=config.layer_settings
    )
    _, full = llama.hf_rope(
        config.rope_max_wavelength, config.rope_scaling_factor, config.rope_scaling
    )
    _, sliding = llama.hf_rope(
        settings.get("rope_max_wavelength", config.rope_max_wavelength),
        settings.get("rope_scaling_factor", 1.0),
        settings.get("rope_scaling"),
    )
    for key in ("rope_theta", "rope_scaling"):
        del hf[key]
    return {
        **hf,
        "rope_parameters": {"full_attention": full, "sliding_attention": sliding},
        "attn_logit_softcapping": None,
        "final_logit_softcapping": None,
        "use_bidirectional_attention": False,
    }


def exports(config) -> bool:
    """Whether a config of this family with no `model_type` asked for
    exports as gemma3: sandwich norms with q/k norms."""
    return bool(config.norm_position == "sandwich" and config.qk_norm)


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
    )
)

__all__ = ["config_from_hf", "export_weights", "hf_config", "load_weights"]
