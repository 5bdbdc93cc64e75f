"""Hugging Face DeiT conversion: hidden states, pooler output and classifier
logits (the classifier with teacher too) match `transformers` (torch,
float32, eager attention) on tiny random-init models, at the checkpoint's
resolution and at another one (`interpolate_pos_encoding=True`); the
config mapping; export round trips; errors name the problem."""

import json

import keras
import numpy as np
import pytest
from contracts import edited_hf_dir, randomize_weights

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from hf_parity import randomize, record  # noqa: E402

import keras_transformers  # noqa: E402
from keras_transformers import TransformerConfig  # noqa: E402
from keras_transformers.convert import export_hf, hf_preset_data  # noqa: E402
from keras_transformers.models import ViTBackbone, ViTClassifier  # noqa: E402

DEIT = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    image_size=32,
    patch_size=8,
)
# kind -> (HF class, HF config changes, our class)
KINDS = {
    "base": ("DeiTModel", {}, ViTBackbone),
    "classifier": ("DeiTForImageClassification", dict(num_labels=3), ViTClassifier),
    "teacher": (
        "DeiTForImageClassificationWithTeacher",
        dict(num_labels=3),
        ViTClassifier,
    ),
}


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """kind -> (directory, the HF model saved there)."""
    root, out = tmp_path_factory.mktemp("hf_deit"), {}
    for kind, (name, changes, _) in KINDS.items():
        config = transformers.DeiTConfig(
            **{**DEIT, **changes}, attn_implementation="eager"
        )
        model = randomize(getattr(transformers, name)(config))
        model.save_pretrained(root / kind)
        out[kind] = (root / kind, model)
    return out


def _pixels(size=32, seed=1):
    """`[2, 3, size, size]` HF `pixel_values`."""
    shape = (2, 3, size, size)
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def _compare(ours, reference, pixels, case, **kwargs):
    """Our model against an HF DeiT model on the same pixels."""
    with torch.no_grad():
        ref = reference(pixel_values=torch.tensor(pixels), **kwargs)
    out = ours(np.ascontiguousarray(pixels.transpose(0, 2, 3, 1)))
    if isinstance(ours, ViTClassifier):
        return record(
            case + " logits", keras.ops.convert_to_numpy(out), ref.logits.numpy()
        )
    record(
        case + " hidden", keras.ops.convert_to_numpy(out), ref.last_hidden_state.numpy()
    )
    if ours.pooler is not None:
        pooled = keras.ops.convert_to_numpy(ours.pool(out))
        record(case + " pooled", pooled, ref.pooler_output.numpy())


@pytest.mark.parametrize("kind", list(KINDS))
def test_outputs_match(hf, kind):
    path, reference = hf[kind]
    model = keras_transformers.from_preset(path)
    assert type(model) is KINDS[kind][2]
    assert model.config.vision.distillation_token
    if kind == "teacher":
        assert model.distillation_classifier is not None
    _compare(model, reference, _pixels(), kind)


def test_other_image_size(hf):
    """HF at 48x48 with `interpolate_pos_encoding=True` == ours called on
    48x48 images == ours loaded at `image_size=48` (both prefix tokens'
    positions kept)."""
    path, reference = hf["teacher"]
    pixels = _pixels(48, seed=2)
    _compare(
        keras_transformers.from_preset(path),
        reference,
        pixels,
        "teacher at 48",
        interpolate_pos_encoding=True,
    )
    resized = ViTClassifier.from_preset(path, image_size=48)
    table = resized.backbone.patch_embedding.position_embeddings
    assert tuple(table.shape) == (2 + 6 * 6, 32)
    _compare(resized, reference, pixels, "loaded at 48", interpolate_pos_encoding=True)


def test_teacher_checkpoint_as_single_head_classifier(hf):
    """`distillation_head=False` on a teacher checkpoint: the backbone
    loads, the head (HF's has two) is new."""
    path, reference = hf["teacher"]
    with pytest.warns(UserWarning, match="classifier"):
        model = ViTClassifier.from_preset(path, distillation_head=False)
    assert model.distillation_classifier is None
    hidden = keras.ops.convert_to_numpy(
        model.backbone(_pixels().transpose(0, 2, 3, 1).copy())
    )
    with torch.no_grad():
        ref = reference.deit(pixel_values=torch.tensor(_pixels())).last_hidden_state
    record("teacher backbone", hidden, ref.numpy())


