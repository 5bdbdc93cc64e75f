"""Hugging Face DINOv2 (`model_type: "dinov2"`) <-> the vit family.

DINOv2 is ViT's pre-norm encoder (layer norm epsilon 1e-6, 14 x 14 patches)
with LayerScale: each residual branch is multiplied by a learned `[D]`
scale before it is added (`layer_scale`, initialised to
`layerscale_value`). The ViT mapping of
`keras_transformers.convert.vit` is reused with DINOv2's names, under
`dinov2.` in task files: `norm1` / `norm2` (the pre-norms), `mlp.fc1` /
`mlp.fc2` (feed-forward), `layer_scale1.lambda1` / `layer_scale2.lambda1`
-> `self_attention_scale` / `feed_forward_scale` of each block.

- `Dinov2Model` -> `ViTBackbone` (HF's `pooler_output` is the class
  token's final state, `hidden[:, 0]`; no pooler weights);
- `Dinov2ForImageClassification` -> `ViTClassifier`: HF's head reads
  `concat(class token state, mean of the patch states)`, which is
  `vision.pooling="token_and_mean"` (every DINOv2 config has it, so a
  classifier built from a backbone checkpoint has HF's layout), and
  `classifier` is `[2 * D, num_classes]`.
- `use_swiglu_ffn` (ViT-g/14): HF's `mlp.weights_in` `[2F, D]` holds the
  gate (first half) and the up projection (second half) of a SwiGLU, the
  layout of our gated feed-forward (`gated_feed_forward=True`, "silu",
  `intermediate_dim` F = (int(D * mlp_ratio * 2 / 3) + 7) // 8 * 8);
  `mlp.weights_out` is the output projection.
- `embeddings.mask_token` (used only by HF's masked-patch pre-training
  input `bool_masked_pos`) is read and dropped; export writes zeros.
- `drop_path_rate` (stochastic depth, a training-only regulariser that is
  the identity at inference) is ignored; export writes 0.0.
- Position embeddings: the hub checkpoints store a 37 x 37 grid (image_size
  518). Like HF, our model resizes them bicubically to the grid of the
  images it is given (`torch.nn.functional.interpolate(mode="bicubic",
  align_corners=False)` to the target size, the numbers of
  `keras_transformers.layers.patches.bicubic_matrix`), so 224 x 224 inputs
  need no option; `from_preset(path, image_size=224)` resizes the table once
  at load instead.

Preprocessing: `preprocessor_config.json` gives `vision.rescale` / `mean` /
`std` (BitImageProcessor's defaults, CLIP's mean and std, where a key is
absent; the hub's DINOv2 checkpoints list ImageNet's 0.485 / 0.229 ...).
BitImageProcessor also resizes the shortest edge to 256 (bicubic) and
center-crops 224 x 224: that stays with the caller. `export_hf` writes a
ViTImageProcessor file that resizes to `image_size` and normalises.

Export: a config with `layer_scale` (and no distillation token) exports as
"dinov2".
"""

from __future__ import annotations

import sys

import numpy as np

from keras_transformers.convert import vit
from keras_transformers.convert.common import (
    assign,
    check_exportable,
    check_shape,
    fetch,
)
from keras_transformers.convert.image_processor import fit_directory as _fit
from keras_transformers.convert.image_processor import write_preprocessor
from keras_transformers.convert.protocol import Converter, one_layout
from keras_transformers.registry import register_converter

