"""Hugging Face Llama (`model_type: "llama"`) <-> `GPTBackbone`.

PyTorch `Linear` weights are `[out, in]`; ours are `[in, out]` (split into
heads for attention). Both use the rotate-half rotary layout, so no
permutation of the query / key rows is needed.
"""

from __future__ import annotations

import numpy as np

from keras_transformers.convert.common import (
    DECODER,
    assign,
    attention_parts,
    check_exportable,
    export_head,
    export_layer,
    fetch,
    load_head,
    load_layer,
    special_ids,
)
from keras_transformers.convert.protocol import decoder
from keras_transformers.registry import register_converter
from keras_transformers.rotary_scaling import rope_type, rotary_frequencies

MODEL_TYPE = "llama"
BASE_ARCHITECTURE = "LlamaModel"
ARCHITECTURE = "LlamaForCausalLM"
PREFIXES = ("model.", "")
# The tensor (under one of PREFIXES) that marks a checkpoint of this type.
PROBE = "embed_tokens.weight"
ATTENTION = {"query": "q_proj", "key": "k_proj", "value": "v_proj", "output": "o_proj"}
MLP = {"gate_dense": "gate_proj", "inner_dense": "up_proj", "output_dense": "down_proj"}


def _rope(hf: dict) -> tuple[float, float, dict | None]:
    """(theta, linear scaling factor, long-context scaling dict or None) from
    either config layout: transformers 5 `rope_parameters`, or the older
    top-level `rope_theta` + `rope_scaling`. YaRN and LongRoPE get their
    `factor` written out where the checkpoint derives it from
    `max_position_embeddings`."""
    # transformers reads `rope_scaling` first where both are present.
    params = dict(hf.get("rope_scaling") or hf.get("rope_parameters") or {})
    kind = params.pop("rope_type", params.pop("type", "default"))
    params.pop("type", None)
    params.pop("partial_rotary_factor", None)  # see `rotary_fraction`
    default = (hf.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    theta = params.pop("rope_theta", hf.get("rope_theta", default))
    if kind == "default":
        return float(theta), 1.0, None
    if kind == "linear":
        return float(theta), float(params["factor"]), None
    rope_type({"rope_type": kind})  # names the supported types
    original = params.get("original_max_position_embeddings")
    if original is None and hf.get("original_max_position_embeddings"):  # Phi-3
        original = params["original_max_position_embeddings"] = hf[
            "original_max_position_embeddings"
        ]
    if kind in ("yarn", "longrope") and params.get("factor") is None and original:
        params["factor"] = hf.get("max_position_embeddings", 2048) / original
    if kind == "dynamic":  # transformers stretches past max_position_embeddings
        params["original_max_position_embeddings"] = hf.get(
            "max_position_embeddings", 2048
        )
    return float(theta), 1.0, {"rope_type": kind, **params}


def rotary_fraction(hf: dict) -> float:
    """`partial_rotary_factor` of either layout (the rotary dict, or the
    top level); 1.0 when absent."""
    for params in (hf.get("rope_scaling") or {}, hf.get("rope_parameters") or {}, hf):
        if params.get("partial_rotary_factor") is not None:
            return float(params["partial_rotary_factor"])
    return 1.0


def rope_fields(hf: dict, head_dim: int) -> tuple[float, float, dict | None]:
    """`(rope_max_wavelength, rope_scaling_factor, rope_scaling)` of a
    config dict's rotary keys (either layout), checked for `head_dim`.

    Raises:
        ValueError: a scaling type we lack, or one without its fields.
    """
    try:
        theta, factor, scaling = _rope(hf)
        rotary_frequencies(int(head_dim * rotary_fraction(hf)), theta, scaling)
    except (ValueError, KeyError) as error:
        raise ValueError(f"Llama config's rope_scaling is invalid: {error}") from None
    return theta, factor, scaling


def config_from_hf(hf: dict) -> dict:
    """TransformerConfig fields for an HF Llama `config.json` dict.

    Raises:
        ValueError: an option we cannot reproduce is set (activation other
            than silu, attention_bias != mlp_bias, a rope scaling other than
            linear, llama3, yarn or longrope, or one without the fields its
            type needs).
    """
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(
            f"Llama hidden_act={hf['hidden_act']!r} is not supported; only 'silu'."
        )
    attention_bias, mlp_bias = (
        bool(hf.get("attention_bias", False)),
        bool(hf.get("mlp_bias", False)),
    )
    if attention_bias != mlp_bias:
        raise ValueError(
            f"Llama config has attention_bias={attention_bias} but mlp_bias={mlp_bias}; "
            "keras_transformers has one `use_bias` for both, so they must be equal."
        )
    hidden, heads = hf.get("hidden_size", 4096), hf.get("num_attention_heads", 32)
    head_dim = hf.get("head_dim")
    theta, factor, scaling = rope_fields(hf, head_dim or hidden // heads)
    vocab = hf.get("vocab_size", 32000)
    return dict(
        vocabulary_size=vocab,
        num_layers=hf.get("num_hidden_layers", 32),
        hidden_dim=hidden,
        num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=None if head_dim in (None, hidden // heads) else head_dim,
        intermediate_dim=hf.get("intermediate_size", 11008),
        max_sequence_length=hf.get("max_position_embeddings", 2048),
        norm_type="rms",
        norm_epsilon=float(hf.get("rms_norm_eps", 1e-6)),
        position_embedding="rotary",
        rope_max_wavelength=theta,
        rope_scaling_factor=factor,
        rope_scaling=scaling,
        rotary_fraction=rotary_fraction(hf),
        activation="silu",
        gated_feed_forward=True,
        use_bias=attention_bias,
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        dropout=0.0,
        attention_dropout=float(hf.get("attention_dropout", 0.0)),
        initializer_range=float(hf.get("initializer_range", 0.02)),
        **special_ids(hf, vocab),
    )


def derived_config(hf: dict, name: str, defaults: dict, **forced) -> dict:
    """`config_from_hf` for a Llama-layout type: `defaults` (its HF config
    class's defaults) fill missing keys, `forced` HF keys override, and
    errors name model `name` instead of Llama."""
    try:
        return config_from_hf({**defaults, **hf, **forced})
    except ValueError as error:
        raise ValueError(str(error).replace("Llama", name)) from None


def _layers(block):
    """(layer, HF name, kernel shape) of a block's attention and norms
    (with `qk_norm`, the per-head `q_norm` / `k_norm` `[H]` of Qwen3; with
    sandwich norms, Gemma 2's four per block)."""
    attention = block.self_attention
    out = [
        (layer, f"self_attn.{ATTENTION[role]}", shape)
        for role, (layer, shape) in attention_parts(attention).items()
    ]
    if attention.query_norm is not None:
        out.append((attention.query_norm, "self_attn.q_norm", None))
        out.append((attention.key_norm, "self_attn.k_norm", None))
    out.append((block.self_attention_norm, "input_layernorm", None))
    if block.self_attention_post_norm is None:
        out.append((block.feed_forward_norm, "post_attention_layernorm", None))
        return out
    # Sandwich norms (Gemma 2 and 3): a norm before and after each sub-layer.
    out.append((block.self_attention_post_norm, "post_attention_layernorm", None))
    out.append((block.feed_forward_norm, "pre_feedforward_layernorm", None))
    out.append((block.feed_forward_post_norm, "post_feedforward_layernorm", None))
    return out


def load_mlp(feed_forward, checkpoint, name: str) -> None:
    """A gated `FeedForward` from `{name}.gate_proj` / `up_proj` /
    `down_proj` (also Qwen-MoE's dense layers and shared expert)."""
    for attr, hf_name in MLP.items():
        layer = getattr(feed_forward, attr)
        load_layer(layer, checkpoint.get, f"{name}.{hf_name}", transpose=True)


def export_mlp(out: dict, feed_forward, name: str) -> None:
    """Inverse of `load_mlp`."""
    for attr, hf_name in MLP.items():
        layer = getattr(feed_forward, attr)
        export_layer(out, layer, f"{name}.{hf_name}", transpose=True)


def _load_mlp(block, checkpoint, prefix: str) -> None:
    load_mlp(block.feed_forward, checkpoint, prefix + "mlp")


def _export_mlp(out: dict, block, prefix: str) -> None:
    export_mlp(out, block.feed_forward, prefix + "mlp")


def load_weights(
    backbone,
    checkpoint,
    require_head: bool,
    model_type=MODEL_TYPE,
    feed_forward=_load_mlp,
) -> None:
    """Copies a Llama-layout checkpoint into `backbone` (a `GPTBackbone`);
    `feed_forward(block, checkpoint, "...layers.{i}.")` loads each block's
    feed-forward (Mixtral passes its experts)."""
    p = checkpoint.prefix(PREFIXES, PROBE, model_type)
    get = checkpoint.get
    name = p + "embed_tokens.weight"
    assign(backbone.token_embedding.embeddings, get(name), name)
    for i, block in enumerate(backbone.blocks):
        for layer, hf_name, shape in _layers(block):
            linear = "norm" not in hf_name
            load_layer(
                layer, get, f"{p}layers.{i}.{hf_name}", shape=shape, transpose=linear
            )
        feed_forward(block, checkpoint, f"{p}layers.{i}.")
    load_layer(backbone.final_norm, get, p + "norm")
    load_head(backbone.token_embedding, checkpoint, require_head)


def hf_rope(theta, factor, scaling) -> tuple[dict | None, dict]:
    """Our rotary fields (`rope_max_wavelength`, `rope_scaling_factor`,
    `rope_scaling`) as Hugging Face writes them: `(rope_scaling or None,
    the flat rope_parameters with rope_theta)`."""
    if scaling:
        scaling = dict(scaling)
    elif float(factor) != 1.0:
        scaling = {"rope_type": "linear", "factor": float(factor)}
    else:
        scaling = None
    return scaling, {
        "rope_type": "default",
        "rope_theta": float(theta),
        **(scaling or {}),
    }


def hf_config(config, model_type=MODEL_TYPE, **allowed) -> dict:
    """The HF `config.json` dict (without `architectures`) for `config`.

    A Llama-layout type passes its `model_type` and, as `allowed`, the
    fields it needs other than Llama's (e.g. `qk_norm=True`); the caller
    then adds or drops its own keys.
    """
    layout = dict(norm_type="rms", position_embedding="rotary", activation="silu")
    required = {**DECODER, **layout, "gated_feed_forward": True, **allowed}
    check_exportable(config, required, model_type)
    theta = float(config.rope_max_wavelength)
    scaling, rope = hf_rope(theta, config.rope_scaling_factor, config.rope_scaling)
    partial = {}
    if config.rotary_fraction != 1.0:
        partial = {"partial_rotary_factor": config.rotary_fraction}
    positions = config.max_sequence_length
    if (scaling or {}).get("rope_type") == "dynamic":  # its reference length
        positions = scaling["original_max_position_embeddings"]
    return {
        "model_type": model_type,
        "vocab_size": config.vocabulary_size,
        "num_hidden_layers": config.num_layers,
        "hidden_size": config.hidden_dim,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.resolved_num_kv_heads,
        "head_dim": config.resolved_head_dim,
        "intermediate_size": config.intermediate_dim,
        "max_position_embeddings": positions,
        "hidden_act": "silu",
        "rms_norm_eps": config.norm_epsilon,
        # Both layouts: transformers 5 reads `rope_parameters`, 4.x the others.
        "rope_theta": theta,
        "rope_scaling": scaling,
        "rope_parameters": {**rope, **partial},
        "attention_bias": config.use_bias,
        "mlp_bias": config.use_bias,
        "attention_dropout": config.attention_dropout,
        "initializer_range": config.initializer_range,
        "tie_word_embeddings": config.tie_embeddings,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "pad_token_id": config.pad_token_id,
    }


def export_weights(backbone, feed_forward=_export_mlp) -> dict[str, np.ndarray]:
    """The backbone's weights under LlamaForCausalLM names;
    `feed_forward(out, block, "model.layers.{i}.")` writes each block's
    feed-forward (Mixtral passes its experts)."""
    p, out = "model.", {}
    out[p + "embed_tokens.weight"] = fetch(backbone.token_embedding.embeddings)
    for i, block in enumerate(backbone.blocks):
        for layer, hf_name, shape in _layers(block):
            linear = "norm" not in hf_name
            name = f"{p}layers.{i}.{hf_name}"
            export_layer(out, layer, name, shape=shape, transpose=linear)
        feed_forward(out, block, f"{p}layers.{i}.")
    export_layer(out, backbone.final_norm, p + "norm")
    export_head(out, backbone.token_embedding)
    return out


def exports(config) -> bool:
    """Whether a config of this family with no `model_type` asked for
    exports as llama: any other rotary decoder."""
    return True


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
        export_order=100,  # the family's default: registry.export_converter
    )
)
