"""Image data for the ViT models: IDX files (MNIST / Fashion-MNIST), folders
of images with one sub-folder per class, and training-time augmentation.

Backend-independent helpers (NumPy, the standard library and Keras layers):

* :func:`read_idx` / :func:`write_idx` - the IDX format of MNIST and
  Fashion-MNIST, gzip-compressed or plain;
* :func:`load_fashion_mnist` - Fashion-MNIST from the Debian package
  `dataset-fashion-mnist` (`apt-get install dataset-fashion-mnist`), else
  `keras.datasets.fashion_mnist` (which downloads it);
* :func:`load_image_folder` - `DIR/<class name>/<image files>`;
* :func:`load_images` - either of the two for a path (what the command
  line's `--images` accepts);
* :func:`resize_images` - to a square size, keeping the dtype;
* :func:`augmentation` / :class:`Augmented` - random flips and shifts as
  standard Keras layers, applied inside the compiled training step (so the
  same code runs on JAX, TensorFlow and PyTorch) and never at inference.

Our ViTs take channels-last *float* images of raw pixels `[N, H, W, C]`
(0..255): rescaling and mean / std normalisation happen inside the model,
from the preset's `vision` config. The loaders therefore return IDX pixels
as uint8 (as stored) and folder images as float32; cast with
`x.astype("float32")` before `fit` / `predict`.

Example:

```python
(x_train, y_train), (x_test, y_test) = load_fashion_mnist()  # uint8 [N, 28, 28]
model = ViTClassifier.from_preset("vit_mnist_28", num_classes=10)
model.fit(x_train[..., None].astype("float32"), y_train, ...)
```
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import Any

import keras
import numpy as np

from keras_transformers.training.random_state import SavesRandomState

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif")

# IDX magic numbers: 0x00000803 (unsigned bytes, 3 dimensions) for images,
# 0x00000801 (unsigned bytes, 1 dimension) for labels.
IMAGES_MAGIC, LABELS_MAGIC = 2051, 2049


# ---------------------------------------------------------------------------
# IDX files.
# ---------------------------------------------------------------------------


def _open(path: Path):
    with open(path, "rb") as f:
        gzipped = f.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gzipped else open(path, "rb")


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Reads an IDX file of unsigned bytes, gzip-compressed or plain.

    Images (magic 2051): a 16-byte header (magic, N, H, W as big-endian
    int32), then N*H*W pixels. Labels (magic 2049): an 8-byte header
    (magic, N), then N labels.

    Args:
        path: the file, e.g. `train-images-idx3-ubyte.gz`.

    Returns:
        uint8 `[N, H, W]` images or uint8 `[N]` labels.

    Raises:
        ValueError: an unknown magic number or a truncated file (the message
            names the file).
    """
    path = Path(path)
    try:
        with _open(path) as f:
            data = f.read()
    except (OSError, EOFError) as error:  # e.g. a corrupt gzip stream
        raise ValueError(f"cannot read IDX file {path}: {error}") from None
    if len(data) < 8:
        raise ValueError(f"{path} is not an IDX file: only {len(data)} bytes.")
    magic = int.from_bytes(data[:4], "big")
    if magic not in (IMAGES_MAGIC, LABELS_MAGIC):
        raise ValueError(
            f"{path} is not an IDX file of images or labels: magic number {magic} "
            f"(expected {IMAGES_MAGIC} for images or {LABELS_MAGIC} for labels)."
        )
    rank = 3 if magic == IMAGES_MAGIC else 1
    header = 4 + 4 * rank
    if len(data) < header:
        raise ValueError(f"{path} is truncated: its header needs {header} bytes.")
    shape = tuple(
        int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(rank)
    )
    size = int(np.prod(shape))
    if len(data) - header < size:
        raise ValueError(
            f"{path} is truncated: shape {shape} needs {size:,} bytes after the "
            f"header, the file has {len(data) - header:,}."
        )
    return np.frombuffer(data, np.uint8, size, header).reshape(shape).copy()


def write_idx(path: str | os.PathLike, array: Any) -> None:
    """Writes uint8 `[N, H, W]` images or `[N]` labels as an IDX file
    (gzip-compressed when `path` ends in `.gz`); `read_idx` reads it back."""
    array = np.asarray(array)
    if (
        array.ndim not in (1, 3)
        or array.min(initial=0) < 0
        or array.max(initial=0) > 255
    ):
        raise ValueError(
            "write_idx takes [N, H, W] images or [N] labels of values 0..255. "
            f"Received shape {array.shape}."
        )
    magic = IMAGES_MAGIC if array.ndim == 3 else LABELS_MAGIC
    header = b"".join(int(n).to_bytes(4, "big") for n in (magic, *array.shape))
    data = header + array.astype(np.uint8).tobytes()
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(data)


