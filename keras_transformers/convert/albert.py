"""Hugging Face ALBERT (`model_type: "albert"`) <-> the BERT family.

ALBERT is BERT (under `albert.`) with factorised embeddings,
`embedding_size` wide (our `embedding_dim`) and always projected to
`hidden_size` (`encoder.embedding_hidden_mapping_in`), and blocks shared
across depth: `num_hidden_groups` groups (our `num_layer_groups`; 1 in
every published checkpoint: one block run `num_hidden_layers` times),
stored once each as `encoder.albert_layer_groups.G.albert_layers.0`
(`attention.query` / `key` / `value` / `dense` / `LayerNorm`, `ffn`,
`ffn_output`, `full_layer_layer_norm`). The pooler is `albert.pooler` (tanh),
the masked-LM head `predictions.*` (dense to the embedding width, the
config's activation, LayerNorm, the tied embeddings and a bias).
`AlbertForPreTraining` loads as `BertMaskedLM` without its sentence-order
head (`sop_classifier`, reported as unused); `inner_group_num` other than 1
(several blocks per group) is refused. Everything else is
`keras_transformers.convert.bert`, run on renamed tensors.
"""

from __future__ import annotations

import re

import numpy as np

from keras_transformers.convert import bert
from keras_transformers.convert.protocol import Converter
from keras_transformers.convert.renamed import Renamed
from keras_transformers.registry import register_converter

MODEL_TYPE = "albert"
FAMILY = "bert"
PREFIXES = ("albert.", "")
PROBE = bert.PROBE
HEADS = ("Model", "ForPreTraining", "ForMaskedLM", "ForSequenceClassification")
HEADS += ("ForTokenClassification",)
BERT_CLASSES = {"Albert" + h: "Bert" + h for h in HEADS}
CLASSES = {name: bert.CLASSES[b] for name, b in BERT_CLASSES.items()}
DEFAULTS = dict(  # `transformers.AlbertConfig` defaults that differ from BERT's
    vocab_size=30000,
    embedding_size=128,
    hidden_size=4096,
    num_attention_heads=64,
    intermediate_size=16384,
    hidden_act="gelu_new",
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    classifier_dropout_prob=0.1,
    num_hidden_groups=1,
    inner_group_num=1,
    bos_token_id=2,
    eos_token_id=3,
)
LAYER = {  # BERT layer part -> ALBERT's
    "attention.self.query": "attention.query",
    "attention.self.key": "attention.key",
    "attention.self.value": "attention.value",
    "attention.output.dense": "attention.dense",
    "attention.output.LayerNorm": "attention.LayerNorm",
    "intermediate.dense": "ffn",
    "output.dense": "ffn_output",
    "output.LayerNorm": "full_layer_layer_norm",
}
NAMES = (  # BERT name prefix -> ALBERT's
    ("bert.", "albert."),
    ("cls.predictions.transform.dense.", "predictions.dense."),
    ("cls.predictions.transform.LayerNorm.", "predictions.LayerNorm."),
    ("cls.predictions.", "predictions."),
)
BLOCK = re.compile(r"encoder\.layer\.(\d+)\.(.+)\.(weight|bias)$")
PROJECTION = "embeddings_project"  # BERT's name for it (ELECTRA's)


def _albert_name(name: str) -> str:
    """The ALBERT name of BERT tensor `name`."""
    for old, new in NAMES:
        if name.startswith(old):
            name = new + name[len(old) :]
            break
    name = name.replace(PROJECTION, "encoder.embedding_hidden_mapping_in")
    name = name.replace("pooler.dense.", "pooler.")
    block = BLOCK.search(name)
    if block and block[2] in LAYER:
        group, part, kind = block.groups()
        layer = f"albert_layer_groups.{group}.albert_layers.0.{LAYER[part]}"
        name = f"{name[: block.start()]}encoder.{layer}.{kind}"
    return name


