"""Hugging Face DINOv2 conversion: hidden states and classifier logits
(class token + patch mean head) match `transformers` (torch, float32,
eager attention) on tiny random-init models with LayerScale, the MLP and
the SwiGLU feed-forward, at the checkpoint's resolution and at other ones
(HF always resizes its position table to the input); the config mapping;
export round trips; errors name the problem."""

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
from keras_transformers.convert import dinov2, export_hf, hf_preset_data  # noqa: E402
from keras_transformers.layers.patches import resize_grid  # noqa: E402
from keras_transformers.models import ViTBackbone, ViTClassifier  # noqa: E402

# A 7x7 native grid (image 56, patch 8), like the hub's 37x37 (518 / 14).
DINO = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    mlp_ratio=4,
    image_size=56,
    patch_size=8,
)
# kind -> (HF class, HF config changes, our class)
KINDS = {
    "base": ("Dinov2Model", {}, ViTBackbone),
    "classifier": ("Dinov2ForImageClassification", dict(num_labels=3), ViTClassifier),
    "swiglu": ("Dinov2Model", dict(use_swiglu_ffn=True), ViTBackbone),
}


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """kind -> (directory, the HF model saved there)."""
    root, out = tmp_path_factory.mktemp("hf_dinov2"), {}
    for kind, (name, changes, _) in KINDS.items():
        config = transformers.Dinov2Config(
            **{**DINO, **changes}, attn_implementation="eager"
        )
        model = randomize(getattr(transformers, name)(config))
        model.save_pretrained(root / kind)
        out[kind] = (root / kind, model)
    return out


def _pixels(size=56, seed=1):
    shape = (2, 3, size, size)
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def _compare(ours, reference, pixels, case):
    with torch.no_grad():
        ref = reference(pixel_values=torch.tensor(pixels))
    out = keras.ops.convert_to_numpy(
        ours(np.ascontiguousarray(pixels.transpose(0, 2, 3, 1)))
    )
    if isinstance(ours, ViTClassifier):
        return record(case + " logits", out, ref.logits.numpy())
    record(case + " hidden", out, ref.last_hidden_state.numpy())
    pooled = keras.ops.convert_to_numpy(ours.pool(keras.ops.convert_to_tensor(out)))
    width = ours.config.hidden_dim  # pooler_output: the class token's state
    record(case + " class token", pooled[:, :width], ref.pooler_output.numpy())


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("size", [56, 32, 80])
def test_outputs_match(hf, kind, size):
    """At the native 7x7 grid and at 4x4 / 10x10, where HF interpolates its
    positions (bicubic, align_corners=False) and so do we."""
    path, reference = hf[kind]
    model = keras_transformers.from_preset(path)
    assert type(model) is KINDS[kind][2]
    _compare(model, reference, _pixels(size), f"{kind} at {size}")


def test_position_interpolation_matches_hf(hf):
    """Our resized table against HF's `interpolate_pos_encoding` itself, the
    224-from-518 case scaled down (7x7 -> 4x4 and 7x7 -> 12x12); and a model
    loaded at `image_size=32` equals HF at 32."""
    path, reference = hf["base"]
    embeddings = reference.embeddings
    table = embeddings.position_embeddings.detach().numpy()[0]
    for side in (4, 12):
        dummy = torch.zeros(1, 1 + side * side, 32)
        with torch.no_grad():
            theirs = embeddings.interpolate_pos_encoding(dummy, 8 * side, 8 * side)
        ours = resize_grid(table, (7, 7), (side, side), 1)
        record(f"positions 7x7 -> {side}x{side}", ours[None], theirs.numpy())
    # The hub's case itself: a 37x37 table (518 / 14) at 224 x 224 (16x16).
    config = transformers.Dinov2Config(image_size=518, patch_size=14, hidden_size=8)
    hub = transformers.models.dinov2.modeling_dinov2.Dinov2Embeddings(config)
    table = np.random.default_rng(3).standard_normal((1 + 37 * 37, 8))
    with torch.no_grad():
        hub.position_embeddings.copy_(torch.tensor(table[None], dtype=torch.float32))
        theirs = hub.interpolate_pos_encoding(torch.zeros(1, 257, 8), 224, 224)
    ours = resize_grid(table.astype("float32"), (37, 37), (16, 16), 1)
    record("positions 37x37 -> 16x16", ours[None], theirs.numpy())
    resized = ViTBackbone.from_preset(path, image_size=32)
    assert tuple(resized.patch_embedding.position_embeddings.shape) == (17, 32)
    _compare(resized, reference, _pixels(32), "loaded at 32")


