"""Rotary scalings (`linear`, `llama3`, `yarn`, `longrope`) give the
inverse frequencies, attention factors and cos/sin of transformers' rotary
embedding, at positions on both sides of each scaling's threshold."""

import numpy as np
import pytest

from keras_transformers.layers import RotaryEmbedding
from keras_transformers.rotary_scaling import rotary_frequencies
from tests.contracts import to_numpy

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

HEAD, THETA, MAX_POSITION = 32, 10000.0, 128
SCALINGS = {
    "linear": dict(rope_type="linear", factor=4.0),
    "llama3": dict(
        rope_type="llama3",
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=32,
    ),
    "yarn": dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=32),
    "yarn_mscale": dict(
        rope_type="yarn",
        factor=4.0,
        original_max_position_embeddings=32,
        mscale=0.707,
        mscale_all_dim=1.0,
        beta_fast=16,
        truncate=False,
    ),
    "longrope": dict(
        rope_type="longrope",
        short_factor=np.linspace(1.0, 2.0, HEAD // 2).tolist(),
        long_factor=np.linspace(1.0, 8.0, HEAD // 2).tolist(),
        original_max_position_embeddings=32,
    ),
}


def _hf_rotary(scaling):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = LlamaConfig(
        hidden_size=HEAD * 4,
        num_attention_heads=4,
        head_dim=HEAD,
        max_position_embeddings=MAX_POSITION,
        rope_parameters={"rope_theta": THETA, **scaling},
    )
    return config, LlamaRotaryEmbedding(config)


@pytest.mark.parametrize("name", list(SCALINGS))
def test_frequencies_equal_transformers(name):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = SCALINGS[name]
    config, _ = _hf_rotary(scaling)
    init = ROPE_INIT_FUNCTIONS[scaling["rope_type"]]
    for long in (False, True) if name == "longrope" else (False,):
        expected, factor = init(config, "cpu", seq_len=33 if long else None)
        inverse, ours = rotary_frequencies(HEAD, THETA, scaling, MAX_POSITION, long)
        np.testing.assert_allclose(inverse, expected.numpy(), rtol=1e-6)
        assert ours == pytest.approx(factor)


@pytest.mark.parametrize("name", list(SCALINGS))
@pytest.mark.parametrize("length", [24, 100])  # within and past the original 32
def test_cos_sin_equal_transformers(name, length):
    scaling = SCALINGS[name]
    _, hf = _hf_rotary(scaling)
    positions = np.arange(length)[None]
    x = torch.zeros(1, length, HEAD)
    cos, sin = hf(x, torch.tensor(positions))
    layer = RotaryEmbedding(THETA, scaling=scaling, max_position=MAX_POSITION)
    ours_cos, ours_sin = layer.cos_sin(positions.astype("int32"), HEAD)
    # Angles reach 100 rad, where one float32 step is 7.6e-6.
    np.testing.assert_allclose(to_numpy(ours_cos)[:, :, 0], cos.numpy(), atol=1e-5)
    np.testing.assert_allclose(to_numpy(ours_sin)[:, :, 0], sin.numpy(), atol=1e-5)


def test_config_round_trip_and_clear_errors():
    layer = RotaryEmbedding(THETA, scaling=SCALINGS["yarn"], max_position=MAX_POSITION)
    again = RotaryEmbedding.from_config(layer.get_config())
    assert again.scaling == SCALINGS["yarn"] and again.max_position == MAX_POSITION
    with pytest.raises(ValueError, match="'dynamic2' is not supported.*llama3"):
        RotaryEmbedding(scaling={"rope_type": "dynamic2"})
    with pytest.raises(ValueError, match="needs low_freq_factor"):
        rotary_frequencies(HEAD, THETA, {"rope_type": "llama3", "factor": 8.0})
    with pytest.raises(ValueError, match="3 entries.*needs 16"):
        bad = dict(SCALINGS["longrope"], short_factor=[1.0] * 3)
        rotary_frequencies(HEAD, THETA, bad, MAX_POSITION)