def _as_bert(hf: dict) -> dict:
    """`hf` (with ALBERT's defaults) as the BERT config of the same sizes.

    Raises:
        ValueError: `inner_group_num` other than 1, or groups that do not
            divide the layers.
    """
    hf = {**DEFAULTS, **hf}
    if int(hf["inner_group_num"]) != 1:
        raise ValueError(
            f"ALBERT config has inner_group_num={hf['inner_group_num']} (several "
            "blocks per shared group), which keras_transformers does not support; "
            "only inner_group_num=1 (every published ALBERT) converts."
        )
    layers, groups = int(hf.get("num_hidden_layers", 12)), int(hf["num_hidden_groups"])
    if groups < 1 or layers % groups:
        raise ValueError(
            f"ALBERT config has num_hidden_groups={groups}, which does not divide "
            f"num_hidden_layers={layers}; only groups of equal length convert."
        )
    architectures = [BERT_CLASSES.get(a, a) for a in hf.get("architectures") or ()]
    dropout = hf.get("classifier_dropout_prob")
    return {**hf, "architectures": architectures, "classifier_dropout": dropout}


def config_from_hf(hf: dict) -> dict:
    """TransformerConfig fields for an HF ALBERT `config.json` dict.

    Raises:
        ValueError: `inner_group_num` other than 1, uneven groups, or what
            `keras_transformers.convert.bert.config_from_hf` refuses.
    """
    fields = bert.config_from_hf(_as_bert(hf))
    hf = {**DEFAULTS, **hf}
    fields.update(
        embedding_dim=int(hf["embedding_size"]),
        num_layer_groups=int(hf["num_hidden_groups"]),
    )
    return fields


def preset_data(hf: dict) -> dict:
    """As `keras_transformers.convert.bert.preset_data`."""
    data = bert.preset_data(_as_bert(hf))
    data["config"] = config_from_hf(hf)
    return data


def _renamed(checkpoint) -> Renamed:
    return Renamed(checkpoint, _albert_name, (PREFIXES, PROBE, MODEL_TYPE))


def fit_config(fields: dict, checkpoint, cls) -> dict:
    """As `keras_transformers.convert.bert.fit_config`, on ALBERT names."""
    return bert.fit_config(fields, checkpoint and _renamed(checkpoint), cls)


def load_model_weights(model, checkpoint, hf: dict) -> None:
    """Copies an ALBERT checkpoint into `model` (any BERT-family class with
    factorised embeddings); see
    `keras_transformers.convert.bert.load_model_weights`."""
    bert.load_model_weights(model, _renamed(checkpoint), _as_bert(hf))


def export(model, model_type: str = MODEL_TYPE) -> tuple[dict, dict[str, np.ndarray]]:
    """`(config.json dict, tensors)` of a BERT-family model as the ALBERT
    class of its task (`AlbertModel`, `AlbertForMaskedLM`,
    `AlbertForSequenceClassification`, `AlbertForTokenClassification`). A
    model without `embedding_dim` gets an identity projection, one without
    `num_layer_groups` a group per layer.

    Raises:
        ValueError: a `BertClassifier` with `pooling="token"`, or what
            `keras_transformers.convert.bert.export` refuses.
    """
    backbone = getattr(model, "backbone", model)
    config = backbone.config
    if getattr(model, "pooling", "pooled") != "pooled":
        raise ValueError(
            "AlbertForSequenceClassification classifies the pooler output; this "
            "BertClassifier has pooling='token'."
        )
    layout = dict(
        embedding_dim=config.embedding_dim, num_layer_groups=config.num_layer_groups
    )
    hf, tensors = bert.export(model, MODEL_TYPE, layout)
    if backbone.embedding_projection is None:  # the identity, in PyTorch layout
        p, width = ("" if model is backbone else "bert."), config.hidden_dim
        tensors[p + PROJECTION + ".weight"] = np.eye(width, dtype="float32")
        tensors[p + PROJECTION + ".bias"] = np.zeros(width, "float32")
    hf.update(
        architectures=[hf["architectures"][0].replace("Bert", "Albert", 1)],
        embedding_size=backbone.token_embedding.output_dim,
        num_hidden_groups=config.num_layer_groups or config.num_layers,
        inner_group_num=1,
    )
    if "classifier_dropout" in hf:
        hf["classifier_dropout_prob"] = hf.pop("classifier_dropout")
    return hf, {_albert_name(name): value for name, value in tensors.items()}


def exports(config) -> bool:
    """Whether a config of this family with no `model_type` asked for
    exports as albert: blocks shared across depth."""
    return config.num_layer_groups is not None


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
        export_order=15,  # the family's default: registry.export_converter
    )
)
