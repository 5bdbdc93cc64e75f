"""Hugging Face DistilBERT (`model_type: "distilbert"`) <-> the BERT family.

DistilBERT is BERT without token types or pooler, its tensors renamed
(`distilbert.transformer.layer.N.attention.q_lin`, `sa_layer_norm`,
`ffn.lin1`, ..., the masked-LM head as `vocab_transform`,
`vocab_layer_norm`, `vocab_projector`) and its norms' epsilon fixed at
1e-12. Everything else is `keras_transformers.convert.bert`, run on renamed
tensors. `DistilBertForSequenceClassification` (a ReLU dense before its
classifier, where ours is BERT's tanh pooler) is refused.
"""

from __future__ import annotations

import re

import numpy as np

from keras_transformers.convert import bert
from keras_transformers.convert.protocol import Converter
from keras_transformers.convert.renamed import Renamed
from keras_transformers.registry import register_converter

MODEL_TYPE = "distilbert"
FAMILY = "bert"
PREFIXES = ("distilbert.", "")
PROBE = bert.PROBE
HEADS = ("Model", "ForMaskedLM", "ForTokenClassification")
BERT_CLASSES = {"DistilBert" + h: "Bert" + h for h in HEADS}
CLASSES = {name: bert.CLASSES[b] for name, b in BERT_CLASSES.items()}
REFUSED = "DistilBertForSequenceClassification"
NORM_EPSILON = 1e-12  # fixed in DistilBERT
FIELDS = {  # DistilBERT key -> (BERT key, DistilBERT default)
    "vocab_size": ("vocab_size", 30522),
    "max_position_embeddings": ("max_position_embeddings", 512),
    "n_layers": ("num_hidden_layers", 6),
    "n_heads": ("num_attention_heads", 12),
    "dim": ("hidden_size", 768),
    "hidden_dim": ("intermediate_size", 3072),
    "dropout": ("hidden_dropout_prob", 0.1),
    "attention_dropout": ("attention_probs_dropout_prob", 0.1),
    "activation": ("hidden_act", "gelu"),
    "initializer_range": ("initializer_range", 0.02),
    "pad_token_id": ("pad_token_id", 0),
    "tie_word_embeddings": ("tie_word_embeddings", True),
}
LAYER = {  # BERT layer part -> DistilBERT's
    "attention.self.query": "attention.q_lin",
    "attention.self.key": "attention.k_lin",
    "attention.self.value": "attention.v_lin",
    "attention.output.dense": "attention.out_lin",
    "attention.output.LayerNorm": "sa_layer_norm",
    "intermediate.dense": "ffn.lin1",
    "output.dense": "ffn.lin2",
    "output.LayerNorm": "output_layer_norm",
}
HEAD = (  # BERT name prefix -> DistilBERT's
    ("bert.", "distilbert."),
    ("cls.predictions.transform.dense.", "vocab_transform."),
    ("cls.predictions.transform.LayerNorm.", "vocab_layer_norm."),
    ("cls.predictions.decoder.", "vocab_projector."),
    ("cls.predictions.bias", "vocab_projector.bias"),
)
BLOCK = re.compile(r"encoder\.layer\.(\d+)\.(.+)\.(weight|bias)$")


def _distilbert_name(name: str) -> str:
    """The DistilBERT name of BERT tensor `name`."""
    for old, new in HEAD:
        if name.startswith(old):
            name = new + name[len(old) :]
            break
    block = BLOCK.search(name)
    if block and block[2] in LAYER:
        layer, part, kind = block.groups()
        name = f"{name[: block.start()]}transformer.layer.{layer}.{LAYER[part]}.{kind}"
    return name


