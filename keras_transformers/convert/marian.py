"""Hugging Face Marian (`model_type: "marian"`) <-> the seq2seq family.

Marian (Helsinki-NLP opus-mt) is the 2017 encoder-decoder Transformer:
post-norm LayerNorm blocks (epsilon 1e-5), no final or embedding norm,
sinusoidal positions with the sines in the first half of the features and
the cosines in the second (`sinusoidal_interleave=False`), counted from 0 in
both stacks (no offset), and one embedding matrix shared by the encoder, the
decoder and (when `tie_word_embeddings`) the output layer.
`MarianModel` loads as `Seq2SeqBackbone`, `MarianMTModel` as `Seq2SeqLM`.

`final_logits_bias` (`[1, V]`, a buffer every `MarianMTModel` saves) becomes
the backbone weight `logits_bias` (`[V]`): converted configs always set
`logits_bias=True`, whatever its values, so the class and parameter count of
a converted model do not depend on the data, and export writes it back
(zeros for a model without one). A `MarianModel` checkpoint has none: the
bias starts at zero, as in `MarianMTModel.from_pretrained` of that file.

One embedding matrix: `shared.weight`, or, where stored, the stacks'
`encoder.embed_tokens` / `decoder.embed_tokens` copies (transformers 5
reads those instead of `shared` when `tie_word_embeddings=False`), which
must then be equal; export writes all three.

The layer and embedding mapping is `keras_transformers.convert.seq2seq_common`,
shared with BART. Training-only options without a counterpart here
(`activation_dropout`, `*_layerdrop`) are ignored.
"""

from __future__ import annotations

import numpy as np

from keras_transformers.convert import seq2seq_common as s2s
from keras_transformers.convert.protocol import Converter, backbone_weights, one_layout
from keras_transformers.registry import register_converter

MODEL_TYPE = "marian"
FAMILY = "transformer"
PREFIXES = ("model.", "")
# The tensor (under one of PREFIXES) that marks a checkpoint of this type.
PROBE = "shared.weight"
CLASSES = {"MarianModel": "Seq2SeqBackbone", "MarianMTModel": "Seq2SeqLM"}
ARCHITECTURES = {v: k for k, v in CLASSES.items()}
FIELDS = s2s.fields_table(vocab_size=58101)  # HF key -> (our field, HF default)
# HF defaults of the special ids (MarianConfig).
SPECIAL_DEFAULTS = dict(
    pad_token_id=58100, eos_token_id=0, decoder_start_token_id=58100
)
LAYOUT = dict(  # every Marian checkpoint
    s2s.LAYOUT,
    embedding_norm=False,
    position_embedding="sinusoidal",
    sinusoidal_interleave=False,
)
MAX_WAVELENGTH = 10000.0


def _fail(what: str, fix: str):
    s2s.fail("Marian", what, fix)


def _check(hf: dict) -> None:
    """Raises ValueError naming the first Marian option we cannot reproduce."""
    s2s.check(hf, "Marian", FIELDS, CLASSES)
    if not hf.get("share_encoder_decoder_embeddings", True):
        _fail(
            "share_encoder_decoder_embeddings=False",
            "only checkpoints whose encoder and decoder share one embedding "
            "matrix (share_encoder_decoder_embeddings=True) convert.",
        )
    vocab, target = hf.get("vocab_size", 58101), hf.get("decoder_vocab_size")
    if target not in (None, vocab):
        _fail(
            f"decoder_vocab_size={target} but vocab_size={vocab}",
            "the decoder vocabulary must be the shared one.",
        )
    if hf.get("d_model", 1024) % 2:
        _fail(
            f"odd d_model={hf['d_model']}",
            "sinusoidal positions need an even width.",
        )


def config_from_hf(hf: dict) -> dict:
    """TransformerConfig fields for an HF Marian `config.json` dict.

    `decoder_start_token_id` becomes `bos_token_id` (our decoder start).

    Raises:
        ValueError: encoder and decoder differ in heads or feed-forward
            width, unshared embeddings, another decoder vocabulary, an odd
            `d_model`, an unknown activation, or an architecture other than
            `MarianModel` / `MarianMTModel`.
    """
    _check(hf)
    fields = s2s.config_fields(hf, FIELDS, SPECIAL_DEFAULTS)
    return dict(LAYOUT, **fields, logits_bias=True)


