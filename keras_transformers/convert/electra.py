"""Hugging Face ELECTRA (`model_type: "electra"`) <-> the BERT family.

ELECTRA is BERT under `electra.` without a pooler, with factorised
embeddings: `embedding_size` wide (our `embedding_dim`) and projected to
`hidden_size` by `electra.embeddings_project` when the two differ
(ELECTRA-small: 128 -> 256; base and large have no projection). Its heads:

- `ElectraForPreTraining` (the published discriminators):
  `discriminator_predictions.dense` (the config's activation) and
  `.dense_prediction`, one logit per token: `ElectraDiscriminator`.
- `ElectraForMaskedLM` (the generators): `generator_predictions.dense`
  (to the embedding width, GELU), `.LayerNorm` and `generator_lm_head`
  (the word embeddings, its own bias): `BertMaskedLM`.
- `ElectraForSequenceClassification`: `classifier.dense` with GELU on the
  first token (our pooler, `pooler_activation="gelu"`) and
  `classifier.out_proj`: `BertClassifier`.
- `ElectraForTokenClassification`: `classifier`: `BertTokenClassifier`.

Other classes load as `BertBackbone`. Everything else is
`keras_transformers.convert.bert`, run on renamed tensors.
"""

from __future__ import annotations

import warnings

import numpy as np

from keras_transformers.convert import bert
from keras_transformers.convert.common import export_layer, load_layer
from keras_transformers.convert.protocol import Converter
from keras_transformers.convert.renamed import Renamed
from keras_transformers.registry import register_converter

MODEL_TYPE = "electra"
FAMILY = "bert"
PREFIXES = ("electra.", "")
PROBE = bert.PROBE
DISCRIMINATOR = "ElectraForPreTraining"
HEADS = ("Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification")
# HF architecture -> the BERT architecture it converts as.
BERT_CLASSES = {"Electra" + h: "Bert" + h for h in HEADS}
BERT_CLASSES[DISCRIMINATOR] = "BertModel"  # the backbone, plus our head
CLASSES = {name: bert.CLASSES[b] for name, b in BERT_CLASSES.items()}
CLASSES[DISCRIMINATOR] = "ElectraDiscriminator"
ARCHITECTURES = {ours: name for name, ours in CLASSES.items()}
DEFAULTS = dict(  # `transformers.ElectraConfig` defaults that differ from BERT's
    embedding_size=128,
    hidden_size=256,
    num_attention_heads=4,
    intermediate_size=1024,
)
NAMES = (  # BERT name prefix -> ELECTRA's
    ("bert.", "electra."),
    ("cls.predictions.transform.dense.", "generator_predictions.dense."),
    ("cls.predictions.transform.LayerNorm.", "generator_predictions.LayerNorm."),
    ("cls.predictions.decoder.", "generator_lm_head."),
    ("cls.predictions.bias", "generator_lm_head.bias"),
)
SEQUENCE_HEAD = (  # BERT -> ELECTRA names of a sequence classifier
    ("electra.pooler.dense.", "classifier.dense."),
    ("classifier.", "classifier.out_proj."),
)
LAYOUT = dict(pooler_activation="gelu")  # what export needs besides BERT's


def _architecture(hf: dict) -> str | None:
    return next((a for a in hf.get("architectures") or () if a in CLASSES), None)


def _as_bert(hf: dict) -> dict:
    """`hf` (with ELECTRA's defaults) as the BERT config of the same sizes.

    Raises:
        ValueError: a generator whose `hidden_act` is not GELU (its head's
            activation is GELU whatever the config says; ours follows it).
    """
    hf = {**DEFAULTS, **hf}
    if _architecture(hf) == "ElectraForMaskedLM" and hf.get("hidden_act") != "gelu":
        raise ValueError(
            f"ElectraForMaskedLM with hidden_act={hf.get('hidden_act')!r} is not "
            "supported: its generator head applies GELU, BertMaskedLM's head the "
            "config's activation. Load it as a BertBackbone."
        )
    architectures = [BERT_CLASSES.get(a, a) for a in hf.get("architectures") or ()]
    return {**hf, "architectures": architectures}


def config_from_hf(hf: dict) -> dict:
    """TransformerConfig fields for an HF ELECTRA `config.json` dict.

    Raises:
        ValueError: a generator without GELU, or what
            `keras_transformers.convert.bert.config_from_hf` refuses.
    """
    fields = bert.config_from_hf(_as_bert(hf))
    width = int({**DEFAULTS, **hf}["embedding_size"])
    fields.update(
        embedding_dim=None if width == fields["hidden_dim"] else width,
        pooler=_architecture(hf) == "ElectraForSequenceClassification",
        pooler_activation="gelu",
    )
    return fields


def preset_data(hf: dict) -> dict:
    """As `keras_transformers.convert.bert.preset_data`;
    `ElectraForPreTraining` is an `ElectraDiscriminator`."""
    data = bert.preset_data(_as_bert(hf))
    data["config"] = config_from_hf(hf)
    if _architecture(hf) == DISCRIMINATOR:
        data["class_name"] = "ElectraDiscriminator"
    return data