def _as_bert(hf: dict) -> dict:
    """`hf` as the BERT config the same model has.

    Raises:
        ValueError: sinusoidal positions or a sequence classifier.
    """
    if hf.get("sinusoidal_pos_embds"):
        raise ValueError(
            "DistilBERT config has sinusoidal_pos_embds=True, which keras_transformers "
            "does not convert. Only checkpoints with learned positions convert."
        )
    if REFUSED in (hf.get("architectures") or ()):
        raise ValueError(
            f"{REFUSED} is not supported: its head (a ReLU dense, then the "
            "classifier) differs from BertClassifier's tanh pooler. Load the "
            "checkpoint as a BertBackbone and add a new classifier."
        )
    out = {bert_key: hf.get(k, d) for k, (bert_key, d) in FIELDS.items()}
    architectures = [BERT_CLASSES.get(a, a) for a in hf.get("architectures") or ()]
    return {
        **out,
        "architectures": architectures,
        "type_vocab_size": 0,
        "layer_norm_eps": NORM_EPSILON,
        **{k: hf[k] for k in ("id2label", "num_labels", "bos_token_id") if k in hf},
        "eos_token_id": hf.get("eos_token_id"),
    }


def config_from_hf(hf: dict) -> dict:
    """TransformerConfig fields for an HF DistilBERT `config.json` dict.

    Raises:
        ValueError: sinusoidal positions, `DistilBertForSequenceClassification`
            or what `keras_transformers.convert.bert.config_from_hf` refuses.
    """
    return bert.config_from_hf(_as_bert(hf))


def preset_data(hf: dict) -> dict:
    """As `keras_transformers.convert.bert.preset_data`."""
    data = bert.preset_data(_as_bert(hf))
    if "task" in data:
        data["task"]["classifier_dropout"] = hf.get("dropout", 0.1)
    return data


def _renamed(checkpoint) -> Renamed:
    return Renamed(checkpoint, _distilbert_name, (PREFIXES, PROBE, MODEL_TYPE))


def fit_config(fields: dict, checkpoint, cls) -> dict:
    """As `keras_transformers.convert.bert.fit_config` (no pooler is stored)."""
    return bert.fit_config(fields, checkpoint and _renamed(checkpoint), cls)


def load_model_weights(model, checkpoint, hf: dict) -> None:
    """Copies a DistilBERT checkpoint into `model` (any BERT-family class);
    see `keras_transformers.convert.bert.load_model_weights`."""
    bert.load_model_weights(model, _renamed(checkpoint), _as_bert(hf))


def export(model, model_type: str = MODEL_TYPE) -> tuple[dict, dict[str, np.ndarray]]:
    """`(config.json dict, tensors)` of a `BertBackbone`, `BertMaskedLM` or
    `BertTokenClassifier` as the DistilBERT class of its task.

    Raises:
        ValueError: a `BertClassifier`, a pooler, segments, a norm epsilon
            other than 1e-12, or what `keras_transformers.convert.bert.export`
            refuses.
    """
    backbone = getattr(model, "backbone", model)
    config = backbone.config
    unsupported = {
        "BertClassifier": type(model).__name__ == "BertClassifier",
        "pooler=True": backbone.pooler is not None,
        f"num_segments={config.num_segments}": config.num_segments > 0,
        f"norm_epsilon={config.norm_epsilon}": config.norm_epsilon != NORM_EPSILON,
    }
    problems = [name for name, bad in unsupported.items() if bad]
    if problems:
        raise ValueError(
            f"DistilBERT cannot express {', '.join(problems)} (no pooler, no "
            "segments, norm epsilon 1e-12, no tanh-pooler classifier)."
        )
    bert_hf, tensors = bert.export(model)
    hf = {k: bert_hf[bert_key] for k, (bert_key, _) in FIELDS.items()}
    architecture = bert_hf["architectures"][0].replace("Bert", "DistilBert", 1)
    hf.update(model_type=MODEL_TYPE, architectures=[architecture])
    hf.update(sinusoidal_pos_embds=False, qa_dropout=0.1, seq_classif_dropout=0.2)
    hf.update({k: bert_hf[k] for k in ("id2label", "label2id") if k in bert_hf})
    out = {_distilbert_name(n): v for n, v in tensors.items()}
    out.pop(_distilbert_name("bert.embeddings.token_type_embeddings.weight"), None)
    out.pop("embeddings.token_type_embeddings.weight", None)
    return hf, out


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
    )
)
