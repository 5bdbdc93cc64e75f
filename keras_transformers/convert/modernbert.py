"""Hugging Face ModernBERT (`model_type: "modernbert"`) <-> the BERT family.

ModernBERT is a pre-norm encoder with rotary positions and no segment or
position tables: an embedding norm (`embeddings.norm`), blocks whose first
has no attention norm (`first_attention_norm=False`: it reads the embedding
norm's output), a fused query-key-value projection (`attn.Wqkv`, split into
our three on load and fused again on export), a GeGLU feed-forward
(`mlp.Wi` holds the activated half, then the gate: our `gate` and
`intermediate`), a final norm, and LayerNorms without bias
(`norm_bias=False`: `norm_type="layer_no_bias"`).

Layers alternate: every `global_attn_every_n_layers`-th layer (from the
first) attends globally with rotary base `global_rope_theta`; the others
are bidirectional sliding windows of `local_attention` tokens (each token
sees `local_attention // 2` on either side) with base `local_rope_theta`:
`layer_types`, `sliding_window=local_attention` and
`layer_settings["sliding_attention"]`. transformers 5's `rope_parameters`
(keyed by layer type) reads too.

Classes: `ModernBertModel` is a `BertBackbone`, `ModernBertForMaskedLM` a
`BertMaskedLM` (`head.dense` without bias, activation, `head.norm`, the
tied decoder with its bias); others (the sequence and token classifiers,
whose head adds a norm after the pooling dense layer) load as
`BertBackbone`. Options we cannot reproduce raise a ValueError naming them.
"""

from __future__ import annotations

import warnings

from keras_transformers.convert.common import (
    ACTIVATIONS,
    export_rows,
    linear_rows,
    load_rows,
    norm_rows,
    special_ids,
)
from keras_transformers.convert.protocol import Converter
from keras_transformers.registry import register_converter

MODEL_TYPE = "modernbert"
FAMILY = "bert"
PREFIXES = ("model.", "")
PROBE = "embeddings.tok_embeddings.weight"
CLASSES = {"ModernBertModel": "BertBackbone", "ModernBertForMaskedLM": "BertMaskedLM"}
ARCHITECTURES = {ours: name for name, ours in CLASSES.items()}
DEFAULTS = dict(  # `transformers.ModernBertConfig`'s
    vocab_size=50368,
    hidden_size=768,
    intermediate_size=1152,
    num_hidden_layers=22,
    num_attention_heads=12,
    hidden_activation="gelu",
    max_position_embeddings=8192,
    initializer_range=0.02,
    norm_eps=1e-5,
    norm_bias=False,
    pad_token_id=50283,
    eos_token_id=50282,
    bos_token_id=50281,
    cls_token_id=50281,
    sep_token_id=50282,
    attention_bias=False,
    attention_dropout=0.0,
    global_attn_every_n_layers=3,
    global_rope_theta=160000.0,
    local_rope_theta=10000.0,
    local_attention=128,
    embedding_dropout=0.0,
    mlp_bias=False,
    mlp_dropout=0.0,
    decoder_bias=True,
    classifier_bias=False,
    classifier_activation="gelu",
    tie_word_embeddings=True,
)
SLIDING = "sliding_attention"


def _fail(option: str, value, fix: str):
    raise ValueError(
        f"ModernBERT config has {option}={value!r}, which keras_transformers cannot "
        f"reproduce: {fix}."
    )


def _layer_types(hf: dict) -> list[str]:
    """`layer_types`, or as transformers derives them from
    `global_attn_every_n_layers` (layer i is global when i % n == 0)."""
    if hf.get("layer_types"):
        return list(hf["layer_types"])
    n = int(hf["global_attn_every_n_layers"])
    return [
        SLIDING if i % n else "full_attention" for i in range(hf["num_hidden_layers"])
    ]


def _rope_thetas(hf: dict) -> tuple[float, float]:
    """(global, local) rotary bases, from `rope_parameters` (transformers 5)
    or `global_rope_theta` / `local_rope_theta`."""
    params = hf.get("rope_parameters") or {}
    thetas = []
    for kind, key in (("full_attention", "global"), (SLIDING, "local")):
        own = params.get(kind) or {}
        if own.get("rope_type", "default") != "default":
            _fail("rope_parameters", params, "only the default rotary converts")
        thetas.append(float(own.get("rope_theta", hf[f"{key}_rope_theta"])))
    return tuple(thetas)


