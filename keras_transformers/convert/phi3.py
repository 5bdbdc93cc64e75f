"""Hugging Face Phi-3 (`model_type: "phi3"`) <-> `GPTBackbone`.

Llama's layout (`keras_transformers.convert.llama`) with fused projections:
`self_attn.qkv_proj.weight` `[(N + 2K) * H, D]` holds the query, key and
value rows in that order, and `mlp.gate_up_proj.weight` `[2F, D]` the gate
then the up rows. Loading splits them into Llama's names; `export_weights`
fuses them again. `sliding_window` (null: full attention) maps to the
config's `sliding_window` (transformers applies it to Phi-3 as to Mistral).
Phi-3 has no biases.

The 128k-context variants' `rope_scaling` of type `longrope` (or `yarn`)
converts (`keras_transformers.rotary_scaling`), and
`partial_rotary_factor` (Phi-4-mini: 0.75) is the config's
`rotary_fraction`. The older type name `su` is refused (a ValueError
names it).

Nothing else in a `TransformerConfig` tells a Phi-3 model from a Llama
one, so `export_hf` writes it as "llama" ("mistral" with a sliding window),
which transformers runs identically, unless it rotates part of each head
(phi3 then); `export_hf(model, path, model_type="phi3")` writes the fused
Phi-3 layout.
"""

from __future__ import annotations

import numpy as np

from keras_transformers.convert import llama
from keras_transformers.convert.protocol import decoder
from keras_transformers.registry import register_converter

MODEL_TYPE = "phi3"
BASE_ARCHITECTURE = "Phi3Model"
ARCHITECTURE = "Phi3ForCausalLM"
PREFIXES = llama.PREFIXES
PROBE = llama.PROBE
# Phi3Config defaults where they differ from Llama's.
DEFAULTS = dict(
    vocab_size=32064,
    hidden_size=3072,
    intermediate_size=8192,
    max_position_embeddings=4096,
    rms_norm_eps=1e-5,
    bos_token_id=1,
    eos_token_id=32000,
    pad_token_id=32000,
    sliding_window=None,
)
NO_BIAS = dict(attention_bias=False, mlp_bias=False)
# Fused tensor -> the Llama tensors it holds, in row order.
FUSED = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}


def _check_rope(hf: dict) -> None:
    """Raises a ValueError naming `rope_scaling` of type `su` in either
    layout (transformers 5 `rope_parameters`, or the hub's top-level
    `rope_scaling`)."""
    for params in (hf.get("rope_parameters") or {}, hf.get("rope_scaling") or {}):
        kind = params.get("rope_type", params.get("type", "default"))
        if kind == "su":
            raise ValueError(
                "Phi3 rope_scaling of type 'su' (the first name of LongRoPE) is not "
                "supported; set its type to 'longrope' (same fields)."
            )


def config_from_hf(hf: dict) -> dict:
    """TransformerConfig fields for an HF Phi-3 `config.json` dict.

    Raises:
        ValueError: an option we cannot reproduce (`rope_scaling` of type
            su, activation other than silu).
    """
    _check_rope(hf)
    fields = llama.derived_config(hf, "Phi3", DEFAULTS, **NO_BIAS)
    return {**fields, "sliding_window": {**DEFAULTS, **hf}["sliding_window"]}


def _rows(config, fused: str) -> list[int]:
    """Row counts of the parts of `fused` (a key of FUSED) for `config`."""
    h = config.resolved_head_dim
    if fused == "self_attn.qkv_proj":
        kv = config.resolved_num_kv_heads * h
        return [config.num_heads * h, kv, kv]
    return [config.intermediate_dim] * 2


class _SplitFused:
    """A `Checkpoint` that also serves Llama's `q_proj` / `k_proj` /
    `v_proj` / `gate_proj` / `up_proj` weights as row blocks of Phi-3's
    fused tensors (the fused tensor read last is kept)."""

    def __init__(self, checkpoint, config) -> None:
        self._checkpoint, self._config = checkpoint, config
        self._last = (None, None)

    def __getattr__(self, name):
        return getattr(self._checkpoint, name)

    def __contains__(self, name: str) -> bool:
        return name in self._checkpoint

    def get(self, name: str) -> np.ndarray:
        for fused, parts in FUSED.items():
            for index, part in enumerate(parts):
                suffix = f"{part}.weight"
                if name.endswith(suffix) and name not in self._checkpoint:
                    return self._part(name[: -len(suffix)], fused, index)
        return self._checkpoint.get(name)

    def _part(self, prefix: str, fused: str, index: int) -> np.ndarray:
        """Part `index` of `{prefix}{fused}.weight` (`[sum(rows), D]`)."""
        name = f"{prefix}{fused}.weight"
        if self._last[0] != name:
            self._last = (name, self._checkpoint.get(name))
        value, rows = self._last[1], _rows(self._config, fused)
        if value.ndim != 2 or value.shape[0] != sum(rows):
            raise ValueError(
                f"Checkpoint weight {name!r} has shape {list(value.shape)}, but "
                f"config.json describes {sum(rows)} rows ({rows}): fix config.json."
            )
        start = sum(rows[:index])
        return value[start : start + rows[index]]


def load_weights(backbone, checkpoint, require_head: bool) -> None:
    """Copies a Phi-3 checkpoint into `backbone` (a `GPTBackbone`)."""
    view = _SplitFused(checkpoint, backbone.config)
    llama.load_weights(backbone, view, require_head, model_type=MODEL_TYPE)


def export_weights(backbone) -> dict[str, np.ndarray]:
    """The backbone's weights under Phi3ForCausalLM names (fused
    `qkv_proj` and `gate_up_proj`)."""
    out = llama.export_weights(backbone)
    for i in range(len(backbone.blocks)):
        p = f"model.layers.{i}."
        for fused, parts in FUSED.items():
            blocks = [out.pop(f"{p}{part}.weight") for part in parts]
            out[f"{p}{fused}.weight"] = np.concatenate(blocks, axis=0)
    return out


def hf_config(config) -> dict:
    """The HF `config.json` dict (without `architectures`) for `config`."""
    hf = llama.hf_config(
        config,
        MODEL_TYPE,
        sliding_window=config.sliding_window,
        use_bias=False,
        rotary_fraction=config.rotary_fraction,
    )
    del hf["attention_bias"], hf["mlp_bias"]
    return {
        **hf,
        "sliding_window": config.sliding_window,
        "original_max_position_embeddings": config.max_sequence_length,
        "partial_rotary_factor": config.rotary_fraction,
    }


def exports(config) -> bool:
    """Whether a config of this family with no `model_type` asked for
    exports as phi3: partial rotary (no other layout here has it). Other
    Phi-3 configs are Llama's, and export as llama unless asked."""
    return config.rotary_fraction != 1.0


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
        export_order=5,  # the family's default: registry.export_converter
    )
)

__all__ = ["config_from_hf", "export_weights", "hf_config", "load_weights"]
