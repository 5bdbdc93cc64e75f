"""The weight and config mapping shared by the encoder-decoder converters
(`marian`, `bart`): Hugging Face's fairseq-style seq2seq layout <-> the
seq2seq family (`Seq2SeqBackbone`, `Seq2SeqLM`).

Both types store one embedding matrix (`shared.weight`, plus the stacks'
`encoder.embed_tokens` / `decoder.embed_tokens` copies), post-norm layers
`{encoder,decoder}.layers.{i}.` with `self_attn` (and, in the decoder,
`encoder_attn`) projections `q_proj`, `k_proj`, `v_proj`, `out_proj`, the
feed-forward `fc1` / `fc2` and the LayerNorms `self_attn_layer_norm`,
`encoder_attn_layer_norm`, `final_layer_norm`; the generation class adds
`final_logits_bias` (`[1, V]`, our backbone weight `logits_bias`, `[V]`)
and, untied, `lm_head.weight`. Each type module adds its positions and
embedding norms and names its classes.

PyTorch `Linear` weights are `[out, in]`; ours are `[in, out]` (split into
heads for attention).
"""

from __future__ import annotations

import numpy as np

from keras_transformers.convert.common import (
    ACTIVATIONS,
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

# HF key -> (our field, HF default); the default's type is the type.
# `vocab_size` is added per type (its default differs).
FIELDS = {
    "d_model": ("hidden_dim", 1024),
    "encoder_layers": ("num_layers", 12),
    "decoder_layers": ("num_decoder_layers", 12),
    "encoder_attention_heads": ("num_heads", 16),
    "encoder_ffn_dim": ("intermediate_dim", 4096),
    "max_position_embeddings": ("max_sequence_length", 1024),
    "dropout": ("dropout", 0.1),
    "attention_dropout": ("attention_dropout", 0.0),
    "init_std": ("initializer_range", 0.02),
    "scale_embedding": ("scale_embeddings", False),
    "tie_word_embeddings": ("tie_embeddings", True),
}
# Encoder field -> the decoder field that must equal it (we have one value).
SAME = {
    "encoder_attention_heads": "decoder_attention_heads",
    "encoder_ffn_dim": "decoder_ffn_dim",
}
# What every checkpoint of both types has.
LAYOUT = dict(
    stacks="encoder_decoder",
    norm_position="post",
    norm_type="layer",
    norm_epsilon=1e-5,  # torch.nn.LayerNorm's default; neither type changes it
    final_norm=False,
    pooler=False,
    gated_feed_forward=False,
    use_bias=True,
    num_segments=0,
    sliding_window=None,
    moe=None,
    vision=None,
)
# Our activation -> the HF name export writes.
EXPORT_ACTIVATIONS = dict(
    gelu="gelu", gelu_approximate="gelu_new", relu="relu", silu="swish"
)
ATTENTION = {
    "query": "q_proj",
    "key": "k_proj",
    "value": "v_proj",
    "output": "out_proj",
}


def fields_table(vocab_size: int) -> dict:
    """`FIELDS` with `vocab_size` and its HF default."""
    return {"vocab_size": ("vocabulary_size", vocab_size), **FIELDS}


def fail(name: str, what: str, fix: str):
    """Raises the ValueError of an option of `name` (e.g. "BART") we cannot
    convert."""
    raise ValueError(
        f"{name} config has {what}, which keras_transformers cannot convert: {fix}"
    )


def check(hf: dict, name: str, fields: dict, classes: dict) -> None:
    """Raises ValueError naming the first shared option of `hf` we cannot
    reproduce: encoder and decoder widths that differ, a decoder-only model,
    an unknown activation or an architecture outside `classes`."""
    for encoder, decoder in SAME.items():
        default = fields[encoder][1]
        a, b = hf.get(encoder, default), hf.get(decoder, default)
        if a != b:
            fail(
                name,
                f"{encoder}={a} but {decoder}={b}",
                "the encoder and decoder must have the same value (one "
                f"`{fields[encoder][0]}` in TransformerConfig).",
            )
    if hf.get("is_decoder", False):
        fail(
            name, "is_decoder=True (a causal LM)", "only the encoder-decoder converts."
        )
    activation = hf.get("activation_function", "gelu")
    if activation not in ACTIVATIONS:
        fail(
            name,
            f"activation_function={activation!r}",
            f"supported activations are {sorted(ACTIVATIONS)}.",
        )
    names = hf.get("architectures") or []
    if names and not any(a in classes for a in names):
        fail(name, f"architectures={names}", f"supported are {sorted(classes)}.")


def config_fields(hf: dict, fields: dict, id_defaults: dict) -> dict:
    """The mapped `fields`, the activation and the special ids of `hf`
    (`id_defaults`: the type's defaults of `pad_token_id`, `eos_token_id`
    and `decoder_start_token_id`); the decoder start becomes
    `bos_token_id` (pad when None)."""
    out = {ours: type(d)(hf.get(k, d)) for k, (ours, d) in fields.items()}
    ids = {k: hf.get(k, v) for k, v in id_defaults.items()}
    start = ids.pop("decoder_start_token_id")
    ids["bos_token_id"] = ids["pad_token_id"] if start is None else start
    out["activation"] = ACTIVATIONS[hf.get("activation_function", "gelu")]
    return {**out, **special_ids(ids, out["vocabulary_size"])}


def preset_data(hf: dict, family: str, classes: dict, fields: dict) -> dict:
    """`{"family", "class_name", "config"}`: the class of the checkpoint's
    architecture in `classes`, else `Seq2SeqLM`."""
    names = hf.get("architectures") or ()
    name = next((classes[a] for a in names if a in classes), "Seq2SeqLM")
    return {"family": family, "class_name": name, "config": fields}


def _block(block, decoder: bool) -> list[tuple]:
    """(layer, HF name, kernel shape) of one encoder or decoder layer."""
    attentions = [(block.self_attention, "self_attn")]
    if decoder:
        attentions.append((block.cross_attention_layer, "encoder_attn"))
    out = [
        (layer, f"{prefix}.{ATTENTION[role]}", shape)
        for attention, prefix in attentions
        for role, (layer, shape) in attention_parts(attention).items()
    ]
    ffn = block.feed_forward
    out += [(ffn.inner_dense, "fc1", None), (ffn.output_dense, "fc2", None)]
    out += [(block.self_attention_norm, "self_attn_layer_norm", None)]
    if decoder:
        out += [(block.cross_attention_norm, "encoder_attn_layer_norm", None)]
    return out + [(block.feed_forward_norm, "final_layer_norm", None)]


def entries(backbone, p: str) -> list[tuple]:
    """(layer, HF name, kernel shape) of every block of `backbone`, the
    model under prefix `p`."""
    out = []
    for side, blocks in (
        ("encoder", backbone.blocks),
        ("decoder", backbone.decoder_blocks),
    ):
        for i, block in enumerate(blocks):
            h = f"{p}{side}.layers.{i}."
            out += [(x, h + n, s) for x, n, s in _block(block, side == "decoder")]
    return out


def input_embedding(checkpoint, p: str, tied: bool) -> tuple[str, np.ndarray]:
    """(name, `[V, D]` value) of the one input embedding.

    transformers 5 ties `encoder.embed_tokens` and `decoder.embed_tokens`
    to `shared` only with `tie_word_embeddings`; otherwise each stack reads
    its own stored copy (and `shared` is unused). The copies each stack
    reads must be equal, as must a stored `lm_head.weight` when tied.
    """
    copies = [f"{p}{side}.embed_tokens.weight" for side in ("encoder", "decoder")]
    copies = [n for n in copies if n in checkpoint]
    names = copies or [p + "shared.weight"]
    if tied:
        names = [p + "shared.weight", *copies]
        names += ["lm_head.weight"] if "lm_head.weight" in checkpoint else []
    values = [checkpoint.get(n) for n in names]
    checkpoint.used.add(p + "shared.weight")
    if any(
        v.shape != values[0].shape or not np.array_equal(v, values[0]) for v in values
    ):
        raise ValueError(
            f"Checkpoint weights {names} differ, but keras_transformers has one "
            "embedding matrix for the encoder, the decoder and (with "
            "tie_word_embeddings=True) the output layer: this checkpoint cannot "
            "be converted."
        )
    return names[0], values[0]


def load_stacks(backbone, checkpoint, p: str, require_head: bool) -> None:
    """Copies the embedding, every block, `final_logits_bias` (when stored;
    else the bias stays zero) and an untied `lm_head.weight` (required when
    `require_head`) of the checkpoint under prefix `p` into `backbone`."""
    embedding = backbone.token_embedding
    name, value = input_embedding(checkpoint, p, embedding.tie_weights)
    assign(embedding.embeddings, value, name)
    for layer, name, shape in entries(backbone, p):
        linear = hasattr(layer, "kernel")
        load_layer(layer, checkpoint.get, name, shape=shape, transpose=linear)
    if backbone.logits_bias is not None and "final_logits_bias" in checkpoint:
        value = checkpoint.get("final_logits_bias")  # [1, V]
        shape = (1, backbone.config.vocabulary_size)
        assign(backbone.logits_bias, value, "final_logits_bias", shape=shape)
    load_head(embedding, checkpoint, require_head)


def hf_fields(config, fields: dict, layout: dict, model_type: str) -> dict:
    """The HF `config.json` entries both types share for `config`: `fields`,
    the decoder's copies, the activation, the special ids (the decoder start
    is `bos_token_id`, else `start`) and `forced_eos_token_id` None, so that
    `transformers` generation does not force an end token that ours does not.

    Raises:
        ValueError: the config differs from `layout` or has grouped-query
            attention or another head size.
    """
    mha = dict(  # plain multi-head attention, head_dim = hidden_dim / num_heads
        resolved_num_kv_heads=config.num_heads,
        resolved_head_dim=config.hidden_dim // config.num_heads,
    )
    check_exportable(config, {**layout, **mha}, model_type)
    hf = {k: getattr(config, ours) for k, (ours, _) in fields.items()}
    hf["decoder_layers"] = config.resolved_num_decoder_layers
    hf.update({decoder: hf[encoder] for encoder, decoder in SAME.items()})
    return {
        **hf,
        "model_type": model_type,
        "activation_function": EXPORT_ACTIVATIONS[config.activation],
        "activation_dropout": 0.0,
        "is_encoder_decoder": True,
        "pad_token_id": config.pad_token_id,
        "eos_token_id": config.eos_token_id,
        "forced_eos_token_id": None,
    }


def architecture(model, architectures: dict, name: str) -> str:
    """The HF class of `model` in `architectures` (ours -> HF).

    Raises:
        ValueError: a class without an entry there.
    """
    cls = type(model).__name__
    if cls not in architectures:
        raise ValueError(f"{cls} has no Hugging Face {name} counterpart.")
    return architectures[cls]


def export_stacks(model, hf_class: str):
    """`(backbone, prefix, tensors)` of a `Seq2SeqLM` or `Seq2SeqBackbone`
    exported as `hf_class`: the embedding (`shared` and the stacks' copies:
    transformers 5 ties them to `shared` only with tie_word_embeddings),
    every block, and for the LM `final_logits_bias` (zeros without
    `logits_bias`) and an untied `lm_head.weight`.

    Raises:
        ValueError: a backbone with untied output weights (its HF base
            class has no output layer).
    """
    backbone = getattr(model, "backbone", model)
    p, out = ("" if model is backbone else "model."), {}
    embedding = backbone.token_embedding
    for part in ("shared", "encoder.embed_tokens", "decoder.embed_tokens"):
        out[f"{p}{part}.weight"] = fetch(embedding.embeddings)
    for layer, part, shape in entries(backbone, p):
        export_layer(out, layer, part, shape=shape, transpose=hasattr(layer, "kernel"))
    if model is not backbone:
        vocab = backbone.config.vocabulary_size
        bias = backbone.logits_bias
        out["final_logits_bias"] = (
            np.zeros((1, vocab), np.float32)
            if bias is None
            else fetch(bias, shape=(1, vocab))
        )
        export_head(out, embedding)
    elif not embedding.tie_weights:
        raise ValueError(
            f"{hf_class} has no output layer, so this Seq2SeqBackbone's untied "
            "output weights would be lost: export the Seq2SeqLM instead."
        )
    return backbone, p, out