MODEL_TYPE = "dinov2"
FAMILY = "vit"
TITLE = "DINOv2"
PREFIXES = ("dinov2.", "")
PROBE = "encoder.layer.0.layer_scale1.lambda1"
CLASSES = {
    "Dinov2Model": "ViTBackbone",
    "Dinov2ForImageClassification": "ViTClassifier",
}
# BitImageProcessor's defaults (OPENAI_CLIP_MEAN / _STD).
PROCESSOR_DEFAULTS = dict(
    do_rescale=True,
    rescale_factor=1 / 255,
    do_normalize=True,
    image_mean=[0.48145466, 0.4578275, 0.40821073],
    image_std=[0.26862954, 0.26130258, 0.27577711],
)
FIELDS = {k: v for k, v in vit.FIELDS.items() if k != "intermediate_size"}
FIELDS["layer_norm_eps"] = ("norm_epsilon", 1e-6)
SIZES = {"image_size": 224, "patch_size": 14, "num_channels": 3}
LAYER = dict(
    vit.LAYER,
    intermediate="mlp.fc1",
    out="mlp.fc2",
    self_attention_norm="norm1",
    feed_forward_norm="norm2",
)
SCALES = {"self_attention_scale": "layer_scale1", "feed_forward_scale": "layer_scale2"}
TOKEN = dict(pooling="token_and_mean", class_token=True, distillation_token=False)
FREE = ("layer_scale", "gated_feed_forward")  # checked in `hf_config`


def swiglu_width(hidden_size: int, mlp_ratio) -> int:
    """HF Dinov2SwiGLUFFN's hidden size: two thirds of the MLP's, rounded
    up to a multiple of 8."""
    return (int(int(hidden_size * mlp_ratio) * 2 / 3) + 7) // 8 * 8


def config_from_hf(hf: dict) -> dict:
    """TransformerConfig fields for an HF DINOv2 `config.json` dict.

    Raises:
        ValueError: `qkv_bias=False`, an unknown `hidden_act`, or a
            non-square `image_size` / `patch_size`.
    """
    fields = vit.encoder_fields(hf, _THIS)
    width, ratio = fields["hidden_dim"], hf.get("mlp_ratio", 4)
    swiglu = bool(hf.get("use_swiglu_ffn", False))
    return dict(
        fields,
        intermediate_dim=swiglu_width(width, ratio) if swiglu else int(width * ratio),
        gated_feed_forward=swiglu,
        activation="silu" if swiglu else fields["activation"],
        layer_scale=float(hf.get("layerscale_value", 1.0)),
        pooler=False,
        vision=dict(fields["vision"], **TOKEN),
    )


def preset_data(hf: dict) -> dict:
    """`{"family", "class_name", "config"}`, plus `"task"` for
    `Dinov2ForImageClassification`."""
    return vit.preset_data(hf, _THIS)


def fit_directory(fields: dict, directory) -> dict:
    """`vision.rescale` / `mean` / `std` from `preprocessor_config.json`."""
    return _fit(fields, directory, PROCESSOR_DEFAULTS)


def layer_names(config) -> dict:
    """`LAYER`; with SwiGLU, `mlp.weights_out` and no intermediate (the
    fused `mlp.weights_in` is mapped here)."""
    if config.gated_feed_forward:
        return dict(LAYER, intermediate=None, out="mlp.weights_out")
    return LAYER


head_layers = vit.head_layers


def load_model_weights(model, checkpoint, hf: dict) -> None:
    """Copies a DINOv2 checkpoint into a `ViTBackbone` / `ViTClassifier`
    with `layer_scale`."""
    backbone = getattr(model, "backbone", model)
    p = vit.load_model_weights(model, checkpoint, hf, _THIS)
    get = checkpoint.get
    for i, block in enumerate(backbone.blocks):
        e = f"{p}encoder.layer.{i}."
        for ours, theirs in SCALES.items():
            name = f"{e}{theirs}.lambda1"
            assign(getattr(block, ours), get(name), name)
        if backbone.config.gated_feed_forward:
            _load_swiglu(block.feed_forward, get, e + "mlp.weights_in")
    if p + "embeddings.mask_token" in checkpoint:
        get(p + "embeddings.mask_token")  # pre-training only: dropped