def labels_path(images_path: str | os.PathLike) -> Path:
    """The labels file beside an IDX images file, by the MNIST naming
    convention: `train-images-idx3-ubyte[.gz]` -> `train-labels-idx1-ubyte[.gz]`.

    Raises:
        ValueError: the name does not follow the convention.
    """
    path = Path(images_path)
    if "images-idx3" not in path.name:
        raise ValueError(
            f"cannot tell the labels file of {path}: its name has no "
            "'images-idx3' to replace by 'labels-idx1'. Pass the labels file."
        )
    return path.with_name(path.name.replace("images-idx3", "labels-idx1"))


def load_idx_pair(images: str | os.PathLike, labels=None) -> tuple:
    """IDX images and their labels (`labels`: default `labels_path(images)`).

    Returns:
        `(images, labels)`: uint8 `[N, H, W]` and uint8 `[N]`.
    """
    labels = Path(labels) if labels is not None else labels_path(images)
    if not labels.is_file():
        raise ValueError(f"labels file not found: {labels}")
    x, y = read_idx(images), read_idx(labels)
    if x.ndim != 3 or y.ndim != 1:
        raise ValueError(
            f"expected an images file and a labels file; {images} holds shape "
            f"{x.shape} and {labels} shape {y.shape}."
        )
    if len(x) != len(y):
        raise ValueError(f"{images} has {len(x)} images but {labels} {len(y)} labels.")
    return x, y


def load_fashion_mnist(directory: str | os.PathLike = FASHION_MNIST_DIR) -> tuple:
    """Fashion-MNIST: 60,000 training and 10,000 test images, 28x28 grey.

    Reads the IDX files of the Debian package `dataset-fashion-mnist` in
    `directory`; without them, `keras.datasets.fashion_mnist.load_data()`
    (which downloads the same files once).

    Returns:
        `((x_train, y_train), (x_test, y_test))`: uint8 `[N, 28, 28]` images
        and uint8 `[N]` labels, class names in `FASHION_MNIST_CLASSES`.

    Raises:
        RuntimeError: neither source is available.
    """
    directory = Path(directory)
    name = "{}-{}-ubyte.gz"
    files = [directory / name.format(s, "images-idx3") for s in ("train", "t10k")]
    if all(f.is_file() and labels_path(f).is_file() for f in files):
        return load_idx_pair(files[0]), load_idx_pair(files[1])
    try:
        (x_train, y_train), (x_test, y_test) = keras.datasets.fashion_mnist.load_data()
    except Exception as error:  # no network, a proxy, a corrupt cache...
        raise RuntimeError(
            f"Fashion-MNIST is not in {directory} and keras.datasets could not "
            f"download it ({type(error).__name__}: {error}). On Debian or Ubuntu: "
            "`apt-get install dataset-fashion-mnist`."
        ) from None
    return (x_train, y_train), (x_test, y_test)


# ---------------------------------------------------------------------------
# Folders of images.
# ---------------------------------------------------------------------------


