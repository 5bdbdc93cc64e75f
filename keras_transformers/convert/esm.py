"""Hugging Face ESM (`model_type: "esm"`; ESM-2 protein language models)
<-> the BERT family.

ESM-2 is a pre-norm BERT with rotary positions (`position_embedding_type:
"rotary"`, base `rope_theta`): each layer normalises before attention
(`attention.LayerNorm`) and before the feed-forward (`LayerNorm`), and the
stack ends with a final norm (`encoder.emb_layer_norm_after`); there are no
segment or position tables, and an embedding norm only with
`emb_layer_norm_before`. Token dropout (`token_dropout`, with
`mask_token_id`) zeroes the embeddings of mask tokens and rescales the
others as at inference in transformers: `token_dropout_mask_id`.

Classes: `EsmModel` is a `BertBackbone` (with the tanh pooler when the
checkpoint has its weights), `EsmForMaskedLM` a `BertMaskedLM` (`lm_head`:
dense, GELU, norm, the tied decoder and a bias). Others load as
`BertBackbone`; the contact-prediction head (`contact_head`, on attention
maps) is not converted. Absolute positions (ESM-1b), decoders and ESMFold
configs raise a ValueError naming the option.
"""

from __future__ import annotations

import warnings

from keras_transformers.convert import bert
from keras_transformers.convert.common import (
    export_rows,
    linear_rows,
    load_rows,
    norm_rows,
    special_ids,
)
from keras_transformers.convert.protocol import Converter
from keras_transformers.registry import register_converter

MODEL_TYPE = "esm"
FAMILY = "bert"
PREFIXES = ("esm.", "")
PROBE = "embeddings.word_embeddings.weight"
CLASSES = {"EsmModel": "BertBackbone", "EsmForMaskedLM": "BertMaskedLM"}
ARCHITECTURES = {ours: name for name, ours in CLASSES.items()}
DEFAULTS = dict(  # `transformers.EsmConfig`'s
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,
    hidden_dropout_prob=0.1,
    attention_probs_dropout_prob=0.1,
    max_position_embeddings=1026,
    rope_theta=10000.0,
    initializer_range=0.02,
    layer_norm_eps=1e-12,
    position_embedding_type="absolute",
    emb_layer_norm_before=False,
    token_dropout=False,
    tie_word_embeddings=True,
    eos_token_id=2,
)
CONVERTIBLE = {  # option -> (the value we convert, what other values mean)
    "position_embedding_type": ("rotary", "ESM-1b's learned absolute positions"),
    "is_decoder": (False, "a causal decoder"),
    "add_cross_attention": (False, "cross-attention in every layer"),
    "is_folding_model": (False, "ESMFold's structure trunk"),
    "tie_word_embeddings": (True, "a masked-LM decoder of its own"),
}
# Tensors of the checkpoint that have no place here (buffers, contact head).
UNUSED = (
    "embeddings.position_ids",
    "rotary_embeddings.inv_freq",
    "contact_head.regression.weight",
    "contact_head.regression.bias",
)
ROTARY = "attention.self.rotary_embeddings.inv_freq"  # a buffer, saved per layer


def config_from_hf(hf: dict) -> dict:
    """TransformerConfig fields for an HF ESM `config.json` dict.

    Raises:
        ValueError: an option we cannot reproduce (named), or
            `token_dropout` without `mask_token_id`.
    """
    hf = {**DEFAULTS, **{k: v for k, v in hf.items() if v is not None}}
    for key, (value, what) in CONVERTIBLE.items():
        if hf.get(key, value) != value:
            raise ValueError(
                f"ESM config has {key}={hf[key]!r} ({what}), which keras_transformers "
                f"cannot reproduce. Only checkpoints with {key}={value!r} convert."
            )
    mask_id = hf.get("mask_token_id") if hf["token_dropout"] else None
    if hf["token_dropout"] and mask_id is None:
        raise ValueError(
            "ESM config has token_dropout=True but no mask_token_id: set "
            "mask_token_id (32 in ESM-2's vocabulary) or token_dropout=False."
        )
    vocabulary = int(hf["vocab_size"])
    return dict(
        vocabulary_size=vocabulary,
        num_layers=int(hf["num_hidden_layers"]),
        hidden_dim=int(hf["hidden_size"]),
        num_heads=int(hf["num_attention_heads"]),
        intermediate_dim=int(hf["intermediate_size"]),
        max_sequence_length=int(hf["max_position_embeddings"]),
        stacks="encoder",
        norm_position="pre",
        norm_type="layer",
        norm_epsilon=float(hf["layer_norm_eps"]),
        final_norm=True,
        embedding_norm=bool(hf["emb_layer_norm_before"]),
        position_embedding="rotary",
        rope_max_wavelength=float(hf["rope_theta"]),
        activation="gelu",
        use_bias=True,
        num_segments=0,
        pooler="EsmForMaskedLM" not in (hf.get("architectures") or ()),
        tie_embeddings=True,
        token_dropout_mask_id=None if mask_id is None else int(mask_id),
        dropout=float(hf["hidden_dropout_prob"]),
        attention_dropout=float(hf["attention_probs_dropout_prob"]),
        initializer_range=float(hf["initializer_range"]),
        **special_ids(hf, vocabulary),
    )


