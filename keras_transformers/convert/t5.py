"""Hugging Face T5 (`model_type: "t5"`) <-> the seq2seq family.

T5 (v1.0: t5-small, t5-base; v1.1 and FLAN-T5) is a pre-norm
encoder-decoder with T5LayerNorm (an RMS norm without mean or bias, float32:
`norm_type="rms"`), no biases, no position embeddings but a learned
bucketed relative position bias on the self-attention logits
(`position_embedding="relative"`: one `[buckets, heads]` table in the first
block of each stack, shared by the stack; none in cross-attention),
unscaled query-key logits (`attention_scale=1.0`), a final norm per stack
and one embedding matrix (`shared`) for both stacks.
`T5Model` loads as `Seq2SeqBackbone`, `T5ForConditionalGeneration` as
`Seq2SeqLM`.

Feed-forward (`feed_forward_proj`): "relu" (v1.0: `wi`, ReLU, `wo`) or
"gated-gelu" (v1.1 / FLAN: `gelu_new(wi_0(x)) * wi_1(x)`, then `wo`: our
gated feed-forward with `activation="gelu_approximate"`, `wi_0` the gate).

Output layer: v1.0 ties it to `shared` and first scales the decoder output
by `d_model**-0.5` (`scale_logits`); v1.1 has its own `lm_head.weight` and
no scaling. `transformers` decides the scaling from `tie_word_embeddings`
(or a saved `scale_decoder_outputs`), and always ties `lm_head` to `shared`
unless the checkpoint holds a different `lm_head.weight`: so do we
(`fit_config`).

Training-only differences: T5's dropout also acts on the feed-forward
hidden units and after each stack's final norm; ours on embeddings,
sub-layer outputs and attention probabilities (`dropout_rate` sets
`dropout` and `attention_dropout`). `initializer_factor` is ignored.
PyTorch `Linear` weights are `[out, in]`; ours are `[in, out]`.
"""

from __future__ import annotations

import numpy as np