def load_image_folder(
    directory: str | os.PathLike,
    image_size: int | tuple | None = None,
    num_channels: int = 3,
) -> tuple:
    """Images in `directory/<class name>/`, one sub-folder per class.

    Classes are the sub-folder names in sorted order (label = index);
    files with other extensions than `IMAGE_EXTENSIONS` are skipped.

    Args:
        directory: the folder of class folders.
        image_size: resize every image to this `(height, width)` (an int for
            squares); None keeps their size, which must then be the same.
        num_channels: 1 (grey), 3 (RGB) or 4 (RGBA).

    Returns:
        `(images, labels, class_names)`: float32 `[N, H, W, C]` raw pixels
        (0..255), int32 `[N]` labels and the list of class names.

    Raises:
        ValueError: no class folders, no images, or images of different
            sizes without `image_size`.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"image folder not found: {directory}")
    class_names = sorted(p.name for p in directory.iterdir() if p.is_dir())
    if not class_names:
        raise ValueError(
            f"{directory} has no sub-folders: put the images of each class in "
            "a folder named after the class."
        )
    mode = {1: "grayscale", 3: "rgb", 4: "rgba"}.get(num_channels)
    if mode is None:
        raise ValueError(f"`num_channels` must be 1, 3 or 4. Received: {num_channels}")
    if isinstance(image_size, int):
        image_size = (image_size, image_size)
    images, labels = [], []
    for label, name in enumerate(class_names):
        for file in sorted((directory / name).iterdir()):
            if file.suffix.lower() in IMAGE_EXTENSIONS:
                image = keras.utils.load_img(
                    file,
                    color_mode=mode,
                    target_size=image_size,
                    interpolation="bilinear",
                )
                images.append(
                    np.asarray(image, "float32").reshape(
                        image.size[1], image.size[0], num_channels
                    )
                )
                labels.append(label)
    if not images:
        raise ValueError(
            f"no images ({', '.join(IMAGE_EXTENSIONS)}) in the class folders of {directory}."
        )
    shapes = sorted({x.shape for x in images})
    if len(shapes) > 1:
        raise ValueError(
            f"the images in {directory} have different sizes ({shapes[0]}, "
            f"{shapes[-1]}, ...): pass `image_size` to resize them."
        )
    return np.stack(images), np.asarray(labels, "int32"), class_names


def load_images(path: str | os.PathLike, labels=None, num_channels: int = 1) -> tuple:
    """A folder of class folders or an IDX images file (what `--images` takes).

    Args:
        path: a directory (see `load_image_folder`) or an IDX images file.
        labels: the IDX labels file (default: found by `labels_path`);
            not allowed with a folder.
        num_channels: channels of the folder images (IDX images are grey).

    Returns:
        `(images, labels, class_names)`: float32 `[N, H, W, C]`, int32 `[N]`,
        and the class names (for IDX files: `"0"`, `"1"`, ...; Fashion-MNIST's
        names when the files are Fashion-MNIST's, by name).
    """
    path = Path(path)
    if path.is_dir():
        if labels is not None:
            raise ValueError(f"{path} is a folder: its labels are its sub-folders.")
        return load_image_folder(path, num_channels=num_channels)
    if not path.is_file():
        raise ValueError(f"images not found: {path}")
    x, y = load_idx_pair(path, labels)
    num_classes = int(y.max()) + 1 if len(y) else 0
    names = [str(i) for i in range(num_classes)]
    if num_classes <= 10 and "fashion" in str(path.resolve()).lower():
        names = list(FASHION_MNIST_CLASSES)
    return x[..., None].astype("float32"), y.astype("int32"), names


def resize_images(images: Any, size: int) -> np.ndarray:
    """`[N, H, W, C]` images resized (bilinear, antialiased) to `size x size`,
    as float32 NumPy; the same array when it already has that size."""
    images = np.asarray(images)
    if images.shape[1:3] == (size, size):
        return images.astype("float32", copy=False)
    out = keras.ops.image.resize(
        images.astype("float32"), (size, size), interpolation="bilinear", antialias=True
    )
    return np.asarray(keras.ops.convert_to_numpy(out), "float32")


# ---------------------------------------------------------------------------
# Augmentation.
# ---------------------------------------------------------------------------


def augmentation(
    flip: bool = True, translation: float = 0.0, seed: int | None = None
) -> keras.Sequential:
    """Random horizontal flips and shifts, as standard Keras layers.

    Args:
        flip: flip left-right with probability 0.5 (right for clothes and
            most photos, wrong for digits and text).
        translation: largest shift, as a fraction of the height and width
            (0 disables it); the borders are filled with black (0). Shifts
            regularise strongly: on Fashion-MNIST, 0.1 cost a ViT with 7x7
            patches about 2 points of accuracy after 20 epochs.
        seed: seed of the random layers.

    Returns:
        A `keras.Sequential` that changes `[B, H, W, C]` images when called
        with `training=True` and returns them unchanged otherwise.
    """
    layers = []
    if flip:
        layers.append(keras.layers.RandomFlip("horizontal", seed=seed))
    if translation:
        layers.append(
            keras.layers.RandomTranslation(
                translation, translation, fill_mode="constant", seed=seed
            )
        )
    return keras.Sequential(layers or [keras.layers.Identity()], name="augmentation")


class Augmented(SavesRandomState, keras.Model):
    """`model(augment(images))` during training; `model(images)` otherwise.

    Train this wrapper with `fit`; the wrapped model's weights are trained
    and it is saved on its own (the augmentation is not part of it).

    Args:
        model: an image model, e.g. a `ViTClassifier`.
        augment: layers applied to the images when `training=True`, e.g.
            `augmentation()`.
    """

    def __init__(self, model: keras.Model, augment: keras.Layer, **kwargs) -> None:
        super().__init__(**kwargs)
        self.base_model, self.augment = model, augment

    def build(self, input_shape):
        shape = input_shape["images"] if isinstance(input_shape, dict) else input_shape
        if not self.augment.built:
            self.augment.build(shape)
        self.built = True

    def call(self, inputs, training=None):
        if training:
            if isinstance(inputs, dict):
                inputs = {
                    **inputs,
                    "images": self.augment(inputs["images"], training=True),
                }
            else:
                inputs = self.augment(inputs, training=True)
        return self.base_model(inputs, training=training)
