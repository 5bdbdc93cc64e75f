"""Hugging Face BERT (`model_type: "bert"`) <-> the BERT family.

`architectures` picks the class (see `CLASSES`; others load as
`BertBackbone`). PyTorch `Linear` weights are `[out, in]`; ours are
`[in, out]` (split into heads for attention). Old files with
`LayerNorm.gamma` / `.beta` names load too.
"""

from __future__ import annotations

import warnings

import keras
import numpy as np

from keras_transformers.convert.common import (
    ACTIVATIONS,
    assign,
    attention_parts,
    check_exportable,
    export_layer,
    fetch,
    load_layer,
    load_positions,
    num_labels,
    special_ids,
)
from keras_transformers.convert.protocol import Converter, one_layout
from keras_transformers.registry import register_converter

MODEL_TYPE = "bert"
FAMILY = "bert"
PREFIXES = ("bert.", "")
# The tensor (under one of PREFIXES) that marks a checkpoint of this type.
PROBE = "embeddings.word_embeddings.weight"
CLASSES = {  # HF architecture -> ours; export inverts it (less PreTraining)
    "BertModel": "BertBackbone",
    "BertForPreTraining": "BertMaskedLM",
    "BertForMaskedLM": "BertMaskedLM",
    "BertForSequenceClassification": "BertClassifier",
    "BertForTokenClassification": "BertTokenClassifier",
}
ARCHITECTURES = {v: k for k, v in CLASSES.items() if k != "BertForPreTraining"}
NO_POOLER = ("BertForMaskedLM", "BertForTokenClassification")  # add_pooling_layer=False
CLASSIFIERS = ("BertClassifier", "BertTokenClassifier")
MLM = "cls.predictions."
FIELDS = {  # HF key -> (our field, HF default); the default's type is the type
    "vocab_size": ("vocabulary_size", 30522),
    "num_hidden_layers": ("num_layers", 12),
    "hidden_size": ("hidden_dim", 768),
    "num_attention_heads": ("num_heads", 12),
    "intermediate_size": ("intermediate_dim", 3072),
    "max_position_embeddings": ("max_sequence_length", 512),
    "type_vocab_size": ("num_segments", 2),
    "layer_norm_eps": ("norm_epsilon", 1e-12),
    "hidden_dropout_prob": ("dropout", 0.1),
    "attention_probs_dropout_prob": ("attention_dropout", 0.1),
    "initializer_range": ("initializer_range", 0.02),
    "tie_word_embeddings": ("tie_embeddings", True),
}
CONVERTIBLE = {  # option -> (the value we convert, what other values mean)
    "position_embedding_type": ("absolute", "relative position embeddings"),
    "is_decoder": (False, "a causal decoder, e.g. BertLMHeadModel"),
    "add_cross_attention": (False, "cross-attention in every layer"),
}
ENCODER = dict(  # the layout of every BERT checkpoint
    stacks="encoder",
    norm_position="post",
    norm_type="layer",
    final_norm=False,
    embedding_norm=True,
    position_embedding="learned",
    gated_feed_forward=False,
    use_bias=True,
    scale_embeddings=False,
    sliding_window=None,
    moe=None,
    vision=None,
    pooler_activation="tanh",
    embedding_dim=None,
    num_layer_groups=None,
)


def _architecture(hf: dict) -> str | None:
    return next((a for a in hf.get("architectures") or () if a in CLASSES), None)


def config_from_hf(hf: dict) -> dict:
    """TransformerConfig fields for an HF BERT `config.json` dict.

    Raises:
        ValueError: relative position embeddings, a decoder / cross-attention
            config or an unknown `hidden_act`.
    """
    for key, (value, what) in CONVERTIBLE.items():
        if hf.get(key, value) != value:
            raise ValueError(
                f"BERT config has {key}={hf[key]!r} ({what}), which keras_transformers "
                f"does not support. Only checkpoints with {key}={value!r} convert."
            )
    activation = hf.get("hidden_act", "gelu")
    if activation not in ACTIVATIONS:
        raise ValueError(
            f"BERT hidden_act={activation!r} is not supported. "
            f"Supported: {sorted(ACTIVATIONS)}."
        )
    fields = {ours: type(d)(hf.get(k, d)) for k, (ours, d) in FIELDS.items()}
    return dict(
        ENCODER,
        **fields,
        activation=ACTIVATIONS[activation],
        pooler=_architecture(hf) not in NO_POOLER,
        **special_ids(hf, fields["vocabulary_size"]),
    )


def preset_data(hf: dict) -> dict:
    """`{"family", "class_name", "config"}`, plus `"task"` (the head
    arguments `num_classes`, `classifier_dropout`) for classifiers."""
    name = CLASSES.get(_architecture(hf), "BertBackbone")
    data = {"family": FAMILY, "class_name": name, "config": config_from_hf(hf)}
    if name in CLASSIFIERS:
        dropout = hf.get("classifier_dropout")
        dropout = hf.get("hidden_dropout_prob", 0.1) if dropout is None else dropout
        data["task"] = {"num_classes": num_labels(hf), "classifier_dropout": dropout}
    return data


