"""Gemma 4 text tensors <-> `GPTBackbone` weights: one two-way name map
(`_entries`) drives loading and export (`keras_transformers.convert.gemma4`).

Norm weights are plain (`x * w`, no offset from 1); a KV-shared layer has
no `k_proj` / `v_proj` / `k_norm`, a layer with values from keys no
`v_proj`; the MoE block's experts are stored `[E, out, in]` (ours
`[E, in, out]`) and its router as `router.proj` / `router.scale` /
`router.per_expert_scale`; each block's `layer_scalar` is a constant.
"""

from __future__ import annotations

from keras_transformers.convert.common import (
    assign,
    attention_parts,
    export_head,
    export_layer,
    fetch,
    load_head,
    load_layer,
)

PREFIXES = ("model.", "")
PROBE = "embed_tokens.weight"
ATTENTION = {"query": "q_proj", "key": "k_proj", "value": "v_proj", "output": "o_proj"}
MLP = {"gate_dense": "gate_proj", "inner_dense": "up_proj", "output_dense": "down_proj"}


def _entries(backbone):
    """The two-way name map: `(variable or layer, HF name, kernel shape,
    transpose)` of every tensor, the same list for loading and export."""
    out = [(backbone.token_embedding.embeddings, "embed_tokens.weight", None, False)]
    ple = backbone.per_layer_inputs
    if ple is not None:
        out += [
            (ple.embedding.embeddings, "embed_tokens_per_layer.weight", None, False),
            (ple.projection, "per_layer_model_projection", None, True),
            (ple.norm, "per_layer_projection_norm", None, False),
        ]
    for i, block in enumerate(backbone.blocks):
        p = f"layers.{i}."
        attention = block.self_attention
        for role, (layer, shape) in _attention_parts(attention).items():
            out.append((layer, f"{p}self_attn.{ATTENTION[role]}", shape, True))
        out.append((attention.query_norm, p + "self_attn.q_norm", None, False))
        if attention.key_norm is not None:
            out.append((attention.key_norm, p + "self_attn.k_norm", None, False))
        for layer, name in (
            (block.self_attention_norm, "input_layernorm"),
            (block.self_attention_post_norm, "post_attention_layernorm"),
            (block.feed_forward_norm, "pre_feedforward_layernorm"),
            (block.feed_forward_post_norm, "post_feedforward_layernorm"),
        ):
            out.append((layer, p + name, None, False))
        out += _feed_forward(block.feed_forward, p)
        gate = block.per_layer_gate
        if gate is not None:
            out += [
                (gate.gate, p + "per_layer_input_gate", None, True),
                (gate.projection, p + "per_layer_projection", None, True),
                (gate.norm, p + "post_per_layer_input_norm", None, False),
            ]
        out.append((block.output_scale_weight, p + "layer_scalar", None, False))
    out.append((backbone.final_norm, "norm", None, False))
    return out


def _feed_forward(ff, p: str) -> list:
    """The entries of a block's feed-forward: the dense one, or the dense
    one beside the experts (`DenseAndExperts`: router, experts, norms;
    `"experts"`: the checkpoint's `[E, out, in]` is our `[E, in, out]`)."""
    moe = getattr(ff, "moe", None)
    dense = ff if moe is None else ff.dense
    out = [
        (getattr(dense, attr), f"{p}mlp.{name}", None, True)
        for attr, name in MLP.items()
    ]
    if moe is None:
        return out
    return out + [
        (ff.dense_post_norm, p + "post_feedforward_layernorm_1", None, False),
        (ff.experts_norm, p + "pre_feedforward_layernorm_2", None, False),
        (ff.experts_post_norm, p + "post_feedforward_layernorm_2", None, False),
        (moe.router_kernel, p + "router.proj.weight", None, True),
        (moe.router_scale, p + "router.scale", None, False),
        (moe.expert_scale, p + "router.per_expert_scale", None, False),
        (moe.expert_gate_up, p + "experts.gate_up_proj", None, "experts"),
        (moe.expert_down, p + "experts.down_proj", None, "experts"),
    ]


def _attention_parts(attention) -> dict:
    """`attention_parts` less the projections a layer lacks (a KV-shared
    layer's key and value, a layer with values from keys' value)."""
    parts = attention_parts(attention) if attention.key_dense else None
    if parts is None:
        d = attention.query_dense.kernel.shape[0]
        q = attention.num_heads * attention.head_dim
        parts = {
            "query": (attention.query_dense, (d, q)),
            "output": (attention.output_dense, (q, d)),
        }
    return {role: part for role, part in parts.items() if part[0] is not None}


def _is_variable(item) -> bool:
    return not hasattr(item, "weights")


def load_weights(
    backbone,
    checkpoint,
    require_head: bool,
    prefixes=PREFIXES,
    model_type="gemma4_text",
) -> None:
    """Copies a Gemma 4 text checkpoint into `backbone` (a `GPTBackbone`)."""
    p = checkpoint.prefix(prefixes, PROBE, model_type)
    get = checkpoint.get
    for item, name, shape, transpose in _entries(backbone):
        if transpose == "experts":
            assign(item, get(p + name).transpose(0, 2, 1), p + name)
        elif _is_variable(item):
            assign(item, get(p + name), p + name, transpose=transpose)
        else:
            load_layer(item, get, p + name, shape=shape, transpose=transpose)
    load_head(backbone.token_embedding, checkpoint, require_head)


def export_weights(backbone) -> dict:
    """The backbone's weights under Gemma4ForCausalLM names."""
    out = {}
    for item, name, shape, transpose in _entries(backbone):
        name = "model." + name
        if transpose == "experts":
            out[name] = fetch(item).transpose(0, 2, 1)
        elif _is_variable(item):
            out[name] = fetch(item, transpose=transpose)
        else:
            export_layer(out, item, name, shape=shape, transpose=transpose)
    export_head(out, backbone.token_embedding)
    return out


__all__ = ["export_weights", "load_weights"]
