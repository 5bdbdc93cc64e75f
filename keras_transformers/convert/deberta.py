"""Hugging Face DeBERTa-v2 / v3 (`model_type: "deberta-v2"`) <-> the BERT
family with `position_embedding="disentangled"`.

DeBERTa is BERT without absolute positions (`position_biased_input=False`)
whose attention adds relative-position terms (see
`keras_transformers.layers.disentangled`): its tensors are BERT's under
`deberta.` (`attention.self.query_proj` / `key_proj` / `value_proj`), plus
`encoder.rel_embeddings`, `encoder.LayerNorm` (`norm_rel_ebd`) and, without
`share_att_key`, per-layer `pos_key_proj` / `pos_query_proj`. The sequence
classifier's ContextPooler (`pooler.dense`, `pooler_hidden_act`) is our
pooler; the masked-LM head (the legacy `cls.predictions.*` or
`lm_predictions.lm_head.*`: dense, activation, LayerNorm, the tied
embeddings and a bias) is `MaskedLMHead`. Everything else is
`keras_transformers.convert.bert`, run on renamed tensors.
"""

from __future__ import annotations

import numpy as np

from keras_transformers.convert import bert
from keras_transformers.convert.common import (
    ACTIVATIONS,
    assign,
    export_layer,
    fetch,
    load_layer,
)
from keras_transformers.convert.protocol import Converter
from keras_transformers.convert.renamed import Renamed
from keras_transformers.registry import register_converter

MODEL_TYPE = "deberta-v2"
FAMILY = "bert"
PREFIXES = ("deberta.", "")
PROBE = bert.PROBE
HEADS = ("Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification")
BERT_CLASSES = {"DebertaV2" + h: "Bert" + h for h in HEADS}
CLASSES = {name: bert.CLASSES[b] for name, b in BERT_CLASSES.items()}
DEFAULTS = dict(  # `transformers.DebertaV2Config` defaults that differ from BERT's
    vocab_size=128100,
    hidden_size=1536,
    num_hidden_layers=24,
    num_attention_heads=24,
    intermediate_size=6144,
    type_vocab_size=0,
    layer_norm_eps=1e-7,
    position_biased_input=True,
    relative_attention=False,
)
REFUSED = {  # option -> (the value we convert, what other values mean, the fix)
    "relative_attention": (
        True,
        "no relative positions",
        "a checkpoint with disentangled attention, as every published DeBERTa-v2 / v3",
    ),
    "position_biased_input": (
        False,
        "absolute position embeddings added to the input",
        "DeBERTa-v2 / v3 checkpoints, which have none",
    ),
    "conv_kernel_size": (0, "the v2-xlarge/xxlarge convolution layer", "v3 models"),
}
SELF = "attention.self."
NAMES = (  # BERT name part -> DeBERTa's
    (SELF + "query.", SELF + "query_proj."),
    (SELF + "key.", SELF + "key_proj."),
    (SELF + "value.", SELF + "value_proj."),
)
LM_HEAD = (  # legacy (BERT) masked-LM names -> the `legacy=False` head's
    ("cls.predictions.transform.dense.", "lm_predictions.lm_head.dense."),
    ("cls.predictions.transform.LayerNorm.", "lm_predictions.lm_head.LayerNorm."),
    ("cls.predictions.bias", "lm_predictions.lm_head.bias"),
)
ENCODER = "encoder."
POOLER_ACTIVATIONS = {**ACTIVATIONS, "tanh": "tanh"}  # pooler_hidden_act -> ours
EXPORTED = {"gelu": "gelu", "gelu_approximate": "gelu_new", "relu": "relu"}
EXPORTED.update(silu="silu", tanh="tanh")  # our activation -> HF's


def _terms(hf: dict) -> list[str]:
    terms = hf.get("pos_att_type") or []
    if isinstance(terms, str):
        terms = [t.strip() for t in terms.lower().split("|")]
    return list(terms)


