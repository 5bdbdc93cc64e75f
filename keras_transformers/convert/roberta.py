"""Hugging Face RoBERTa (`model_type` `roberta`, `xlm-roberta`, `camembert`)
<-> the BERT family.

The three types share one layout: BERT's, with tensors under `roberta.`,
the masked-LM head as `lm_head.*` and the sequence classifier as
`classifier.dense` (our pooler: a tanh dense on the first token) plus
`classifier.out_proj` (our classifier). Everything else is
`keras_transformers.convert.bert`, run on renamed tensors.

Positions: RoBERTa numbers real tokens from `pad_token_id + 1` (position
ids `pad_token_id + 1 + cumsum(mask)`), so loading drops the first
`pad_token_id + 1` rows of the position table (`max_sequence_length` is
`max_position_embeddings - pad_token_id - 1`) and export prepends that many
zero rows. Right-padded inputs match `transformers`; left-padded ones do
not (their real tokens start later in RoBERTa's numbering).
"""

from __future__ import annotations

import numpy as np

from keras_transformers.convert import bert
from keras_transformers.convert.protocol import Converter
from keras_transformers.convert.renamed import POSITIONS, Renamed
from keras_transformers.registry import register_converter

MODEL_TYPE = "roberta"
MODEL_TYPES = {
    "roberta": "Roberta",
    "xlm-roberta": "XLMRoberta",
    "camembert": "Camembert",
}
FAMILY = "bert"
PREFIXES = ("roberta.", "")
PROBE = bert.PROBE
HEADS = ("Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification")
# HF architecture -> the BERT architecture it converts as.
BERT_CLASSES = {p + h: "Bert" + h for p in MODEL_TYPES.values() for h in HEADS}
CLASSES = {name: bert.CLASSES[b] for name, b in BERT_CLASSES.items()}
# `transformers.RobertaConfig` defaults that differ from BERT's.
DEFAULTS = dict(
    vocab_size=50265,
    max_position_embeddings=514,
    pad_token_id=1,
    bos_token_id=0,
    eos_token_id=2,
)
HEAD_NAMES = (  # BERT name prefix -> RoBERTa name prefix
    ("cls.predictions.transform.dense.", "lm_head.dense."),
    ("cls.predictions.transform.LayerNorm.", "lm_head.layer_norm."),
    ("cls.predictions.", "lm_head."),
)
SEQUENCE_HEAD = (  # BERT -> RoBERTa names of a sequence classifier
    ("roberta.pooler.dense.", "classifier.dense."),
    ("classifier.", "classifier.out_proj."),
)


def _offset(hf: dict) -> int:
    """Position rows before the first real token: `pad_token_id + 1`."""
    pad = hf.get("pad_token_id")
    return (1 if pad is None else int(pad)) + 1


def _as_bert(hf: dict) -> dict:
    """`hf` as the BERT config the same model has (our position table).

    Raises:
        ValueError: a position table no longer than `pad_token_id + 1`.
    """
    hf = {**DEFAULTS, **hf}
    rows = int(hf["max_position_embeddings"]) - _offset(hf)
    if rows < 1:
        raise ValueError(
            f"RoBERTa max_position_embeddings={hf['max_position_embeddings']} leaves "
            f"no positions after the first pad_token_id + 1 = {_offset(hf)} rows."
        )
    architectures = [BERT_CLASSES.get(a, a) for a in hf.get("architectures") or ()]
    return {**hf, "architectures": architectures, "max_position_embeddings": rows}


def config_from_hf(hf: dict) -> dict:
    """TransformerConfig fields for an HF RoBERTa `config.json` dict.

    Raises:
        ValueError: what `keras_transformers.convert.bert.config_from_hf`
            refuses, or a position table no longer than `pad_token_id + 1`.
    """
    return bert.config_from_hf(_as_bert(hf))


def preset_data(hf: dict) -> dict:
    """As `keras_transformers.convert.bert.preset_data`."""
    return bert.preset_data(_as_bert(hf))


def _rename(name: str, pairs) -> str:
    for old, new in pairs:
        if name.startswith(old):
            return new + name[len(old) :]
    return name


def _roberta_name(name: str, sequence: bool) -> str:
    """The RoBERTa name of BERT tensor `name` (`sequence`: of a sequence
    classifier, whose pooler is `classifier.dense`)."""
    name = _rename(name, (("bert.", "roberta."), *HEAD_NAMES))
    return _rename(name, SEQUENCE_HEAD) if sequence else name


def _renamed(checkpoint, hf: dict) -> Renamed:
    """`checkpoint` under BERT's names, without the leading position rows."""
    sequence = "classifier.out_proj.weight" in checkpoint
    return Renamed(
        checkpoint,
        lambda name: _roberta_name(name, sequence),
        (PREFIXES, PROBE, MODEL_TYPE),
        skip_positions=_offset(hf),
    )


def fit_config(fields: dict, checkpoint, cls) -> dict:
    """As `keras_transformers.convert.bert.fit_config`, on RoBERTa names."""
    return bert.fit_config(fields, checkpoint and _renamed(checkpoint, {}), cls)


def load_model_weights(model, checkpoint, hf: dict) -> None:
    """Copies a RoBERTa checkpoint into `model` (any BERT-family class); see
    `keras_transformers.convert.bert.load_model_weights`."""
    bert.load_model_weights(model, _renamed(checkpoint, hf), _as_bert(hf))


def export(model, model_type: str = MODEL_TYPE) -> tuple[dict, dict[str, np.ndarray]]:
    """`(config.json dict, tensors)` of a BERT-family model as the
    `model_type` ("roberta", "xlm-roberta" or "camembert") class of its
    task; `pad_token_id` (1 when unset) fixes the position offset.

    Raises:
        ValueError: an unknown `model_type`, or what
            `keras_transformers.convert.bert.export` refuses.
    """
    if model_type not in MODEL_TYPES:
        raise ValueError(
            f"model_type={model_type!r} is not a RoBERTa type; BERT-family models "
            f"export as 'bert' or one of {sorted(MODEL_TYPES)}."
        )
    hf, tensors = bert.export(model)
    pad = 1 if hf.get("pad_token_id") is None else hf["pad_token_id"]
    architecture = hf["architectures"][0].replace("Bert", MODEL_TYPES[model_type], 1)
    offset = _offset({"pad_token_id": pad})
    hf.update(
        model_type=model_type,
        architectures=[architecture],
        pad_token_id=pad,
        max_position_embeddings=hf["max_position_embeddings"] + offset,
    )
    sequence = architecture.endswith("ForSequenceClassification")
    out = {}
    for name, value in tensors.items():
        name = _roberta_name(name, sequence)
        if name.endswith(POSITIONS):
            value = np.concatenate([np.zeros((offset, value.shape[1])), value])
        out[name] = value
    return hf, out


CONVERTER = Converter(
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
for _type in MODEL_TYPES:  # one layout, three model types
    register_converter(CONVERTER.as_type(_type))
