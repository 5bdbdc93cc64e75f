"""Hugging Face BART (`model_type: "bart"`) <-> the seq2seq family.

BART (facebook/bart-base, facebook/bart-large) is a post-norm
encoder-decoder (LayerNorm epsilon 1e-5, exact-erf gelu) with learned
positions, a LayerNorm after the embeddings of each stack
(`layernorm_embedding`: `embedding_norm`, one per stack) and one embedding
matrix shared by the encoder, the decoder and the output layer.
`BartModel` loads as `Seq2SeqBackbone`, `BartForConditionalGeneration` as
`Seq2SeqLM`; the layer mapping is `keras_transformers.convert.seq2seq_common`,
shared with Marian.

Positions: each stack has its own table (`separate_decoder_positions`).
`BartLearnedPositionalEmbedding` reads row `position + 2` of a
`max_position_embeddings + 2`-row table, positions counted from 0 whatever
the padding, so loading drops the first 2 rows (exact for any padding;
`max_sequence_length` is `max_position_embeddings`) and export writes 2
zero rows before ours (rows `transformers` never reads).

`final_logits_bias` (`[1, V]`, zeros in released checkpoints) is the
backbone weight `logits_bias` (`[V]`), as for Marian: converted configs
always set `logits_bias=True`.

Special ids: `decoder_start_token_id` (2, the end token `</s>`) becomes
`bos_token_id`, our decoder start; `pad_token_id` and `eos_token_id` keep
their values; BART's own `bos_token_id` (`<s>`, which the tokenizer adds
to sources) needs no config field. A `generation_config.json` is read as
for every checkpoint (end ids, lengths, sampling), its
`forced_bos_token_id` and `forced_eos_token_id` included: `generate()`
makes `<s>` the first generated token and `</s>` the last allowed one, as
transformers does. Training-only options (`activation_dropout`,
`*_layerdrop`, `classifier_dropout`) are ignored; mBART-style pre-norm
(`normalize_before`, `add_final_layer_norm`) and the other options of
older BART configs we cannot reproduce raise a ValueError naming them.
"""

from __future__ import annotations

import numpy as np

from keras_transformers.convert import seq2seq_common as s2s
from keras_transformers.convert.common import (
    export_layer,
    fetch,
    load_layer,
    load_positions,
)
from keras_transformers.convert.protocol import Converter, backbone_weights, one_layout
from keras_transformers.registry import register_converter

MODEL_TYPE = "bart"
FAMILY = "transformer"
PREFIXES = ("model.", "")
PROBE = "encoder.layernorm_embedding.weight"
CLASSES = {"BartModel": "Seq2SeqBackbone", "BartForConditionalGeneration": "Seq2SeqLM"}
ARCHITECTURES = {v: k for k, v in CLASSES.items()}
FIELDS = s2s.fields_table(vocab_size=50265)  # HF key -> (our field, HF default)
# HF defaults of the special ids (BartConfig).
SPECIAL_DEFAULTS = dict(pad_token_id=1, eos_token_id=2, decoder_start_token_id=2)
OFFSET = 2  # position rows before position 0
LAYOUT = dict(  # every BART checkpoint
    s2s.LAYOUT,
    embedding_norm=True,
    position_embedding="learned",
    separate_decoder_positions=True,
)
# Options of older BartConfig versions: key -> (the value we reproduce, why).
UNSUPPORTED = {
    "normalize_before": (False, "pre-norm layers (mBART) are not BART's layout"),
    "add_final_layer_norm": (False, "a final LayerNorm per stack (mBART)"),
    "add_bias_logits": (False, "a separate output-layer bias"),
    "normalize_embedding": (True, "BART normalizes the embeddings"),
    "static_position_embeddings": (False, "fixed sinusoidal positions"),
}


