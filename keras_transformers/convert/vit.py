"""Hugging Face ViT (`model_type: "vit"`) <-> the vit family, and the
mapping of the ViT layout that `deit` and `dinov2` share (each of them
passes its converter module as `spec`, see `keras_transformers.convert.deit`
and `.dinov2`).

`ViTModel` loads as `ViTBackbone`, with `pooler=True` when the file has
`pooler.dense` (HF's tanh pre-logits layer, saved unless
`add_pooling_layer=False`); `ViTForImageClassification` as `ViTClassifier`
(`num_classes` from `id2label`; HF classifies the class token after the
final norm, without a pooler); other architectures (e.g.
`ViTForMaskedImageModeling`) load as `ViTBackbone`. The weights, under
`vit.` in task files:

- `embeddings.patch_embeddings.projection.weight` `[D, C, p, p]` (a strided
  convolution) -> `patch_embedding.kernel` `[p, p, C, D]`;
- `embeddings.cls_token` `[1, 1, D]` -> `patch_embedding.class_token` `[D]`;
- `embeddings.position_embeddings` `[1, 1 + P, D]` -> `position_embeddings`
  `[1 + P, D]`, resized bicubically over the patch grid (prefix tokens
  kept, the numbers of HF's `interpolate_pos_encoding=True`) when
  `image_size` is overridden, e.g. `ViTClassifier.from_preset(path,
  image_size=384)`;
- `encoder.layer.{i}.` + `LAYER`: self-attention, feed-forward and the
  pre-norms `self_attention_norm` / `feed_forward_norm`;
- `layernorm` -> `final_norm`, `pooler.dense` -> `pooler`, `classifier`.

PyTorch `Linear` weights are `[out, in]`; ours are `[in, out]` (split into
heads for attention). `embeddings.mask_token` (masked image modelling) is
not used.

Inputs: HF takes `pixel_values` `[B, C, H, W]` that its image processor has
resized and normalised; ours takes channels-last `images` `[B, H, W, C]`
and normalises them itself. A `preprocessor_config.json` beside the weights
(`do_rescale`, `rescale_factor`, `do_normalize`, `image_mean`, `image_std`)
becomes `vision.rescale` / `mean` / `std`, so the loaded model takes raw
0..255 pixels; without one it takes HF's `pixel_values` (channels-last).
Resizing is not part of the model: feed `image_size` images (or another
multiple of the patch size: positions are then interpolated). Export writes
`preprocessor_config.json` when the config normalises its inputs. A
`ViTBackbone` without pooler exports as a `ViTModel` file without
`pooler.dense` (transformers then makes a new pooler, with its warning).
"""

from __future__ import annotations

import math
import sys
import warnings

import numpy as np

from keras_transformers.convert.bert import num_labels
from keras_transformers.convert.common import (
    ACTIVATIONS,
    assign,
    attention_parts,
    check_exportable,
    check_shape,
    export_layer,
    fetch,
    load_layer,
    write,
)
from keras_transformers.convert.image_processor import (  # noqa: F401 (API)
    PROCESSOR_DEFAULTS,
    fit_directory,
    preprocessor_config,
    write_preprocessor,
)
from keras_transformers.convert.protocol import Converter, one_layout
from keras_transformers.layers.patches import resize_grid
from keras_transformers.registry import register_converter

MODEL_TYPE = "vit"
FAMILY = "vit"
TITLE = "ViT"  # in messages
PREFIXES = ("vit.", "")
# The tensor (under one of PREFIXES) that marks a checkpoint of this type.
PROBE = "embeddings.cls_token"
CLASSES = {  # HF architecture -> ours; export inverts it
    "ViTModel": "ViTBackbone",
    "ViTForImageClassification": "ViTClassifier",
}
ARCHITECTURES = {v: k for k, v in CLASSES.items()}
FIELDS = {  # HF key -> (our field, HF default); the default's type is the type
    "hidden_size": ("hidden_dim", 768),
    "num_hidden_layers": ("num_layers", 12),
    "num_attention_heads": ("num_heads", 12),
    "intermediate_size": ("intermediate_dim", 3072),
    "hidden_dropout_prob": ("dropout", 0.0),
    "attention_probs_dropout_prob": ("attention_dropout", 0.0),
    "layer_norm_eps": ("norm_epsilon", 1e-12),
    "initializer_range": ("initializer_range", 0.02),
}
SIZES = {"image_size": 224, "patch_size": 16, "num_channels": 3}  # HF defaults
# Our part of an encoder block -> its HF name under `encoder.layer.{i}.`.
LAYER = dict(
    query="attention.attention.query",
    key="attention.attention.key",
    value="attention.attention.value",
    output="attention.output.dense",
    intermediate="intermediate.dense",
    out="output.dense",
    self_attention_norm="layernorm_before",
    feed_forward_norm="layernorm_after",
)
TOKENS = ("cls_token", "distillation_token")  # HF names of the prefix tokens
ENCODER = dict(  # the layout of every ViT checkpoint
    vocabulary_size=0,
    stacks="encoder",
    norm_position="pre",
    norm_type="layer",
    final_norm=True,
    embedding_norm=False,
    position_embedding="learned",
    gated_feed_forward=False,
    use_bias=True,
    tie_embeddings=False,
    logits_bias=False,
    scale_embeddings=False,
    num_segments=0,
    sliding_window=None,
    moe=None,
    layer_scale=None,
)
TOKEN = dict(pooling="token", class_token=True, distillation_token=False)