def fit_config(fields: dict, checkpoint, cls) -> dict:
    """A pooler when the checkpoint has its weights (a `BertModel` may be
    saved without), and always for `BertClassifier`, which reads it."""
    pooler = fields["pooler"]
    if checkpoint is not None:
        pooler = any(p + "pooler.dense.weight" in checkpoint for p in PREFIXES)
    return {**fields, "pooler": pooler or cls.__name__ == "BertClassifier"}


def _block(block) -> list[tuple]:
    """(layer, HF name, kernel shape) of one encoder layer."""
    names = dict(query="self.query", key="self.key", value="self.value")
    out = [
        (layer, "attention." + names.get(role, "output.dense"), shape)
        for role, (layer, shape) in attention_parts(block.self_attention).items()
    ]
    ffn = block.feed_forward
    out += [(ffn.inner_dense, "intermediate.dense", None)]
    out += [(ffn.output_dense, "output.dense", None)]
    out += [(block.self_attention_norm, "attention.output.LayerNorm", None)]
    return out + [(block.feed_forward_norm, "output.LayerNorm", None)]


def _entries(model, p: str, pooler: bool, head: bool) -> list[tuple]:
    """(layer or variable, HF name, kernel shape, transposed) of `model`:
    the backbone under prefix `p`, its pooler and its head if asked."""
    backbone = getattr(model, "backbone", model)
    e, segments = p + "embeddings.", backbone.segment_embedding
    out = [
        (backbone.token_embedding.embeddings, e + "word_embeddings.weight", None),
        (backbone.embedding_norm, e + "LayerNorm", None),
    ]
    if backbone.position_embedding is not None:  # none: relative positions
        positions = backbone.position_embedding.embeddings
        out.append((positions, e + "position_embeddings.weight", None))
    if segments is not None:
        out.append((segments.embeddings, e + "token_type_embeddings.weight", None))
    if backbone.embedding_projection is not None:  # ELECTRA's name
        out.append((backbone.embedding_projection, p + "embeddings_project", None))
    blocks = list({id(b): b for b in backbone.blocks}.values())  # shared: once
    for i, block in enumerate(blocks):
        out += [(x, f"{p}encoder.layer.{i}.{n}", s) for x, n, s in _block(block)]
    if pooler and backbone.pooler is not None:
        out.append((backbone.pooler, p + "pooler.dense", None))
    if head and hasattr(model, "classifier"):
        out.append((model.classifier, "classifier", None))
    elif head and hasattr(model, "masked_lm_head"):
        lm, embedding = model.masked_lm_head, backbone.token_embedding
        out += [(lm.transform, MLM + "transform.dense", None)]
        out += [(lm.norm, MLM + "transform.LayerNorm", None)]
        if embedding.tie_weights:  # the tied decoder's bias is this one too
            out.append((lm.bias, MLM + "bias", None))
        else:  # untied: a `[V, D]` decoder with its own bias
            out.append((embedding.reverse_embeddings, MLM + "decoder.weight", None))
            out.append((lm.bias, MLM + "decoder.bias", None))
    # PyTorch Linear weights (and the untied decoder) are transposed.
    linear = lambda x, n: hasattr(x, "kernel") or n.endswith("decoder.weight")  # noqa: E731
    return [(x, n, s, linear(x, n)) for x, n, s in out]


def _getter(checkpoint):
    """`checkpoint.get` that also reads legacy `LayerNorm.gamma` / `.beta`."""

    def get(name):
        legacy = name.replace("LayerNorm.weight", "LayerNorm.gamma")
        legacy = legacy.replace("LayerNorm.bias", "LayerNorm.beta")
        return checkpoint.get(legacy if name not in checkpoint else name)

    return get