def test_config_mapping(hf):
    data = hf_preset_data(hf["classifier"][0])
    assert (data["family"], data["class_name"]) == ("vit", "ViTClassifier")
    assert data["task"] == {"num_classes": 3, "classifier_dropout": 0.0}
    config = TransformerConfig.from_dict(data["config"])
    expected = dict(norm_epsilon=1e-6, layer_scale=1.0, pooler=False)
    expected.update(intermediate_dim=128, gated_feed_forward=False, activation="gelu")
    assert {key: getattr(config, key) for key in expected} == expected
    assert (config.vision.pooling, config.vision.patch_size) == ("token_and_mean", 8)
    swiglu = keras_transformers.load_config(hf["swiglu"][0])
    assert (swiglu.intermediate_dim, swiglu.gated_feed_forward) == (88, True)
    assert swiglu.activation == "silu"
    assert dinov2.swiglu_width(1536, 4) == 4096  # ViT-g/14's
    edited = dict(json.loads((hf["base"][0] / "config.json").read_text()))
    edited.update(layerscale_value=1e-5, drop_path_rate=0.4)  # drop path: ignored
    assert dinov2.config_from_hf(edited)["layer_scale"] == 1e-5


def test_classifier_head_and_params(hf):
    model = keras_transformers.from_preset(hf["classifier"][0])
    assert tuple(model.classifier.kernel.shape) == (64, 3)  # [2 * D, classes]
    from keras_transformers.config.param_count import classifier_params

    config = model.config
    assert model.count_params() == config.num_params() + classifier_params(config, 3)
    reference = hf["classifier"][1]  # HF also holds the mask token
    hf_count = sum(p.numel() for p in reference.parameters())
    assert model.count_params() == hf_count - config.hidden_dim


def test_preprocessor_defaults(hf, tmp_path):
    """BitImageProcessor's keys; CLIP's mean and std where absent."""
    path = edited_hf_dir(hf["base"][0], tmp_path / "processed")
    (path / "preprocessor_config.json").write_text(json.dumps({"do_rescale": True}))
    vision = keras_transformers.load_config(path).vision
    assert vision.rescale == 1 / 255
    assert vision.mean == tuple(dinov2.PROCESSOR_DEFAULTS["image_mean"])


def _config(**fields):
    """A tiny DINOv2 config: 32x32 RGB, 8x8 patches, width 32, 4 heads."""
    vision = dict(image_size=32, patch_size=8, num_channels=3, rescale=1.0)
    vision.update({"pooling": "token_and_mean", **fields.pop("vision", {})})
    fields = {"layer_scale": 1.0, "norm_epsilon": 1e-6, **fields}
    return keras_transformers.load_config("vit_tiny_28").replace(
        num_heads=4, vision=vision, **fields
    )


SWIGLU = dict(gated_feed_forward=True, activation="silu", intermediate_dim=88)


@pytest.mark.parametrize(
    "cls, fields",
    [(ViTClassifier, {}), (ViTBackbone, SWIGLU)],
)
def test_export_round_trip(tmp_path, cls, fields):
    head = dict(num_classes=3) if cls is ViTClassifier else {}
    model = randomize_weights(cls(config=_config(**fields), **head))
    export_hf(model, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    name = "Dinov2ForImageClassification" if head else "Dinov2Model"
    assert (saved["model_type"], saved["architectures"]) == ("dinov2", [name])
    assert saved["use_swiglu_ffn"] == bool(fields)
    auto = "AutoModelForImageClassification" if head else "AutoModel"
    reference = (
        getattr(transformers, auto)
        .from_pretrained(tmp_path, attn_implementation="eager", dtype=torch.float32)
        .eval()
    )
    assert type(reference).__name__ == name
    mask = reference.base_model.embeddings.mask_token.detach().numpy()
    assert not mask.any()  # written as zeros
    _compare(model, reference, _pixels(32), f"export {name}")
    back = keras_transformers.from_preset(tmp_path)
    assert type(back) is cls and back.config == model.config


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(vision=dict(pooling="token")), "pooling"),
        (dict(intermediate_dim=48), "mlp_ratio"),
        (dict(gated_feed_forward=True), "activation"),
        (dict(layer_scale=None), "layer_scale"),
        (dict(norm_type="rms"), "norm_type"),
    ],
)
def test_export_rejects_unrepresentable(fields, match):
    with pytest.raises(ValueError, match=match):
        dinov2.hf_config(_config(**fields))


def test_errors_name_the_problem(hf, tmp_path):
    base = hf["base"][0]
    path = edited_hf_dir(base, tmp_path / "bias", qkv_bias=False)
    with pytest.raises(ValueError, match="DINOv2 config has qkv_bias=False"):
        keras_transformers.from_preset(path)
    path = edited_hf_dir(base, tmp_path / "square", image_size=[56, 64])
    with pytest.raises(ValueError, match="non-square"):
        keras_transformers.from_preset(path)
    path = edited_hf_dir(base, tmp_path / "swiglu", use_swiglu_ffn=True)
    with pytest.raises(ValueError, match="mlp.weights_"):  # fc1 / fc2 saved
        keras_transformers.from_preset(path)
    with pytest.raises(ValueError, match="pooler"):
        ViTBackbone(config=_config(pooler=True))