def preset_data(hf: dict) -> dict:
    """`{"family", "class_name", "config"}`: `BertMaskedLM` for
    `EsmForMaskedLM`, else `BertBackbone`."""
    names = [a for a in hf.get("architectures") or () if a in CLASSES]
    name = CLASSES[names[0]] if names else "BertBackbone"
    return {"family": FAMILY, "class_name": name, "config": config_from_hf(hf)}


def fit_config(fields: dict, checkpoint, cls) -> dict:
    """A pooler exactly when the checkpoint has its weights."""
    if checkpoint is None:
        return fields
    pooler = any(p + "pooler.dense.weight" in checkpoint for p in PREFIXES)
    return {**fields, "pooler": pooler}


def _rows(model, p: str, head: bool) -> list[tuple]:
    """The two-way name map (see `convert.common.load_rows`)."""
    backbone = getattr(model, "backbone", model)
    table = backbone.token_embedding.embeddings
    rows = [(p + "embeddings.word_embeddings.weight", [(table, table.shape)], False)]
    if backbone.embedding_norm is not None:
        rows += norm_rows(backbone.embedding_norm, p + "embeddings.layer_norm")
    for i, block in enumerate(backbone.blocks):
        n, attention = f"{p}encoder.layer.{i}.", block.self_attention
        rows += norm_rows(block.self_attention_norm, n + "attention.LayerNorm")
        for role in ("query", "key", "value"):
            layer = getattr(attention, role + "_dense")
            rows += linear_rows([layer], f"{n}attention.self.{role}")
        out = attention.output_dense
        kernel = [(out.kernel, (-1, out.kernel.shape[-1]))]
        rows.append((n + "attention.output.dense.weight", kernel, True))
        rows.append((n + "attention.output.dense.bias", [(out.bias, (-1,))], False))
        rows += norm_rows(block.feed_forward_norm, n + "LayerNorm")
        rows += linear_rows([block.feed_forward.inner_dense], n + "intermediate.dense")
        rows += linear_rows([block.feed_forward.output_dense], n + "output.dense")
    rows += norm_rows(backbone.final_norm, p + "encoder.emb_layer_norm_after")
    if backbone.pooler is not None:
        rows += linear_rows([backbone.pooler], p + "pooler.dense")
    if head:
        lm = model.masked_lm_head
        rows += linear_rows([lm.transform], "lm_head.dense")
        rows += norm_rows(lm.norm, "lm_head.layer_norm")
        rows.append(("lm_head.bias", [(lm.bias, (-1,))], False))
    return rows


def load_model_weights(model, checkpoint, hf: dict) -> None:
    """Copies an ESM checkpoint into a `BertBackbone` or `BertMaskedLM`; a
    masked-LM head the checkpoint lacks stays new (with a warning)."""
    p = checkpoint.prefix(PREFIXES, PROBE, MODEL_TYPE)
    head = hasattr(model, "masked_lm_head") and "lm_head.dense.weight" in checkpoint
    if hasattr(model, "masked_lm_head") and not head:
        warnings.warn(
            f"{checkpoint.directory} has no weights for the masked-LM head of "
            "BertMaskedLM: newly initialised, train before use.",
            stacklevel=3,
        )
    # transformers saves `LayerNorm.weight` / `.bias` as `.gamma` / `.beta`.
    load_rows(_rows(model, p, head), bert._getter(checkpoint))
    checkpoint.used.update(p + name for name in UNUSED)
    layers = range(len(getattr(model, "backbone", model).blocks))
    # transformers 5 saves it once, under a literal `*` for the layer.
    checkpoint.used.update(f"{p}encoder.layer.{i}.{ROTARY}" for i in [*layers, "*"])
    checkpoint.used.add("lm_head.decoder.weight")  # the tied table


