"""`keras-transformers train VIT_PRESET --images ...`: image classification
from an IDX file or a folder of images, saved and reloaded.

The runs are tiny (vit_tiny_28 with one layer, a few dozen images, one
epoch); each is shared, through a module fixture, by the tests that need it.
"""

import contextlib
import io
import json

import keras
import numpy as np
import pytest

import keras_transformers
from keras_transformers import cli
from keras_transformers.cli import train, vit
from keras_transformers.cli._common import given
from keras_transformers.data import images

SMALL = {"num_layers": 1}
TRAIN_ARGS = ["--epochs", "1", "--batch-size", "8", "--no-augment"]


def _run(argv, **overrides):
    """Parses `argv` as the CLI does and runs `train_vit` with `overrides`."""
    args = cli.build_parser().parse_args(argv)
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        model = vit.train_vit(args, **overrides)
    return model, stdout.getvalue()


def _errors(capsys, argv):
    status = cli.main(argv)
    return status, capsys.readouterr().err


def _bright_or_dark(rng, n, size=28):
    """Images of class 1 are bright, class 0 dark: learnable in one epoch."""
    y = np.arange(n) % 2
    x = rng.integers(0, 60, (n, size, size)) + 180 * y[:, None, None]
    return x.astype(np.uint8), y.astype(np.uint8)


@pytest.fixture(scope="module")
def idx_file(tmp_path_factory):
    root = tmp_path_factory.mktemp("idx")
    x, y = _bright_or_dark(np.random.default_rng(0), 48)
    path = root / "train-images-idx3-ubyte.gz"
    images.write_idx(path, x)
    images.write_idx(root / "train-labels-idx1-ubyte.gz", y)
    return path


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory):
    """Two classes of 32x32 RGB PNGs: the CLI resizes them to 28x28 grey."""
    root = tmp_path_factory.mktemp("folder") / "shades"
    x, y = _bright_or_dark(np.random.default_rng(1), 24, size=32)
    for i, (image, label) in enumerate(zip(x, y)):
        folder = root / ("bright" if label else "dark")
        folder.mkdir(parents=True, exist_ok=True)
        rgb = np.repeat(image[..., None], 3, axis=-1).astype("float32")
        keras.utils.save_img(folder / f"{i}.png", rgb, scale=False)
    return root


@pytest.fixture(scope="module")
def trained_idx(tmp_path_factory, idx_file):
    output = tmp_path_factory.mktemp("runs") / "vit_idx"
    argv = ["train", "vit_tiny_28", "--images", str(idx_file), "--output", str(output)]
    argv += ["--validation-fraction", "0.25", "--learning-rate", "0.01"]
    model, out = _run(argv + TRAIN_ARGS, **SMALL)
    return model, output, out


def test_train_on_idx_file_saves_a_classifier(trained_idx, idx_file):
    model, output, out = trained_idx
    assert "36 training and 12 validation images of 28x28x1, 2 classes" in out
    assert (
        "Validation accuracy per epoch" in out and "Final: validation accuracy" in out
    )
    assert json.loads((output / vit.LABELS_FILE).read_text()) == {"labels": ["0", "1"]}
    restored = keras_transformers.from_preset(str(output))
    assert type(restored).__name__ == "ViTClassifier"
    assert restored.num_classes == 2 and restored.config.num_layers == 1
    x, _, _ = images.load_images(idx_file)
    logits = np.asarray(restored.predict(x[:6], verbose=0))
    assert logits.shape == (6, 2) and np.isfinite(logits).all()
    np.testing.assert_allclose(logits, model.predict(x[:6], verbose=0), atol=1e-4)