def preset_data(hf: dict) -> dict:
    """`{"family", "class_name", "config"}`: `Seq2SeqBackbone` for a
    `MarianModel` checkpoint, else `Seq2SeqLM`."""
    return s2s.preset_data(hf, FAMILY, CLASSES, config_from_hf(hf))


def sinusoidal_table(length: int, dim: int) -> np.ndarray:
    """Marian's position table `[length, dim]`: sines of every frequency,
    then cosines (what `MarianSinusoidalPositionalEmbedding` stores)."""
    positions = np.arange(length, dtype=np.float64)[:, None]
    i = np.arange(dim // 2, dtype=np.float64)[None, :]
    angles = positions / np.power(MAX_WAVELENGTH, 2.0 * i / dim)  # [L, dim / 2]
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=-1)


def _check_positions(checkpoint, name: str) -> None:
    """A stored position table must be the one our layer computes."""
    table = checkpoint.get(name)
    expected = table.ndim == 2 and sinusoidal_table(*table.shape)
    if table.ndim != 2 or float(np.abs(table - expected).max()) > 1e-2:
        raise ValueError(
            f"Checkpoint weight {name!r} is not Marian's sinusoidal table (sines "
            "then cosines, positions from 0), which keras_transformers computes "
            "on the fly; this checkpoint cannot be converted."
        )


def load_weights(backbone, checkpoint, require_head: bool) -> None:
    """Copies a Marian checkpoint into `backbone` (a `Seq2SeqBackbone`);
    `require_head`: the model is a `Seq2SeqLM`, so an untied
    `lm_head.weight` must be there.

    Raises:
        ValueError: a missing or misshapen weight, embedding copies that
            differ, or a stored position table that is not Marian's.
    """
    p = checkpoint.prefix(PREFIXES, PROBE, MODEL_TYPE)
    s2s.load_stacks(backbone, checkpoint, p, require_head)
    for side in ("encoder", "decoder"):
        name = f"{p}{side}.embed_positions.weight"
        if name in checkpoint:  # MarianModel saves its (fixed) tables
            _check_positions(checkpoint, name)


def hf_config(config) -> dict:
    """The HF `config.json` dict (without `architectures`) for `config`.

    `forced_eos_token_id` is written as None (MarianConfig's default is 0),
    so that `transformers` generation does not force an end token that
    ours does not.

    Raises:
        ValueError: the config has options Marian cannot express.
    """
    hf = s2s.hf_fields(config, FIELDS, LAYOUT, MODEL_TYPE)
    if config.hidden_dim % 2:
        raise ValueError(
            f"Marian needs an even hidden_dim. Received: hidden_dim={config.hidden_dim}"
        )
    start = config.bos_token_id
    return {
        **hf,
        "decoder_vocab_size": config.vocabulary_size,
        "share_encoder_decoder_embeddings": True,
        "decoder_start_token_id": config.pad_token_id if start is None else start,
    }


def export(model) -> tuple[dict, dict[str, np.ndarray]]:
    """`(config.json dict, tensors)` of a `Seq2SeqLM` (as `MarianMTModel`)
    or `Seq2SeqBackbone` (as `MarianModel`).

    Raises:
        ValueError: another class, or a config Marian cannot express.
    """
    name = s2s.architecture(model, ARCHITECTURES, "Marian")
    hf = {
        **hf_config(getattr(model, "backbone", model).config),
        "architectures": [name],
    }
    backbone, _, out = s2s.export_stacks(model, name)
    if model is backbone:  # MarianModel saves its fixed position tables
        config = backbone.config
        table = sinusoidal_table(config.max_sequence_length, config.hidden_dim)
        for side in ("encoder", "decoder"):
            out[f"{side}.embed_positions.weight"] = table
    return hf, out


def exports(config) -> bool:
    """Whether a config of this family with no `model_type` asked for
    exports as marian: any other encoder-decoder (sinusoidal positions)."""
    return True


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
        export_order=100,  # the family's default: registry.export_converter
    )
)

__all__ = ["config_from_hf", "export", "load_weights", "preset_data"]
