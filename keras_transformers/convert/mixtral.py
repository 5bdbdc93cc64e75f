"""Hugging Face Mixtral (`model_type: "mixtral"`) <-> the mixtral family.

`MixtralForCausalLM` loads as `MixtralCausalLM`, `MixtralModel` as
`MixtralBackbone`, `MixtralForSequenceClassification` as `MixtralClassifier`
(its `score` head, `num_classes` from `id2label`; see
`keras_transformers.convert.protocol.decoder`), and each exports back as
that class. Attention, norms, embeddings and rotary positions are
Llama's (`keras_transformers.convert.llama`); every block's feed-forward is
a `SparseMoE`. Under `model.layers.{i}.block_sparse_moe.`:

- `gate.weight` `[E, D]` -> `router_kernel` `[D, E]`;
- `experts.{e}.w1.weight` `[F, D]` (gate) -> `expert_gate_up[e, :, :F]`;
- `experts.{e}.w3.weight` `[F, D]` (up) -> `expert_gate_up[e, :, F:]`;
- `experts.{e}.w2.weight` `[D, F]` (down) -> `expert_down[e]` `[F, D]`.

These per-expert names are what `save_pretrained` writes (and what every
transformers version reads); export writes them. Loading also accepts
transformers 5's fused in-memory layout: `mlp.gate.weight` `[E, D]`,
`mlp.experts.gate_up_proj` `[E, 2F, D]` (gate rows first) and
`mlp.experts.down_proj` `[E, D, F]`.

Config: `num_local_experts` -> `moe.num_experts`, `num_experts_per_tok` ->
`moe.num_experts_per_token` (top-k weights renormalised, as in Mixtral),
`router_aux_loss_coef` -> `moe.router_aux_loss_coef`, `router_jitter_noise`
-> `moe.router_jitter`, `sliding_window` -> `sliding_window`;
`output_router_logits` is ignored. Training differences (inference and the
weights are unaffected): HF adds the load-balancing loss only when
`output_router_logits` is true and computes it once over all layers'
routing, while ours adds one loss per MoE layer whenever the coefficient is
non-zero; HF's jitter multiplies the experts' input as well as the
router's, ours only the router's (Switch style). `moe.router_z_loss_coef`
and `moe.dispatch` have no HF counterpart and are not exported.
"""

from __future__ import annotations

import numpy as np

from keras_transformers.convert import llama
from keras_transformers.convert.common import (
    DECODER,
    assign,
    check_exportable,
    check_shape,
    fetch,
)
from keras_transformers.convert.protocol import decoder
from keras_transformers.registry import register_converter

MODEL_TYPE = "mixtral"
FAMILY = "mixtral"
BASE_ARCHITECTURE = "MixtralModel"
ARCHITECTURE = "MixtralForCausalLM"
PREFIXES = llama.PREFIXES
PROBE = llama.PROBE
# MixtralConfig defaults where they differ from Llama's (for sparse configs).
DEFAULTS = dict(
    vocab_size=32000,
    intermediate_size=14336,
    num_key_value_heads=8,
    max_position_embeddings=4096 * 32,
    rms_norm_eps=1e-5,
    rope_theta=1e6,
)
# Per-expert tensor names under `...layers.{i}.`: (the block's module, gate,
# up and down projection); Qwen-MoE's are ("mlp.", "gate_proj", "up_proj",
# "down_proj").
EXPERT_NAMES = ("block_sparse_moe.", "w1", "w3", "w2")
# MoE options HF Mixtral always has: field -> value.
MOE_LAYOUT = dict(
    normalize_router_weights=True,
    capacity_factor=None,
    every_k_layers=1,
    num_shared_experts=0,
)


def config_from_hf(hf: dict) -> dict:
    """TransformerConfig fields for an HF Mixtral `config.json` dict.

    Raises:
        ValueError: an option we cannot reproduce (activation other than
            silu, rope scaling other than linear, llama3, yarn
            or longrope) or an invalid expert count.
    """
    # Mixtral has no attention / MLP biases (its config has no such keys).
    hf_llama = {**DEFAULTS, **hf, "attention_bias": False, "mlp_bias": False}
    try:
        fields = llama.config_from_hf(hf_llama)
    except ValueError as error:  # Llama's checks, reworded for Mixtral
        raise ValueError(str(error).replace("Llama", "Mixtral")) from None
    experts, top_k = hf.get("num_local_experts", 8), hf.get("num_experts_per_tok", 2)
    if not 1 <= top_k <= experts:
        raise ValueError(
            f"Mixtral config has num_experts_per_tok={top_k} and num_local_experts="
            f"{experts}; num_experts_per_tok must be between 1 and num_local_experts."
        )
    fields["moe"] = dict(
        num_experts=experts,
        num_experts_per_token=top_k,
        router_aux_loss_coef=float(hf.get("router_aux_loss_coef", 0.001)),
        router_z_loss_coef=0.0,
        router_jitter=float(hf.get("router_jitter_noise") or 0.0),
        **MOE_LAYOUT,
    )
    fields["sliding_window"] = hf.get("sliding_window")
    return fields


