"""Hugging Face GPT-NeoX and Pythia (`model_type: "gpt_neox"`) <-> `GPTBackbone`.

A LayerNorm decoder with biases everywhere, an untied output layer
(`embed_out`) and:

- parallel residuals (`use_parallel_residual`, every Pythia):
  `x + attn(ln1(x)) + mlp(ln2(x))`, the config's
  `norm_position="parallel"`; without them the usual pre-norm block;
- rotary positions on the first `rotary_pct` of each head
  (`rotary_fraction`; Pythia: 0.25) with base `rotary_emb_base` (both read
  from transformers 5's `rope_parameters` too);
- one fused `attention.query_key_value` projection `[3 * N * H, D]` whose
  rows are per head: head n's query, key and value rows (`[N, 3, H, D]`).
  Loading splits it into our query, key and value kernels; export fuses
  them again.

`attention_bias=false` (biases in the MLP but not in attention) is
refused: the config's one `use_bias` covers both.
"""

from __future__ import annotations

import numpy as np

from keras_transformers.convert import llama
from keras_transformers.convert.common import (
    ACTIVATIONS,
    DECODER,
    assign,
    attention_parts,
    check_exportable,
    check_shape,
    export_layer,
    fetch,
    load_layer,
    special_ids,
)
from keras_transformers.convert.protocol import decoder
from keras_transformers.registry import register_converter

MODEL_TYPE = "gpt_neox"
NAME = "GPT-NeoX"
BASE_ARCHITECTURE = "GPTNeoXModel"
ARCHITECTURE = "GPTNeoXForCausalLM"
PREFIXES = ("gpt_neox.", "")
# The tensor (under one of PREFIXES) that marks a checkpoint of this type.
PROBE = "embed_in.weight"
HEAD = "embed_out.weight"
QKV = ("query", "key", "value")
FUSED = "attention.query_key_value"
# GPTNeoXConfig's defaults (GPT-NeoX-20B's shape).
DEFAULTS = dict(
    vocab_size=50432,
    hidden_size=6144,
    num_hidden_layers=44,
    num_attention_heads=64,
    intermediate_size=24576,
    hidden_act="gelu",
    max_position_embeddings=2048,
    layer_norm_eps=1e-5,
    bos_token_id=0,
    eos_token_id=2,
    tie_word_embeddings=False,
    use_parallel_residual=True,
    attention_bias=True,
    rotary_pct=0.25,
    rotary_emb_base=10000.0,
)
# GPT-NeoX-20B's "gelu_fast" is the tanh form, as "gelu_new" is.
HF_ACTIVATIONS = {**ACTIVATIONS, "gelu_fast": "gelu_approximate"}


def _rope_keys(hf: dict) -> dict:
    """The rotary keys in Llama's layout (`rope_parameters` with
    `rope_theta` and `partial_rotary_factor`), read from GPT-NeoX's own
    (`rotary_emb_base`, `rotary_pct`, `rope_scaling`) as transformers does."""
    params = dict(hf.get("rope_scaling") or hf.get("rope_parameters") or {})
    params.setdefault("rope_theta", hf["rotary_emb_base"])
    params.setdefault("partial_rotary_factor", hf["rotary_pct"])
    return {
        "rope_parameters": params,
        "max_position_embeddings": hf["max_position_embeddings"],
    }


