"""Hugging Face Mistral, Qwen2, Qwen3, Gemma and Phi-3 conversion (Llama layouts on the
GPT family): logits and greedy generation match `transformers` (torch,
float32, eager attention) on tiny random-init models with a right-padded
batch; export round-trips through `from_pretrained`; options we cannot
represent raise errors that name them; the full-size presets have the
published parameter counts."""

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
from keras_transformers import registry  # noqa: E402
from keras_transformers.convert import export_hf, hf_preset_data  # noqa: E402
from keras_transformers.models import GPTCausalLM  # noqa: E402

VOCAB, LENGTH, WINDOW = 96, 12, 4
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    rope_theta=500.0,
    bos_token_id=0,
    eos_token_id=1,
)
# Each type's tiny config: Mistral with a window shorter than the batch and
# head_dim != hidden / heads; Qwen2 tied; Qwen3 with head_dim 12; Gemma tied
# with head_dim 16; Phi-3 (fused projections) with a window.
TINY = {
    "gemma": dict(head_dim=16, hidden_act="gelu_pytorch_tanh", pad_token_id=0),
    "phi3": dict(sliding_window=WINDOW, pad_token_id=0, tie_word_embeddings=False),
    "mistral": dict(sliding_window=WINDOW, head_dim=16, tie_word_embeddings=False),
    "qwen2": dict(use_sliding_window=False, tie_word_embeddings=True),
    "qwen3": dict(head_dim=12, attention_bias=False, tie_word_embeddings=False),
}
TYPES = sorted(TINY)
# What `export_hf` writes without `model_type`: a config cannot tell Phi-3
# from Llama, so a windowed Phi-3 model exports as Mistral.
EXPORTED = {"phi3": "mistral"}
# Full-size configs (from the checkpoints' config.json) and the published
# parameter counts of Mistral-7B-v0.1, Qwen2-0.5B, Qwen3-0.6B, gemma-2b and
# Phi-3-mini-4k-instruct.
FULL = {
    "gemma": dict(
        vocab_size=256000,
        hidden_size=2048,
        intermediate_size=16384,
        num_hidden_layers=18,
        num_attention_heads=8,
        num_key_value_heads=1,
        head_dim=256,
        tie_word_embeddings=True,
    ),
    "phi3": dict(
        vocab_size=32064,
        hidden_size=3072,
        intermediate_size=8192,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        sliding_window=2047,
        tie_word_embeddings=False,
    ),
    "mistral": dict(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        sliding_window=4096,
        tie_word_embeddings=False,
    ),
    "qwen2": dict(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    ),
    "qwen3": dict(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=True,
    ),
}
PUBLISHED = {
    "gemma": ("gemma_2b", 2_506_172_416),
    "phi3": ("phi3_mini", 3_821_079_552),
    "mistral": ("mistral_7b", 7_241_732_096),
    "qwen2": ("qwen2_0.5b", 494_032_768),
    "qwen3": ("qwen3_0.6b", 596_049_920),
}


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """`{type}` (causal LM) and `{type}_base` (base model, no head) directories."""
    root, dirs = tmp_path_factory.mktemp("hf"), {}
    for kind in TYPES:
        config = transformers.AutoConfig.for_model(kind, **COMMON, **TINY[kind])
        model = randomize(transformers.AutoModelForCausalLM.from_config(config))
        dirs[kind] = root / kind
        model.save_pretrained(dirs[kind])
        dirs[kind + "_base"] = root / (kind + "_base")
        model.model.save_pretrained(dirs[kind + "_base"])
    return dirs


@pytest.mark.parametrize("kind", TYPES)
def test_causal_lm_logits_match(hf_dirs, kind):
    ids, mask = padded_batch(VOCAB, LENGTH)
    expected = hf_outputs(reference(hf_dirs[kind]), ids, mask)
    lm = keras_transformers.from_preset(hf_dirs[kind])
    assert isinstance(lm, GPTCausalLM)
    record(f"{kind} logits", our_outputs(lm, ids, mask), expected, mask)


@pytest.mark.parametrize("kind", TYPES)
def test_greedy_generation_matches(hf_dirs, kind):
    """Cached greedy decoding, past Mistral's window (a rolling cache)."""
    prompt = np.array([[5, 17, 42, 90, 3]], "int32")
    assert_greedy_matches(hf_dirs[kind], prompt, max_new_tokens=8)


def test_config_mapping(hf_dirs):
    mistral = keras_transformers.load_config(hf_dirs["mistral"])
    assert (mistral.sliding_window, mistral.head_dim) == (WINDOW, 16)
    assert not (mistral.use_bias or mistral.qkv_bias or mistral.qk_norm)
    qwen2 = keras_transformers.load_config(hf_dirs["qwen2"])
    assert (qwen2.qkv_bias, qwen2.use_bias, qwen2.tie_embeddings) == (True, False, True)
    assert qwen2.sliding_window is None and not qwen2.qk_norm
    qwen3 = keras_transformers.load_config(hf_dirs["qwen3"])
    assert (qwen3.qk_norm, qwen3.head_dim, qwen3.use_bias) == (True, 12, False)
    assert not qwen3.qkv_bias
    gemma = keras_transformers.load_config(hf_dirs["gemma"])
    assert (gemma.scale_embeddings, gemma.activation) == (True, "gelu_approximate")
    assert (gemma.head_dim, gemma.tie_embeddings) == (16, True)
    phi3 = keras_transformers.load_config(hf_dirs["phi3"])
    assert (phi3.sliding_window, phi3.use_bias, phi3.head_dim) == (WINDOW, False, None)
    for kind in TYPES:
        assert hf_preset_data(hf_dirs[kind + "_base"])["class_name"] == "GPTBackbone"
        base = keras_transformers.from_preset(hf_dirs[kind + "_base"])
        assert base.count_params() == base.config.num_params()