def load_routed(moe, checkpoint, name: str, names=EXPERT_NAMES) -> None:
    """Router and routed experts of `moe` (a `SparseMoE`) in block `name`
    (`...layers.{i}.`): per-expert tensors called as in `names` (see
    `EXPERT_NAMES`), or transformers 5's fused `mlp.experts.gate_up_proj` /
    `down_proj` with router `mlp.gate.weight`."""
    module, *projections = names
    get, (e, f, d) = checkpoint.get, tuple(moe.expert_down.shape)
    first = f"{name}{module}experts.0.{projections[0]}.weight"
    if first not in checkpoint and name + "mlp.experts.gate_up_proj" in checkpoint:
        router = name + "mlp.gate.weight"
        gate_up = get(name + "mlp.experts.gate_up_proj")
        down = get(name + "mlp.experts.down_proj")
        check_shape(gate_up, (e, 2 * f, d), name + "mlp.experts.gate_up_proj", moe.path)
        check_shape(down, (e, d, f), name + "mlp.experts.down_proj", moe.path)
    else:
        router, parts = name + module + "gate.weight", []
        for w, shape in zip(projections, ((f, d), (f, d), (d, f))):
            tensors = []
            for x in range(e):
                n = f"{name}{module}experts.{x}.{w}.weight"
                tensors.append(get(n))
                check_shape(tensors[-1], shape, n, moe.path)
            parts.append(np.stack(tensors))
        gate_up = np.concatenate(parts[:2], axis=1)  # [E, 2F, D]
        down = parts[2]
    assign(moe.router_kernel, get(router), router, transpose=True)
    assign(moe.expert_gate_up, gate_up.transpose(0, 2, 1), name + "experts (gate, up)")
    assign(moe.expert_down, down.transpose(0, 2, 1), name + "experts (down)")


def _load_experts(block, checkpoint, name: str) -> None:
    load_routed(block.feed_forward, checkpoint, name)


def load_weights(backbone, checkpoint, require_head: bool) -> None:
    """Copies a Mixtral checkpoint into `backbone` (a `MixtralBackbone`):
    Llama's mapping with the experts as each block's feed-forward."""
    llama.load_weights(
        backbone, checkpoint, require_head, MODEL_TYPE, feed_forward=_load_experts
    )


def check_moe_layout(moe, layout: dict, model_type: str) -> None:
    """Raises a ValueError naming every `moe.<field>` of `moe` (a
    `MoEConfig`) that differs from `layout` (field -> the value
    `model_type` needs)."""
    bad = {
        f"moe.{k}": getattr(moe, k) for k, v in layout.items() if getattr(moe, k) != v
    }
    if bad:
        needed = {f"moe.{k}": v for k, v in layout.items() if f"moe.{k}" in bad}
        raise ValueError(
            f"This model cannot be exported as Hugging Face {model_type!r}: it has "
            f"{bad}, but {model_type} needs {needed}."
        )


def hf_config(config) -> dict:
    """The HF `config.json` dict (without `architectures`) for `config`."""
    if config.moe is None:
        raise ValueError(
            "A config without a `moe` group cannot be exported as Hugging Face "
            "'mixtral'; export a dense decoder as 'llama' (GPTCausalLM)."
        )
    layout = dict(norm_type="rms", position_embedding="rotary", activation="silu")
    required = {k: v for k, v in DECODER.items() if k not in ("moe", "sliding_window")}
    required.update(layout, gated_feed_forward=True, use_bias=False)
    check_exportable(config, required, MODEL_TYPE)
    moe = config.moe
    check_moe_layout(moe, MOE_LAYOUT, MODEL_TYPE)
    expert_dim = moe.expert_intermediate_dim or config.intermediate_dim
    dense = config.replace(moe=None, sliding_window=None, intermediate_dim=expert_dim)
    hf = llama.hf_config(dense)
    del hf["attention_bias"], hf["mlp_bias"]
    hf.update(
        model_type=MODEL_TYPE,
        num_local_experts=moe.num_experts,
        num_experts_per_tok=moe.num_experts_per_token,
        router_aux_loss_coef=moe.router_aux_loss_coef,
        router_jitter_noise=moe.router_jitter,
        output_router_logits=False,
        sliding_window=config.sliding_window,
    )
    return hf


def export_routed(out: dict, moe, prefix: str, names=EXPERT_NAMES) -> None:
    """Router and routed experts of `moe` (a `SparseMoE`) in block `prefix`
    under the per-expert names `names` (inverse of `load_routed`)."""
    module, gate, up, down_name = names
    name, f = prefix + module, moe.intermediate_dim
    out[name + "gate.weight"] = fetch(moe.router_kernel, transpose=True)
    gate_up, down = fetch(moe.expert_gate_up), fetch(moe.expert_down)
    for e in range(moe.num_experts):
        expert = f"{name}experts.{e}."
        out[f"{expert}{gate}.weight"] = np.ascontiguousarray(gate_up[e, :, :f].T)
        out[f"{expert}{up}.weight"] = np.ascontiguousarray(gate_up[e, :, f:].T)
        out[f"{expert}{down_name}.weight"] = np.ascontiguousarray(down[e].T)


def _export_experts(out: dict, block, prefix: str) -> None:
    export_routed(out, block.feed_forward, prefix)


def export_weights(backbone) -> dict[str, np.ndarray]:
    """The backbone's weights under MixtralForCausalLM (per-expert) names."""
    return llama.export_weights(backbone, feed_forward=_export_experts)


def exports(config) -> bool:
    """Whether a config of this family with no `model_type` asked for
    exports as mixtral: any other sparse decoder."""
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
        family=FAMILY,
    )
)

__all__ = ["config_from_hf", "export_weights", "hf_config", "load_weights"]