def hf_config(config) -> dict:
    """The HF `config.json` dict of an ESM-layout `config`.

    Raises:
        ValueError: a config ESM cannot express.
    """
    if not exports(config):
        raise ValueError(
            "This model cannot be exported as Hugging Face 'esm': it needs "
            "stacks='encoder', norm_position='pre', LayerNorms, a final norm, "
            "rotary positions (one base, all of each head), a GELU feed-forward "
            "that is not gated, biases, tied embeddings, no segments, sliding "
            "layers, factorised or shared layers."
        )
    mask_id = config.token_dropout_mask_id
    return {
        "model_type": MODEL_TYPE,
        "vocab_size": config.vocabulary_size,
        "hidden_size": config.hidden_dim,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "intermediate_size": config.intermediate_dim,
        "max_position_embeddings": config.max_sequence_length,
        "layer_norm_eps": config.norm_epsilon,
        "position_embedding_type": "rotary",
        "rope_theta": config.rope_max_wavelength,
        "emb_layer_norm_before": config.embedding_norm,
        "token_dropout": mask_id is not None,
        "mask_token_id": mask_id,
        "hidden_dropout_prob": config.dropout,
        "attention_probs_dropout_prob": config.attention_dropout,
        "initializer_range": config.initializer_range,
        "tie_word_embeddings": True,
        "pad_token_id": config.pad_token_id,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
    }


def export(model, model_type: str = MODEL_TYPE) -> tuple[dict, dict]:
    """`(config.json dict, tensors)` of a `BertBackbone` (`EsmModel`) or
    `BertMaskedLM` (`EsmForMaskedLM`).

    Raises:
        ValueError: another class, a `BertMaskedLM` with a pooler, or a
            config ESM cannot express.
    """
    cls, backbone = type(model).__name__, getattr(model, "backbone", model)
    if cls not in ARCHITECTURES:
        raise ValueError(f"{cls} has no Hugging Face ESM counterpart.")
    head = model is not backbone
    if head and backbone.pooler is not None:
        raise ValueError(
            "EsmForMaskedLM has no pooler, but this BertMaskedLM has one "
            "(config.pooler=True): build it with pooler=False."
        )
    hf = {**hf_config(backbone.config), "architectures": [ARCHITECTURES[cls]]}
    out = export_rows(_rows(model, "esm." if head else "", head))
    if head:
        out["lm_head.decoder.weight"] = out["esm.embeddings.word_embeddings.weight"]
    return hf, out


def exports(config) -> bool:
    """Whether a BERT-family config exports as esm: ESM's layout (pre-norm,
    rotary, plain GELU feed-forward with biases, first block normalised)."""
    return bool(
        config.stacks == "encoder"
        and config.norm_position == "pre"
        and config.norm_type == "layer"
        and config.first_attention_norm
        and config.final_norm
        and config.rotary
        and not config.gated_feed_forward
        and config.activation == "gelu"
        and config.use_bias
        and config.tie_embeddings
        and config.pooler_activation == "tanh"
        and config.num_segments == 0
        and config.embedding_dim is None
        and config.num_layer_groups is None
        and config.num_kv_heads in (None, config.num_heads)
        and config.head_dim in (None, config.hidden_dim // config.num_heads)
        and config.rope_scaling is None
        and config.rope_scaling_factor == 1.0
        and config.rotary_fraction == 1.0
        and config.layer_types is None
        and config.layer_settings is None
        and config.sliding_window is None
        and not config.qk_norm
        and config.attention_scale is None
    )


CONVERTER = register_converter(
    Converter(
        MODEL_TYPE,
        config_from_hf=config_from_hf,
        preset_data=preset_data,
        load_weights=load_model_weights,
        export=export,
        family=FAMILY,
        prefixes=PREFIXES,
        probe=PROBE,
        fit_config=fit_config,
        exports=exports,
        export_order=16,  # before ELECTRA's and BERT's (registry.export_converter)
    )
)