def test_mistral_without_window(hf_dirs, tmp_path):
    """`sliding_window: null` is full attention; the window changes HF's
    logits, so the windowed parity above is real."""
    path = edited_hf_dir(hf_dirs["mistral"], tmp_path / "full", sliding_window=None)
    assert keras_transformers.load_config(path).sliding_window is None
    ids, mask = padded_batch(VOCAB, LENGTH)
    lm = keras_transformers.from_preset(path)
    expected = hf_outputs(reference(path), ids, mask)
    record("mistral no window logits", our_outputs(lm, ids, mask), expected, mask)
    windowed = hf_outputs(reference(hf_dirs["mistral"]), ids, mask)
    assert np.abs(expected - windowed)[0, WINDOW:].max() > 1e-2


@pytest.mark.parametrize("kind", TYPES)
def test_export_round_trip(hf_dirs, tmp_path, kind):
    lm = randomize_weights(keras_transformers.from_preset(hf_dirs[kind]), seed=1)
    export_hf(lm, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == EXPORTED.get(kind, kind)
    ids, mask = padded_batch(VOCAB, LENGTH)
    ours = our_outputs(lm, ids, mask)
    record(f"{kind} export", ours, hf_outputs(reference(tmp_path), ids, mask), mask)
    back = keras_transformers.from_preset(tmp_path)
    assert back.config == lm.config
    np.testing.assert_allclose(
        our_outputs(back, ids, mask)[mask], ours[mask], atol=1e-6
    )


def test_phi3_export_fused(hf_dirs, tmp_path):
    """`model_type="phi3"` writes the fused `qkv_proj` / `gate_up_proj`
    layout; transformers' Phi-3 gives the same logits."""
    lm = randomize_weights(keras_transformers.from_preset(hf_dirs["phi3"]), seed=2)
    export_hf(lm, tmp_path, model_type="phi3")
    saved = json.loads((tmp_path / "config.json").read_text())
    assert (saved["model_type"], saved["architectures"]) == (
        "phi3",
        ["Phi3ForCausalLM"],
    )
    ids, mask = padded_batch(VOCAB, LENGTH)
    ours = our_outputs(lm, ids, mask)
    record("phi3 fused export", ours, hf_outputs(reference(tmp_path), ids, mask), mask)
    back = keras_transformers.from_preset(tmp_path)
    np.testing.assert_allclose(
        our_outputs(back, ids, mask)[mask], ours[mask], atol=1e-6
    )
    with pytest.raises(ValueError, match="not a GPT-family"):
        export_hf(lm, tmp_path / "bad", model_type="bert")


@pytest.mark.parametrize(
    "kind, changes, match",
    [
        ("mistral", dict(hidden_act="gelu"), "Mistral hidden_act"),
        (
            "qwen2",
            dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1),
            "use_sliding_window",
        ),
        (
            "qwen3",
            dict(layer_types=["full_attention", "sliding_attention"]),
            "use_sliding_window",
        ),
        ("qwen3", dict(attention_bias=True), "attention_bias"),
        ("gemma", dict(use_bidirectional_attention=True), "use_bidirectional"),
        ("gemma", dict(hidden_act="relu"), "Gemma hidden_act"),
        (
            "phi3",
            dict(rope_scaling={"type": "longrope", "short_factor": [1.0] * 4}),
            "rope_scaling.*'longrope' needs long_factor",
        ),
        ("phi3", dict(rope_scaling={"type": "su"}), "'su'.*set its type to 'longrope'"),
        ("qwen2", dict(num_hidden_layers=3), "model.layers.2"),
    ],
)
def test_errors_name_the_problem(hf_dirs, tmp_path, kind, changes, match):
    path = edited_hf_dir(hf_dirs[kind], tmp_path / "edited", **changes)
    with pytest.raises(ValueError, match=match):
        keras_transformers.from_preset(path)


@pytest.mark.parametrize("kind", TYPES)
def test_published_parameter_counts(kind):
    """transformers' model on the meta device (no memory), our count of the
    converted config and the preset all give the published figure."""
    name, published = PUBLISHED[kind]
    config = transformers.AutoConfig.for_model(kind, **FULL[kind])
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == published
    fields = registry.converter(kind).config_from_hf(config.to_dict())
    converted = keras_transformers.TransformerConfig.from_dict(fields)
    assert converted.num_params() == published
    assert keras_transformers.load_config(name).num_params() == published