def _check(hf: dict) -> None:
    """Raises a ValueError naming an option whose value we cannot reproduce."""
    if hf["hidden_activation"] not in ACTIVATIONS:
        _fail(
            "hidden_activation", hf["hidden_activation"], f"use {sorted(ACTIVATIONS)}"
        )
    same = dict(
        mlp_bias=("attention_bias", "biases on all projections or on none"),
        classifier_bias=("attention_bias", "the head's dense bias as the blocks'"),
        classifier_activation=("hidden_activation", "one activation throughout"),
    )
    for option, (other, fix) in same.items():
        if hf[option] != hf[other]:
            _fail(option, hf[option], f"{fix} ({other}={hf[other]!r})")
    if not hf["decoder_bias"]:
        _fail("decoder_bias", False, "the masked-LM decoder always has a bias")
    if not hf["tie_word_embeddings"]:
        _fail("tie_word_embeddings", False, "the decoder is the token embedding")


def config_from_hf(hf: dict) -> dict:
    """TransformerConfig fields for an HF ModernBERT `config.json` dict.

    Raises:
        ValueError: an option we cannot reproduce (named).
    """
    hf = {**DEFAULTS, **hf}
    _check(hf)
    full, local = _rope_thetas(hf)
    return dict(
        vocabulary_size=int(hf["vocab_size"]),
        num_layers=int(hf["num_hidden_layers"]),
        hidden_dim=int(hf["hidden_size"]),
        num_heads=int(hf["num_attention_heads"]),
        intermediate_dim=int(hf["intermediate_size"]),
        max_sequence_length=int(hf["max_position_embeddings"]),
        stacks="encoder",
        norm_position="pre",
        norm_type="layer" if hf["norm_bias"] else "layer_no_bias",
        norm_epsilon=float(hf["norm_eps"]),
        final_norm=True,
        first_attention_norm=False,
        embedding_norm=True,
        position_embedding="rotary",
        rope_max_wavelength=full,
        layer_types=_layer_types(hf),
        layer_settings={SLIDING: {"rope_max_wavelength": local}},
        sliding_window=int(hf["local_attention"]),
        activation=ACTIVATIONS[hf["hidden_activation"]],
        gated_feed_forward=True,
        use_bias=bool(hf["attention_bias"]),
        num_segments=0,
        pooler=False,
        tie_embeddings=True,
        dropout=float(hf["embedding_dropout"]),
        attention_dropout=float(hf["attention_dropout"]),
        initializer_range=float(hf["initializer_range"]),
        **special_ids(hf, int(hf["vocab_size"])),
    )


def preset_data(hf: dict) -> dict:
    """`{"family", "class_name", "config"}`: `BertMaskedLM` for
    `ModernBertForMaskedLM`, else `BertBackbone`."""
    names = [a for a in hf.get("architectures") or () if a in CLASSES]
    name = CLASSES[names[0]] if names else "BertBackbone"
    return {"family": FAMILY, "class_name": name, "config": config_from_hf(hf)}


def _rows(model, p: str, head: bool) -> list[tuple]:
    """The two-way name map: `(HF name, [(variable, our shape)], transposed)`,
    the HF tensor being the parts (in our shape, transposed when asked)
    stacked along its first axis."""
    backbone = getattr(model, "backbone", model)
    table = backbone.token_embedding.embeddings
    rows = [(p + "embeddings.tok_embeddings.weight", [(table, table.shape)], False)]
    rows += norm_rows(backbone.embedding_norm, p + "embeddings.norm")
    for i, block in enumerate(backbone.blocks):
        n, attention, ffn = f"{p}layers.{i}.", block.self_attention, block.feed_forward
        if block.self_attention_norm is not None:
            rows += norm_rows(block.self_attention_norm, n + "attn_norm")
        qkv = [attention.query_dense, attention.key_dense, attention.value_dense]
        rows += linear_rows(qkv, n + "attn.Wqkv")
        out = attention.output_dense
        rows.append(
            (n + "attn.Wo.weight", [(out.kernel, (-1, out.kernel.shape[-1]))], True)
        )
        if out.bias is not None:
            rows.append((n + "attn.Wo.bias", [(out.bias, (-1,))], False))
        rows += norm_rows(block.feed_forward_norm, n + "mlp_norm")
        rows += linear_rows([ffn.gate_dense, ffn.inner_dense], n + "mlp.Wi")
        rows += linear_rows([ffn.output_dense], n + "mlp.Wo")
    rows += norm_rows(backbone.final_norm, p + "final_norm")
    if head:
        lm = model.masked_lm_head
        rows += linear_rows([lm.transform], "head.dense") + norm_rows(
            lm.norm, "head.norm"
        )
        rows.append(("decoder.bias", [(lm.bias, (-1,))], False))
    return rows


