"""Hugging Face GPT-2 (`model_type: "gpt2"`) <-> `GPTBackbone`.

HF GPT-2 uses `Conv1D` layers whose weights are `[in, out]` (our layout);
`attn.c_attn` holds the query, key and value projections side by side.
"""

from __future__ import annotations

import numpy as np

from keras_transformers.convert.common import (
    ACTIVATIONS,
    DECODER,
    assign,
    attention_parts,
    check_exportable,
    check_shape,
    export_head,
    export_layer,
    fetch,
    load_head,
    load_layer,
    load_positions,
    special_ids,
)
from keras_transformers.convert.protocol import decoder
from keras_transformers.registry import register_converter

MODEL_TYPE = "gpt2"
BASE_ARCHITECTURE = "GPT2Model"
ARCHITECTURE = "GPT2LMHeadModel"
PREFIXES = ("transformer.", "")
# The tensor (under one of PREFIXES) that marks a checkpoint of this type.
PROBE = "wte.weight"
QKV = ("query", "key", "value")
# option -> (value we cannot convert, why)
UNSUPPORTED = {
    "scale_attn_by_inverse_layer_idx": (
        True,
        "scales attention by 1 / (layer index + 1)",
    ),
    "reorder_and_upcast_attn": (True, "uses a reordered, upcast attention kernel"),
    "add_cross_attention": (True, "adds cross-attention to every block"),
    "scale_attn_weights": (False, "disables the 1 / sqrt(head_dim) attention scale"),
}


def config_from_hf(hf: dict) -> dict:
    """TransformerConfig fields for an HF GPT-2 `config.json` dict.

    `resid_pdrop` becomes `dropout` (our one rate for embeddings and
    sub-layers; `embd_pdrop` is ignored) and `attn_pdrop` `attention_dropout`.

    Raises:
        ValueError: an option we cannot reproduce is set.
    """
    for key, (value, why) in UNSUPPORTED.items():
        if hf.get(key, not value) == value:
            raise ValueError(
                f"GPT-2 config has {key}={value!r}, which {why}; keras_transformers "
                f"does not support it. Only checkpoints with {key}={not value!r} convert."
            )
    activation = hf.get("activation_function", "gelu_new")
    if activation not in ACTIVATIONS:
        raise ValueError(
            f"GPT-2 activation_function={activation!r} is not supported. "
            f"Supported: {sorted(ACTIVATIONS)}."
        )
    hidden, vocab = hf.get("n_embd", 768), hf.get("vocab_size", 50257)
    return dict(
        vocabulary_size=vocab,
        num_layers=hf.get("n_layer", 12),
        hidden_dim=hidden,
        num_heads=hf.get("n_head", 12),
        intermediate_dim=hf.get("n_inner") or 4 * hidden,
        max_sequence_length=hf.get("n_positions", 1024),
        norm_type="layer",
        norm_epsilon=float(hf.get("layer_norm_epsilon", 1e-5)),
        position_embedding="learned",
        activation=ACTIVATIONS[activation],
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
        dropout=float(hf.get("resid_pdrop", 0.1)),
        attention_dropout=float(hf.get("attn_pdrop", 0.1)),
        initializer_range=float(hf.get("initializer_range", 0.02)),
        **special_ids(hf, vocab),
    )


def load_weights(backbone, checkpoint, require_head: bool) -> None:
    """Copies a GPT-2 checkpoint into `backbone` (a `GPTBackbone`)."""
    p = checkpoint.prefix(PREFIXES, PROBE, MODEL_TYPE)
    get = checkpoint.get
    embeddings = backbone.token_embedding.embeddings
    assign(embeddings, get(p + "wte.weight"), p + "wte.weight")
    positions = backbone.position_embedding.embeddings
    load_positions(positions, get(p + "wpe.weight"), p + "wpe.weight")
    for i, block in enumerate(backbone.blocks):
        h = f"{p}h.{i}."
        parts = attention_parts(block.self_attention)
        (query, (d, q)), name = parts["query"], h + "attn.c_attn"
        qkv_w, qkv_b = get(name + ".weight"), get(name + ".bias")
        check_shape(qkv_w, (d, 3 * q), name + ".weight", query.kernel.path)
        check_shape(qkv_b, (3 * q,), name + ".bias", query.bias.path)
        split = zip(QKV, np.split(qkv_w, 3, axis=1), np.split(qkv_b, 3))
        for role, weight, bias in split:
            layer, shape = parts[role]
            assign(layer.kernel, weight, name + ".weight", shape=shape)
            assign(layer.bias, bias, name + ".bias", shape=shape[1:])
        layer, shape = parts["output"]
        load_layer(layer, get, h + "attn.c_proj", shape=shape)
        for layer, hf_name in _block_layers(block):
            load_layer(layer, get, h + hf_name)
    load_layer(backbone.final_norm, get, p + "ln_f")
    load_head(backbone.token_embedding, checkpoint, require_head)


