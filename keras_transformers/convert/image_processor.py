"""An image processor's `preprocessor_config.json` <-> `config.vision`'s
input normalisation (`rescale`, `mean`, `std`), for the converters of the
ViT layout (`vit`, `deit`, `dinov2`).

Resizing and cropping are not part of our models: a loaded model takes
images of its `image_size` (or another multiple of the patch size)."""

from __future__ import annotations

import json
from pathlib import Path

PREPROCESSOR = "preprocessor_config.json"
# ViTImageProcessor's defaults (IMAGENET_STANDARD_MEAN / _STD).
PROCESSOR_DEFAULTS = dict(
    do_rescale=True,
    rescale_factor=1 / 255,
    do_normalize=True,
    image_mean=[0.5, 0.5, 0.5],
    image_std=[0.5, 0.5, 0.5],
)


def fit_directory(fields: dict, directory, defaults=PROCESSOR_DEFAULTS) -> dict:
    """`fields` with the input normalisation of `directory`'s
    `preprocessor_config.json` (image-processor keys, `defaults` where a
    key is absent) in `vision.rescale` / `mean` / `std`; unchanged when
    there is no such file."""
    file = Path(directory) / PREPROCESSOR
    if not file.exists():
        return fields
    processor = {**defaults, **json.loads(file.read_text())}
    vision = dict(fields["vision"])
    if processor["do_rescale"]:
        vision["rescale"] = float(processor["rescale_factor"])
    if processor["do_normalize"]:
        vision["mean"] = processor["image_mean"]
        vision["std"] = processor["image_std"]
    return {**fields, "vision": vision}


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
