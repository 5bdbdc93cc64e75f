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

PyTorch `Linear` weights are `[out, in]`; ours are `[in, out]` (split into
heads for attention). Training-only options without a counterpart here
(`activation_dropout`, `*_layerdrop`) are ignored.
"""

from __future__ import annotations

import numpy as np

from keras_transformers.convert.common import (
    ACTIVATIONS,
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
from keras_transformers.registry import register_converter

MODEL_TYPE = "marian"
FAMILY = "transformer"
PREFIXES = ("model.", "")
# The tensor (under one of PREFIXES) that marks a checkpoint of this type.
PROBE = "shared.weight"
CLASSES = {"MarianModel": "Seq2SeqBackbone", "MarianMTModel": "Seq2SeqLM"}
ARCHITECTURES = {v: k for k, v in CLASSES.items()}
FIELDS = {  # HF key -> (our field, HF default); the default's type is the type
    "vocab_size": ("vocabulary_size", 58101),
    "d_model": ("hidden_dim", 1024),
    "encoder_layers": ("num_layers", 12),
    "decoder_layers": ("num_decoder_layers", 12),
    "encoder_attention_heads": ("num_heads", 16),
    "encoder_ffn_dim": ("intermediate_dim", 4096),
    "max_position_embeddings": ("max_sequence_length", 1024),
    "dropout": ("dropout", 0.1),
    "attention_dropout": ("attention_dropout", 0.0),
    "init_std": ("initializer_range", 0.02),
    "scale_embedding": ("scale_embeddings", False),
    "tie_word_embeddings": ("tie_embeddings", True),
}
# Encoder field -> the decoder field that must equal it (we have one value).
SAME = {
    "encoder_attention_heads": "decoder_attention_heads",
    "encoder_ffn_dim": "decoder_ffn_dim",
}
# HF defaults of the special ids (MarianConfig).
SPECIAL_DEFAULTS = dict(
    pad_token_id=58100, eos_token_id=0, decoder_start_token_id=58100
)
LAYOUT = dict(  # every Marian checkpoint
    stacks="encoder_decoder",
    norm_position="post",
    norm_type="layer",
    norm_epsilon=1e-5,  # torch.nn.LayerNorm's default; Marian cannot change it
    final_norm=False,
    embedding_norm=False,
    pooler=False,
    position_embedding="sinusoidal",
    sinusoidal_interleave=False,
    gated_feed_forward=False,
    use_bias=True,
    num_segments=0,
    sliding_window=None,
    moe=None,
    vision=None,
)
# Our activation -> the HF name export writes.
EXPORT_ACTIVATIONS = dict(gelu="gelu", gelu_approximate="gelu_new", relu="relu")
EXPORT_ACTIVATIONS["silu"] = "swish"
ATTENTION = {
    "query": "q_proj",
    "key": "k_proj",
    "value": "v_proj",
    "output": "out_proj",
}
MAX_WAVELENGTH = 10000.0


def _fail(what: str, fix: str):
    raise ValueError(
        f"Marian config has {what}, which keras_transformers cannot convert: {fix}"
    )


def _check(hf: dict) -> None:
    """Raises ValueError naming the first Marian option we cannot reproduce."""
    for encoder, decoder in SAME.items():
        default = FIELDS[encoder][1]
        a, b = hf.get(encoder, default), hf.get(decoder, default)
        if a != b:
            _fail(
                f"{encoder}={a} but {decoder}={b}",
                "the encoder and decoder must have the same value (one "
                f"`{FIELDS[encoder][0]}` in TransformerConfig).",
            )
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
    if hf.get("is_decoder", False):
        _fail(
            "is_decoder=True (MarianForCausalLM)", "only the encoder-decoder converts."
        )
    if hf.get("d_model", 1024) % 2:
        _fail(
            f"odd d_model={hf['d_model']}",
            "sinusoidal positions need an even width.",
        )
    activation = hf.get("activation_function", "gelu")
    if activation not in ACTIVATIONS:
        _fail(
            f"activation_function={activation!r}",
            f"supported activations are {sorted(ACTIVATIONS)}.",
        )
    names = hf.get("architectures") or []
    if names and not any(a in CLASSES for a in names):
        _fail(f"architectures={names}", f"supported are {sorted(CLASSES)}.")


@register_converter(MODEL_TYPE)
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
    fields = {ours: type(d)(hf.get(k, d)) for k, (ours, d) in FIELDS.items()}
    ids = {k: hf.get(k, v) for k, v in SPECIAL_DEFAULTS.items()}
    start = ids.pop("decoder_start_token_id")
    ids["bos_token_id"] = ids["pad_token_id"] if start is None else start
    return dict(
        LAYOUT,
        **fields,
        activation=ACTIVATIONS[hf.get("activation_function", "gelu")],
        logits_bias=True,
        **special_ids(ids, fields["vocabulary_size"]),
    )


def preset_data(hf: dict) -> dict:
    """`{"family", "class_name", "config"}`: `Seq2SeqBackbone` for a
    `MarianModel` checkpoint, else `Seq2SeqLM`."""
    names = hf.get("architectures") or ()
    name = next((CLASSES[a] for a in names if a in CLASSES), "Seq2SeqLM")
    return {"family": FAMILY, "class_name": name, "config": config_from_hf(hf)}


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


def _block(block, decoder: bool) -> list[tuple]:
    """(layer, HF name, kernel shape) of one encoder or decoder layer."""
    attentions = [(block.self_attention, "self_attn")]
    if decoder:
        attentions.append((block.cross_attention_layer, "encoder_attn"))
    out = [
        (layer, f"{prefix}.{ATTENTION[role]}", shape)
        for attention, prefix in attentions
        for role, (layer, shape) in attention_parts(attention).items()
    ]
    ffn = block.feed_forward
    out += [(ffn.inner_dense, "fc1", None), (ffn.output_dense, "fc2", None)]
    out += [(block.self_attention_norm, "self_attn_layer_norm", None)]
    if decoder:
        out += [(block.cross_attention_norm, "encoder_attn_layer_norm", None)]
    return out + [(block.feed_forward_norm, "final_layer_norm", None)]


def _entries(backbone, p: str) -> list[tuple]:
    """(layer, HF name, kernel shape) of every block of `backbone`, the
    model under prefix `p`."""
    out = []
    for side, blocks in (
        ("encoder", backbone.blocks),
        ("decoder", backbone.decoder_blocks),
    ):
        for i, block in enumerate(blocks):
            h = f"{p}{side}.layers.{i}."
            out += [(x, h + n, s) for x, n, s in _block(block, side == "decoder")]
    return out


def _input_embedding(checkpoint, p: str, tied: bool) -> tuple[str, np.ndarray]:
    """(name, `[V, D]` value) of the one input embedding.

    transformers 5 ties `encoder.embed_tokens` and `decoder.embed_tokens`
    to `shared` only with `tie_word_embeddings`; otherwise each stack reads
    its own stored copy (and `shared` is unused). The copies each stack
    reads must be equal, as must a stored `lm_head.weight` when tied.
    """
    copies = [f"{p}{side}.embed_tokens.weight" for side in ("encoder", "decoder")]
    copies = [n for n in copies if n in checkpoint]
    names = copies or [p + "shared.weight"]
    if tied:
        names = [p + "shared.weight", *copies]
        names += ["lm_head.weight"] if "lm_head.weight" in checkpoint else []
    values = [checkpoint.get(n) for n in names]
    checkpoint.used.add(p + "shared.weight")
    if any(
        v.shape != values[0].shape or not np.array_equal(v, values[0]) for v in values
    ):
        raise ValueError(
            f"Checkpoint weights {names} differ, but keras_transformers has one "
            "embedding matrix for the encoder, the decoder and (with "
            "tie_word_embeddings=True) the output layer: this checkpoint cannot "
            "be converted."
        )
    return names[0], values[0]


def load_weights(backbone, checkpoint, require_head: bool) -> None:
    """Copies a Marian checkpoint into `backbone` (a `Seq2SeqBackbone`);
    `require_head`: the model is a `Seq2SeqLM`, so an untied
    `lm_head.weight` must be there.

    Raises:
        ValueError: a missing or misshapen weight, embedding copies that
            differ, or a stored position table that is not Marian's.
    """
    p = checkpoint.prefix(PREFIXES, PROBE, MODEL_TYPE)
    embedding = backbone.token_embedding
    name, value = _input_embedding(checkpoint, p, embedding.tie_weights)
    assign(embedding.embeddings, value, name)
    for layer, name, shape in _entries(backbone, p):
        linear = hasattr(layer, "kernel")
        load_layer(layer, checkpoint.get, name, shape=shape, transpose=linear)
    if backbone.logits_bias is not None and "final_logits_bias" in checkpoint:
        value = checkpoint.get("final_logits_bias")  # [1, V]
        shape = (1, backbone.config.vocabulary_size)
        assign(backbone.logits_bias, value, "final_logits_bias", shape=shape)
    load_head(embedding, checkpoint, require_head)
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
    mha = dict(  # plain multi-head attention, head_dim = hidden_dim / num_heads
        resolved_num_kv_heads=config.num_heads,
        resolved_head_dim=config.hidden_dim // config.num_heads,
    )
    check_exportable(config, {**LAYOUT, **mha}, MODEL_TYPE)
    if config.hidden_dim % 2:
        raise ValueError(
            f"Marian needs an even hidden_dim. Received: hidden_dim={config.hidden_dim}"
        )
    hf = {k: getattr(config, ours) for k, (ours, _) in FIELDS.items()}
    hf["decoder_layers"] = config.resolved_num_decoder_layers
    hf.update({decoder: hf[encoder] for encoder, decoder in SAME.items()})
    start = config.bos_token_id
    return {
        **hf,
        "model_type": MODEL_TYPE,
        "decoder_vocab_size": config.vocabulary_size,
        "activation_function": EXPORT_ACTIVATIONS[config.activation],
        "activation_dropout": 0.0,
        "share_encoder_decoder_embeddings": True,
        "is_encoder_decoder": True,
        "pad_token_id": config.pad_token_id,
        "eos_token_id": config.eos_token_id,
        "decoder_start_token_id": config.pad_token_id if start is None else start,
        "forced_eos_token_id": None,
    }


def export(model) -> tuple[dict, dict[str, np.ndarray]]:
    """`(config.json dict, tensors)` of a `Seq2SeqLM` (as `MarianMTModel`)
    or `Seq2SeqBackbone` (as `MarianModel`).

    Raises:
        ValueError: another class, or a config Marian cannot express.
    """
    cls, backbone = type(model).__name__, getattr(model, "backbone", model)
    if cls not in ARCHITECTURES:
        raise ValueError(f"{cls} has no Hugging Face Marian counterpart.")
    hf = {**hf_config(backbone.config), "architectures": [ARCHITECTURES[cls]]}
    p, out = ("" if model is backbone else "model."), {}
    embedding = backbone.token_embedding
    # The stacks' copies too: transformers 5 ties them to `shared` only
    # with tie_word_embeddings.
    for name in ("shared", "encoder.embed_tokens", "decoder.embed_tokens"):
        out[f"{p}{name}.weight"] = fetch(embedding.embeddings)
    for layer, name, shape in _entries(backbone, p):
        export_layer(out, layer, name, shape=shape, transpose=hasattr(layer, "kernel"))
    if model is not backbone:
        vocab = backbone.config.vocabulary_size
        bias = backbone.logits_bias
        out["final_logits_bias"] = (
            np.zeros((1, vocab), np.float32)
            if bias is None
            else fetch(bias, shape=(1, vocab))
        )
        export_head(out, embedding)
    elif not embedding.tie_weights:
        raise ValueError(
            "MarianModel has no output layer, so this Seq2SeqBackbone's untied "
            "output weights would be lost: export the Seq2SeqLM instead."
        )
    else:  # MarianModel saves its fixed position tables (MarianMTModel not)
        config = backbone.config
        table = sinusoidal_table(config.max_sequence_length, config.hidden_dim)
        for side in ("encoder", "decoder"):
            out[f"{side}.embed_positions.weight"] = table
    return hf, out


__all__ = ["config_from_hf", "export", "load_weights", "preset_data"]
