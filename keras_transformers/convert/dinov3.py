"""Hugging Face DINOv3 ViT (`model_type: "dinov3_vit"`) <-> the vit family.

DINOv3 is DINOv2's pre-norm encoder with LayerScale, plus:

- `num_register_tokens` learned register tokens after the class token
  (tokens: class, registers, patches) -> `vision.register_tokens`;
- no position table: 2-D rotary positions of the patch centres (`rope_theta`
  -> `rope_max_wavelength`, `position_embedding="rotary"`; see
  `keras_transformers.layers.patch_rotary`), so any image size (a multiple
  of the patch size, square or not) needs no option. HF's training-only
  coordinate augmentations (`pos_embed_shift` / `_jitter` / `_rescale`)
  are not applied (inference numbers);
- per-projection biases: `query_bias`, `value_bias`, `proj_bias` and
  `mlp_bias` must be true (our `use_bias`), `key_bias` -> `key_bias`;
- `use_gated_mlp`: SwiGLU (`mlp.gate_proj` / `up_proj` / `down_proj`,
  `gated_feed_forward=True`).

`DINOv3ViTModel` -> `ViTBackbone` (HF's `pooler_output` is the final normed
class token state: `vision.pooling="token"`, no pooler weights). Tensors:
`embeddings.patch_embeddings` (a strided convolution `[D, C, p, p]`),
`embeddings.cls_token` `[1, 1, D]`, `embeddings.register_tokens`
`[1, R, D]`, `layer.{i}.` (`model.layer.{i}.` in transformers' own files)
+ `LAYER` and `layer_scale{1,2}.lambda1`, `norm` -> `final_norm`.
`embeddings.mask_token` (masked-patch pre-training input only) is read and
dropped; export writes zeros. `drop_path_rate` (training only) is ignored.

Preprocessing: `preprocessor_config.json` gives `vision.rescale` / `mean` /
`std` (ImageNet's mean and std where a key is absent); resizing stays with
the caller.
"""

from __future__ import annotations

import sys

import numpy as np

from keras_transformers.convert import dinov2, vit
from keras_transformers.convert.common import (
    assign,
    check_exportable,
    check_shape,
    export_layer,
    fetch,
    load_layer,
    write,
)
from keras_transformers.convert.image_processor import fit_directory as _fit
from keras_transformers.convert.image_processor import write_preprocessor
from keras_transformers.convert.protocol import Converter, one_layout
from keras_transformers.registry import register_converter

MODEL_TYPE = "dinov3_vit"
FAMILY = "vit"
TITLE = "DINOv3"
PREFIXES = ("",)
PROBE = "embeddings.register_tokens"
CLASSES = {"DINOv3ViTModel": "ViTBackbone"}
PROCESSOR_DEFAULTS = dict(  # DINOv3ViTImageProcessorFast's (ImageNet's)
    do_rescale=True,
    rescale_factor=1 / 255,
    do_normalize=True,
    image_mean=[0.485, 0.456, 0.406],
    image_std=[0.229, 0.224, 0.225],
)
FIELDS = {  # HF key -> (our field, DINOv3ViTConfig's default)
    "hidden_size": ("hidden_dim", 384),
    "num_hidden_layers": ("num_layers", 12),
    "num_attention_heads": ("num_heads", 6),
    "intermediate_size": ("intermediate_dim", 1536),
    "attention_dropout": ("attention_dropout", 0.0),
    "layer_norm_eps": ("norm_epsilon", 1e-5),
    "initializer_range": ("initializer_range", 0.02),
}
SIZES = {"image_size": 224, "patch_size": 16, "num_channels": 3}
LAYER = dict(
    query="attention.q_proj",
    key="attention.k_proj",
    value="attention.v_proj",
    output="attention.o_proj",
    intermediate="mlp.up_proj",
    out="mlp.down_proj",
    self_attention_norm="norm1",
    feed_forward_norm="norm2",
)
BIASES = ("query_bias", "value_bias", "proj_bias", "mlp_bias")  # must be true
TOKEN = dict(pooling="token", class_token=True, distillation_token=False)
FREE = ("layer_scale", "gated_feed_forward", "position_embedding")


def config_from_hf(hf: dict) -> dict:
    """TransformerConfig fields for an HF DINOv3 ViT `config.json` dict.

    Raises:
        ValueError: a false `query_bias` / `value_bias` / `proj_bias` /
            `mlp_bias`, an unknown `hidden_act`, or a non-square
            `image_size` / `patch_size`.
    """
    off = [key for key in BIASES if not hf.get(key, True)]
    if off:
        raise ValueError(
            f"DINOv3 config has {', '.join(k + '=False' for k in off)}: "
            "keras_transformers' `use_bias` covers the query, value, output "
            "and feed-forward projections together (only the key bias is its "
            "own, `key_bias`). Only checkpoints with these biases convert."
        )
    fields = vit.encoder_fields(hf, _THIS)
    gated = bool(hf.get("use_gated_mlp", False))
    vision = dict(fields["vision"], **TOKEN)
    vision["register_tokens"] = int(hf.get("num_register_tokens", 0))
    return dict(
        fields,
        position_embedding="rotary",
        rope_max_wavelength=float(hf.get("rope_theta", 100.0)),
        key_bias=bool(hf.get("key_bias", False)),
        gated_feed_forward=gated,
        layer_scale=float(hf.get("layerscale_value", 1.0)),
        pooler=False,
        vision=vision,
    )


def preset_data(hf: dict) -> dict:
    """`{"family": "vit", "class_name": "ViTBackbone", "config"}`."""
    return vit.preset_data(hf, _THIS)


