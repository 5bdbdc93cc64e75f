"""Hugging Face Gemma 2 and Gemma 3 (text) conversion, through the per-layer
seam: sliding and full attention layers (`layer_types`), a rotary per
layer type (Gemma 3), soft-capped attention and output logits (Gemma 2),
norms before and after each sub-layer, `query_pre_attn_scalar`, q/k norms
(Gemma 3). Logits and cached greedy generation across the window match
`transformers` (torch, float32, eager attention) on tiny random-init
models with a right-padded batch longer than the window; export
round-trips; the presets have the published parameter counts."""

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
from keras_transformers.config.layer_types import layer_settings  # noqa: E402
from keras_transformers.convert import export_hf  # noqa: E402
from keras_transformers.models import GPTCausalLM  # noqa: E402

VOCAB, LENGTH, WINDOW = 96, 12, 4
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=64,
    sliding_window=WINDOW,
    # Not head_dim: a scale taken from head_dim would show.
    query_pre_attn_scalar=24,
    bos_token_id=0,
    eos_token_id=1,
    pad_token_id=0,
)
TINY = {
    # Soft caps small enough to bend the random logits.
    "gemma2": dict(
        rope_theta=500.0, attn_logit_softcapping=2.0, final_logit_softcapping=3.0
    ),
    # Full layers: base 500 scaled linearly by 2; sliding layers: base 50.
    "gemma3_text": dict(
        rope_theta=500.0,
        rope_local_base_freq=50.0,
        rope_scaling={"rope_type": "linear", "factor": 2.0},
        layer_types=[
            "sliding_attention",
            "sliding_attention",
            "full_attention",
            "sliding_attention",
        ],
    ),
}
TYPES = sorted(TINY)
# Published configs (the checkpoints' config.json; Gemma 3 4B: its text_config
# with Gemma3TextConfig's defaults) and transformers' parameter counts.
FULL = {
    "gemma2_2b": (
        "gemma2",
        dict(
            hidden_size=2304,
            intermediate_size=9216,
            num_hidden_layers=26,
            num_attention_heads=8,
            num_key_value_heads=4,
        ),
        2_614_341_888,
    ),
    "gemma2_9b": (
        "gemma2",
        dict(
            hidden_size=3584,
            intermediate_size=14336,
            num_hidden_layers=42,
            num_attention_heads=16,
            num_key_value_heads=8,
        ),
        9_241_705_984,
    ),
    "gemma3_270m": (
        "gemma3_text",
        dict(
            vocab_size=262144,
            hidden_size=640,
            intermediate_size=2048,
            num_hidden_layers=18,
            num_attention_heads=4,
            num_key_value_heads=1,
            max_position_embeddings=32768,
            sliding_window=512,
        ),
        268_098_176,
    ),
    "gemma3_1b": (
        "gemma3_text",
        dict(
            vocab_size=262144,
            hidden_size=1152,
            intermediate_size=6912,
            num_hidden_layers=26,
            num_attention_heads=4,
            num_key_value_heads=1,
            max_position_embeddings=32768,
            sliding_window=512,
        ),
        999_885_952,
    ),
    "gemma3_4b": (
        "gemma3_text",
        dict(
            hidden_size=2560,
            intermediate_size=10240,
            num_hidden_layers=34,
            sliding_window=1024,
            rope_scaling={"rope_type": "linear", "factor": 8.0},
        ),
        3_880_263_168,
    ),
}


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root, dirs = tmp_path_factory.mktemp("hf_gemma"), {}
    for kind in TYPES:
        config = transformers.AutoConfig.for_model(kind, **COMMON, **TINY[kind])
        model = randomize(transformers.AutoModelForCausalLM.from_config(config))
        dirs[kind] = root / kind
        model.save_pretrained(dirs[kind])
    return dirs


@pytest.mark.parametrize("kind", TYPES)
def test_causal_lm_logits_match(hf_dirs, kind):
    ids, mask = padded_batch(VOCAB, LENGTH)
    expected = hf_outputs(reference(hf_dirs[kind]), ids, mask)
    lm = keras_transformers.from_preset(hf_dirs[kind])
    assert isinstance(lm, GPTCausalLM)
    record(f"{kind} logits", our_outputs(lm, ids, mask), expected, mask)


@pytest.mark.parametrize("kind", TYPES)
def test_greedy_generation_across_the_window(hf_dirs, kind):
    """Cached greedy decoding: sliding layers' rolling caches and full
    layers' caches, 13 positions for a window of 4."""
    prompt = np.array([[5, 17, 42, 90, 3]], "int32")
    assert_greedy_matches(hf_dirs[kind], prompt, max_new_tokens=8)


