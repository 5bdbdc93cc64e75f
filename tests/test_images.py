"""Image data: IDX files, image folders, resizing and the augmentation wrapper."""

import gzip

import keras
import numpy as np
import pytest

from keras_transformers.data import images
from keras_transformers.models import ViTClassifier


@pytest.mark.parametrize("name", ["x-images-idx3-ubyte", "x-images-idx3-ubyte.gz"])
def test_idx_round_trip(tmp_path, rng, name):
    x = rng.integers(0, 256, (5, 4, 3), dtype=np.uint8)
    y = rng.integers(0, 10, 5, dtype=np.uint8)
    write = tmp_path / name
    images.write_idx(write, x)
    images.write_idx(images.labels_path(write), y)
    assert (write.read_bytes()[:2] == b"\x1f\x8b") == name.endswith(".gz")
    np.testing.assert_array_equal(images.read_idx(write), x)
    x2, y2 = images.load_idx_pair(write)
    assert x2.dtype == np.uint8 and x2.shape == (5, 4, 3) and y2.shape == (5,)
    np.testing.assert_array_equal(y2, y)
    # What --images reads: float32 [N, H, W, 1] and int32 labels.
    x3, y3, names = images.load_images(write)
    assert x3.dtype == np.float32 and x3.shape == (5, 4, 3, 1)
    assert y3.dtype == np.int32 and names == [str(i) for i in range(int(y.max()) + 1)]


def test_idx_header_layout(tmp_path):
    """The bytes are the documented format: big-endian magic and sizes."""
    path = tmp_path / "t-labels-idx1-ubyte"
    images.write_idx(path, np.array([3, 1, 4], np.uint8))
    data = path.read_bytes()
    assert data == (2049).to_bytes(4, "big") + (3).to_bytes(4, "big") + b"\x03\x01\x04"


def test_idx_bad_magic_and_truncated(tmp_path):
    bad = tmp_path / "bad.idx"
    bad.write_bytes((2050).to_bytes(4, "big") + bytes(12))
    with pytest.raises(ValueError, match=r"bad\.idx.*magic number 2050"):
        images.read_idx(bad)
    short = tmp_path / "short-images-idx3-ubyte.gz"
    header = b"".join(n.to_bytes(4, "big") for n in (2051, 2, 3, 3))
    with gzip.open(short, "wb") as f:
        f.write(header + bytes(10))  # 18 pixels needed
    with pytest.raises(ValueError, match=r"short-images.*truncated"):
        images.read_idx(short)
    tiny = tmp_path / "tiny"
    tiny.write_bytes(b"\x00\x00")
    with pytest.raises(ValueError, match="tiny"):
        images.read_idx(tiny)


def test_idx_labels_must_match(tmp_path):
    path = tmp_path / "a-images-idx3-ubyte"
    images.write_idx(path, np.zeros((3, 2, 2), np.uint8))
    with pytest.raises(ValueError, match="labels file not found"):
        images.load_idx_pair(path)
    images.write_idx(images.labels_path(path), np.zeros(2, np.uint8))
    with pytest.raises(ValueError, match="3 images but .* 2 labels"):
        images.load_idx_pair(path)
    with pytest.raises(ValueError, match="images-idx3"):
        images.labels_path(tmp_path / "pictures.bin")


def _write_folder(root, rng, sizes=((6, 5), (6, 5))):
    """Two classes, `cat` and `dog`, with one RGB PNG of each size."""
    for name in ("dog", "cat"):
        (root / name).mkdir(parents=True)
        for i, (h, w) in enumerate(sizes):
            pixels = rng.integers(0, 256, (h, w, 3)).astype("float32")
            keras.utils.save_img(root / name / f"{i}.png", pixels, scale=False)
    (root / "cat" / "notes.txt").write_text("not an image")
    return root