def _load_swiglu(ffn, get, name: str) -> None:
    """`weights_in` `[2F, D]` (gate rows, then up rows) -> `gate` and
    `intermediate`."""
    d, f = ffn.inner_dense.kernel.shape
    weight, bias = get(name + ".weight"), get(name + ".bias")
    check_shape(weight, (2 * f, d), name + ".weight", ffn.gate_dense.kernel.path)
    check_shape(bias, (2 * f,), name + ".bias", ffn.gate_dense.bias.path)
    for layer, rows in (
        (ffn.gate_dense, slice(0, f)),
        (ffn.inner_dense, slice(f, None)),
    ):
        assign(layer.kernel, weight[rows], name + ".weight", transpose=True)
        assign(layer.bias, bias[rows], name + ".bias")


def _mlp_ratio(config) -> int:
    """The integer `mlp_ratio` that gives `config.intermediate_dim`."""
    d, f = config.hidden_dim, config.intermediate_dim
    width = swiglu_width if config.gated_feed_forward else (lambda d, r: d * r)
    ratio = next((r for r in range(1, 65) if width(d, r) == f), None)
    if ratio is None:
        raise ValueError(
            f"This model cannot be exported as Hugging Face 'dinov2': its "
            f"intermediate_dim={f} is no integer mlp_ratio of hidden_dim={d} "
            f"({'SwiGLU: (int(D * r * 2 / 3) + 7) // 8 * 8' if config.gated_feed_forward else 'D * r'})."
        )
    return ratio


def hf_config(config) -> dict:
    """The HF `config.json` dict (without `architectures`) for `config`.

    Raises:
        ValueError: no `layer_scale`, a gated feed-forward whose activation
            is not "silu", an intermediate size no `mlp_ratio` gives, or
            another option DINOv2 cannot express.
    """
    if config.layer_scale is None:
        check_exportable(config, {"layer_scale": 1.0}, MODEL_TYPE)
    if config.gated_feed_forward:  # SwiGLU
        check_exportable(config, {"activation": "silu"}, MODEL_TYPE)
    return {
        **vit.hf_fields(config, _THIS),
        "mlp_ratio": _mlp_ratio(config),
        "layerscale_value": config.layer_scale,
        "use_swiglu_ffn": config.gated_feed_forward,
        "drop_path_rate": 0.0,
        "use_mask_token": True,
    }


def architecture(model) -> str:
    """`Dinov2Model` or `Dinov2ForImageClassification`."""
    backbone = model is getattr(model, "backbone", model)
    return "Dinov2Model" if backbone else "Dinov2ForImageClassification"


def export(model) -> tuple[dict, dict]:
    """`(config.json dict, tensors)` of a ViT-family model with LayerScale
    as its HF DINOv2 class.

    Raises:
        ValueError: a config DINOv2 cannot express (see `hf_config`).
    """
    hf, out = vit.export(model, _THIS)
    backbone = getattr(model, "backbone", model)
    p = "" if model is backbone else PREFIXES[0]
    for i, block in enumerate(backbone.blocks):
        e = f"{p}encoder.layer.{i}."
        for ours, theirs in SCALES.items():
            out[f"{e}{theirs}.lambda1"] = fetch(getattr(block, ours))
        if backbone.config.gated_feed_forward:  # gate rows, then up rows
            ffn = block.feed_forward
            for key, attr in (("weight", "kernel"), ("bias", "bias")):
                pair = [
                    fetch(getattr(layer, attr), transpose=key == "weight")
                    for layer in (ffn.gate_dense, ffn.inner_dense)
                ]
                out[f"{e}mlp.weights_in.{key}"] = np.concatenate(pair)
    d = backbone.config.hidden_dim
    out[p + "embeddings.mask_token"] = np.zeros((1, d), "float32")
    return hf, out


_THIS = sys.modules[__name__]


def exports(config) -> bool:
    """Whether a config of this family with no `model_type` asked for
    exports as dinov2: LayerScale."""
    return bool(config.layer_scale is not None)


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
        export_order=20,  # the family's default: registry.export_converter
    )
)