def test_config_mapping(hf_dirs):
    gemma2 = keras_transformers.load_config(hf_dirs["gemma2"])
    assert gemma2.layer_types == ("sliding_attention", "full_attention") * 2
    assert (gemma2.attention_softcap, gemma2.logit_softcap) == (2.0, 3.0)
    assert gemma2.norm_position == "sandwich" and not gemma2.qk_norm
    assert gemma2.attention_scale == pytest.approx(24**-0.5)
    gemma3 = keras_transformers.load_config(hf_dirs["gemma3_text"])
    assert gemma3.qk_norm and gemma3.attention_softcap is None
    sliding, full = layer_settings(gemma3, 0), layer_settings(gemma3, 2)
    assert (sliding["sliding_window"], full["sliding_window"]) == (WINDOW, None)
    assert (sliding["rope_max_wavelength"], sliding["rope_scaling_factor"]) == (
        50.0,
        1.0,
    )
    assert (full["rope_max_wavelength"], full["rope_scaling_factor"]) == (500.0, 2.0)


def test_gemma3_layer_pattern_and_legacy_rope_keys(hf_dirs, tmp_path):
    """Without `layer_types`, every `sliding_window_pattern`-th layer is full
    (as transformers derives it); the hub's older rotary keys
    (`rope_theta`, `rope_local_base_freq`, `rope_scaling`) load as the
    nested `rope_parameters` do."""
    legacy = dict(
        layer_types=None,
        sliding_window_pattern=2,
        rope_parameters=None,
        rope_theta=500.0,
        rope_local_base_freq=50.0,
        rope_scaling={"rope_type": "linear", "factor": 2.0},
    )
    path = edited_hf_dir(hf_dirs["gemma3_text"], tmp_path / "legacy", **legacy)
    config = keras_transformers.load_config(path)
    expected = transformers.AutoConfig.from_pretrained(path).layer_types
    assert (
        list(config.layer_types)
        == expected
        == ["sliding_attention", "full_attention"] * 2
    )
    nested = keras_transformers.load_config(hf_dirs["gemma3_text"])
    assert config.replace(layer_types=nested.layer_types) == nested
    ids, mask = padded_batch(VOCAB, LENGTH)
    record(
        "gemma3 legacy keys logits",
        our_outputs(keras_transformers.from_preset(path), ids, mask),
        hf_outputs(reference(path), ids, mask),
        mask,
    )


@pytest.mark.parametrize("kind", TYPES)
def test_export_round_trip(hf_dirs, tmp_path, kind):
    lm = randomize_weights(keras_transformers.from_preset(hf_dirs[kind]), seed=1)
    export_hf(lm, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == kind
    ids, mask = padded_batch(VOCAB, LENGTH)
    ours = our_outputs(lm, ids, mask)
    record(f"{kind} export", ours, hf_outputs(reference(tmp_path), ids, mask), mask)
    back = keras_transformers.from_preset(tmp_path)
    assert back.config == lm.config


def test_sandwich_models_do_not_export_as_other_layouts(hf_dirs, tmp_path):
    lm = keras_transformers.from_preset(hf_dirs["gemma2"])
    with pytest.raises(
        ValueError, match="cannot be exported as Hugging Face 'gemma'.*norm_position"
    ):
        export_hf(lm, tmp_path, model_type="gemma")


@pytest.mark.parametrize(
    "kind, changes, match",
    [
        ("gemma3_text", dict(use_bidirectional_attention=True), "use_bidirectional"),
        ("gemma2", dict(hidden_activation="relu"), "Gemma2 hidden_act"),
        (
            "gemma2",
            dict(layer_types=["full_attention"]),
            "1 layer_types for num_hidden_layers=4",
        ),
        (
            "gemma3_text",
            dict(
                rope_parameters={
                    "full_attention": {"rope_type": "dynamic", "rope_theta": 1e4}
                }
            ),
            "Gemma3 config's rope_scaling is invalid.*'dynamic'",
        ),
    ],
)
def test_errors_name_the_problem(hf_dirs, tmp_path, kind, changes, match):
    path = edited_hf_dir(hf_dirs[kind], tmp_path / "edited", **changes)
    with pytest.raises(ValueError, match=match):
        keras_transformers.from_preset(path)


@pytest.mark.parametrize("name", sorted(FULL))
def test_published_parameter_counts(name):
    """transformers' model on the meta device, our count of the converted
    config and the preset all give the published figure."""
    kind, fields, published = FULL[name]
    config = transformers.AutoConfig.for_model(kind, **fields)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == published
    converted = registry.converter(kind).config_from_hf(config.to_dict())
    assert (
        keras_transformers.TransformerConfig.from_dict(converted).num_params()
        == published
    )
    preset = keras_transformers.load_config(name)
    assert preset.num_params() == published
    assert preset.layer_types == tuple(config.layer_types)