@pytest.mark.once  # another input format: reading images is the same on every backend
def test_train_on_image_folder_with_test_images(tmp_path, image_folder, idx_file):
    output = tmp_path / "vit_folder"
    argv = ["train", "vit_tiny_28", "--images", str(image_folder)]
    argv += ["--test-images", str(image_folder), "--output", str(output)]
    argv += ["--steps-per-epoch", "2"]
    model, out = _run(argv + TRAIN_ARGS, **SMALL)
    assert "24 training and 24 test images of 28x28x1, 2 classes" in out
    assert "1 epochs x 2 steps of 8 images" in out
    assert "Final: test accuracy" in out
    labels = json.loads((output / vit.LABELS_FILE).read_text())["labels"]
    assert labels == ["bright", "dark"]
    restored = keras_transformers.from_preset(str(output))
    x, y, _ = images.load_image_folder(image_folder, image_size=28, num_channels=1)
    predicted = np.argmax(restored.predict(x, verbose=0), axis=-1)
    assert predicted.shape == y.shape


def test_vit_defaults_apply_unless_given():
    parser = cli.build_parser()
    args = parser.parse_args(["train", "vit_tiny_28"])
    assert not given(args, "epochs") and args.epochs == 6  # text default
    args = parser.parse_args(["train", "vit_tiny_28", "--epochs", "6"])
    assert given(args, "epochs")
    assert train.run.__doc__ and "train_vit" in train.run.__doc__


def test_image_size_option_and_errors(capsys, tmp_path, idx_file):
    argv = ["train", "vit_tiny_28", "--images", str(idx_file)]
    argv += ["--output", str(tmp_path / "a"), "--image-size", "30"]
    status, err = _errors(capsys, argv)
    assert status == 2 and "--image-size 30" in err and "patch size 7" in err
    argv = ["train", "gpt2_tiny", "--images", str(idx_file), "--output", str(tmp_path)]
    status, err = _errors(capsys, argv)
    assert status == 2 and "'gpt'" in err and "vit" in err
    argv = ["train", "vit_tiny_28", "--images", str(tmp_path / "missing.gz")]
    status, err = _errors(capsys, argv + ["--output", str(tmp_path / "b")])
    assert status == 2 and "images not found" in err
    bad = tmp_path / "pictures-images-idx3-ubyte"
    bad.write_bytes(b"\x00\x00\x08\x00" + bytes(16))
    status, err = _errors(capsys, ["train", "vit_tiny_28", "--images", str(bad)])
    assert status == 2 and "labels file not found" in err


@pytest.mark.once  # the command end to end; ViT at other sizes per backend: test_vit.py
def test_train_at_another_image_size(tmp_path, idx_file):
    output = tmp_path / "vit14"
    argv = ["train", "vit_tiny_28", "--images", str(idx_file), "--output", str(output)]
    model, out = _run(argv + TRAIN_ARGS + ["--image-size", "14"], **SMALL)
    assert "images of 14x14x1" in out
    restored = keras_transformers.from_preset(str(output))
    assert restored.config.vision.image_size == 14
    logits = restored.predict(np.zeros((1, 14, 14, 1), "float32"), verbose=0)
    assert np.asarray(logits).shape == (1, 2)


@pytest.mark.once  # the installed data set end to end; ViT fit per backend: test_vit.py
@pytest.mark.skipif(
    not (images.FASHION_MNIST_DIR / "train-images-idx3-ubyte.gz").is_file(),
    reason="Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)",
)
def test_train_on_fashion_mnist_subset(tmp_path):
    """The Debian files as --images (first 256), tested on the held-out part."""
    path = images.FASHION_MNIST_DIR / "train-images-idx3-ubyte.gz"
    argv = ["train", "vit_tiny_28", "--images", str(path), "--max-images", "256"]
    model, out = _run(argv + ["--output", str(tmp_path)] + TRAIN_ARGS, **SMALL)
    assert "243 training and 13 validation images of 28x28x1, 10 classes" in out
    labels = json.loads((tmp_path / vit.LABELS_FILE).read_text())["labels"]
    assert labels[0] == "T-shirt/top" and len(labels) == 10
