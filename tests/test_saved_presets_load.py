"""Presets saved by an earlier version of the library load unchanged.

`tests/saved_presets/` holds tiny models of every family (GPT-2 and
Llama layouts with a sliding window, BERT, seq2seq, Mixtral, ViT) written
by `save_to_preset` with keras_transformers 0.1.0 before per-layer types
existed (on JAX; `tests/saved_presets/make.py` wrote them and their
outputs on fixed inputs, `outputs.npz`). Each loads on every backend and
gives the same outputs."""

from pathlib import Path

import keras
import numpy as np
import pytest

import keras_transformers

SAVED = Path(__file__).parent / "saved_presets"
IDS = np.array([[3, 9, 4, 7, 1, 5], [8, 2, 6, 0, 0, 0]], "int32")
MASK = IDS != 0
MASK[0] = True


def _inputs(name):
    if name == "vit":
        images = np.random.default_rng(0).normal(size=(2, 8, 8, 3)).astype("float32")
        return {"images": images}
    if name == "seq2seq":
        return {
            "encoder_token_ids": IDS,
            "encoder_padding_mask": MASK,
            "decoder_token_ids": IDS[:, :4],
            "decoder_padding_mask": MASK[:, :4],
        }
    if name == "bert":
        return {
            "token_ids": IDS,
            "padding_mask": MASK,
            "segment_ids": np.zeros_like(IDS),
            "mask_positions": np.array([[1, 2], [0, 1]], "int32"),
        }
    return {"token_ids": IDS, "padding_mask": MASK}


@pytest.mark.parametrize(
    "name", ["gpt2", "llama_sliding", "bert", "seq2seq", "mixtral", "vit"]
)
def test_a_preset_saved_before_loads_with_the_same_outputs(name):
    expected = np.load(SAVED / "outputs.npz")[name]
    model = keras_transformers.from_preset(SAVED / name)
    out = model(_inputs(name))
    out = out if not isinstance(out, dict) else out[sorted(out)[0]]
    out = keras.ops.convert_to_numpy(out)
    np.testing.assert_allclose(out, expected, atol=2e-5, rtol=1e-5)
