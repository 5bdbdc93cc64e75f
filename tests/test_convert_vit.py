"""Hugging Face ViT conversion: hidden states, pooler output and classifier
logits match `transformers` (torch, float32, eager attention) on tiny
random-init models, at the checkpoint's resolution and at another one
(`interpolate_pos_encoding=True`); `preprocessor_config.json` becomes the
model's own input normalisation; export round-trips; errors name the
problem."""

import contextlib
import json
import shutil

import keras
import numpy as np
import pytest
from contracts import edited_hf_dir, randomize_weights

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from hf_parity import randomize  # noqa: E402

import keras_transformers  # noqa: E402
from keras_transformers import TransformerConfig  # noqa: E402
from keras_transformers.convert import export_hf, hf_preset_data, vit  # noqa: E402
from keras_transformers.models import ViTBackbone, ViTClassifier  # noqa: E402

TOLERANCE = 1e-5
VIT = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    image_size=16,
    patch_size=4,
)
# kind -> (HF class, HF config changes, HF constructor arguments, our class)
KINDS = {
    "base": ("ViTModel", {}, {}, ViTBackbone),
    "classifier": ("ViTForImageClassification", dict(num_labels=3), {}, ViTClassifier),
    "grey": (  # no pooler, a mask token we do not use
        "ViTModel",
        dict(num_channels=1),
        dict(add_pooling_layer=False, use_mask_token=True),
        ViTBackbone,
    ),
}
AUTO = {
    "ViTModel": "AutoModel",
    "ViTForImageClassification": "AutoModelForImageClassification",
}


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """kind -> (directory, the HF model saved there)."""
    root, out = tmp_path_factory.mktemp("hf_vit"), {}
    for kind, (name, changes, arguments, _) in KINDS.items():
        config = transformers.ViTConfig(
            **{**VIT, **changes}, attn_implementation="eager"
        )
        model = randomize(getattr(transformers, name)(config, **arguments))
        model.save_pretrained(root / kind)
        out[kind] = (root / kind, model)
    return out


def _pixels(channels=3, height=16, width=16, seed=1):
    """`[2, C, H, W]` HF `pixel_values`."""
    shape = (2, channels, height, width)
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def _run_hf(model, pixels, **kwargs):
    with torch.no_grad():
        return model(pixel_values=torch.tensor(pixels), **kwargs)


def _run_ours(model, pixels):
    """Our outputs on channels-first `pixels`: logits for a classifier,
    `(hidden states, pooled or None)` for a backbone."""
    out = model(np.ascontiguousarray(pixels.transpose(0, 2, 3, 1)))
    if isinstance(model, ViTClassifier):
        return keras.ops.convert_to_numpy(out)
    pooled = model.pool(out) if model.pooler is not None else None
    return tuple(
        None if x is None else keras.ops.convert_to_numpy(x) for x in (out, pooled)
    )


def _check(case, ours, theirs):
    diff = float(np.abs(np.asarray(ours) - np.asarray(theirs)).max())
    print(f"[{keras.config.backend()}] {case}: max |diff| = {diff:.2e}")
    assert diff <= TOLERANCE, f"{case}: max |diff| {diff} > {TOLERANCE}"


def _compare(ours, reference, pixels, case, ours_pixels=None, **kwargs):
    """Our model against an HF `ViTModel` / `ViTForImageClassification`."""
    ref = _run_hf(reference, pixels, **kwargs)
    out = _run_ours(ours, pixels if ours_pixels is None else ours_pixels)
    if isinstance(ours, ViTClassifier):
        return _check(case + " logits", out, ref.logits)
    hidden, pooled = out
    _check(case + " hidden", hidden, ref.last_hidden_state)
    if pooled is not None:
        _check(case + " pooled", pooled, ref.pooler_output)


@pytest.mark.parametrize("kind", list(KINDS))
def test_outputs_match(hf, kind):
    path, reference = hf[kind]
    unused = pytest.warns(UserWarning, match="mask_token")
    with unused if kind == "grey" else contextlib.nullcontext():
        model = keras_transformers.from_preset(path)
    assert type(model) is KINDS[kind][3]
    assert getattr(model, "pooler", None) is None or kind == "base"
    channels = reference.config.num_channels
    _compare(model, reference, _pixels(channels), kind)