def test_load_image_folder(tmp_path, rng):
    root = _write_folder(tmp_path / "pets", rng)
    x, y, names = images.load_image_folder(root)
    assert names == ["cat", "dog"]
    assert x.dtype == np.float32 and x.shape == (4, 6, 5, 3)
    assert 0 <= x.min() and x.max() <= 255 and x.max() > 1
    np.testing.assert_array_equal(y, [0, 0, 1, 1])
    grey, _, _ = images.load_image_folder(root, image_size=8, num_channels=1)
    assert grey.shape == (4, 8, 8, 1)
    x2, y2, names2 = images.load_images(root, num_channels=3)
    np.testing.assert_array_equal(x2, x)


def test_load_image_folder_errors(tmp_path, rng):
    with pytest.raises(ValueError, match="not found"):
        images.load_image_folder(tmp_path / "missing")
    with pytest.raises(ValueError, match="no sub-folders"):
        images.load_image_folder(tmp_path)
    root = _write_folder(tmp_path / "mixed", rng, sizes=((6, 5), (4, 4)))
    with pytest.raises(ValueError, match="different sizes"):
        images.load_image_folder(root)
    assert images.load_image_folder(root, image_size=(4, 6))[0].shape == (4, 4, 6, 3)
    with pytest.raises(ValueError, match="labels are its sub-folders"):
        images.load_images(root, labels=tmp_path / "x")


def test_resize_images(rng):
    x = rng.uniform(0, 255, (2, 8, 8, 1)).astype("float32")
    assert images.resize_images(x, 8) is x
    big = images.resize_images(x, 16)
    assert big.shape == (2, 16, 16, 1) and big.dtype == np.float32
    flat = images.resize_images(np.full((1, 8, 8, 3), 7.0), 12)
    np.testing.assert_allclose(flat, 7.0, atol=1e-4)


def test_augmented_only_changes_training(rng):
    model = ViTClassifier.from_preset("vit_tiny_28", num_classes=3)
    net = images.Augmented(model, images.augmentation(translation=0.2, seed=1))
    x = rng.uniform(0, 255, (4, 28, 28, 1)).astype("float32")
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(net(x)), keras.ops.convert_to_numpy(model(x))
    )
    augmented = keras.ops.convert_to_numpy(net.augment(x, training=True))
    assert augmented.shape == x.shape and not np.allclose(augmented, x)
    # Keras runs this fit eagerly (RandomTranslation declares no XLA
    # support): on JAX each op compiles for its shape. The forward's programs
    # are those above; SGD's update adds two per weight shape, Adam's ten.
    net.compile(
        optimizer="sgd",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    before = [keras.ops.convert_to_numpy(w) for w in model.trainable_weights]
    net.fit(x, np.array([0, 1, 2, 0]), epochs=1, batch_size=4, verbose=0)
    after = [keras.ops.convert_to_numpy(w) for w in model.trainable_weights]
    assert any(not np.allclose(a, b) for a, b in zip(before, after))


@pytest.mark.skipif(
    not (images.FASHION_MNIST_DIR / "t10k-images-idx3-ubyte.gz").is_file(),
    reason="Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)",
)
def test_load_fashion_mnist_from_debian():
    (x, y), (x_test, y_test) = images.load_fashion_mnist()
    assert x.shape == (60_000, 28, 28) and x_test.shape == (10_000, 28, 28)
    assert x.dtype == np.uint8 and y.shape == (60_000,) and y_test.shape == (10_000,)
    assert np.bincount(y_test).tolist() == [1000] * 10
    assert 0.27 < x.mean() / 255 < 0.30  # the pixel mean in vit_mnist_28's preset


def test_load_fashion_mnist_without_any_source(tmp_path, monkeypatch):
    def offline():
        raise OSError("no network")

    monkeypatch.setattr(keras.datasets.fashion_mnist, "load_data", offline)
    with pytest.raises(RuntimeError, match="dataset-fashion-mnist.*|no network"):
        images.load_fashion_mnist(tmp_path)