def _check(hf: dict) -> None:
    """Raises ValueError naming an option keras_transformers does not have."""
    for key, (value, what, fix) in REFUSED.items():
        if hf.get(key) is not None and hf[key] != value:
            raise ValueError(
                f"DeBERTa config has {key}={hf[key]!r} ({what}), which keras_transformers "
                f"does not support; only {key}={value!r} converts (use {fix})."
            )
    bad = sorted(set(_terms(hf)) - {"c2p", "p2c"})
    if bad:
        raise ValueError(
            f"DeBERTa pos_att_type has {bad}, which keras_transformers does not "
            "support; only 'c2p' and 'p2c' convert (drop the others from pos_att_type)."
        )
    for key in ("embedding_size", "pooler_hidden_size"):
        if hf.get(key, hf["hidden_size"]) != hf["hidden_size"]:
            raise ValueError(
                f"DeBERTa config has {key}={hf[key]} != hidden_size="
                f"{hf['hidden_size']}, which keras_transformers does not support."
            )
    activation = hf.get("pooler_hidden_act", "gelu")
    if activation not in POOLER_ACTIVATIONS:
        raise ValueError(
            f"DeBERTa pooler_hidden_act={activation!r} is not supported. "
            f"Supported: {sorted(POOLER_ACTIVATIONS)}."
        )


def _as_bert(hf: dict) -> dict:
    """`hf` (with DeBERTa's defaults) as the BERT config of the same sizes."""
    hf = {**DEFAULTS, **hf}
    _check(hf)
    architectures = [BERT_CLASSES.get(a, a) for a in hf.get("architectures") or ()]
    dropout = hf.get("cls_dropout")
    dropout = hf.get("hidden_dropout_prob", 0.1) if dropout is None else dropout
    return {**hf, "architectures": architectures, "classifier_dropout": dropout}


def config_from_hf(hf: dict) -> dict:
    """TransformerConfig fields for an HF DeBERTa-v2 `config.json` dict.

    Raises:
        ValueError: an option keras_transformers lacks (see `REFUSED`,
            `pos_att_type` other than c2p / p2c, `embedding_size` or
            `pooler_hidden_size` other than `hidden_size`), or what
            `keras_transformers.convert.bert.config_from_hf` refuses.
    """
    fields = bert.config_from_hf(_as_bert(hf))
    hf = {**DEFAULTS, **hf}
    buckets = max(int(hf.get("position_buckets", -1)), 0)
    longest = int(hf.get("max_relative_positions", -1))
    norm = [x.strip() for x in str(hf.get("norm_rel_ebd", "none")).lower().split("|")]
    head = hf.get("attention_head_size")
    fields.update(
        position_embedding="disentangled",
        disentangled=dict(
            position_buckets=buckets,
            max_relative_positions=longest
            if longest > 0
            else fields["max_sequence_length"],
            share_att_key=bool(hf.get("share_att_key", False)),
            attention_terms=_terms(hf),
            norm_relative_embeddings="layer_norm" in norm,
        ),
        pooler="DebertaV2ForSequenceClassification" in (hf.get("architectures") or ()),
        pooler_activation=POOLER_ACTIVATIONS[hf.get("pooler_hidden_act", "gelu")],
        head_dim=int(head) if head else None,
    )
    return fields


def preset_data(hf: dict) -> dict:
    """As `keras_transformers.convert.bert.preset_data`."""
    data = bert.preset_data(_as_bert(hf))
    data["config"] = config_from_hf(hf)
    return data


def _deberta_name(name: str, legacy: bool = True) -> str:
    """The DeBERTa name of BERT tensor `name` (`legacy`: the masked-LM head
    as `cls.predictions.*`)."""
    if name.startswith("bert."):
        name = "deberta." + name[len("bert.") :]
    if name.startswith("deberta.pooler."):  # ContextPooler: top level
        name = name[len("deberta.") :]
    for old, new in NAMES:
        name = name.replace(old, new)
    for old, new in () if legacy else LM_HEAD:
        if name.startswith(old):
            name = new + name[len(old) :]
    return name


def _renamed(checkpoint) -> Renamed:
    legacy = "lm_predictions.lm_head.dense.weight" not in checkpoint
    rename = lambda name: _deberta_name(name, legacy)  # noqa: E731
    return Renamed(checkpoint, rename, (PREFIXES, PROBE, MODEL_TYPE))


def fit_config(fields: dict, checkpoint, cls) -> dict:
    """As `keras_transformers.convert.bert.fit_config`, on DeBERTa names."""
    return bert.fit_config(fields, checkpoint and _renamed(checkpoint), cls)


def _relative_entries(backbone, p: str) -> list[tuple]:
    """(layer, DeBERTa name, 2-D kernel shape or None) of the relative
    embeddings' norm and the per-layer position projections."""
    relative = backbone.disentangled
    out = [(relative.norm, p + ENCODER + "LayerNorm", None)] if relative.norm else []
    for kind in ("key", "query"):
        name = p + ENCODER + "layer.{}.attention.self.pos_" + kind + "_proj"
        for i, layer in enumerate(
            relative.position_keys if kind == "key" else relative.position_queries
        ):
            d, n, h = layer.kernel.shape
            out.append((layer, name.format(i), (d, n * h)))
    return out