def _block_layers(block):
    ffn = block.feed_forward
    return (
        (ffn.inner_dense, "mlp.c_fc"),
        (ffn.output_dense, "mlp.c_proj"),
        (block.self_attention_norm, "ln_1"),
        (block.feed_forward_norm, "ln_2"),
    )


def hf_config(config) -> dict:
    """The HF `config.json` dict (without `architectures`) for `config`."""
    layout = dict(norm_type="layer", position_embedding="learned")
    check_exportable(
        config, {**DECODER, **layout, "gated_feed_forward": False}, MODEL_TYPE
    )
    if config.resolved_num_kv_heads != config.num_heads or (
        config.resolved_head_dim * config.num_heads != config.hidden_dim
    ):
        raise ValueError(
            "GPT-2 needs plain multi-head attention with head_dim = hidden_dim / "
            f"num_heads. Received num_kv_heads={config.num_kv_heads}, "
            f"head_dim={config.head_dim}."
        )
    activation = {
        v: k
        for k, v in ACTIVATIONS.items()
        if k in ("gelu_new", "gelu", "relu", "silu")
    }
    return {
        "model_type": MODEL_TYPE,
        "vocab_size": config.vocabulary_size,
        "n_layer": config.num_layers,
        "n_embd": config.hidden_dim,
        "n_head": config.num_heads,
        "n_inner": config.intermediate_dim,
        "n_positions": config.max_sequence_length,
        "layer_norm_epsilon": config.norm_epsilon,
        "activation_function": activation[config.activation],
        "resid_pdrop": config.dropout,
        "embd_pdrop": config.dropout,
        "attn_pdrop": config.attention_dropout,
        "initializer_range": config.initializer_range,
        "tie_word_embeddings": config.tie_embeddings,
        "scale_attn_weights": True,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "pad_token_id": config.pad_token_id,
    }


def export_weights(backbone) -> dict[str, np.ndarray]:
    """The backbone's weights under GPT2LMHeadModel names (zero biases when
    the model has none: HF GPT-2 always has them)."""
    p, out = "transformer.", {}
    out[p + "wte.weight"] = fetch(backbone.token_embedding.embeddings)
    out[p + "wpe.weight"] = fetch(backbone.position_embedding.embeddings)
    for i, block in enumerate(backbone.blocks):
        h, parts, qkv = f"{p}h.{i}.", attention_parts(block.self_attention), {}
        for role in QKV:
            export_layer(
                qkv, parts[role][0], role, shape=parts[role][1], zero_bias=True
            )
        for kind, axis in (("weight", 1), ("bias", 0)):
            joined = [qkv[f"{role}.{kind}"] for role in QKV]
            out[f"{h}attn.c_attn.{kind}"] = np.concatenate(joined, axis=axis)
        layer, shape = parts["output"]
        export_layer(out, layer, h + "attn.c_proj", shape=shape, zero_bias=True)
        for layer, hf_name in _block_layers(block):
            export_layer(out, layer, h + hf_name, zero_bias=True)
    export_layer(out, backbone.final_norm, p + "ln_f")
    export_head(out, backbone.token_embedding)
    return out


def exports(config) -> bool:
    """Whether a config of this family with no `model_type` asked for
    exports as gpt2: learned positions."""
    return bool(config.position_embedding != "rotary")


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
        export_order=0,  # the family's default: registry.export_converter
    )
)