def test_other_classes(hf):
    classifier_dir, classifier = hf["classifier"]
    with pytest.warns(UserWarning, match="classifier.weight"):  # head dropped
        backbone = ViTBackbone.from_preset(classifier_dir)  # a classifier's encoder
    assert backbone.pooler is None
    _compare(backbone, classifier.vit, _pixels(), "classifier's backbone")
    with pytest.warns(UserWarning, match="classifier"):  # other width: new head
        assert ViTClassifier.from_preset(classifier_dir, num_classes=5).num_classes == 5
    base_dir, base = hf["base"]
    with pytest.warns(UserWarning, match="pooler.dense"):  # HF's classifier: no pooler
        with pytest.warns(UserWarning, match="classifier"):
            model = ViTClassifier.from_preset(base_dir, num_classes=4)
    assert model.backbone.pooler is None
    hidden, _ = _run_ours(model.backbone, _pixels())
    _check(
        "base as classifier hidden", hidden, _run_hf(base, _pixels()).last_hidden_state
    )


def test_interpolate_pos_encoding(hf):
    """HF at 24x24 with `interpolate_pos_encoding=True` == ours loaded at
    `image_size=24` == ours at 16 called on 24x24 images."""
    path, reference = hf["classifier"]
    pixels = _pixels(height=24, width=24, seed=2)
    resized = ViTClassifier.from_preset(path, image_size=24)
    table = resized.backbone.patch_embedding.position_embeddings
    assert tuple(table.shape) == (1 + 6 * 6, 32)
    _compare(resized, reference, pixels, "loaded at 24", interpolate_pos_encoding=True)
    original = ViTClassifier.from_preset(path)
    _compare(original, reference, pixels, "called at 24", interpolate_pos_encoding=True)


def _processor(**kwargs):
    cls = getattr(transformers, "ViTImageProcessorPil", transformers.ViTImageProcessor)
    return cls(**kwargs)


def _raw_images(channels=3, size=16):
    """`[2, size, size, C]` 0..255 pixels."""
    shape = (2, size, size, channels)
    return np.random.default_rng(4).integers(0, 256, shape).astype("uint8")


def _processed(processor, raw):
    """HF's `pixel_values` `[B, C, H, W]` of raw channels-last images."""
    return processor(list(raw), return_tensors="np")["pixel_values"].astype("float32")


def test_preprocessor_normalisation(hf, tmp_path):
    """Ours on raw pixels == HF on its image processor's `pixel_values`."""
    path = tmp_path / "with_processor"
    shutil.copytree(hf["base"][0], path)
    mean, std = [0.4, 0.5, 0.6], [0.2, 0.3, 0.25]
    processor = _processor(
        image_mean=mean, image_std=std, size=dict(height=16, width=16)
    )
    processor.save_pretrained(path)
    model = ViTBackbone.from_preset(path)
    vision = model.config.vision
    assert (vision.rescale, vision.mean, vision.std) == (
        1 / 255,
        tuple(mean),
        tuple(std),
    )
    assert keras_transformers.load_config(path).vision == vision
    raw = _raw_images()
    pixels = _processed(processor, raw)
    ours = raw.transpose(0, 3, 1, 2).astype("float32")  # raw pixels, channels first
    _compare(model, hf["base"][1], pixels, "raw pixels", ours_pixels=ours)
    assert ViTBackbone.from_preset(hf["base"][0]).config.vision.mean is None


def test_config_mapping(hf):
    data = hf_preset_data(hf["classifier"][0])
    assert (data["family"], data["class_name"]) == ("vit", "ViTClassifier")
    assert data["task"] == {"num_classes": 3, "classifier_dropout": 0.0}
    config = TransformerConfig.from_dict(data["config"])
    expected = dict(stacks="encoder", norm_position="pre", final_norm=True)
    expected.update(pooler=False, norm_epsilon=1e-12, vocabulary_size=0)
    assert {key: getattr(config, key) for key in expected} == expected
    vision = dict(image_size=16, patch_size=4, num_channels=3, pooling="token")
    vision.update(rescale=1.0, mean=None, std=None)
    assert {key: getattr(config.vision, key) for key in vision} == vision
    # Without weights a ViTModel config has HF's default pooler.
    assert keras_transformers.load_config(hf["grey"][0]).pooler


