"""Long-context rotary scalings through conversion: Llama 3.1-style
`llama3`, YaRN (Qwen2) and LongRoPE (Phi-3) checkpoints give transformers'
logits (float32, eager attention, right-padded batches longer than the
original context) and greedy tokens, and export back in a layout
transformers loads with the same logits."""

import json

import numpy as np
import pytest
from contracts import edited_hf_dir, randomize_weights

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from hf_parity import (  # noqa: E402
    assert_greedy_matches,
    hf_outputs,
    our_outputs,
    padded_batch,
    randomize,
    record,
    reference,
)

import keras_transformers  # noqa: E402
from keras_transformers.convert import export_hf  # noqa: E402

VOCAB, ORIGINAL = 96, 8  # batches of 12 tokens pass the original context
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
    bos_token_id=0,
    eos_token_id=1,
    pad_token_id=0,
    tie_word_embeddings=False,
)
CASES = {
    "llama3": (
        "llama",
        dict(
            rope_type="llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=ORIGINAL,
        ),
    ),
    "yarn": (
        "qwen2",
        dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=ORIGINAL),
    ),
    "longrope": (
        "phi3",
        dict(
            rope_type="longrope",
            short_factor=[1.0, 1.1, 1.3, 1.6],
            long_factor=[1.0, 2.0, 4.0, 8.0],
            original_max_position_embeddings=ORIGINAL,
        ),
    ),
}


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root, dirs = tmp_path_factory.mktemp("rope"), {}
    for name, (kind, scaling) in CASES.items():
        rope = {"rope_theta": 500.0, **scaling}
        config = transformers.AutoConfig.for_model(kind, **COMMON, rope_parameters=rope)
        model = randomize(transformers.AutoModelForCausalLM.from_config(config))
        dirs[name] = root / name
        model.save_pretrained(dirs[name])
    return dirs


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("length", [6, 12])  # within and past the original 8
def test_logits_match(hf_dirs, name, length):
    ids, mask = padded_batch(VOCAB, length, real=length - 2)
    expected = hf_outputs(reference(hf_dirs[name]), ids, mask)
    lm = keras_transformers.from_preset(hf_dirs[name])
    assert lm.config.rope_scaling["rope_type"] == name
    record(f"{name} logits at {length}", our_outputs(lm, ids, mask), expected, mask)


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_generation_across_the_original_context(hf_dirs, name):
    prompt = np.array([[5, 17, 42, 90, 3]], "int32")
    assert_greedy_matches(hf_dirs[name], prompt, max_new_tokens=8)


@pytest.mark.parametrize("name", list(CASES))
def test_export_round_trip(hf_dirs, tmp_path, name):
    lm = randomize_weights(keras_transformers.from_preset(hf_dirs[name]), seed=1)
    export_hf(lm, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["rope_parameters"]["rope_type"] == name
    ids, mask = padded_batch(VOCAB, 12, real=10)
    ours = our_outputs(lm, ids, mask)
    record(f"{name} export", ours, hf_outputs(reference(tmp_path), ids, mask), mask)
    back = keras_transformers.from_preset(tmp_path)
    assert back.config == lm.config


@pytest.mark.parametrize("name", list(CASES))
def test_the_scaling_changes_the_logits(hf_dirs, tmp_path, name):
    """The parity above is real: without the scaling transformers' logits
    move (LongRoPE's short set differs from plain rotary too)."""
    plain = edited_hf_dir(
        hf_dirs[name],
        tmp_path / "plain",
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        rope_scaling=None,
    )
    ids, mask = padded_batch(VOCAB, 12, real=10)
    scaled = hf_outputs(reference(hf_dirs[name]), ids, mask)
    unscaled = hf_outputs(reference(plain), ids, mask)
    assert np.abs(scaled - unscaled)[mask].max() > 1e-3
