"""Hugging Face DINOv3 ViT conversion: hidden states and the pooled class
token match `transformers` (torch, float32, eager attention) on tiny
random-init models with register tokens, 2-D rotary patch positions, no key
bias, LayerScale, the MLP and the SwiGLU feed-forward, at the config's image
size and at a non-square one; parameter counts; export round trips; errors
name the problem."""

import json

import keras
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from hf_parity import randomize, record  # noqa: E402

import keras_transformers  # noqa: E402
from keras_transformers import TransformerConfig  # noqa: E402
from keras_transformers.convert import dinov3, export_hf, hf_preset_data  # noqa: E402
from keras_transformers.layers.patch_rotary import PatchRotaryAttention  # noqa: E402
from keras_transformers.models import ViTBackbone  # noqa: E402

TINY = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    num_register_tokens=2,
    image_size=32,
    patch_size=8,
)
KINDS = {"mlp": {}, "swiglu": dict(use_gated_mlp=True, hidden_act="silu")}


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """kind -> (directory, the HF model saved there)."""
    root, out = tmp_path_factory.mktemp("hf_dinov3"), {}
    for kind, changes in KINDS.items():
        config = transformers.DINOv3ViTConfig(
            **{**TINY, **changes}, attn_implementation="eager"
        )
        model = randomize(transformers.DINOv3ViTModel(config))
        model.save_pretrained(root / kind)
        out[kind] = (root / kind, model)
    return out


def _pixels(shape):
    rng = np.random.default_rng(1)
    return rng.standard_normal((2, 3, *shape)).astype("float32")


def _compare(ours, reference, pixels, case):
    """Our hidden states and pooled class token (`ours`: a backbone, or its
    `(hidden, pooled)` outputs) against an HF model's on `pixels`."""
    with torch.no_grad():
        ref = reference(pixel_values=torch.tensor(pixels))
    if isinstance(ours, ViTBackbone):
        hidden = ours(np.ascontiguousarray(pixels.transpose(0, 2, 3, 1)))
        ours = [keras.ops.convert_to_numpy(x) for x in (hidden, ours.pool(hidden))]
    record(case + " hidden", ours[0], ref.last_hidden_state.numpy())
    record(case + " pooled", ours[1], ref.pooler_output.numpy())
    return ours


@pytest.mark.parametrize("kind", list(KINDS))
def test_outputs_and_export_match(hf, kind, tmp_path):
    """At the config's 4x4 grid and at a non-square 3x5 one; our export
    loads back into transformers with the same outputs."""
    path, reference = hf[kind]
    model = keras_transformers.from_preset(path)
    assert type(model) is ViTBackbone
    _compare(model, reference, _pixels((32, 32)), f"{kind} at 32x32")
    ours = _compare(model, reference, _pixels((24, 40)), f"{kind} at 24x40")
    export_hf(model, tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["model_type"] == "dinov3_vit"
    back = transformers.DINOv3ViTModel.from_pretrained(
        tmp_path, attn_implementation="eager"
    ).eval()
    _compare(ours, back, _pixels((24, 40)), f"{kind} exported")


def test_config_and_params(hf):
    path, reference = hf["mlp"]
    data = hf_preset_data(path)
    assert (data["family"], data["class_name"]) == ("vit", "ViTBackbone")
    config = TransformerConfig.from_dict(data["config"])
    expected = dict(
        position_embedding="rotary",
        rope_max_wavelength=100.0,
        key_bias=False,
        layer_scale=1.0,
        norm_epsilon=1e-5,
        pooler=False,
    )
    assert {key: getattr(config, key) for key in expected} == expected
    assert (config.vision.register_tokens, config.vision.num_prefix_tokens) == (2, 3)
    hf_count = sum(p.numel() for p in reference.parameters())  # with mask_token
    model = keras_transformers.from_preset(path)
    assert model.count_params() == config.num_params() == hf_count - 32
    swiglu = keras_transformers.load_config(hf["swiglu"][0])
    assert (swiglu.gated_feed_forward, swiglu.activation) == (True, "silu")


def test_errors(hf):
    edited = dict(json.loads((hf["mlp"][0] / "config.json").read_text()))
    with pytest.raises(ValueError, match="value_bias=False"):
        dinov3.config_from_hf({**edited, "value_bias": False})
    config = keras_transformers.load_config(hf["mlp"][0])
    with pytest.raises(ValueError, match="head_dim"):
        config.replace(num_heads=4, hidden_dim=24)
    with pytest.raises(ValueError, match="position_embedding"):
        dinov3.hf_config(config.replace(position_embedding="learned"))
    layer = PatchRotaryAttention(num_heads=2, head_dim=8, rope_max_wavelength=100.0)
    with pytest.raises(ValueError, match="patch_coordinates"):
        layer(np.ones((1, 7, 16), "float32"))  # no positions