def _architecture(hf: dict, spec) -> str | None:
    return next((a for a in hf.get("architectures") or () if a in spec.CLASSES), None)


def _side(hf: dict, key: str, spec) -> int:
    """`image_size` / `patch_size` as one int (HF also allows `[h, w]`)."""
    value = hf.get(key, spec.SIZES[key])
    if isinstance(value, (list, tuple)):
        if len(set(value)) != 1:
            raise ValueError(
                f"{spec.TITLE} config has {key}={value}: a non-square "
                f"{key.split('_')[0]}, which keras_transformers does not support "
                "(square images and patches only)."
            )
        value = value[0]
    return int(value)


def encoder_fields(hf: dict, spec) -> dict:
    """The TransformerConfig fields every ViT-layout type shares: sizes
    (`spec.FIELDS`, `spec.SIZES`), activation and `ENCODER`'s layout.

    Raises:
        ValueError: `qkv_bias=False`, an unknown `hidden_act`, or a
            non-square `image_size` / `patch_size`.
    """
    if not hf.get("qkv_bias", True):
        raise ValueError(
            f"{spec.TITLE} config has qkv_bias=False (no query/key/value biases), "
            "which keras_transformers does not support: its `use_bias` covers "
            "every projection. Only checkpoints with qkv_bias=True convert."
        )
    activation = hf.get("hidden_act", "gelu")
    if activation not in ACTIVATIONS:
        raise ValueError(
            f"{spec.TITLE} hidden_act={activation!r} is not supported. "
            f"Supported: {sorted(ACTIVATIONS)}."
        )
    fields = {ours: type(d)(hf.get(k, d)) for k, (ours, d) in spec.FIELDS.items()}
    heads, width = fields["num_heads"], fields["hidden_dim"]
    head_dim = hf.get("head_dim")  # none in the configs: hidden_size / heads
    return dict(
        ENCODER,
        **fields,
        head_dim=None if head_dim in (None, width // heads) else int(head_dim),
        activation=ACTIVATIONS[activation],
        vision={key: _side(hf, key, spec) for key in SIZES},
    )


def config_from_hf(hf: dict) -> dict:
    """TransformerConfig fields for an HF ViT `config.json` dict.

    Raises:
        ValueError: `qkv_bias=False`, an unknown `hidden_act`, or a
            non-square `image_size` / `patch_size`.
    """
    fields = encoder_fields(hf, _THIS)
    pooler = _architecture(hf, _THIS) == "ViTModel"  # add_pooling_layer=True
    return dict(fields, pooler=pooler, vision=dict(fields["vision"], **TOKEN))


def preset_data(hf: dict, spec=None) -> dict:
    """`{"family", "class_name", "config"}`, plus `"task"` (`num_classes`,
    `classifier_dropout`) for a classifier checkpoint (`spec.CLASSES`)."""
    spec = spec or _THIS
    name = spec.CLASSES.get(_architecture(hf, spec), "ViTBackbone")
    data = {"family": FAMILY, "class_name": name, "config": spec.config_from_hf(hf)}
    if name == "ViTClassifier":  # HF's heads have no dropout
        data["task"] = {"num_classes": num_labels(hf), "classifier_dropout": 0.0}
    return data


def fit_config(fields: dict, checkpoint, cls, spec=None) -> dict:
    """A pooler when the checkpoint has its weights (a `ViTModel` may be
    saved without), never for `ViTClassifier` (HF's reads no pooler)."""
    pooler = fields["pooler"]
    if checkpoint is not None:
        prefixes = (spec or _THIS).PREFIXES
        pooler = any(p + "pooler.dense.weight" in checkpoint for p in prefixes)
    return {**fields, "pooler": pooler and cls.__name__ != "ViTClassifier"}


def head_layers(model) -> list[tuple]:
    """(layer, HF name) of a `ViTClassifier`'s heads."""
    return [(model.classifier, "classifier")]


def _block(block, names: dict) -> list[tuple]:
    """(layer, HF name, kernel shape) of one encoder layer; parts whose
    name is None are left to the caller."""
    parts = {k: v for k, v in attention_parts(block.self_attention).items()}
    ffn = block.feed_forward
    parts.update(intermediate=(ffn.inner_dense, None), out=(ffn.output_dense, None))
    parts["self_attention_norm"] = (block.self_attention_norm, None)
    parts["feed_forward_norm"] = (block.feed_forward_norm, None)
    return [(x, names[k], s) for k, (x, s) in parts.items() if names.get(k)]


def layer_names(config) -> dict:
    """Our block part -> its HF name (`LAYER`; a type with other names
    defines its own, e.g. DINOv2's SwiGLU)."""
    return LAYER


def _entries(model, p: str, head: bool, spec) -> list[tuple]:
    """(layer, HF name, kernel shape, transposed) of `model`'s layers (the
    patch embedding aside): the backbone under prefix `p`, its pooler, and
    the heads if `head`."""
    backbone = getattr(model, "backbone", model)
    names = spec.layer_names(backbone.config)
    out = []
    for i, block in enumerate(backbone.blocks):
        out += [(x, f"{p}encoder.layer.{i}.{n}", s) for x, n, s in _block(block, names)]
    out.append((backbone.final_norm, p + "layernorm", None))
    if backbone.pooler is not None:
        out.append((backbone.pooler, p + "pooler.dense", None))
    if head:
        out += [(x, name, None) for x, name in spec.head_layers(model)]
    return [(x, n, s, hasattr(x, "kernel")) for x, n, s in out]  # Linear: [out, in]


def _tokens(patch) -> list:
    """The patch embedding's prefix token variables, in `TOKENS` order."""
    tokens = [patch.class_embedding] if patch.class_token else []
    return tokens + ([patch.distillation_embedding] if patch.distillation_token else [])


def _load_positions(patch, value: np.ndarray, name: str) -> None:
    """`[1, prefix + h*w, D]` positions -> `patch.position_embeddings`,
    resized from the checkpoint's square `h x w` grid to `patch.grid`."""
    rows, width = patch.position_embeddings.shape
    prefix = patch.num_prefix_tokens
    table = value[0] if value.ndim == 3 and value.shape[0] == 1 else value
    side = math.isqrt(max(table.shape[0] - prefix, 0))
    if table.ndim == 2 and side**2 == table.shape[0] - prefix and len(table) != rows:
        table = resize_grid(table.astype("float32"), (side, side), patch.grid, prefix)
    check_shape(table, (rows, width), name, patch.position_embeddings.path)
    write(patch.position_embeddings, table)


def _load_embeddings(patch, get, e: str) -> None:
    """The patch projection, prefix tokens and positions under prefix `e`."""
    name = e + "patch_embeddings.projection.weight"
    p, _, c, d = patch.kernel.shape
    kernel = get(name)
    check_shape(kernel, (d, c, p, p), name, patch.kernel.path)
    write(patch.kernel, kernel.transpose(2, 3, 1, 0))  # [p, p, C, D]
    bias = e + "patch_embeddings.projection.bias"
    assign(patch.bias, get(bias), bias)
    for variable, token in zip(_tokens(patch), TOKENS):
        assign(variable, get(e + token), e + token, shape=(1, 1, d))
    _load_positions(patch, get(e + "position_embeddings"), e + "position_embeddings")


def _check_pooler(hf: dict, spec) -> None:
    """Our pooler is a `[D, D]` tanh dense layer; HF's may differ."""
    act, size = hf.get("pooler_act", "tanh"), hf.get("pooler_output_size")
    if act != "tanh" or size not in (None, hf.get("hidden_size", 768)):
        raise ValueError(
            f"{spec.TITLE} config has pooler_act={act!r}, pooler_output_size={size}: "
            "keras_transformers' pooler is tanh with hidden_size outputs. Load the "
            "checkpoint as ViTClassifier, which has no pooler."
        )


def load_model_weights(model, checkpoint, hf: dict, spec=None) -> str:
    """Copies a ViT-layout checkpoint into `model` (`ViTBackbone` or
    `ViTClassifier`) and returns the tensor prefix of its encoder. Heads
    the checkpoint lacks, or has at another width, stay new (with a
    warning)."""
    spec = spec or _THIS
    backbone = getattr(model, "backbone", model)
    p = checkpoint.prefix(spec.PREFIXES, spec.PROBE, spec.MODEL_TYPE)
    if backbone.pooler is not None:
        _check_pooler(hf, spec)
    heads = spec.head_layers(model) if model is not backbone else []
    stored = all(name + ".weight" in checkpoint for _, name in heads)
    new = bool(heads) and not (stored and num_labels(hf) == model.num_classes)
    _load_embeddings(backbone.patch_embedding, checkpoint.get, p + "embeddings.")
    for x, name, shape, transposed in _entries(model, p, bool(heads) and not new, spec):
        load_layer(x, checkpoint.get, name, shape=shape, transpose=transposed)
    if new:
        warnings.warn(
            f"{checkpoint.directory} has no weights for the classifier of "
            f"ViTClassifier with {model.num_classes} classes: newly initialised, "
            "train before use.",
            stacklevel=3,
        )
    return p


def hf_fields(config, spec) -> dict:
    """The `config.json` keys every ViT-layout type shares, after checking
    that `config` has the layout (`ENCODER` and `spec.TOKEN`; `spec.FREE`
    names the fields the type checks itself)."""
    mha = dict(  # plain multi-head attention, head_dim = hidden_dim / num_heads
        resolved_num_kv_heads=config.num_heads,
        resolved_head_dim=config.hidden_dim // config.num_heads,
    )
    free = getattr(spec, "FREE", ())
    required = {k: v for k, v in {**ENCODER, **mha}.items() if k not in free}
    check_exportable(config, required, spec.MODEL_TYPE)
    check_exportable(config.vision, spec.TOKEN, spec.MODEL_TYPE)
    activation = dict(gelu="gelu", gelu_approximate="gelu_new")
    v = config.vision
    return {
        **{k: getattr(config, ours) for k, (ours, _) in spec.FIELDS.items()},
        "model_type": spec.MODEL_TYPE,
        "hidden_act": activation.get(config.activation, config.activation),
        "image_size": v.image_size,
        "patch_size": v.patch_size,
        "num_channels": v.num_channels,
        "qkv_bias": True,
    }


def hf_config(config, spec=None) -> dict:
    """The HF `config.json` dict (without `architectures`) for `config`."""
    return {
        **hf_fields(config, spec or _THIS),
        "encoder_stride": config.vision.patch_size,  # masked-image upsampling
        "pooler_act": "tanh",
        "pooler_output_size": config.hidden_dim,
    }


def _export_embeddings(out: dict, patch, e: str) -> None:
    """Inverse of `_load_embeddings`."""
    d = patch.hidden_dim
    kernel = fetch(patch.kernel)  # [p, p, C, D]
    out[e + "patch_embeddings.projection.weight"] = kernel.transpose(3, 2, 0, 1)
    out[e + "patch_embeddings.projection.bias"] = fetch(patch.bias)
    for variable, token in zip(_tokens(patch), TOKENS):
        out[e + token] = fetch(variable, shape=(1, 1, d))
    rows = patch.position_embeddings.shape[0]
    out[e + "position_embeddings"] = fetch(
        patch.position_embeddings, shape=(1, rows, d)
    )


def architecture(model) -> str:
    """The HF class `model` exports as."""
    cls = type(model).__name__
    if cls not in ARCHITECTURES:
        raise ValueError(f"{cls} has no Hugging Face ViT counterpart.")
    return ARCHITECTURES[cls]


def export(model, spec=None) -> tuple[dict, dict[str, np.ndarray]]:
    """`(config.json dict, tensors)` of a ViT-family model as its HF class
    (`ViTModel` or `ViTForImageClassification`; `spec.architecture`).

    Raises:
        ValueError: an unknown class, a `ViTClassifier` with a pooler, or a
            config HF ViT cannot express (mean pooling, no class token, RMS
            norm, post-norm, gated feed-forward, GQA, no biases, ...).
    """
    spec = spec or _THIS
    backbone = getattr(model, "backbone", model)
    name = spec.architecture(model)
    if model is not backbone and backbone.pooler is not None:
        raise ValueError(
            f"{name} classifies without a pooler, but this ViTClassifier has "
            "one (config.pooler=True)."
        )
    hf = {**spec.hf_config(backbone.config), "architectures": [name]}
    p, out = ("" if model is backbone else spec.PREFIXES[0]), {}
    _export_embeddings(out, backbone.patch_embedding, p + "embeddings.")
    for x, n, shape, transposed in _entries(model, p, model is not backbone, spec):
        export_layer(out, x, n, shape=shape, transpose=transposed)
    if model is not backbone:
        labels = {i: f"LABEL_{i}" for i in range(model.num_classes)}
        hf.update(id2label=labels, label2id={v: i for i, v in labels.items()})
    return hf, out


_THIS = sys.modules[__name__]  # the `spec` of the ViT type itself


def exports(config) -> bool:
    """Whether a config of this family with no `model_type` asked for
    exports as vit: any other vision transformer."""
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
        fit_directory=fit_directory,
        fit_config=fit_config,
        write_preprocessor=write_preprocessor,
        exports=exports,
        export_order=100,  # the family's default: registry.export_converter
    )
)