def _config(**fields):
    """A tiny ViT config: 16x16 RGB, 4x4 patches, width 32, 4 heads."""
    vision = {"image_size": 16, "patch_size": 4, "num_channels": 3, "rescale": 1.0}
    vision.update(fields.pop("vision", {}))
    return keras_transformers.load_config("vit_tiny_28").replace(
        num_heads=4, vision=vision, **fields
    )


def _random_keras(cls, **fields):
    task = {"num_classes": 3} if cls is ViTClassifier else {}
    return randomize_weights(cls(config=_config(**fields), **task))


NORMALISED = dict(rescale=1 / 255, mean=[0.4, 0.5, 0.6], std=[0.2, 0.3, 0.25])


@pytest.mark.parametrize(
    "cls, fields",
    [
        (ViTBackbone, dict(pooler=True)),
        (ViTBackbone, dict(vision=dict(num_channels=1), activation="gelu_approximate")),
        (ViTClassifier, dict(vision=NORMALISED)),
    ],
)
def test_export_round_trip(tmp_path, cls, fields):
    model = _random_keras(cls, **fields)
    export_hf(model, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    name = "ViTForImageClassification" if cls is ViTClassifier else "ViTModel"
    assert saved["architectures"] == [name]
    normalised = model.config.vision.mean is not None
    assert (tmp_path / "preprocessor_config.json").exists() == normalised
    reference = (
        getattr(transformers, AUTO[name])
        .from_pretrained(tmp_path, attn_implementation="eager", dtype=torch.float32)
        .eval()
    )
    channels = model.config.vision.num_channels
    if normalised:  # HF's processor from the written file, ours on raw pixels
        raw = _raw_images(channels)
        processor = transformers.AutoImageProcessor.from_pretrained(tmp_path)
        pixels, ours = _processed(processor, raw), raw.transpose(0, 3, 1, 2)
        ours = ours.astype("float32")
    else:
        pixels = ours = _pixels(channels)
    _compare(model, reference, pixels, f"export {fields}", ours_pixels=ours)
    back = keras_transformers.from_preset(tmp_path)
    assert type(back) is cls and back.config == model.config
    for a, b in zip(_run_ours(model, ours), _run_ours(back, ours)):
        if a is not None:
            np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(vision=dict(pooling="mean")), "pooling"),
        (dict(vision=dict(pooling="mean", class_token=False)), "class_token"),
        (dict(norm_type="rms"), "norm_type"),
        (dict(norm_position="post"), "norm_position"),
        (dict(gated_feed_forward=True), "gated_feed_forward"),
        (dict(num_kv_heads=2), "num_kv_heads"),
        (dict(head_dim=16), "head_dim"),
        (dict(use_bias=False), "use_bias"),
    ],
)
def test_export_rejects_unrepresentable(fields, match):
    with pytest.raises(ValueError, match=f"cannot be exported as .*{match}'"):
        vit.hf_config(_config(**fields))


@pytest.mark.parametrize(
    "cls, fields, match",
    [
        (ViTBackbone, dict(norm_type="rms"), "norm_type"),
        (ViTBackbone, dict(vision=dict(pooling="mean")), "pooling"),
        (ViTClassifier, dict(pooler=True), "has one \\(config.pooler=True\\)"),
    ],
)
def test_export_hf_writes_nothing_it_cannot_express(tmp_path, cls, fields, match):
    with pytest.raises(ValueError, match=match):
        export_hf(_random_keras(cls, **fields), tmp_path)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(qkv_bias=False), "qkv_bias=False"),
        (dict(hidden_act="gelu_10"), "gelu_10"),
        (dict(image_size=[16, 24]), "non-square"),
        (dict(num_hidden_layers=3), "encoder.layer.2"),
        (dict(num_channels=1), "projection.weight"),
        (dict(pooler_act="relu"), "pooler_act"),
    ],
)
def test_errors_name_the_problem(hf, tmp_path, changes, match):
    path = edited_hf_dir(hf["base"][0], tmp_path / "edited", **changes)
    with pytest.raises(ValueError, match=match):
        keras_transformers.from_preset(path)
