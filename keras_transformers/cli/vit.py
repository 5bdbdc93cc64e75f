"""The image-classification job of the `keras-transformers` command.

`train VIT_PRESET [--images PATH]`: trains the preset's architecture (random
init) as a `ViTClassifier` on labelled images and saves it with
`save_to_preset`, the class names in `labels.json` beside it. `--images` is
a folder with one sub-folder of images per class, or an IDX images file
(MNIST / Fashion-MNIST format; the labels file is found beside it by name,
or given with `--labels`). Without `--images` it trains on Fashion-MNIST
(the Debian package `dataset-fashion-mnist`, else `keras.datasets`) and
tests on its 10,000 test images.

Images are resized to the preset's image size (or `--image-size`); grey
images feed RGB models by repetition. Accuracy is measured on `--test-images`
when given, else on a held-out `--validation-fraction` of the images.

`cli.train` parses the arguments; `cli._training` has the shared helpers
(argument checks, the AdamW + warmup-cosine optimizer).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import keras
import numpy as np

from keras_transformers._atomic import atomic_directory
from keras_transformers.cli import resume
from keras_transformers.cli._common import (
    LABELS_FILE,
    PROG,
    VIT_DEFAULTS,
    CLIError,
    given,
)
from keras_transformers.cli._training import check_train_args, optimizer

VIT_FAMILY = "vit"


def wants_vit(args: argparse.Namespace, family: str | None) -> bool:
    """Whether `train` should run `train_vit`: a vit preset, or --images."""
    return family == VIT_FAMILY or getattr(args, "images", None) is not None


def _load(images, labels, channels: int, size: int, what: str) -> tuple:
    """Images resized to `size`, labels and class names, errors as CLIError."""
    from keras_transformers.data import images as image_data

    try:
        if Path(images).is_dir():
            x, y, names = image_data.load_image_folder(images, size, channels)
        else:
            x, y, names = image_data.load_images(images, labels)
    except ValueError as error:
        raise CLIError(f"{what}: {error}") from None
    if len(x) == 0:
        raise CLIError(f"{what}: {images} holds no images.")
    return image_data.resize_images(x, size), y, names


def _data(args: argparse.Namespace, channels: int, size: int) -> tuple:
    """`(x, y, x_test, y_test, class_names, source, test_name)`: float32
    `[N, size, size, C]` images and int32 labels."""
    from keras_transformers.data import images as image_data

    test = None
    if args.images is None:
        try:
            (x, y), (x_test, y_test) = image_data.load_fashion_mnist()
        except RuntimeError as error:
            raise CLIError(f"{error} Or pass --images.") from None
        names, source = list(image_data.FASHION_MNIST_CLASSES), "Fashion-MNIST"
        x = image_data.resize_images(x[..., None], size)
        test = image_data.resize_images(x_test[..., None], size), y_test
    else:
        x, y, names = _load(args.images, args.labels, channels, size, "--images")
        source = args.images
    if args.max_images:
        x, y = x[: args.max_images], y[: args.max_images]
    if args.test_images is not None:
        x_test, y_test, test_names = _load(
            args.test_images, args.test_labels, channels, size, "--test-images"
        )
        if Path(args.test_images).is_dir() and test_names != names:
            raise CLIError(f"--test-images has classes {test_names}, --images {names}.")
        test = x_test, y_test
    y = np.asarray(y, "int32")
    if test is not None:
        return x, y, test[0], np.asarray(test[1], "int32"), names, source, "test"
    order = np.random.default_rng(args.seed).permutation(len(x))
    n_val = max(int(round(len(x) * args.validation_fraction)), 1)
    if len(x) - n_val < 1:
        raise CLIError(f"--images has too few images ({len(x)}) to hold some out.")
    val, train = order[:n_val], order[n_val:]
    return x[train], y[train], x[val], y[val], names, source, "validation"


def _batches(x, y, args: argparse.Namespace):
    """Training data for `fit`: the images in a new seeded order every epoch
    (reproducible, so `--resume` replays it), the last incomplete batch
    dropped; exactly `--steps-per-epoch` batches per epoch when given."""
    from keras_transformers.data import ShuffledBatches

    batches = ShuffledBatches(x, y, args.batch_size, args.seed)
    if not given(args, "steps_per_epoch"):
        return batches
    from keras_transformers.cli.bert import RepeatBatches

    return RepeatBatches(batches, args.steps_per_epoch)


def train_vit(args: argparse.Namespace, **overrides: Any):
    """`train` for a vit preset: a `ViTClassifier` on labelled images.

    Args:
        args: the parsed `train` arguments.
        **overrides: config fields to change (e.g. `num_layers=1`).

    Returns:
        The trained `ViTClassifier`, saved to `args.output` with
        `labels.json` (the class names, index = label).

    Raises:
        CLIError: an argument or the data cannot be used.
    """
    from keras_transformers.presets import list_presets

    family = list_presets().get(args.preset, {}).get("family")
    if family is not None and family != VIT_FAMILY:
        raise CLIError(
            f"--images trains image classifiers (vit presets); {args.preset!r} "
            f"is a {family!r} model. See `{PROG} presets --family vit`."
        )
    if args.data is not None:
        raise CLIError("vit presets train on images: pass --images, not --data.")
    check_train_args(args, families=(VIT_FAMILY,))
    for name, value in VIT_DEFAULTS.items():
        if not given(args, name):
            setattr(args, name, value)
    from keras_transformers.data import images as image_data
    from keras_transformers.models import ViTClassifier
    from keras_transformers.presets import load_config
    from keras_transformers.training import MaskedSparseCategoricalCrossentropy

    start = time.perf_counter()
    vision = load_config(args.preset, **overrides).vision
    size = args.image_size or vision.image_size
    if size < 1 or size % vision.patch_size:
        raise CLIError(
            f"--image-size {size} is not a positive multiple of the patch size "
            f"{vision.patch_size} of {args.preset}."
        )
    x, y, x_test, y_test, names, source, test_name = _data(
        args, vision.num_channels, size
    )
    if x.shape[-1] not in (1, vision.num_channels):
        raise CLIError(
            f"the images have {x.shape[-1]} channels; {args.preset} takes "
            f"{vision.num_channels}."
        )
    num_classes = max(len(names), int(y.max()) + 1, int(y_test.max()) + 1)
    print(
        f"Data: {source}, {len(x):,} training and {len(x_test):,} {test_name} "
        f"images of {size}x{size}x{x.shape[-1]}, {num_classes} classes."
    )
    keras.utils.set_random_seed(args.seed)
    overrides = {**overrides, "image_size": size}
    model = ViTClassifier.from_preset(args.preset, num_classes=num_classes, **overrides)
    net = model
    if args.augment:
        net = image_data.Augmented(model, image_data.augmentation(seed=args.seed))
        net.build((None, *x.shape[1:]))  # BackupAndRestore restores built models
    steps = (
        args.steps_per_epoch
        if given(args, "steps_per_epoch")
        else max(len(x) // args.batch_size, 1)
    )
    net.compile(
        optimizer=optimizer(args, args.epochs * steps),
        loss=MaskedSparseCategoricalCrossentropy(
            from_logits=True, label_smoothing=args.label_smoothing
        ),
        metrics=["accuracy"],
    )
    print(
        f"Model: {args.preset} (ViTClassifier), {model.count_params():,} parameters; "
        f"{args.epochs} epochs x {steps} steps of {args.batch_size} images"
        f"{', augmented' if args.augment else ''}; backend: {keras.config.backend()}."
    )
    callbacks = resume.resume_callbacks(args)
    fit_start = time.perf_counter()
    history = net.fit(
        callbacks[0].resumable(_batches(x, y, args)),
        shuffle=False,  # the batches shuffle themselves, reproducibly
        epochs=args.epochs,
        callbacks=callbacks,
        validation_data=(x_test, y_test),
        verbose=1 if sys.stdout.isatty() else 2,
    ).history
    fit_seconds = time.perf_counter() - fit_start
    values = " -> ".join(f"{v:.3f}" for v in history["val_accuracy"])
    print(f"{test_name.capitalize()} accuracy per epoch: {values}")
    logits = model.predict(x_test, batch_size=256, verbose=0)
    accuracy = float(np.mean(np.argmax(logits, axis=-1) == y_test))
    text = json.dumps({"labels": list(names)}, indent=2)
    with atomic_directory(args.output, markers=("config.json",)) as directory:
        model.save_to_preset(directory)  # one atomic save with labels.json
        (directory / LABELS_FILE).write_text(text + "\n")
    print(
        f"Final: {test_name} accuracy {accuracy:.3f}; fit {fit_seconds:.0f} s, "
        f"total {time.perf_counter() - start:.0f} s."
    )
    print(f"Saved the classifier and {LABELS_FILE} to {args.output}")
    return model