def test_config_mapping(hf):
    data = hf_preset_data(hf["teacher"][0])
    assert (data["family"], data["class_name"]) == ("vit", "ViTClassifier")
    assert data["task"] == {
        "num_classes": 3,
        "classifier_dropout": 0.0,
        "distillation_head": True,
    }
    config = TransformerConfig.from_dict(data["config"])
    assert (config.norm_epsilon, config.pooler, config.layer_scale) == (
        1e-12,
        False,
        None,
    )
    vision = config.vision
    assert (vision.image_size, vision.patch_size, vision.num_prefix_tokens) == (
        32,
        8,
        2,
    )
    assert (vision.pooling, vision.distillation_token) == ("token", True)
    assert "distillation_head" not in hf_preset_data(hf["classifier"][0])["task"]
    assert keras_transformers.load_config(hf["base"][0]).pooler


def _config(**fields):
    """A tiny DeiT config: 32x32 RGB, 8x8 patches, width 32, 4 heads."""
    vision = dict(image_size=32, patch_size=8, num_channels=3, rescale=1.0)
    vision.update({"distillation_token": True, **fields.pop("vision", {})})
    return keras_transformers.load_config("vit_tiny_28").replace(
        num_heads=4, vision=vision, **fields
    )


NORMALISED = dict(rescale=1 / 255, mean=[0.485, 0.456, 0.406], std=[0.2, 0.3, 0.25])


@pytest.mark.parametrize(
    "cls, fields, task, name",
    [
        (ViTBackbone, dict(pooler=True), {}, "DeiTModel"),
        (ViTClassifier, {}, {}, "DeiTForImageClassification"),
        (
            ViTClassifier,
            dict(vision=NORMALISED),
            dict(distillation_head=True),
            "DeiTForImageClassificationWithTeacher",
        ),
    ],
)
def test_export_round_trip(tmp_path, cls, fields, task, name):
    head = dict(num_classes=3, **task) if cls is ViTClassifier else {}
    model = randomize_weights(cls(config=_config(**fields), **head))
    export_hf(model, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert (saved["model_type"], saved["architectures"]) == ("deit", [name])
    auto = "AutoModelForImageClassification" if cls is ViTClassifier else "AutoModel"
    reference = (
        getattr(transformers, auto)
        .from_pretrained(tmp_path, attn_implementation="eager", dtype=torch.float32)
        .eval()
    )
    assert type(reference).__name__ == name
    raw = np.random.default_rng(4).integers(0, 256, (2, 32, 32, 3)).astype("float32")
    if model.config.vision.mean is not None:  # HF's processor from the written file
        processor = transformers.AutoImageProcessor.from_pretrained(tmp_path)
        pixels = processor(list(raw.astype("uint8")), return_tensors="np")
        pixels = pixels["pixel_values"].astype("float32")
        ours = keras.ops.convert_to_numpy(model(raw))
        with torch.no_grad():
            theirs = reference(pixel_values=torch.tensor(pixels)).logits
        record(f"export {name} raw pixels", ours, theirs.numpy())
    else:
        _compare(model, reference, _pixels(), f"export {name}")
    back = keras_transformers.from_preset(tmp_path)
    assert type(back) is cls and back.config == model.config
    assert getattr(back, "distillation_head", False) == bool(task)


def test_errors_name_the_problem(hf, tmp_path):
    path = edited_hf_dir(hf["base"][0], tmp_path / "bias", qkv_bias=False)
    with pytest.raises(ValueError, match="DeiT config has qkv_bias=False"):
        keras_transformers.from_preset(path)
    path = edited_hf_dir(hf["base"][0], tmp_path / "act", hidden_act="gelu_10")
    with pytest.raises(ValueError, match="gelu_10"):
        keras_transformers.from_preset(path)
    path = edited_hf_dir(hf["base"][0], tmp_path / "pool", pooler_act="relu")
    with pytest.raises(ValueError, match="pooler_act"):
        keras_transformers.from_preset(path)
    vit_dir = tmp_path / "vit"  # ViT weights (no distillation token) as "deit"
    transformers.ViTModel(transformers.ViTConfig(**DEIT)).save_pretrained(vit_dir)
    path = edited_hf_dir(vit_dir, tmp_path / "wrong", model_type="deit")
    with pytest.raises(ValueError, match="does not look like a deit checkpoint"):
        keras_transformers.from_preset(path)


def test_options_that_need_the_distillation_token(tmp_path):
    plain = _config(vision=dict(distillation_token=False))
    with pytest.raises(ValueError, match="distillation_head=True"):
        ViTClassifier(config=plain, distillation_head=True)
    with pytest.raises(ValueError, match="class_token"):
        _config(vision=dict(pooling="mean", class_token=False))
    model = ViTBackbone(config=plain)
    with pytest.raises(ValueError, match="distillation_token"):
        export_hf(model, tmp_path / "deit", model_type="deit")
    with pytest.raises(ValueError, match="model_type='bert' is not a VIT-family"):
        export_hf(model, tmp_path / "bert", model_type="bert")
    assert not (tmp_path / "deit").exists() or not list((tmp_path / "deit").iterdir())