def config_from_hf(hf: dict) -> dict:
    """TransformerConfig fields for an HF GPT-NeoX `config.json` dict.

    Raises:
        ValueError: an option we cannot reproduce (`attention_bias=false`,
            an activation we lack, a rotary scaling we lack).
    """
    hf = {**DEFAULTS, **hf}
    if not hf["attention_bias"]:
        raise ValueError(
            f"{NAME} config has attention_bias=false (no attention biases, but "
            "biases in the MLP), which keras_transformers cannot represent: its "
            "one `use_bias` covers both. Only attention_bias=true converts."
        )
    if hf["hidden_act"] not in HF_ACTIVATIONS:
        raise ValueError(
            f"{NAME} hidden_act={hf['hidden_act']!r} is not supported. "
            f"Supported: {sorted(HF_ACTIVATIONS)}."
        )
    hidden, heads = hf["hidden_size"], hf["num_attention_heads"]
    rope = _rope_keys(hf)
    try:
        theta, factor, scaling = llama.rope_fields(rope, hidden // heads)
    except ValueError as error:
        raise ValueError(str(error).replace("Llama", NAME)) from None
    vocab = hf["vocab_size"]
    parallel = bool(hf["use_parallel_residual"])
    return dict(
        vocabulary_size=vocab,
        num_layers=hf["num_hidden_layers"],
        hidden_dim=hidden,
        num_heads=heads,
        intermediate_dim=hf["intermediate_size"],
        max_sequence_length=hf["max_position_embeddings"],
        norm_position="parallel" if parallel else "pre",
        norm_type="layer",
        norm_epsilon=float(hf["layer_norm_eps"]),
        position_embedding="rotary",
        rope_max_wavelength=theta,
        rope_scaling_factor=factor,
        rope_scaling=scaling,
        rotary_fraction=llama.rotary_fraction(rope),
        activation=HF_ACTIVATIONS[hf["hidden_act"]],
        use_bias=True,
        tie_embeddings=bool(hf["tie_word_embeddings"]),
        dropout=float(hf.get("hidden_dropout", 0.0)),
        attention_dropout=float(hf.get("attention_dropout", 0.0)),
        initializer_range=float(hf.get("initializer_range", 0.02)),
        **special_ids(hf, vocab),
    )


def _layers(block):
    """(layer, HF name, kernel shape) of a block's tensors other than the
    fused query / key / value projection."""
    output, shape = attention_parts(block.self_attention)["output"]
    ffn = block.feed_forward
    return [
        (block.self_attention_norm, "input_layernorm", None),
        (block.feed_forward_norm, "post_attention_layernorm", None),
        (output, "attention.dense", shape),
        (ffn.inner_dense, "mlp.dense_h_to_4h", None),
        (ffn.output_dense, "mlp.dense_4h_to_h", None),
    ]


def _load_fused(block, get, name: str) -> None:
    """Our query, key and value projections from the fused `{name}.weight`
    `[N * 3 * H, D]` and `{name}.bias` `[N * 3 * H]` (per head: q, k, v)."""
    parts = attention_parts(block.self_attention)
    query, (d, q) = parts["query"]
    heads = block.self_attention.num_heads
    weight, bias = get(name + ".weight"), get(name + ".bias")
    check_shape(weight, (3 * q, d), name + ".weight", query.kernel.path)
    check_shape(bias, (3 * q,), name + ".bias", query.bias.path)
    weight, bias = weight.reshape(heads, 3, -1, d), bias.reshape(heads, 3, -1)
    for index, role in enumerate(QKV):
        layer, shape = parts[role]
        rows = weight[:, index].reshape(q, d)  # [N * H, D]
        assign(layer.kernel, rows, name + ".weight", shape=shape, transpose=True)
        assign(layer.bias, bias[:, index].reshape(q), name + ".bias", shape=(q,))


def _export_fused(out: dict, block, name: str) -> None:
    """Inverse of `_load_fused`."""
    parts, heads = attention_parts(block.self_attention), block.self_attention.num_heads
    weights, biases = [], []
    for role in QKV:
        layer, shape = parts[role]
        rows = fetch(layer.kernel, shape=shape, transpose=True)  # [N * H, D]
        weights.append(rows.reshape(heads, -1, rows.shape[-1]))
        biases.append(fetch(layer.bias).reshape(heads, -1))
    d = weights[0].shape[-1]
    out[name + ".weight"] = np.stack(weights, axis=1).reshape(-1, d)
    out[name + ".bias"] = np.stack(biases, axis=1).reshape(-1)


def load_weights(backbone, checkpoint, require_head: bool) -> None:
    """Copies a GPT-NeoX checkpoint into `backbone` (a `GPTBackbone`)."""
    p = checkpoint.prefix(PREFIXES, PROBE, MODEL_TYPE)
    get = checkpoint.get
    assign(backbone.token_embedding.embeddings, get(p + PROBE), p + PROBE)
    for i, block in enumerate(backbone.blocks):
        h = f"{p}layers.{i}."
        _load_fused(block, get, h + FUSED)
        for layer, hf_name, shape in _layers(block):
            linear = "norm" not in hf_name
            load_layer(layer, get, h + hf_name, shape=shape, transpose=linear)
    load_layer(backbone.final_norm, get, p + "final_layer_norm")
    embedding = backbone.token_embedding
    if not embedding.tie_weights and (require_head or HEAD in checkpoint):
        assign(embedding.reverse_embeddings, get(HEAD), HEAD, transpose=True)


def export_weights(backbone) -> dict[str, np.ndarray]:
    """The backbone's weights under GPTNeoXForCausalLM names."""
    p, out = "gpt_neox.", {}
    out[p + PROBE] = fetch(backbone.token_embedding.embeddings)
    for i, block in enumerate(backbone.blocks):
        h = f"{p}layers.{i}."
        _export_fused(out, block, h + FUSED)
        for layer, hf_name, shape in _layers(block):
            linear = "norm" not in hf_name
            export_layer(out, layer, h + hf_name, shape=shape, transpose=linear)
    export_layer(out, backbone.final_norm, p + "final_layer_norm")
    embedding = backbone.token_embedding
    if not embedding.tie_weights:
        out[HEAD] = fetch(embedding.reverse_embeddings, transpose=True)
    return out


def hf_config(config) -> dict:
    """The HF `config.json` dict (without `architectures`) for `config`.

    Raises:
        ValueError: the config has something GPT-NeoX lacks (the fields
            named), or grouped-query attention / another head size.
    """
    parallel = config.norm_position == "parallel"
    layout = dict(
        norm_type="layer",
        position_embedding="rotary",
        gated_feed_forward=False,
        use_bias=True,
        norm_position="parallel" if parallel else "pre",
        rotary_fraction=config.rotary_fraction,
    )
    check_exportable(config, {**DECODER, **layout}, MODEL_TYPE)
    if config.resolved_num_kv_heads != config.num_heads or (
        config.resolved_head_dim * config.num_heads != config.hidden_dim
    ):
        raise ValueError(
            f"{NAME} needs plain multi-head attention with head_dim = hidden_dim / "
            f"num_heads. Received num_kv_heads={config.num_kv_heads}, "
            f"head_dim={config.head_dim}."
        )
    scaling, rope = llama.hf_rope(
        config.rope_max_wavelength, config.rope_scaling_factor, config.rope_scaling
    )
    activation = {"gelu_approximate": "gelu_new"}.get(
        config.activation, config.activation
    )
    return {
        "model_type": MODEL_TYPE,
        "vocab_size": config.vocabulary_size,
        "num_hidden_layers": config.num_layers,
        "hidden_size": config.hidden_dim,
        "num_attention_heads": config.num_heads,
        "intermediate_size": config.intermediate_dim,
        "max_position_embeddings": config.max_sequence_length,
        "hidden_act": activation,
        "layer_norm_eps": config.norm_epsilon,
        "use_parallel_residual": parallel,
        "attention_bias": True,
        # Both layouts: transformers 5 reads `rope_parameters`, 4.x the others.
        "rope_parameters": {**rope, "partial_rotary_factor": config.rotary_fraction},
        "rotary_pct": config.rotary_fraction,
        "rotary_emb_base": float(config.rope_max_wavelength),
        "rope_scaling": scaling,
        "hidden_dropout": config.dropout,
        "attention_dropout": config.attention_dropout,
        "initializer_range": config.initializer_range,
        "tie_word_embeddings": config.tie_embeddings,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "pad_token_id": config.pad_token_id,
    }


def exports(config) -> bool:
    """Whether a config of this family with no `model_type` asked for
    exports as gpt_neox: rotary positions with LayerNorm (no other rotary
    layout here has it)."""
    return bool(config.rotary and config.norm_type == "layer")


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
        export_order=3,  # the family's default: registry.export_converter
    )
)

__all__ = ["config_from_hf", "export_weights", "hf_config", "load_weights"]
