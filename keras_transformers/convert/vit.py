"""Hugging Face ViT (`model_type: "vit"`) <-> the vit family.

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
  `[1 + P, D]`, resized bicubically over the patch grid (class token kept,
  the numbers of HF's `interpolate_pos_encoding=True`) when `image_size` is
  overridden, e.g. `ViTClassifier.from_preset(path, image_size=384)`;
- `encoder.layer.{i}.`: `attention.attention.{query,key,value}` and
  `attention.output.dense` (self-attention), `intermediate.dense` and
  `output.dense` (feed-forward), `layernorm_before` / `layernorm_after`
  (the pre-norms `self_attention_norm` / `feed_forward_norm`);
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

import json
import math
import warnings
from pathlib import Path

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
from keras_transformers.layers.patches import resize_grid
from keras_transformers.registry import register_converter

MODEL_TYPE = "vit"
FAMILY = "vit"
PREFIXES = ("vit.", "")
# The tensor (under one of PREFIXES) that marks a checkpoint of this type.
PROBE = "embeddings.cls_token"
CLASSES = {  # HF architecture -> ours; export inverts it
    "ViTModel": "ViTBackbone",
    "ViTForImageClassification": "ViTClassifier",
}
ARCHITECTURES = {v: k for k, v in CLASSES.items()}
PREPROCESSOR = "preprocessor_config.json"
# ViTImageProcessor's defaults (IMAGENET_STANDARD_MEAN / _STD).
PROCESSOR_DEFAULTS = dict(
    do_rescale=True,
    rescale_factor=1 / 255,
    do_normalize=True,
    image_mean=[0.5, 0.5, 0.5],
    image_std=[0.5, 0.5, 0.5],
)
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
)
TOKEN = dict(pooling="token", class_token=True)  # HF ViT reads the class token


def _architecture(hf: dict) -> str | None:
    return next((a for a in hf.get("architectures") or () if a in CLASSES), None)


def _side(hf: dict, key: str) -> int:
    """`image_size` / `patch_size` as one int (HF also allows `[h, w]`)."""
    value = hf.get(key, SIZES[key])
    if isinstance(value, (list, tuple)):
        if len(set(value)) != 1:
            raise ValueError(
                f"ViT config has {key}={value}: a non-square {key.split('_')[0]}, "
                "which keras_transformers does not support (square images and "
                "patches only)."
            )
        value = value[0]
    return int(value)


def _check(hf: dict) -> None:
    """Raises ValueError for ViT options we cannot reproduce."""
    if not hf.get("qkv_bias", True):
        raise ValueError(
            "ViT config has qkv_bias=False (no query/key/value biases), which "
            "keras_transformers does not support: its `use_bias` covers every "
            "projection. Only checkpoints with qkv_bias=True convert."
        )
    activation = hf.get("hidden_act", "gelu")
    if activation not in ACTIVATIONS:
        raise ValueError(
            f"ViT hidden_act={activation!r} is not supported. "
            f"Supported: {sorted(ACTIVATIONS)}."
        )


@register_converter(MODEL_TYPE)
def config_from_hf(hf: dict) -> dict:
    """TransformerConfig fields for an HF ViT `config.json` dict.

    Raises:
        ValueError: `qkv_bias=False`, an unknown `hidden_act`, or a
            non-square `image_size` / `patch_size`.
    """
    _check(hf)
    fields = {ours: type(d)(hf.get(k, d)) for k, (ours, d) in FIELDS.items()}
    heads, width = fields["num_heads"], fields["hidden_dim"]
    head_dim = hf.get("head_dim")  # ViTConfig has none: hidden_size / heads
    vision = {key: _side(hf, key) for key in SIZES}
    return dict(
        ENCODER,
        **fields,
        head_dim=None if head_dim in (None, width // heads) else int(head_dim),
        activation=ACTIVATIONS[hf.get("hidden_act", "gelu")],
        pooler=_architecture(hf) == "ViTModel",  # add_pooling_layer=True
        vision=dict(vision, **TOKEN),
    )


def preset_data(hf: dict) -> dict:
    """`{"family", "class_name", "config"}`, plus `"task"` (`num_classes`,
    `classifier_dropout`) for `ViTForImageClassification`."""
    name = CLASSES.get(_architecture(hf), "ViTBackbone")
    data = {"family": FAMILY, "class_name": name, "config": config_from_hf(hf)}
    if name == "ViTClassifier":  # HF ViT has no classifier dropout
        data["task"] = {"num_classes": num_labels(hf), "classifier_dropout": 0.0}
    return data


def fit_directory(fields: dict, directory) -> dict:
    """`fields` with the input normalisation of `directory`'s
    `preprocessor_config.json` (ViTImageProcessor keys, its defaults where
    a key is absent) in `vision.rescale` / `mean` / `std`; unchanged when
    there is no such file."""
    file = Path(directory) / PREPROCESSOR
    if not file.exists():
        return fields
    processor = {**PROCESSOR_DEFAULTS, **json.loads(file.read_text())}
    vision = dict(fields["vision"])
    if processor["do_rescale"]:
        vision["rescale"] = float(processor["rescale_factor"])
    if processor["do_normalize"]:
        vision["mean"] = processor["image_mean"]
        vision["std"] = processor["image_std"]
    return {**fields, "vision": vision}


def fit_config(fields: dict, checkpoint, cls) -> dict:
    """A pooler when the checkpoint has its weights (a `ViTModel` may be
    saved without), never for `ViTClassifier` (HF's reads no pooler)."""
    pooler = fields["pooler"]
    if checkpoint is not None:
        pooler = any(p + "pooler.dense.weight" in checkpoint for p in PREFIXES)
    return {**fields, "pooler": pooler and cls.__name__ != "ViTClassifier"}


def _block(block) -> list[tuple]:
    """(layer, HF name, kernel shape) of one encoder layer."""
    names = dict(
        query="attention.query",
        key="attention.key",
        value="attention.value",
        output="output.dense",
    )
    out = [
        (layer, "attention." + names[role], shape)
        for role, (layer, shape) in attention_parts(block.self_attention).items()
    ]
    ffn = block.feed_forward
    out += [(ffn.inner_dense, "intermediate.dense", None)]
    out += [(ffn.output_dense, "output.dense", None)]
    out += [(block.self_attention_norm, "layernorm_before", None)]
    return out + [(block.feed_forward_norm, "layernorm_after", None)]


def _entries(model, p: str, head: bool) -> list[tuple]:
    """(layer, HF name, kernel shape, transposed) of `model`'s layers (the
    patch embedding aside): the backbone under prefix `p`, its pooler, and
    the classifier if `head`."""
    backbone = getattr(model, "backbone", model)
    out = []
    for i, block in enumerate(backbone.blocks):
        out += [(x, f"{p}encoder.layer.{i}.{n}", s) for x, n, s in _block(block)]
    out.append((backbone.final_norm, p + "layernorm", None))
    if backbone.pooler is not None:
        out.append((backbone.pooler, p + "pooler.dense", None))
    if head:
        out.append((model.classifier, "classifier", None))
    return [(x, n, s, hasattr(x, "kernel")) for x, n, s in out]  # Linear: [out, in]


def _load_positions(patch, value: np.ndarray, name: str) -> None:
    """`[1, 1 + h*w, D]` positions -> `patch.position_embeddings`, resized
    from the checkpoint's square `h x w` grid to `patch.grid`."""
    rows, width = patch.position_embeddings.shape
    table = value[0] if value.ndim == 3 and value.shape[0] == 1 else value
    side = math.isqrt(max(table.shape[0] - 1, 0))
    if table.ndim == 2 and side * side == table.shape[0] - 1 and table.shape[0] != rows:
        table = resize_grid(table.astype("float32"), (side, side), patch.grid, 1)
    check_shape(table, (rows, width), name, patch.position_embeddings.path)
    write(patch.position_embeddings, table)


def _load_embeddings(patch, get, e: str) -> None:
    """The patch projection, class token and positions under prefix `e`."""
    name = e + "patch_embeddings.projection.weight"
    p, _, c, d = patch.kernel.shape
    kernel = get(name)
    check_shape(kernel, (d, c, p, p), name, patch.kernel.path)
    write(patch.kernel, kernel.transpose(2, 3, 1, 0))  # [p, p, C, D]
    bias = e + "patch_embeddings.projection.bias"
    assign(patch.bias, get(bias), bias)
    token = e + "cls_token"
    assign(patch.class_embedding, get(token), token, shape=(1, 1, d))
    _load_positions(patch, get(e + "position_embeddings"), e + "position_embeddings")


def _check_pooler(hf: dict) -> None:
    """Our pooler is a `[D, D]` tanh dense layer; HF's may differ."""
    act, size = hf.get("pooler_act", "tanh"), hf.get("pooler_output_size")
    if act != "tanh" or size not in (None, hf.get("hidden_size", 768)):
        raise ValueError(
            f"ViT config has pooler_act={act!r}, pooler_output_size={size}: "
            "keras_transformers' pooler is tanh with hidden_size outputs. Load the "
            "checkpoint as ViTClassifier, which has no pooler."
        )


def load_model_weights(model, checkpoint, hf: dict) -> None:
    """Copies a ViT checkpoint into `model` (`ViTBackbone` or
    `ViTClassifier`). A classifier the checkpoint lacks, or has at another
    width, stays new (with a warning)."""
    backbone = getattr(model, "backbone", model)
    p = checkpoint.prefix(PREFIXES, PROBE, MODEL_TYPE)
    if backbone.pooler is not None:
        _check_pooler(hf)
    head = model is not backbone
    same = CLASSES.get(_architecture(hf)) == "ViTClassifier"
    new = head and not (same and num_labels(hf) == model.num_classes)
    _load_embeddings(backbone.patch_embedding, checkpoint.get, p + "embeddings.")
    for x, name, shape, transposed in _entries(model, p, head and not new):
        load_layer(x, checkpoint.get, name, shape=shape, transpose=transposed)
    if new:
        warnings.warn(
            f"{checkpoint.directory} has no weights for the classifier of "
            f"ViTClassifier with {model.num_classes} classes: newly initialised, "
            "train before use.",
            stacklevel=3,
        )


def hf_config(config) -> dict:
    """The HF `config.json` dict (without `architectures`) for `config`."""
    mha = dict(  # plain multi-head attention, head_dim = hidden_dim / num_heads
        resolved_num_kv_heads=config.num_heads,
        resolved_head_dim=config.hidden_dim // config.num_heads,
    )
    check_exportable(config, {**ENCODER, **mha}, MODEL_TYPE)
    check_exportable(config.vision, TOKEN, MODEL_TYPE)
    activation = dict(gelu="gelu", gelu_approximate="gelu_new")
    v = config.vision
    return {
        **{k: getattr(config, ours) for k, (ours, _) in FIELDS.items()},
        "model_type": MODEL_TYPE,
        "hidden_act": activation.get(config.activation, config.activation),
        "image_size": v.image_size,
        "patch_size": v.patch_size,
        "num_channels": v.num_channels,
        "qkv_bias": True,
        "encoder_stride": v.patch_size,  # ViTForMaskedImageModeling's upsampling
        "pooler_act": "tanh",
        "pooler_output_size": config.hidden_dim,
    }


def preprocessor_config(config) -> dict | None:
    """The `preprocessor_config.json` dict (ViTImageProcessor) of
    `config.vision`'s normalisation, or None when it is the identity. It
    resizes to `image_size` (bilinear, the processor's default)."""
    v = config.vision
    if v.rescale == 1.0 and v.mean is None and v.std is None:
        return None

    def per_channel(values, default):
        values = list(values or (default,))
        return values * v.num_channels if len(values) == 1 else values

    normalize = v.mean is not None or v.std is not None
    return {
        "image_processor_type": "ViTImageProcessor",
        "do_resize": True,
        "size": {"height": v.image_size, "width": v.image_size},
        "do_rescale": v.rescale != 1.0,
        "rescale_factor": v.rescale,
        "do_normalize": normalize,
        "image_mean": per_channel(v.mean, 0.0),
        "image_std": per_channel(v.std, 1.0),
    }


def write_preprocessor(config, directory) -> None:
    """Writes `preprocessor_config.json` to `directory` when `config`
    normalises its inputs (see `preprocessor_config`)."""
    processor = preprocessor_config(config)
    if processor is not None:
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        text = json.dumps(processor, indent=2, sort_keys=True) + "\n"
        (path / PREPROCESSOR).write_text(text)


def _export_embeddings(out: dict, patch, e: str) -> None:
    """Inverse of `_load_embeddings`."""
    d = patch.hidden_dim
    kernel = fetch(patch.kernel)  # [p, p, C, D]
    out[e + "patch_embeddings.projection.weight"] = kernel.transpose(3, 2, 0, 1)
    out[e + "patch_embeddings.projection.bias"] = fetch(patch.bias)
    out[e + "cls_token"] = fetch(patch.class_embedding, shape=(1, 1, d))
    rows = patch.position_embeddings.shape[0]
    out[e + "position_embeddings"] = fetch(
        patch.position_embeddings, shape=(1, rows, d)
    )


def export(model) -> tuple[dict, dict[str, np.ndarray]]:
    """`(config.json dict, tensors)` of a ViT-family model as its HF class
    (`ViTModel` or `ViTForImageClassification`).

    Raises:
        ValueError: an unknown class, a `ViTClassifier` with a pooler, or a
            config HF ViT cannot express (mean pooling, no class token, RMS
            norm, post-norm, gated feed-forward, GQA, no biases, ...).
    """
    cls, backbone = type(model).__name__, getattr(model, "backbone", model)
    if cls not in ARCHITECTURES:
        raise ValueError(f"{cls} has no Hugging Face ViT counterpart.")
    if cls == "ViTClassifier" and backbone.pooler is not None:
        raise ValueError(
            "ViTForImageClassification classifies the class token without a "
            "pooler, but this ViTClassifier has one (config.pooler=True)."
        )
    hf = {**hf_config(backbone.config), "architectures": [ARCHITECTURES[cls]]}
    p, out = ("" if model is backbone else "vit."), {}
    _export_embeddings(out, backbone.patch_embedding, p + "embeddings.")
    for x, name, shape, transposed in _entries(model, p, head=model is not backbone):
        export_layer(out, x, name, shape=shape, transpose=transposed)
    if model is not backbone:
        labels = {i: f"LABEL_{i}" for i in range(model.num_classes)}
        hf.update(id2label=labels, label2id={v: i for i, v in labels.items()})
    return hf, out