def load_model_weights(model, checkpoint, hf: dict) -> None:
    """Copies a ModernBERT checkpoint into a `BertBackbone` or
    `BertMaskedLM`; a masked-LM head the checkpoint lacks stays new (with a
    warning)."""
    p = checkpoint.prefix(PREFIXES, PROBE, MODEL_TYPE)
    head = hasattr(model, "masked_lm_head") and "head.dense.weight" in checkpoint
    if hasattr(model, "masked_lm_head") and not head:
        warnings.warn(
            f"{checkpoint.directory} has no weights for the masked-LM head of "
            "BertMaskedLM: newly initialised, train before use.",
            stacklevel=3,
        )
    load_rows(_rows(model, p, head), checkpoint.get)
    checkpoint.used.update(["decoder.weight"] * head)  # the tied table


def hf_config(config) -> dict:
    """The HF `config.json` dict of a ModernBERT-layout `config`.

    Raises:
        ValueError: a config ModernBERT cannot express (named fields).
    """
    from keras_transformers.config.layer_types import layer_settings

    if not exports(config):
        raise ValueError(
            "This model cannot be exported as Hugging Face 'modernbert': it needs "
            "stacks='encoder', norm_position='pre', first_attention_norm=False, an "
            "embedding and a final norm, rotary positions, a gated feed-forward, "
            "tied embeddings, no pooler, segments, factorised or shared layers."
        )
    windows = [
        layer_settings(config, i)["sliding_window"] for i in range(config.num_layers)
    ]
    types = [SLIDING if w else "full_attention" for w in windows]
    local = config.layer_settings or {}
    local = local.get(SLIDING, {}).get(
        "rope_max_wavelength", config.rope_max_wavelength
    )
    activation = {"gelu_approximate": "gelu_pytorch_tanh"}.get(
        config.activation, config.activation
    )
    bias = config.use_bias
    return {
        "model_type": MODEL_TYPE,
        "vocab_size": config.vocabulary_size,
        "hidden_size": config.hidden_dim,
        "intermediate_size": config.intermediate_dim,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "hidden_activation": activation,
        "classifier_activation": activation,
        "max_position_embeddings": config.max_sequence_length,
        "initializer_range": config.initializer_range,
        "norm_eps": config.norm_epsilon,
        "norm_bias": config.norm_type == "layer",
        "attention_bias": bias,
        "mlp_bias": bias,
        "classifier_bias": bias,
        "decoder_bias": True,
        "layer_types": types,
        "local_attention": next((w for w in windows if w), 128),
        "rope_parameters": {
            "full_attention": {
                "rope_type": "default",
                "rope_theta": config.rope_max_wavelength,
            },
            SLIDING: {"rope_type": "default", "rope_theta": float(local)},
        },
        "embedding_dropout": config.dropout,
        "attention_dropout": config.attention_dropout,
        "tie_word_embeddings": True,
        "pad_token_id": config.pad_token_id,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
    }


def export(model, model_type: str = MODEL_TYPE) -> tuple[dict, dict]:
    """`(config.json dict, tensors)` of a `BertBackbone` (`ModernBertModel`)
    or `BertMaskedLM` (`ModernBertForMaskedLM`).

    Raises:
        ValueError: another class, or a config ModernBERT cannot express.
    """
    cls = type(model).__name__
    if cls not in ARCHITECTURES:
        raise ValueError(f"{cls} has no Hugging Face ModernBERT counterpart.")
    backbone = getattr(model, "backbone", model)
    hf = {**hf_config(backbone.config), "architectures": [ARCHITECTURES[cls]]}
    head = model is not backbone
    out = export_rows(_rows(model, "model." if head else "", head))
    if head:
        out["decoder.weight"] = out["model.embeddings.tok_embeddings.weight"]
    return hf, out


def exports(config) -> bool:
    """Whether a BERT-family config exports as modernbert: ModernBERT's
    layout (pre-norm, rotary, gated, first block without attention norm)."""
    return bool(
        config.stacks == "encoder"
        and config.norm_position == "pre"
        and not config.first_attention_norm
        and config.embedding_norm
        and config.final_norm
        and config.rotary
        and config.gated_feed_forward
        and config.tie_embeddings
        and not config.pooler
        and config.num_segments == 0
        and config.embedding_dim is None
        and config.num_layer_groups is None
        and config.norm_type in ("layer", "layer_no_bias")
        and config.num_kv_heads in (None, config.num_heads)
        and config.head_dim in (None, config.hidden_dim // config.num_heads)
        and config.rope_scaling is None
        and config.rotary_fraction == 1.0
        and config.token_dropout_mask_id is None
        and not config.qk_norm
        and set(config.layer_types or ()) <= {"full_attention", SLIDING}
        and _plain_settings(config.layer_settings)
    )


def _plain_settings(settings) -> bool:
    """Only the sliding layers' own rotary base (and window) differ."""
    own = dict(settings or {})
    allowed = {"rope_max_wavelength", "sliding_window"}
    return set(own) <= {SLIDING} and set(own.get(SLIDING, {})) <= allowed


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
        exports=exports,
        export_order=15,  # before ELECTRA's and BERT's (registry.export_converter)
    )
)
