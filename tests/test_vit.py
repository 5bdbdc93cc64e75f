"""ViT family: patches and shapes, position resizing, input checks, fit,
saving and resolution changes."""

import keras
import numpy as np
import pytest
from contracts import (
    assert_close,
    compiled_call,
    compiled_reading,
    randomize_weights,
    run_fit_test,
    run_layer_test,
    run_saving_test,
    to_numpy,
)

import keras_transformers as kt
from keras_transformers.layers import PatchEmbedding
from keras_transformers.layers.patches import bicubic_matrix, resize_grid
from keras_transformers.models import ViTBackbone, ViTClassifier
from keras_transformers.models.vit import with_image_size

SMALL = dict(
    vocabulary_size=0,
    num_layers=2,
    hidden_dim=32,
    num_heads=4,
    intermediate_dim=64,
    stacks="encoder",
    norm_epsilon=1e-6,
    vision=dict(image_size=16, patch_size=4, num_channels=3),
)


def _forwards(fn, models, *args):
    """`fn(*args)` (calls of `models`) as NumPy; on JAX one compiled program
    (eager JAX compiles each op of a new shape on its own). The file's usual
    shape, [2, 16, 16, 3], stays eager: its ops' programs serve every test."""
    if keras.config.backend() != "jax":
        return to_numpy(fn(*args))
    variables = [v for model in models for v in model.variables]
    return to_numpy(compiled_reading(fn, variables)(*args))


@pytest.fixture(scope="module")
def classifier():
    keras.utils.set_random_seed(0)
    return randomize_weights(ViTClassifier(config=SMALL, num_classes=5))


@pytest.fixture
def images(rng):
    return rng.uniform(0, 1, size=(2, 16, 16, 3)).astype("float32")


def test_patch_count_shapes_and_params(classifier, images):
    hidden = classifier.backbone(images)
    assert tuple(hidden.shape) == (2, 1 + 16, 32)  # (16/4)^2 patches + class token
    assert tuple(classifier({"images": images}).shape) == (2, 5)
    assert classifier.backbone.count_params() == classifier.config.num_params()
    mean = ViTBackbone(
        config=SMALL, vision=dict(SMALL["vision"], pooling="mean", class_token=False)
    )
    assert _forwards(mean, [mean], images).shape == (2, 16, 32)
    assert mean.count_params() == mean.config.num_params()


def test_patch_embedding_is_a_strided_convolution(rng):
    layer, out = run_layer_test(
        PatchEmbedding,
        dict(hidden_dim=8, patch_size=4, image_size=8, num_channels=3),
        (rng.normal(size=(2, 8, 12, 3)).astype("float32"),),
        (2, 1 + 2 * 3, 8),
    )
    x = rng.normal(size=(2, 8, 12, 3)).astype("float32")
    conv = keras.layers.Conv2D(8, 4, strides=4, data_format="channels_last")
    conv.build((None, 8, 12, 3))
    conv.set_weights([to_numpy(layer.kernel), to_numpy(layer.bias)])
    expected = to_numpy(conv(x)).reshape(2, 6, 8)
    got = (
        to_numpy(layer(x))[:, 1:]
        - to_numpy(resize_grid(layer.position_embeddings, (2, 2), (2, 3), 1))[None, 1:]
    )
    assert_close(got, expected, atol=1e-5)


def test_bicubic_matrix_matches_torch_interpolate():
    torch = pytest.importorskip("torch")
    grid = np.random.default_rng(0).normal(size=(5, 7)).astype("float32")
    for out in [(5, 7), (8, 11), (3, 4), (10, 14)]:
        ours = bicubic_matrix(5, out[0]) @ grid @ bicubic_matrix(7, out[1]).T
        ref = torch.nn.functional.interpolate(
            torch.from_numpy(grid)[None, None],
            size=out,
            mode="bicubic",
            align_corners=False,
        )[0, 0].numpy()
        np.testing.assert_allclose(ours, ref, atol=1e-5)


def test_resizing_to_the_same_grid_reproduces_the_table(classifier):
    table = to_numpy(classifier.backbone.patch_embedding.position_embeddings)
    assert np.array_equal(resize_grid(table, (4, 4), (4, 4), 1), table)
    np.testing.assert_allclose(bicubic_matrix(6, 6), np.eye(6))
    # Up and back down is not the identity, but the class token row is kept.
    up = resize_grid(table, (4, 4), (8, 8), 1)
    assert up.shape == (65, 32) and np.array_equal(up[0], table[0])
    # The layer's on-the-fly resize is the same computation as the NumPy one.
    tensor = resize_grid(
        classifier.backbone.patch_embedding.position_embeddings, (4, 4), (8, 8), 1
    )
    assert_close(tensor, up, atol=1e-6)


def test_other_image_sizes_and_with_image_size(classifier, rng):
    big = rng.uniform(0, 1, size=(2, 32, 24, 3)).astype("float32")
    assert _forwards(classifier, [classifier], big).shape == (2, 5)
    square = big[:, :, :24]
    square = rng.uniform(0, 1, size=(2, 24, 24, 3)).astype("float32")
    resized = with_image_size(classifier, 24)
    assert resized.config.vision.image_size == 24
    ours, theirs = _forwards(
        lambda x: (resized(x), classifier(x)), [resized, classifier], square
    )
    assert_close(ours, theirs, atol=1e-5)
    same = with_image_size(classifier, 16)
    x = square[:, :16, :16]
    assert_close(same(x), classifier(x), atol=0)