def load_model_weights(model, checkpoint, hf: dict) -> None:
    """Copies a BERT checkpoint into `model` (any BERT-family class). A
    pooler or head the checkpoint lacks, or a head of another class or
    width, stays new (with a warning naming it)."""
    cls, backbone = type(model).__name__, getattr(model, "backbone", model)
    p = checkpoint.prefix(PREFIXES, PROBE, MODEL_TYPE)
    new = [] if p + "pooler.dense.weight" in checkpoint else ["pooler"]
    new = new if backbone.pooler is not None else []
    same = CLASSES.get(_architecture(hf)) == cls
    if cls in CLASSIFIERS and not (same and num_labels(hf) == model.num_classes):
        new.append("classifier")
    if cls == "BertMaskedLM" and MLM + "transform.dense.weight" not in checkpoint:
        new.append("masked-LM head")
    head = model is not backbone and not set(new) - {"pooler"}
    get = _getter(checkpoint)
    for x, name, shape, transposed in _entries(model, p, "pooler" not in new, head):
        if not isinstance(x, keras.Variable):
            load_layer(x, get, name, shape=shape, transpose=transposed)
        elif "position_embeddings" in name:  # cut or grown to max_sequence_length
            load_positions(x, get(name), name)
        else:
            if name == MLM + "decoder.bias" and name not in checkpoint:
                name = MLM + "bias"  # files that tie the decoder bias
            assign(x, get(name), name, transpose=transposed)
    # Buffers and tied copies some files also hold.
    tied = [MLM + n for n in ("bias", "decoder.weight", "decoder.bias")]
    checkpoint.used.update([p + "embeddings.position_ids"] + tied * head)
    if new:
        warnings.warn(
            f"{checkpoint.directory} has no weights for the {' and '.join(new)} of "
            f"{cls}: newly initialised, train before use.",
            stacklevel=3,
        )


def hf_config(config, layout=None, model_type: str = MODEL_TYPE) -> dict:
    """The HF `config.json` dict (without `architectures`) for `config`;
    `layout` changes what `ENCODER` requires (a type sharing BERT's fields,
    `model_type`, e.g. ELECTRA's factorised embeddings)."""
    mha = dict(  # plain multi-head attention, head_dim = hidden_dim / num_heads
        resolved_num_kv_heads=config.num_heads,
        resolved_head_dim=config.hidden_dim // config.num_heads,
    )
    check_exportable(config, {**ENCODER, **mha, **(layout or {})}, model_type)
    activation = dict(gelu="gelu", gelu_approximate="gelu_new")
    return {
        **{k: getattr(config, ours) for k, (ours, _) in FIELDS.items()},
        "model_type": model_type,
        "type_vocab_size": max(config.num_segments, 1),  # 0: one all-zero row
        "hidden_act": activation.get(config.activation, config.activation),
        "position_embedding_type": "absolute",
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "pad_token_id": config.pad_token_id,
    }


def export(model, model_type=MODEL_TYPE, layout=None) -> tuple[dict, dict]:
    """`(config.json dict, tensors)` of a BERT-family model as its HF class
    (`BertModel`, `BertForMaskedLM`, `BertForSequenceClassification` or
    `BertForTokenClassification`); `layout` and `model_type` as `hf_config`'s.

    Raises:
        ValueError: an unknown class, a `BertClassifier` without pooler, or
            a config BERT cannot express.
    """
    cls, backbone = type(model).__name__, getattr(model, "backbone", model)
    if cls not in ARCHITECTURES:
        raise ValueError(f"{cls} has no Hugging Face BERT counterpart.")
    if cls == "BertClassifier" and backbone.pooler is None:
        raise ValueError(
            "BertForSequenceClassification classifies the pooler output, but this "
            "BertClassifier has no pooler (config.pooler=False)."
        )
    hf = hf_config(backbone.config, layout, model_type)
    hf["architectures"] = [ARCHITECTURES[cls]]
    out = export_tensors(model)
    if cls in CLASSIFIERS:
        labels = {i: f"LABEL_{i}" for i in range(model.num_classes)}
        hf.update(id2label=labels, label2id={v: i for i, v in labels.items()})
        hf["classifier_dropout"] = model.classifier_dropout
    return hf, out


def export_tensors(model) -> dict[str, np.ndarray]:
    """The tensors of a BERT-family model under BERT's names (a task
    model's backbone under `bert.`), whatever its position scheme."""
    cls, backbone = type(model).__name__, getattr(model, "backbone", model)
    p, out = ("" if model is backbone else "bert."), {}
    pooler = cls in ("BertBackbone", "BertClassifier")  # the others have none
    for x, name, shape, transposed in _entries(model, p, pooler, head=True):
        if isinstance(x, keras.Variable):
            out[name] = fetch(x, transpose=transposed)
        else:
            export_layer(out, x, name, shape=shape, transpose=transposed)
    if MLM + "decoder.bias" in out:  # untied: HF keeps an unused copy too
        out[MLM + "bias"] = out[MLM + "decoder.bias"]
    if backbone.segment_embedding is None:  # one all-zero token type
        width = backbone.token_embedding.output_dim
        out[p + "embeddings.token_type_embeddings.weight"] = np.zeros((1, width))
    return out


def exports(config) -> bool:
    """Whether a config of this family with no `model_type` asked for
    exports as bert: any other BERT-family encoder."""
    return True


CONVERTER = register_converter(
    Converter(
        MODEL_TYPE,
        config_from_hf=config_from_hf,
        preset_data=preset_data,
        load_weights=load_model_weights,
        export=one_layout(export),
        family=FAMILY,
        prefixes=PREFIXES,
        probe=PROBE,
        fit_config=fit_config,
        exports=exports,
        export_order=100,  # the family's default: registry.export_converter
    )
)
