"""Hugging Face Qwen3.5 (`model_type: "qwen3_5_text"`, and the text model
of a `"qwen3_5"` checkpoint) <-> `GPTBackbone`.

A Qwen3.5 stack mixes two layer types (`layer_types`; without them every
`full_attention_interval`-th layer, 4 by default, is full attention):

- "linear_attention": a Gated DeltaNet (`keras_transformers.layers.
  GatedDeltaNet`, the config's `linear_attention` group) under
  `linear_attn.`: `in_proj_qkv` `[C, D]` -> `qkv`, `in_proj_z` -> the
  output gate, `in_proj_b` -> `beta`, `in_proj_a` -> `decay`,
  `conv1d.weight` `[C, 1, K]` -> `conv_kernel` `[K, C]`, `dt_bias`,
  `A_log` -> `a_log`, `norm` (the gated RMSNorm, a plain scale) and
  `out_proj`;
- "full_attention": Qwen3's attention (per-head `q_norm` / `k_norm`, no
  biases, a quarter of each head rotating: `partial_rotary_factor`) with
  an output gate (`attention_output_gate`): `q_proj` `[N * 2H, D]` holds,
  per head, the query's H rows then the gate's H rows.

Every other RMSNorm (the blocks', the final one, `q_norm`, `k_norm`)
computes `x * (1 + w)`: the checkpoint stores offsets from 1, as Gemma's
(loading adds 1, export subtracts it). Positions are text positions:
the multimodal rotary sections (`mrope_section`) then all read the same
position, which is plain rotary.

A `"qwen3_5"` checkpoint (`Qwen3_5ForConditionalGeneration`) nests the
text model's config under `text_config` and its tensors under
`model.language_model.`: the text model loads from it (a causal LM; the
vision tower's tensors are reported unused) and exports as
`"qwen3_5_text"`; vision inputs are not supported.
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np

from keras_transformers.convert import llama
from keras_transformers.convert.common import (
    assign,
    attention_parts,
    export_head,
    export_layer,
    fetch,
    load_head,
    load_layer,
)
from keras_transformers.convert.protocol import decoder
from keras_transformers.layers.gated_deltanet import GatedDeltaNet
from keras_transformers.registry import register_converter

MODEL_TYPE = "qwen3_5_text"
WRAPPER_TYPE = "qwen3_5"
NAME = "Qwen3.5"
BASE_ARCHITECTURE = "Qwen3_5TextModel"
ARCHITECTURE = "Qwen3_5ForCausalLM"
PREFIXES = ("model.language_model.", *llama.PREFIXES)
PROBE = llama.PROBE
# Qwen3_5TextConfig's defaults where they differ from Llama's.
DEFAULTS = dict(
    vocab_size=248320,
    hidden_size=4096,
    intermediate_size=12288,
    num_hidden_layers=32,
    num_attention_heads=16,
    num_key_value_heads=4,
    head_dim=256,
    max_position_embeddings=32768,
    tie_word_embeddings=False,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_num_key_heads=16,
    linear_num_value_heads=32,
    full_attention_interval=4,
)
QWEN_TYPES = ("linear_attention", "full_attention")
# The gate half of `q_proj` (a name of ours, split from / merged into it).
GATE = "self_attn.q_gate"


def text_config(hf: dict, name: str = NAME) -> dict:
    """The text model's config dict: `hf` itself, or the `text_config` a
    multimodal checkpoint nests (with its `tie_word_embeddings`)."""
    nested = hf.get("text_config")
    if nested is None:
        return hf
    if not isinstance(nested, dict):
        raise ValueError(f"{name} config's text_config must be a dict: {nested!r}.")
    tie = {k: hf[k] for k in ("tie_word_embeddings",) if k in hf}
    return {**tie, **nested}


def layer_types(hf: dict, name: str = NAME) -> list[str]:
    """Each layer's type, derived from `full_attention_interval` as
    transformers does when the file has none."""
    layers, interval = hf["num_hidden_layers"], hf["full_attention_interval"]
    types = hf.get("layer_types") or [
        "full_attention" if (i + 1) % interval == 0 else "linear_attention"
        for i in range(layers)
    ]
    if len(types) != layers or any(kind not in QWEN_TYPES for kind in types):
        raise ValueError(
            f"{name} config has layer_types={types}: expected {layers} entries "
            f"(num_hidden_layers), each one of {QWEN_TYPES}."
        )
    return list(types)


def _rotary_fraction(hf: dict) -> float:
    """`partial_rotary_factor` (0.25 when the file has none, as
    Qwen3_5TextConfig sets it)."""
    for params in (hf.get("rope_parameters") or {}, hf.get("rope_scaling") or {}, hf):
        if params.get("partial_rotary_factor") is not None:
            return float(params["partial_rotary_factor"])
    return 0.25


def attention_fields(hf: dict, name: str, defaults: dict) -> dict:
    """The TransformerConfig fields a Qwen3.5 text config (dense or MoE)
    shares: Llama's, with q/k norms, the output gate, partial rotary, the
    layer types and the Gated DeltaNet group.

    Raises:
        ValueError: an option we cannot reproduce (`attention_bias`, an
            activation other than silu, an unknown layer type, rope scaling
            other than linear, llama3, yarn or longrope).
    """
    hf = {**defaults, **hf}
    if hf.get("attention_bias", False):
        raise ValueError(
            f"{name} config has attention_bias=True (biases on the q, k, v and o "
            "projections), which keras_transformers cannot represent; only "
            "attention_bias=false converts."
        )
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(
            f"{name} hidden_act={hf['hidden_act']!r} is not supported; only 'silu' "
            "(the feed-forward and the Gated DeltaNet's convolution)."
        )
    types = layer_types(hf, name)
    fraction = _rotary_fraction(hf)
    forced = dict(mlp_bias=False, partial_rotary_factor=fraction)
    fields = llama.derived_config(hf, name, {}, **forced)
    linear = dict(
        num_key_heads=hf["linear_num_key_heads"],
        num_value_heads=hf["linear_num_value_heads"],
        key_head_dim=hf["linear_key_head_dim"],
        value_head_dim=hf["linear_value_head_dim"],
        conv_kernel_size=hf["linear_conv_kernel_dim"],
    )
    return {
        **fields,
        "rotary_fraction": fraction,
        "qk_norm": True,
        "attention_output_gate": True,
        "layer_types": types,
        "linear_attention": linear if "linear_attention" in types else None,
    }


def config_from_hf(hf: dict) -> dict:
    """TransformerConfig fields for an HF Qwen3.5 `config.json` dict (the
    text model's, or a multimodal one's `text_config`); see
    `attention_fields` for what raises."""
    return attention_fields(text_config(hf), NAME, DEFAULTS)


def _is_offset_norm(name: str) -> bool:
    """A `x * (1 + w)` norm weight (all but the Gated DeltaNet's)."""
    return name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight")


class _View:
    """A `Checkpoint` in our layout: offset norms read as `1 + w` (float32),
    `q_proj` as its query rows and `self_attn.q_gate` as its gate rows
    (`head_dim` rows each, alternating per head)."""

    def __init__(self, checkpoint, head_dim: int) -> None:
        self._checkpoint, self._head_dim = checkpoint, head_dim

    def __getattr__(self, name):
        return getattr(self._checkpoint, name)

    def __contains__(self, name: str) -> bool:
        return name in self._checkpoint

    def get(self, name: str) -> np.ndarray:
        for part, half in (("self_attn.q_proj.", 0), (GATE + ".", 1)):
            if part in name:
                stored = name.replace(GATE, "self_attn.q_proj")
                value = self._checkpoint.get(stored)  # [N * 2H, D]
                heads = value.reshape(-1, 2, self._head_dim, value.shape[-1])
                return heads[:, half].reshape(-1, value.shape[-1])
        value = self._checkpoint.get(name)
        return value.astype(np.float32) + 1.0 if _is_offset_norm(name) else value


def _entries(block) -> list:
    """(layer or variable, HF name under `layers.{i}.`, kernel shape,
    transposed) of a block's token mixer and norms: the two-way map."""
    mixer = block.self_attention
    if isinstance(mixer, GatedDeltaNet):
        taps = (mixer.conv_kernel_size, 1, mixer.conv_dim)
        out = [
            (mixer.qkv_dense, "linear_attn.in_proj_qkv", None, True),
            (mixer.gate_dense, "linear_attn.in_proj_z", None, True),
            (mixer.beta_dense, "linear_attn.in_proj_b", None, True),
            (mixer.decay_dense, "linear_attn.in_proj_a", None, True),
            (mixer.conv_kernel, "linear_attn.conv1d.weight", taps, True),
            (mixer.dt_bias, "linear_attn.dt_bias", None, False),
            (mixer.a_log, "linear_attn.A_log", None, False),
            (mixer.norm, "linear_attn.norm", None, False),
            (mixer.output_dense, "linear_attn.out_proj", None, True),
        ]
    else:
        out = [
            (layer, f"self_attn.{llama.ATTENTION[role]}", shape, True)
            for role, (layer, shape) in attention_parts(mixer).items()
        ]
        out.append((mixer.gate_dense, GATE, attention_parts(mixer)["query"][1], True))
        out.append((mixer.query_norm, "self_attn.q_norm", None, False))
        out.append((mixer.key_norm, "self_attn.k_norm", None, False))
    out.append((block.self_attention_norm, "input_layernorm", None, False))
    out.append((block.feed_forward_norm, "post_attention_layernorm", None, False))
    return out


def _dense_mlp(block, checkpoint, prefix: str) -> None:
    llama.load_mlp(block.feed_forward, checkpoint, prefix + "mlp")


def _export_dense_mlp(out: dict, block, prefix: str) -> None:
    llama.export_mlp(out, block.feed_forward, prefix + "mlp")


def load_weights(
    backbone,
    checkpoint,
    require_head: bool,
    model_type: str = MODEL_TYPE,
    feed_forward=_dense_mlp,
) -> None:
    """Copies a Qwen3.5 checkpoint into `backbone`; `feed_forward(block,
    checkpoint, "...layers.{i}.")` loads each block's feed-forward (the
    MoE type passes its experts)."""
    view = _View(checkpoint, backbone.config.resolved_head_dim)
    p = checkpoint.prefix(PREFIXES, PROBE, model_type)
    name = p + "embed_tokens.weight"
    assign(backbone.token_embedding.embeddings, view.get(name), name)
    for i, block in enumerate(backbone.blocks):
        for target, hf_name, shape, transpose in _entries(block):
            full = f"{p}layers.{i}.{hf_name}"
            if isinstance(target, keras.Variable):
                assign(target, view.get(full), full, shape=shape, transpose=transpose)
            else:
                load_layer(target, view.get, full, shape=shape, transpose=transpose)
        feed_forward(block, view, f"{p}layers.{i}.")
    load_layer(backbone.final_norm, view.get, p + "norm")
    load_head(backbone.token_embedding, view, require_head)


def export_weights(backbone, feed_forward=_export_dense_mlp) -> dict[str, np.ndarray]:
    """The backbone's weights under Qwen3_5ForCausalLM names (inverse of
    `load_weights`: the gate merged back into `q_proj`, offset norms)."""
    p, out = "model.", {}
    out[p + "embed_tokens.weight"] = fetch(backbone.token_embedding.embeddings)
    head_dim = backbone.config.resolved_head_dim
    for i, block in enumerate(backbone.blocks):
        prefix = f"{p}layers.{i}."
        for target, hf_name, shape, transpose in _entries(block):
            name = prefix + hf_name
            if isinstance(target, keras.Variable):
                out[name] = fetch(target, shape=shape, transpose=transpose)
            else:
                export_layer(out, target, name, shape=shape, transpose=transpose)
        gate = out.pop(prefix + GATE + ".weight", None)
        if gate is not None:  # [N * H, D] each -> [N * 2H, D], per head
            query = out[prefix + "self_attn.q_proj.weight"]
            d = query.shape[-1]
            both = [x.reshape(-1, 1, head_dim, d) for x in (query, gate)]
            merged = np.concatenate(both, axis=1).reshape(-1, d)
            out[prefix + "self_attn.q_proj.weight"] = merged
        feed_forward(out, block, prefix)
    export_layer(out, backbone.final_norm, p + "norm")
    export_head(out, backbone.token_embedding)
    return {k: v - 1.0 if _is_offset_norm(k) else v for k, v in out.items()}


def text_hf_config(config, model_type: str, **allowed) -> dict:
    """The HF `config.json` keys a Qwen3.5 text type shares (Llama's, the
    layer types, partial rotary and the Gated DeltaNet's), for `config`."""
    linear = config.linear_attention
    hf = llama.hf_config(
        config,
        model_type,
        use_bias=False,
        qk_norm=True,
        rotary_fraction=config.rotary_fraction,
        attention_output_gate=True,
        layer_types=config.layer_types,
        linear_attention=linear,
        **allowed,
    )
    if not config.layer_types or set(config.layer_types) - set(QWEN_TYPES):
        raise ValueError(
            f"This model cannot be exported as Hugging Face {model_type!r}: its "
            f"layer_types={config.layer_types} must be 'linear_attention' and "
            "'full_attention' entries."
        )
    del hf["mlp_bias"], hf["rope_theta"], hf["rope_scaling"]
    return hf


def hf_config(config) -> dict:
    """The HF `config.json` dict (without `architectures`) for `config`."""
    return {**text_hf_config(config, MODEL_TYPE), **linear_keys(config)}


def linear_keys(config) -> dict:
    """The `linear_*` keys and `layer_types` of `config`."""
    group = config.linear_attention
    keys = {"layer_types": list(config.layer_types)}
    if group is None:
        return keys
    return {
        **keys,
        "linear_num_key_heads": group.num_key_heads,
        "linear_num_value_heads": group.num_value_heads,
        "linear_key_head_dim": group.key_head_dim,
        "linear_value_head_dim": group.value_head_dim,
        "linear_conv_kernel_dim": group.conv_kernel_size,
    }


def exports(config) -> bool:
    """Whether a config of this family with no `model_type` asked for
    exports as qwen3_5_text: gated attention (with Gated DeltaNet layers)."""
    return bool(config.attention_output_gate)


def _refuse_wrapper(model, model_type: str) -> tuple:
    raise ValueError(
        f"Exporting as Hugging Face {WRAPPER_TYPE!r} (Qwen3_5ForConditionalGeneration) "
        "needs its vision tower, and vision parts are not supported by "
        f"keras_transformers: export the text model as {MODEL_TYPE!r} "
        f"({ARCHITECTURE}, which transformers loads), e.g. "
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
        export_order=2,  # before phi3 (partial rotary), qwen3 (q/k norms), ...
    )
)
# The multimodal checkpoint type: its text model loads; exporting it fails.
WRAPPER = register_converter(
    dataclasses.replace(
        CONVERTER.as_type(WRAPPER_TYPE), export=_refuse_wrapper, exports=None
    )
)

__all__ = ["config_from_hf", "export_weights", "hf_config", "load_weights"]
