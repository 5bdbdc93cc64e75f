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


def _compare(ours, reference, shape, case):
    pixels = np.random.default_rng(1).standard_normal((2, 3, *shape)).astype("float32")
    with torch.no_grad():
        ref = reference(pixel_values=torch.tensor(pixels))
    out = ours(np.ascontiguousarray(pixels.transpose(0, 2, 3, 1)))
    record(
        case + " hidden", keras.ops.convert_to_numpy(out), ref.last_hidden_state.numpy()
    )
    pooled = keras.ops.convert_to_numpy(ours.pool(out))
    record(case + " pooled", pooled, ref.pooler_output.numpy())


@pytest.mark.parametrize("kind", list(KINDS))
def test_outputs_match(hf, kind):
    """At the config's 4x4 grid and at a non-square 3x5 one."""
    path, reference = hf[kind]
    model = keras_transformers.from_preset(path)
    assert type(model) is ViTBackbone
    for shape in ((32, 32), (24, 40)):
        _compare(model, reference, shape, f"{kind} at {shape}")


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


@pytest.mark.parametrize("kind", list(KINDS))
def test_export_round_trip(hf, kind, tmp_path):
    """Our export loads back into transformers with the same outputs."""
    model = keras_transformers.from_preset(hf[kind][0])
    export_hf(model, tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["model_type"] == "dinov3_vit"
    back = transformers.DINOv3ViTModel.from_pretrained(
        tmp_path, attn_implementation="eager"
    ).eval()
    _compare(model, back, (24, 40), f"{kind} exported")


def test_errors(hf):
    edited = dict(json.loads((hf["mlp"][0] / "config.json").read_text()))
    with pytest.raises(ValueError, match="value_bias=False"):
        dinov3.config_from_hf({**edited, "value_bias": False})
    config = keras_transformers.load_config(hf["mlp"][0])
    with pytest.raises(ValueError, match="head_dim"):
        config.replace(num_heads=4, hidden_dim=24)
    with pytest.raises(ValueError, match="position_embedding"):
        dinov3.hf_config(config.replace(position_embedding="learned"))
