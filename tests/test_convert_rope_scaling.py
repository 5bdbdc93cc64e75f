"""Long-context rotary scalings through conversion: Llama 3.1-style
`llama3`, YaRN (Qwen2), LongRoPE (Phi-3; with partial rotary as
Phi-4-mini) and dynamic NTK (Llama) checkpoints give transformers' logits
(float32, eager attention, right-padded batches longer than the original
context) and greedy tokens, and export back in a layout transformers loads
with the same logits."""

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
    # Phi-4-mini's layout: LongRoPE on the first half of each head.
    "partial_longrope": (
        "phi3",
        dict(
            rope_type="longrope",
            short_factor=[1.0, 1.2],
            long_factor=[2.0, 6.0],
            original_max_position_embeddings=ORIGINAL,
            partial_rotary_factor=0.5,
        ),
    ),
}


def _type(name):
    return CASES[name][1]["rope_type"]


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
    assert lm.config.rope_scaling["rope_type"] == _type(name)
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
    assert saved["rope_parameters"]["rope_type"] == _type(name)
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


def test_partial_rotary_maps_to_rotary_fraction(hf_dirs):
    config = keras_transformers.load_config(hf_dirs["partial_longrope"])
    assert config.rotary_fraction == 0.5
    assert "partial_rotary_factor" not in config.rope_scaling


# -- dynamic NTK: the frequencies follow the sequence past max_position_embeddings


@pytest.fixture(scope="module")
def dynamic_dir(tmp_path_factory):
    rope = {"rope_theta": 500.0, "rope_type": "dynamic", "factor": 2.0}
    fields = {**COMMON, "max_position_embeddings": ORIGINAL}
    config = transformers.AutoConfig.for_model("llama", **fields, rope_parameters=rope)
    model = randomize(transformers.AutoModelForCausalLM.from_config(config))
    path = tmp_path_factory.mktemp("dynamic") / "llama"
    model.save_pretrained(path)
    return path


def test_dynamic_ntk_logits_and_greedy_tokens(dynamic_dir):
    """Loaded with a longer `max_sequence_length` (transformers reads past
    `max_position_embeddings` too), within and past the original context."""
    lm = keras_transformers.from_preset(dynamic_dir, max_sequence_length=32)
    assert lm.config.rope_scaling["original_max_position_embeddings"] == ORIGINAL
    for length in (6, 12):
        ids, mask = padded_batch(VOCAB, length, real=length - 2)
        expected = hf_outputs(reference(dynamic_dir), ids, mask)
        record(
            f"dynamic logits at {length}", our_outputs(lm, ids, mask), expected, mask
        )
    prompt = np.array([[5, 17, 42, 90, 3]], "int32")
    hf = reference(dynamic_dir)
    hf.generation_config.eos_token_id = None
    with torch.no_grad():
        expected = hf.generate(
            torch.tensor(prompt, dtype=torch.long),
            attention_mask=torch.ones(prompt.shape, dtype=torch.long),
            do_sample=False,
            max_new_tokens=8,
            pad_token_id=0,
        ).numpy()
    ours = lm.generate(prompt, max_new_tokens=8, stop_token_ids=None)
    np.testing.assert_array_equal(np.asarray(ours), expected)


def test_dynamic_ntk_exports_its_reference_length(dynamic_dir, tmp_path):
    lm = keras_transformers.from_preset(dynamic_dir, max_sequence_length=32)
    lm = randomize_weights(lm, seed=1)
    export_hf(lm, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["max_position_embeddings"] == ORIGINAL
    assert saved["rope_parameters"]["rope_type"] == "dynamic"
    ids, mask = padded_batch(VOCAB, 12, real=10)
    ours = our_outputs(lm, ids, mask)
    record("dynamic export", ours, hf_outputs(reference(tmp_path), ids, mask), mask)