def fit_directory(fields: dict, directory) -> dict:
    """`vision.rescale` / `mean` / `std` from `preprocessor_config.json`."""
    return _fit(fields, directory, PROCESSOR_DEFAULTS)


def layer_names(config) -> dict:
    """`LAYER` (the SwiGLU gate is mapped in `_entries`)."""
    return LAYER


def _entries(backbone, layer: str) -> list[tuple]:
    """(layer, HF name, kernel shape, transposed) of the blocks (HF names
    under `{layer}{i}.`) and the final norm."""
    out = []
    for i, block in enumerate(backbone.blocks):
        e = f"{layer}{i}."
        out += [(x, e + n, s) for x, n, s in vit._block(block, LAYER)]
        if backbone.config.gated_feed_forward:
            out.append((block.feed_forward.gate_dense, e + "mlp.gate_proj", None))
    out.append((backbone.final_norm, "norm", None))
    return [(x, n, s, hasattr(x, "kernel")) for x, n, s in out]


def _tokens(patch) -> list:
    """(variable, HF name, HF shape) of the class and register tokens."""
    d = patch.hidden_dim
    out = [(patch.class_embedding, "embeddings.cls_token", (1, 1, d))]
    if patch.register_tokens:
        shape = (1, patch.register_tokens, d)
        out.append((patch.register_embeddings, "embeddings.register_tokens", shape))
    return out


def load_model_weights(model, checkpoint, hf: dict) -> None:
    """Copies a DINOv3 ViT checkpoint into a `ViTBackbone`."""
    backbone = getattr(model, "backbone", model)
    checkpoint.prefix(PREFIXES, PROBE, MODEL_TYPE)
    get = checkpoint.get
    patch = backbone.patch_embedding
    name = "embeddings.patch_embeddings.weight"
    p, _, c, d = patch.kernel.shape
    kernel = get(name)
    check_shape(kernel, (d, c, p, p), name, patch.kernel.path)
    write(patch.kernel, kernel.transpose(2, 3, 1, 0))  # [p, p, C, D]
    assign(patch.bias, get("embeddings.patch_embeddings.bias"), name[:-6] + "bias")
    for variable, token, shape in _tokens(patch):
        assign(variable, get(token), token, shape=shape)
    if not patch.register_tokens and PROBE in checkpoint:
        get(PROBE)  # [1, 0, D]
    layer = "model.layer." if "model.layer.0.norm1.weight" in checkpoint else "layer."
    for x, n, shape, transposed in _entries(backbone, layer):
        load_layer(x, get, n, shape=shape, transpose=transposed)
    for i, block in enumerate(backbone.blocks):
        for ours, theirs in dinov2.SCALES.items():
            n = f"{layer}{i}.{theirs}.lambda1"
            assign(getattr(block, ours), get(n), n)
    if "embeddings.mask_token" in checkpoint:
        get("embeddings.mask_token")  # pre-training only: dropped


def hf_config(config) -> dict:
    """The HF `config.json` dict (without `architectures`) for `config`.

    Raises:
        ValueError: no 2-D rotary positions or no `layer_scale`, or another
            option DINOv3 cannot express.
    """
    check_exportable(config, {"position_embedding": "rotary"}, MODEL_TYPE)
    if config.layer_scale is None:
        check_exportable(config, {"layer_scale": 1.0}, MODEL_TYPE)
    hf = vit.hf_fields(config, _THIS)
    del hf["qkv_bias"]
    return {
        **hf,
        "rope_theta": config.rope_max_wavelength,
        "query_bias": True,
        "key_bias": config.key_bias,
        "value_bias": True,
        "proj_bias": True,
        "mlp_bias": True,
        "layerscale_value": config.layer_scale,
        "use_gated_mlp": config.gated_feed_forward,
        "num_register_tokens": config.vision.register_tokens,
        "drop_path_rate": 0.0,
    }


def export(model) -> tuple[dict, dict]:
    """`(config.json dict, tensors)` of a `ViTBackbone` with 2-D rotary
    positions as HF `DINOv3ViTModel`.

    Raises:
        ValueError: a task model, or a config DINOv3 cannot express (see
            `hf_config`).
    """
    if getattr(model, "backbone", model) is not model:
        raise ValueError(
            f"Hugging Face DINOv3 has no counterpart of {type(model).__name__}: "
            "export its backbone (`model.backbone`)."
        )
    hf = {**hf_config(model.config), "architectures": ["DINOv3ViTModel"]}
    patch, out = model.patch_embedding, {}
    kernel = fetch(patch.kernel)  # [p, p, C, D]
    out["embeddings.patch_embeddings.weight"] = kernel.transpose(3, 2, 0, 1)
    out["embeddings.patch_embeddings.bias"] = fetch(patch.bias)
    for variable, token, shape in _tokens(patch):
        out[token] = fetch(variable, shape=shape)
    d = model.config.hidden_dim
    out.setdefault("embeddings.register_tokens", np.zeros((1, 0, d), "float32"))
    out["embeddings.mask_token"] = np.zeros((1, 1, d), "float32")
    for x, n, shape, transposed in _entries(model, "layer."):
        export_layer(out, x, n, shape=shape, transpose=transposed)
    for i, block in enumerate(model.blocks):
        for ours, theirs in dinov2.SCALES.items():
            out[f"layer.{i}.{theirs}.lambda1"] = fetch(getattr(block, ours))
    return hf, out


_THIS = sys.modules[__name__]


def exports(config) -> bool:
    """Whether a config of this family with no `model_type` asked for
    exports as dinov3_vit: 2-D rotary patch positions."""
    return bool(config.rotary)


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
        write_preprocessor=write_preprocessor,
        exports=exports,
        export_order=15,  # before dinov2's layer-scale rule
    )
)