def load_model_weights(model, checkpoint, hf: dict) -> None:
    """Copies a DeBERTa-v2 checkpoint into `model` (any BERT-family class
    with disentangled attention); see
    `keras_transformers.convert.bert.load_model_weights`."""
    backbone = getattr(model, "backbone", model)
    bert.load_model_weights(model, _renamed(checkpoint), _as_bert(hf))
    p = checkpoint.prefix(PREFIXES, PROBE, MODEL_TYPE)
    table = p + ENCODER + "rel_embeddings.weight"
    assign(backbone.disentangled.embeddings, checkpoint.get(table), table)
    for layer, name, shape in _relative_entries(backbone, p):
        load_layer(layer, checkpoint.get, name, shape=shape, transpose=bool(shape))


def export(model, model_type: str = MODEL_TYPE) -> tuple[dict, dict[str, np.ndarray]]:
    """`(config.json dict, tensors)` of a BERT-family model with disentangled
    attention as the DeBERTa-v2 class of its task (masked-LM head in the
    legacy `cls.predictions` layout).

    Raises:
        ValueError: a model without disentangled attention, or a class
            DeBERTa has no counterpart for.
    """
    cls, backbone = type(model).__name__, getattr(model, "backbone", model)
    config = backbone.config
    if config.disentangled is None:
        raise ValueError(
            "Only models with position_embedding='disentangled' export as "
            f"'deberta-v2'; this one has {config.position_embedding!r} (export it "
            "as 'bert')."
        )
    if cls not in bert.ARCHITECTURES:
        raise ValueError(f"{cls} has no Hugging Face DeBERTa counterpart.")
    architecture = bert.ARCHITECTURES[cls].replace("Bert", "DebertaV2", 1)
    if cls == "BertClassifier" and (
        backbone.pooler is None or model.pooling != "pooled"
    ):
        raise ValueError(
            "DebertaV2ForSequenceClassification classifies the pooler output; this "
            "BertClassifier has no pooler or pooling='token'."
        )
    group = config.disentangled
    if config.pooler_activation not in EXPORTED:
        raise ValueError(
            f"DeBERTa's pooler has no {config.pooler_activation!r} activation "
            f"(pooler_hidden_act: one of {sorted(EXPORTED.values())})."
        )
    hf = {
        **{k: getattr(config, ours) for k, (ours, _) in bert.FIELDS.items()},
        "model_type": MODEL_TYPE,
        "architectures": [architecture],
        "type_vocab_size": config.num_segments,
        "hidden_act": EXPORTED[config.activation],
        "attention_head_size": config.resolved_head_dim,
        "relative_attention": True,
        "position_biased_input": False,
        "max_relative_positions": group.max_relative_positions,
        "position_buckets": group.position_buckets or -1,
        "share_att_key": group.share_att_key,
        "pos_att_type": list(group.attention_terms),
        "norm_rel_ebd": "layer_norm" if group.norm_relative_embeddings else "none",
        "pooler_hidden_act": EXPORTED[config.pooler_activation],
        "pooler_dropout": 0.0,
        "legacy": True,
        "pad_token_id": config.pad_token_id,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
    }
    tensors = bert.export_tensors(model)
    if not config.num_segments:  # DeBERTa has no token types then
        tensors = {k: v for k, v in tensors.items() if "token_type" not in k}
    out = {_deberta_name(name): value for name, value in tensors.items()}
    p = "" if model is backbone else "deberta."
    table = backbone.disentangled.embeddings
    out[p + ENCODER + "rel_embeddings.weight"] = fetch(table)
    for layer, name, shape in _relative_entries(backbone, p):
        export_layer(out, layer, name, shape=shape, transpose=bool(shape))
    if cls in bert.CLASSIFIERS:
        labels = {i: f"LABEL_{i}" for i in range(model.num_classes)}
        hf.update(id2label=labels, label2id={v: i for i, v in labels.items()})
        hf["cls_dropout"] = model.classifier_dropout
    return hf, out


def exports(config) -> bool:
    """Whether a config of this family with no `model_type` asked for
    exports as deberta-v2: disentangled attention."""
    return bool(config.position_embedding == "disentangled")


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
        export_order=10,  # the family's default: registry.export_converter
    )
)