def _check(hf: dict) -> None:
    """Raises ValueError naming the first BART option we cannot reproduce."""
    s2s.check(hf, "BART", FIELDS, CLASSES)
    for key, (value, why) in UNSUPPORTED.items():
        if hf.get(key, value) != value:
            s2s.fail(
                "BART", f"{key}={hf[key]!r}", f"only {key}={value!r} converts ({why})."
            )


def config_from_hf(hf: dict) -> dict:
    """TransformerConfig fields for an HF BART `config.json` dict.

    Raises:
        ValueError: encoder and decoder differ in heads or feed-forward
            width, an unknown activation, an architecture other than
            `BartModel` / `BartForConditionalGeneration`, or an option of
            `UNSUPPORTED` with another value.
    """
    _check(hf)
    fields = s2s.config_fields(hf, FIELDS, SPECIAL_DEFAULTS)
    return dict(LAYOUT, **fields, logits_bias=True)


def preset_data(hf: dict) -> dict:
    """`{"family", "class_name", "config"}`: `Seq2SeqBackbone` for a
    `BartModel` checkpoint, else `Seq2SeqLM`."""
    return s2s.preset_data(hf, FAMILY, CLASSES, config_from_hf(hf))


def _embeddings(backbone, p: str) -> list[tuple]:
    """(position table, embedding norm, HF prefix) of each stack."""
    return [
        (backbone.position_embedding, backbone.embedding_norm, f"{p}encoder."),
        (
            backbone.decoder_position_embedding,
            backbone.decoder_embedding_norm,
            f"{p}decoder.",
        ),
    ]


def load_weights(backbone, checkpoint, require_head: bool) -> None:
    """Copies a BART checkpoint into `backbone` (a `Seq2SeqBackbone`);
    `require_head`: the model is a `Seq2SeqLM`, so an untied
    `lm_head.weight` must be there.

    Raises:
        ValueError: a missing or misshapen weight, or embedding copies that
            differ.
    """
    p = checkpoint.prefix(PREFIXES, PROBE, MODEL_TYPE)
    s2s.load_stacks(backbone, checkpoint, p, require_head)
    for positions, norm, h in _embeddings(backbone, p):
        name = h + "embed_positions.weight"
        load_positions(positions.embeddings, checkpoint.get(name)[OFFSET:], name)
        load_layer(norm, checkpoint.get, h + "layernorm_embedding")


def hf_config(config) -> dict:
    """The HF `config.json` dict (without `architectures`) for `config`;
    the decoder start is `bos_token_id` (else the end token, else pad).

    Raises:
        ValueError: the config has options BART cannot express.
    """
    hf = s2s.hf_fields(config, FIELDS, LAYOUT, MODEL_TYPE)
    start = next(
        i
        for i in (config.bos_token_id, config.eos_token_id, config.pad_token_id)
        if i is not None
    )
    return {**hf, "decoder_start_token_id": start}


def export(model) -> tuple[dict, dict[str, np.ndarray]]:
    """`(config.json dict, tensors)` of a `Seq2SeqLM` (as
    `BartForConditionalGeneration`) or `Seq2SeqBackbone` (as `BartModel`).

    Raises:
        ValueError: another class, or a config BART cannot express.
    """
    name = s2s.architecture(model, ARCHITECTURES, "BART")
    hf = {
        **hf_config(getattr(model, "backbone", model).config),
        "architectures": [name],
    }
    backbone, p, out = s2s.export_stacks(model, name)
    for positions, norm, h in _embeddings(backbone, p):
        table = fetch(positions.embeddings)
        pad = np.zeros((OFFSET, table.shape[1]), np.float32)
        out[h + "embed_positions.weight"] = np.concatenate([pad, table])
        export_layer(out, norm, h + "layernorm_embedding")
    return hf, out


def exports(config) -> bool:
    """Whether a config of this family with no `model_type` asked for
    exports as bart: learned positions."""
    return bool(config.position_embedding == "learned")


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
        exports=exports,
        export_order=20,  # the family's default: registry.export_converter
    )
)

__all__ = ["config_from_hf", "export", "load_weights", "preset_data"]