def test_preset_loads_at_another_resolution(classifier, tmp_path, rng):
    classifier.save_to_preset(tmp_path / "vit")
    big = ViTClassifier.from_preset(tmp_path / "vit", image_size=32)
    assert big.config.vision.image_size == 32
    assert big.num_classes == 5
    x = rng.uniform(0, 1, size=(1, 32, 32, 3)).astype("float32")
    table = to_numpy(big.backbone.patch_embedding.position_embeddings)
    assert table.shape == (1 + 64, 32)
    backbone = ViTBackbone.from_preset(tmp_path / "vit", image_size=32)
    models = [big, classifier, backbone]
    outs = _forwards(
        lambda x: (big(x), classifier(x), backbone(x), big.backbone(x)), models, x
    )
    assert_close(outs[0], outs[1], atol=1e-5)  # same interpolation
    assert_close(outs[2], outs[3], atol=1e-6)


def test_normalisation_is_carried_by_the_config(rng):
    raw = rng.uniform(0, 255, size=(2, 16, 16, 3)).astype("float32")
    mean, std = [0.4, 0.5, 0.6], [0.2, 0.25, 0.3]
    vision = dict(SMALL["vision"], rescale=1 / 255, mean=mean, std=std)
    keras.utils.set_random_seed(1)
    normalising = ViTBackbone(config=SMALL, vision=vision)
    plain = ViTBackbone(config=SMALL)
    plain.set_weights(normalising.get_weights())
    prepared = (raw / 255 - np.array(mean)) / np.array(std)
    assert_close(normalising(raw), plain(prepared.astype("float32")), atol=1e-5)


def test_grey_images(rng):
    grey = kt.from_preset("vit_tiny_28")
    x = rng.uniform(0, 255, size=(3, 28, 28)).astype("float32")
    # [B, H, W] gets a channel
    assert_close(*_forwards(lambda x: (grey(x), grey(x[..., None])), [grey], x), atol=0)
    rgb = ViTBackbone(config=SMALL)
    g = rng.uniform(0, 1, size=(2, 16, 16, 1)).astype("float32")
    assert_close(rgb(g), rgb(np.repeat(g, 3, axis=-1)), atol=0)


@pytest.mark.parametrize(
    "images, message",
    [
        (np.zeros((1, 16, 16, 3), "int32"), "must be floats"),
        (np.zeros((1, 16, 16, 3), "uint8"), "astype"),
        (np.zeros((1, 16, 16, 2), "float32"), "2 channels"),
        (np.zeros((1, 18, 16, 3), "float32"), "height 18 is not a multiple"),
        (np.zeros((1, 16, 10, 3), "float32"), "width 10 is not a multiple"),
        (np.zeros((16, 16, 3), "float32"), "batch"),
    ],
)
def test_bad_images_raise(classifier, images, message):
    with pytest.raises(ValueError, match=message):
        classifier(images)


def test_bad_configs_raise():
    with pytest.raises(ValueError, match="vision.image_size"):
        kt.TransformerConfig.from_dict(dict(SMALL, vision=dict(image_size=15)))
    with pytest.raises(ValueError, match="vision.std"):
        kt.VisionConfig(std=[0.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="vision.mean"):
        kt.VisionConfig(mean=[0.5, 0.5])
    with pytest.raises(ValueError, match="vision"):
        ViTBackbone(config=dict(SMALL, vision=None, vocabulary_size=10))
    with pytest.raises(ValueError, match="num_classes"):
        ViTClassifier(config=SMALL, num_classes=0)


def test_overfits_a_small_batch(rng):
    keras.utils.set_random_seed(0)
    model = ViTClassifier.from_preset("vit_tiny_28", num_classes=4)
    x = rng.uniform(0, 255, size=(8, 28, 28, 1)).astype("float32")
    y = np.arange(8) % 4
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    # 150 steps on the one batch: `train_on_batch` gives each step's loss and
    # accuracy as `fit(epochs=150)` does, without fit's per-epoch set-up
    # (on TensorFlow 9 s of CPU instead of 15 s); fit runs below.
    logs = [model.train_on_batch(x, y, return_dict=True) for _ in range(150)]
    assert logs[-1]["loss"] < 0.1 * logs[0]["loss"]
    assert logs[-1]["accuracy"] == 1.0


def test_fit_with_keras_augmentation_layers(rng):
    model = ViTClassifier.from_preset("vit_tiny_28", num_classes=3)
    augment = keras.Sequential(
        [
            keras.layers.RandomFlip("horizontal"),
            keras.layers.RandomTranslation(0.1, 0.1),
        ]
    )
    x = rng.uniform(0, 255, size=(8, 28, 28, 1)).astype("float32")
    augment.build(x.shape)
    x = to_numpy(compiled_call(augment, x, training=True))
    run_fit_test(model, x, np.arange(8) % 3)


def test_saving_round_trip(classifier, images, tmp_path):
    reloaded = run_saving_test(classifier, images, tmp_path)
    assert reloaded.num_classes == 5
    assert type(kt.from_preset(tmp_path / "preset")) is ViTClassifier


def test_dropout_only_in_training(rng):
    model = ViTClassifier(
        config=dict(SMALL, dropout=0.5, attention_dropout=0.5),
        num_classes=3,
        classifier_dropout=0.5,
    )
    randomize_weights(model)  # the head starts at zero
    x = rng.uniform(0, 1, size=(2, 16, 16, 3)).astype("float32")
    assert_close(model(x), model(x), atol=0)
    assert not np.allclose(to_numpy(model(x, training=True)), to_numpy(model(x)))