from keras_transformers.convert.common import (
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
from keras_transformers.convert.protocol import Converter, backbone_weights, one_layout
from keras_transformers.registry import register_converter

MODEL_TYPE = "t5"
FAMILY = "transformer"
PREFIXES = ("",)
# The tensor that marks a checkpoint of this type.
PROBE = "encoder.block.0.layer.0.SelfAttention.q.weight"
CLASSES = {"T5Model": "Seq2SeqBackbone", "T5ForConditionalGeneration": "Seq2SeqLM"}
ARCHITECTURES = {v: k for k, v in CLASSES.items()}
FIELDS = {  # HF key -> (our field, HF default); the default's type is the type
    "vocab_size": ("vocabulary_size", 32128),
    "d_model": ("hidden_dim", 512),
    "d_kv": ("head_dim", 64),
    "d_ff": ("intermediate_dim", 2048),
    "num_layers": ("num_layers", 6),
    "num_heads": ("num_heads", 8),
    "relative_attention_num_buckets": ("relative_attention_buckets", 32),
    "relative_attention_max_distance": ("relative_attention_max_distance", 128),
    "dropout_rate": ("dropout", 0.1),
    "layer_norm_epsilon": ("norm_epsilon", 1e-6),
    "n_positions": ("max_sequence_length", 512),
}
# feed_forward_proj -> (activation, gated_feed_forward)
FEED_FORWARD = {"relu": ("relu", False), "gated-gelu": ("gelu_approximate", True)}
LAYOUT = dict(  # every T5 checkpoint
    stacks="encoder_decoder",
    norm_position="pre",
    norm_type="rms",
    final_norm=True,
    embedding_norm=False,
    pooler=False,
    position_embedding="relative",
    attention_scale=1.0,
    use_bias=False,
    qkv_bias=False,
    qk_norm=False,
    scale_embeddings=False,
    logits_bias=False,
    num_segments=0,
    sliding_window=None,
    moe=None,
    vision=None,
)
ATTENTION = {"query": "q", "key": "k", "value": "v", "output": "o"}
# An unused table some early T5 checkpoints hold (transformers ignores it).
UNUSED = "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"


def _fail(what: str, fix: str):
    raise ValueError(
        f"T5 config has {what}, which keras_transformers cannot convert: {fix}"
    )


def _check(hf: dict) -> None:
    """Raises ValueError naming the first T5 option we cannot reproduce."""
    proj = hf.get("feed_forward_proj", "relu")
    if proj not in FEED_FORWARD:
        _fail(
            f"feed_forward_proj={proj!r}",
            f"supported feed-forward layers are {sorted(FEED_FORWARD)}.",
        )
    if hf.get("is_decoder", False):
        _fail("is_decoder=True", "only the encoder-decoder converts.")
    names = hf.get("architectures") or []
    if names and not any(a in CLASSES for a in names):
        _fail(f"architectures={names}", f"supported are {sorted(CLASSES)}.")


def config_from_hf(hf: dict) -> dict:
    """TransformerConfig fields for an HF T5 `config.json` dict.

    `decoder_start_token_id` (default: the pad id) becomes `bos_token_id`
    (our decoder start); `num_decoder_layers` defaults to `num_layers`.

    Raises:
        ValueError: a `feed_forward_proj` other than "relu" / "gated-gelu",
            `is_decoder`, or an architecture other than `T5Model` /
            `T5ForConditionalGeneration`.
    """
    _check(hf)
    fields = {ours: type(d)(hf.get(k, d)) for k, (ours, d) in FIELDS.items()}
    activation, gated = FEED_FORWARD[hf.get("feed_forward_proj", "relu")]
    tied = hf.get("tie_word_embeddings", True) is not False
    ids = {k: hf.get(k, d) for k, d in (("pad_token_id", 0), ("eos_token_id", 1))}
    ids = special_ids(ids, fields["vocabulary_size"])
    start = hf.get("decoder_start_token_id")
    return dict(
        LAYOUT,
        **fields,
        num_decoder_layers=int(hf.get("num_decoder_layers") or fields["num_layers"]),
        attention_dropout=fields["dropout"],
        activation=activation,
        gated_feed_forward=gated,
        tie_embeddings=tied,
        scale_logits=bool(hf.get("scale_decoder_outputs", tied)),
        **{**ids, "bos_token_id": ids["pad_token_id"] if start is None else start},
    )


def preset_data(hf: dict) -> dict:
    """`{"family", "class_name", "config"}`: `Seq2SeqBackbone` for a
    `T5Model` checkpoint, else `Seq2SeqLM`."""
    names = hf.get("architectures") or ()
    name = next((CLASSES[a] for a in names if a in CLASSES), "Seq2SeqLM")
    return {"family": FAMILY, "class_name": name, "config": config_from_hf(hf)}


def fit_config(fields: dict, checkpoint, cls) -> dict:
    """An untied output layer exactly when the checkpoint holds an
    `lm_head.weight` that differs from `shared.weight` (as `transformers`,
    which otherwise ties them whatever `tie_word_embeddings` says)."""
    if checkpoint is None:
        return fields
    untied = False  # without lm_head.weight, transformers ties it to shared
    if "lm_head.weight" in checkpoint:
        names = ["lm_head.weight", "shared.weight"]
        fresh = [n for n in names if n not in checkpoint.used]
        untied = not np.array_equal(*(checkpoint.get(n) for n in names))
        checkpoint.used.difference_update(fresh)  # only the loading's reads count
    return {**fields, "tie_embeddings": not untied}


def _feed_forward(ffn) -> list[tuple]:
    """(layer, HF name) of a feed-forward: `wi` (gated: `wi_0` the gate,
    `wi_1` the linear branch) and `wo`."""
    if ffn.gated:
        inner = [(ffn.gate_dense, "wi_0"), (ffn.inner_dense, "wi_1")]
    else:
        inner = [(ffn.inner_dense, "wi")]
    return inner + [(ffn.output_dense, "wo")]


def _block(block, decoder: bool) -> list[tuple]:
    """(layer, HF name, kernel shape) of one encoder or decoder block."""
    parts = [(block.self_attention, "SelfAttention", block.self_attention_norm)]
    if decoder:
        parts.append(
            (block.cross_attention_layer, "EncDecAttention", block.cross_attention_norm)
        )
    out = []
    for i, (attention, name, norm) in enumerate(parts):
        out += [
            (layer, f"layer.{i}.{name}.{ATTENTION[role]}", shape)
            for role, (layer, shape) in attention_parts(attention).items()
        ]
        out.append((norm, f"layer.{i}.layer_norm", None))
    i = len(parts)
    out += [
        (layer, f"layer.{i}.DenseReluDense.{name}", None)
        for layer, name in _feed_forward(block.feed_forward)
    ]
    return out + [(block.feed_forward_norm, f"layer.{i}.layer_norm", None)]


def _entries(backbone) -> list[tuple]:
    """(layer, HF name, kernel shape) of every block and final norm."""
    out = []
    for side, blocks, norm in (
        ("encoder", backbone.blocks, backbone.final_norm),
        ("decoder", backbone.decoder_blocks, backbone.decoder_final_norm),
    ):
        for i, block in enumerate(blocks):
            h = f"{side}.block.{i}."
            out += [(x, h + n, s) for x, n, s in _block(block, side == "decoder")]
        out.append((norm, f"{side}.final_layer_norm", None))
    return out


def _bias_tables(backbone) -> list[tuple]:
    """(variable, HF name) of the two relative position tables `[buckets, N]`."""
    return [
        (
            getattr(backbone, f"{side}_position_bias").embeddings,
            f"{side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
        )
        for side in ("encoder", "decoder")
    ]


def _input_embedding(checkpoint, tied: bool) -> np.ndarray:
    """`shared.weight` `[V, D]`; stored stack copies (and, when tied, a
    stored `lm_head.weight`) must equal it."""
    names = ["shared.weight"]
    names += [f"{s}.embed_tokens.weight" for s in ("encoder", "decoder")]
    names += ["lm_head.weight"] if tied else []
    names = [n for n in names if n in checkpoint or n == "shared.weight"]
    values = [checkpoint.get(n) for n in names]
    if any(
        v.shape != values[0].shape or not np.array_equal(v, values[0]) for v in values
    ):
        raise ValueError(
            f"Checkpoint weights {names} differ, but keras_transformers has one "
            "embedding matrix for the encoder, the decoder and (when tied) the "
            "output layer: this checkpoint cannot be converted."
        )
    return values[0]


def load_weights(backbone, checkpoint, require_head: bool) -> None:
    """Copies a T5 checkpoint into `backbone` (a `Seq2SeqBackbone`);
    `require_head`: the model is a `Seq2SeqLM`, so an untied
    `lm_head.weight` must be there.

    Raises:
        ValueError: a missing or misshapen weight, or embedding copies that
            differ.
    """
    checkpoint.prefix(PREFIXES, PROBE, MODEL_TYPE)
    embedding = backbone.token_embedding
    value = _input_embedding(checkpoint, embedding.tie_weights)
    assign(embedding.embeddings, value, "shared.weight")
    for variable, name in _bias_tables(backbone):
        assign(variable, checkpoint.get(name), name)
    for layer, name, shape in _entries(backbone):
        linear = hasattr(layer, "kernel")
        load_layer(layer, checkpoint.get, name, shape=shape, transpose=linear)
    load_head(embedding, checkpoint, require_head)
    if UNUSED in checkpoint:
        checkpoint.used.add(UNUSED)


def _feed_forward_proj(config) -> str:
    for name, (activation, gated) in FEED_FORWARD.items():
        if (config.activation, config.gated_feed_forward) == (activation, gated):
            return name
    raise ValueError(
        "T5 feed-forward layers are ReLU (activation='relu', "
        "gated_feed_forward=False) or gated GELU (activation='gelu_approximate', "
        f"gated_feed_forward=True). Received: activation={config.activation!r}, "
        f"gated_feed_forward={config.gated_feed_forward}."
    )


def hf_config(config) -> dict:
    """The HF `config.json` dict (without `architectures`) for `config`;
    `scale_decoder_outputs` is written out, so that `transformers` scales
    exactly when `scale_logits` does.

    Raises:
        ValueError: the config has options T5 cannot express.
    """
    mha = dict(resolved_num_kv_heads=config.num_heads)
    check_exportable(config, {**LAYOUT, **mha}, MODEL_TYPE)
    hf = {k: getattr(config, ours) for k, (ours, _) in FIELDS.items()}
    hf["d_kv"] = config.resolved_head_dim
    start = config.bos_token_id
    return {
        **hf,
        "model_type": MODEL_TYPE,
        "num_decoder_layers": config.resolved_num_decoder_layers,
        "feed_forward_proj": _feed_forward_proj(config),
        "tie_word_embeddings": config.tie_embeddings,
        "scale_decoder_outputs": config.scale_logits,
        "is_encoder_decoder": True,
        "pad_token_id": config.pad_token_id,
        "eos_token_id": config.eos_token_id,
        "decoder_start_token_id": config.pad_token_id if start is None else start,
    }


def export(model) -> tuple[dict, dict[str, np.ndarray]]:
    """`(config.json dict, tensors)` of a `Seq2SeqLM` (as
    `T5ForConditionalGeneration`) or `Seq2SeqBackbone` (as `T5Model`).

    Raises:
        ValueError: another class, or a config T5 cannot express.
    """
    cls, backbone = type(model).__name__, getattr(model, "backbone", model)
    if cls not in ARCHITECTURES:
        raise ValueError(f"{cls} has no Hugging Face T5 counterpart.")
    hf = {**hf_config(backbone.config), "architectures": [ARCHITECTURES[cls]]}
    embedding = backbone.token_embedding
    out = {"shared.weight": fetch(embedding.embeddings)}
    for variable, name in _bias_tables(backbone):
        out[name] = fetch(variable)
    for layer, name, shape in _entries(backbone):
        export_layer(out, layer, name, shape=shape, transpose=hasattr(layer, "kernel"))
    if model is not backbone:
        export_head(out, embedding)
    elif not embedding.tie_weights:
        raise ValueError(
            "T5Model has no output layer, so this Seq2SeqBackbone's untied "
            "output weights would be lost: export the Seq2SeqLM instead."
        )
    return hf, out


def exports(config) -> bool:
    """Whether a config of this family with no `model_type` asked for
    exports as t5: T5's relative position bias."""
    return bool(config.position_embedding == "relative")


CONVERTER = register_converter(
    Converter(
        MODEL_TYPE,
        config_from_hf=config_from_hf,
        preset_data=preset_data,
        load_weights=backbone_weights(load_weights),
        export=one_layout(export),
        family=FAMILY,
        prefixes=PREFIXES,
        probe=PROBE,
        fit_config=fit_config,
        exports=exports,
        export_order=10,  # the family's default: registry.export_converter
    )
)

__all__ = ["config_from_hf", "export", "fit_config", "load_weights", "preset_data"]
