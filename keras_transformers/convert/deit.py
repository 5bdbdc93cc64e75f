"""Hugging Face DeiT (`model_type: "deit"`) <-> the vit family.

DeiT is ViT's encoder with a second learned token, the distillation token,
after the class token (`vision.distillation_token=True`; the position table
has a row for each of the two). Every tensor name is ViT's (see
`keras_transformers.convert.vit`, whose mapping this module reuses), under
`deit.` in task files, plus `embeddings.distillation_token` `[1, 1, D]` ->
`patch_embedding.distillation_token` `[D]`.

- `DeiTModel` -> `ViTBackbone` (with `pooler` when `pooler.dense` is saved:
  tanh over the class token's state, as ViT's);
- `DeiTForImageClassification` -> `ViTClassifier` (`classifier` on the
  class token's state);
- `DeiTForImageClassificationWithTeacher` -> `ViTClassifier` with the task
  argument `distillation_head=True`: `cls_classifier` -> `classifier` on
  the class token, `distillation_classifier` on the distillation token, and
  the logits are the mean of the two (HF's `logits`; its `cls_logits` and
  `distillation_logits` are not returned separately).
- Other architectures (`DeiTForMaskedImageModeling`) load as `ViTBackbone`;
  `embeddings.mask_token` is not used.

Preprocessing: `preprocessor_config.json` gives `vision.rescale` / `mean` /
`std` (DeiTImageProcessor's defaults where a key is absent: mean and std
0.5; the hub's DeiT checkpoints list ImageNet's 0.485 / 0.229 ...), so the
loaded model takes raw 0..255 pixels. DeiTImageProcessor also resizes to
256 x 256 (bicubic) and center-crops 224 x 224: that stays with the caller
(e.g. `keras.layers.Resizing(256, 256, "bicubic")` then
`keras.layers.CenterCrop(224, 224)`). `export_hf` writes a
ViTImageProcessor file that resizes to `image_size` and normalises.

Export: a config with `vision.distillation_token` exports as "deit"
(`DeiTModel`, `DeiTForImageClassification`, or
`DeiTForImageClassificationWithTeacher` with `distillation_head`).
"""

from __future__ import annotations

import sys

from keras_transformers.convert import vit
from keras_transformers.convert.image_processor import fit_directory as _fit
from keras_transformers.convert.image_processor import write_preprocessor
from keras_transformers.convert.protocol import Converter, one_layout
from keras_transformers.registry import register_converter

MODEL_TYPE = "deit"
FAMILY = "vit"
TITLE = "DeiT"
PREFIXES = ("deit.", "")
PROBE = "embeddings.distillation_token"
TEACHER = "DeiTForImageClassificationWithTeacher"
CLASSES = {
    "DeiTModel": "ViTBackbone",
    "DeiTForImageClassification": "ViTClassifier",
    TEACHER: "ViTClassifier",
}
# DeiTImageProcessor's defaults (IMAGENET_STANDARD_MEAN / _STD).
PROCESSOR_DEFAULTS = vit.PROCESSOR_DEFAULTS
FIELDS, SIZES = vit.FIELDS, vit.SIZES  # DeiTConfig's keys and defaults are ViT's
TOKEN = dict(pooling="token", class_token=True, distillation_token=True)


def config_from_hf(hf: dict) -> dict:
    """TransformerConfig fields for an HF DeiT `config.json` dict.

    Raises:
        ValueError: `qkv_bias=False`, an unknown `hidden_act`, or a
            non-square `image_size` / `patch_size`.
    """
    fields = vit.encoder_fields(hf, _THIS)
    pooler = vit._architecture(hf, _THIS) == "DeiTModel"  # add_pooling_layer
    return dict(fields, pooler=pooler, vision=dict(fields["vision"], **TOKEN))


def preset_data(hf: dict) -> dict:
    """`{"family", "class_name", "config"}`, plus `"task"` for a classifier
    (`distillation_head=True` for the classifier with teacher)."""
    data = vit.preset_data(hf, _THIS)
    if vit._architecture(hf, _THIS) == TEACHER:
        data["task"]["distillation_head"] = True
    return data


def fit_directory(fields: dict, directory) -> dict:
    """`vision.rescale` / `mean` / `std` from `preprocessor_config.json`."""
    return _fit(fields, directory, PROCESSOR_DEFAULTS)


def fit_config(fields: dict, checkpoint, cls) -> dict:
    """A pooler only when `pooler.dense` is saved, never for a classifier."""
    return vit.fit_config(fields, checkpoint, cls, _THIS)


layer_names = vit.layer_names


def head_layers(model) -> list[tuple]:
    """(layer, HF name) of a `ViTClassifier`'s heads: HF's classifier with
    teacher names them `cls_classifier` / `distillation_classifier`."""
    if model.distillation_classifier is None:
        return [(model.classifier, "classifier")]
    return [
        (model.classifier, "cls_classifier"),
        (model.distillation_classifier, "distillation_classifier"),
    ]


def load_model_weights(model, checkpoint, hf: dict) -> None:
    """Copies a DeiT checkpoint into a `ViTBackbone` / `ViTClassifier`
    built with `vision.distillation_token`."""
    vit.load_model_weights(model, checkpoint, hf, _THIS)


def hf_config(config) -> dict:
    """The HF `config.json` dict (without `architectures`) for `config`."""
    return vit.hf_config(config, _THIS)


def architecture(model) -> str:
    """`DeiTModel`, `DeiTForImageClassification` or, with
    `distillation_head`, `DeiTForImageClassificationWithTeacher`."""
    if model is getattr(model, "backbone", model):
        return "DeiTModel"
    return TEACHER if model.distillation_head else "DeiTForImageClassification"


def export(model) -> tuple[dict, dict]:
    """`(config.json dict, tensors)` of a ViT-family model with a
    distillation token as its HF DeiT class.

    Raises:
        ValueError: no distillation token, or a config DeiT cannot express
            (see `keras_transformers.convert.vit.export`).
    """
    return vit.export(model, _THIS)


_THIS = sys.modules[__name__]


def exports(config) -> bool:
    """Whether a config of this family with no `model_type` asked for
    exports as deit: a distillation token."""
    return bool(config.vision.distillation_token)


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
        export_order=10,  # the family's default: registry.export_converter
    )
)