def _rename(name: str, pairs) -> str:
    for old, new in pairs:
        if name.startswith(old):
            return new + name[len(old) :]
    return name


def _electra_name(name: str, sequence: bool) -> str:
    """The ELECTRA name of BERT tensor `name` (`sequence`: of a sequence
    classifier, whose pooler is `classifier.dense`)."""
    name = _rename(name, NAMES)
    return _rename(name, SEQUENCE_HEAD) if sequence else name


def _renamed(checkpoint) -> Renamed:
    sequence = "classifier.out_proj.weight" in checkpoint
    rename = lambda name: _electra_name(name, sequence)  # noqa: E731
    return Renamed(checkpoint, rename, (PREFIXES, PROBE, MODEL_TYPE))


def fit_config(fields: dict, checkpoint, cls) -> dict:
    """As `keras_transformers.convert.bert.fit_config`, on ELECTRA names."""
    return bert.fit_config(fields, checkpoint and _renamed(checkpoint), cls)


def _head_entries(model) -> list[tuple]:
    """(layer, HF name) of an `ElectraDiscriminator`'s head."""
    head = "discriminator_predictions."
    return [
        (model.discriminator_dense, head + "dense"),
        (model.discriminator_prediction, head + "dense_prediction"),
    ]


def load_model_weights(model, checkpoint, hf: dict) -> None:
    """Copies an ELECTRA checkpoint into `model` (any BERT-family class or
    an `ElectraDiscriminator`); see
    `keras_transformers.convert.bert.load_model_weights`."""
    bert.load_model_weights(model, _renamed(checkpoint), _as_bert(hf))
    if type(model).__name__ != "ElectraDiscriminator":
        return
    if "discriminator_predictions.dense.weight" not in checkpoint:
        warnings.warn(
            f"{checkpoint.directory} has no weights for the discriminator head of "
            "ElectraDiscriminator: newly initialised, train before use.",
            stacklevel=3,
        )
        return
    for layer, name in _head_entries(model):
        load_layer(layer, checkpoint.get, name, transpose=True)


def _check_exportable(model) -> None:
    """Raises ValueError naming what ELECTRA cannot express in `model`."""
    cls, backbone = type(model).__name__, getattr(model, "backbone", model)
    config = backbone.config
    problems = {
        f"{cls} (no ELECTRA class)": cls not in ARCHITECTURES,
        "embedding_dim == hidden_dim (ELECTRA projects only narrower embeddings; "
        "set embedding_dim=None)": config.embedding_dim == config.hidden_dim,
        "a pooler outside BertClassifier (ElectraModel has none)": (
            backbone.pooler is not None and cls != "BertClassifier"
        ),
        "BertClassifier(pooling='token') (ELECTRA's classifier has its dense "
        "layer)": getattr(model, "pooling", "pooled") != "pooled",
        f"a masked-LM head with activation={config.activation!r} (the generator "
        "head's is 'gelu')": cls == "BertMaskedLM" and config.activation != "gelu",
    }
    bad = [name for name, wrong in problems.items() if wrong]
    if bad:
        raise ValueError(f"Hugging Face ELECTRA cannot express {'; '.join(bad)}.")


def export(model, model_type: str = MODEL_TYPE) -> tuple[dict, dict[str, np.ndarray]]:
    """`(config.json dict, tensors)` of a BERT-family model as the ELECTRA
    class of its task (`ElectraModel`, `ElectraForPreTraining`,
    `ElectraForMaskedLM`, `ElectraForSequenceClassification`,
    `ElectraForTokenClassification`).

    Raises:
        ValueError: what ELECTRA cannot express (a pooler outside a
            classifier, a classifier without one, `embedding_dim` equal to
            `hidden_dim`, a generator head without GELU) or what
            `keras_transformers.convert.bert.hf_config` refuses.
    """
    _check_exportable(model)
    backbone = getattr(model, "backbone", model)
    layout = {**LAYOUT, "embedding_dim": backbone.config.embedding_dim}
    discriminator = type(model).__name__ == "ElectraDiscriminator"
    if discriminator:
        hf = bert.hf_config(backbone.config, layout, MODEL_TYPE)
        tensors = bert.export_tensors(model)
    else:
        hf, tensors = bert.export(model, MODEL_TYPE, layout)
    hf.update(
        architectures=[ARCHITECTURES[type(model).__name__]],
        embedding_size=backbone.token_embedding.output_dim,
    )
    sequence = hf["architectures"] == ["ElectraForSequenceClassification"]
    out = {_electra_name(n, sequence): v for n, v in tensors.items()}
    for layer, name in _head_entries(model) if discriminator else ():
        export_layer(out, layer, name, transpose=True)
    return hf, out


def exports(config) -> bool:
    """Whether a config of this family with no `model_type` asked for
    exports as electra: learned positions, no shared blocks and a GELU
    pooler (ELECTRA's classifier head; BERT's pooler is tanh)."""
    return bool(
        config.position_embedding == "learned"
        and config.num_layer_groups is None
        and config.pooler_activation == "gelu"
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
        export_order=20,  # the family's default: registry.export_converter
    )
)
