"""Hugging Face gpt-oss conversion: a tiny random-init `GptOssForCausalLM`
(sliding and full layers alternating, attention sinks, q/k/v/o biases,
YaRN rotary, a router with bias, biased experts with the clamped SwiGLU)
loads into the Mixtral classes with the same logits on a right-padded
batch longer than the window, the same cached greedy tokens, and exports
back to a checkpoint transformers loads with the same tensors; the config
maps field by field; options we cannot express fail naming the option.
Also the layer knobs on their own (`MultiHeadAttention(sinks=True)`,
`SparseMoE`'s biases and `glu_limit`)."""

import json

import keras
import numpy as np
import pytest
from contracts import edited_hf_dir

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors = pytest.importorskip("safetensors")

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
from keras_transformers.config.layer_types import layer_settings  # noqa: E402
from keras_transformers.convert import export_hf, gpt_oss  # noqa: E402
from keras_transformers.layers import MultiHeadAttention, SparseMoE  # noqa: E402
from keras_transformers.models import MixtralBackbone, MixtralCausalLM  # noqa: E402

VOCAB, LENGTH, WINDOW = 96, 12, 4
TINY = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=24,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_local_experts=4,
    num_experts_per_tok=2,
    sliding_window=WINDOW,
    max_position_embeddings=64,
    # A limit the random gate / up values cross; YaRN with the ramp inside
    # the 8 frequencies of a 16-wide head.
    swiglu_limit=0.5,
    rope_parameters=dict(
        rope_type="yarn",
        rope_theta=500.0,
        factor=4.0,
        beta_fast=8.0,
        beta_slow=1.0,
        truncate=False,
        original_max_position_embeddings=16,
    ),
    bos_token_id=0,
    eos_token_id=1,
    pad_token_id=0,
)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("hf_gpt_oss") / "gpt_oss"
    config = transformers.GptOssConfig(**TINY)
    randomize(transformers.GptOssForCausalLM(config)).save_pretrained(path)
    return path


def _tensors(path):
    with safetensors.safe_open(str(path / "model.safetensors"), "numpy") as f:
        return {name: f.get_tensor(name) for name in f.keys()}


def test_causal_lm_logits_match(hf_dir):
    ids, mask = padded_batch(VOCAB, LENGTH)
    hf_model = reference(hf_dir)
    lm = keras_transformers.from_preset(hf_dir)
    assert isinstance(lm, MixtralCausalLM)
    ours, theirs = our_outputs(lm, ids, mask), hf_outputs(hf_model, ids, mask)
    record("gpt_oss padded", ours, theirs, mask)
    assert type(lm.backbone) is MixtralBackbone
    expected = hf_outputs(hf_model.model, ids, mask, base=True)
    record("gpt_oss backbone", our_outputs(lm.backbone, ids, mask), expected, mask)


def test_greedy_generation_across_the_window(hf_dir):
    """Cached greedy decoding: sliding layers' ring caches with sinks, 13
    positions for a window of 4."""
    prompt = np.array([[5, 17, 42, 90, 3]], "int32")
    assert_greedy_matches(hf_dir, prompt, max_new_tokens=8)


def test_config_mapping(hf_dir):
    config = keras_transformers.load_config(hf_dir)
    assert config.layer_types == ("sliding_attention", "full_attention") * 2
    assert [layer_settings(config, i)["sliding_window"] for i in range(4)] == [
        WINDOW,
        None,
    ] * 2
    assert config.attention_sinks and config.use_bias and not config.qk_norm
    assert (config.head_dim, config.activation) == (16, "quick_gelu")
    assert config.rope_scaling["rope_type"] == "yarn"
    assert config.rope_scaling["truncate"] is False
    moe = config.moe
    assert (moe.num_experts, moe.num_experts_per_token, moe.glu_limit) == (4, 2, 0.5)
    assert moe.router_bias and moe.expert_bias and moe.normalize_router_weights


def test_config_defaults_are_the_hf_class():
    """Keys a config.json leaves out take GptOssConfig's defaults."""
    ours = gpt_oss.config_from_hf({"model_type": "gpt_oss"})
    hf = transformers.GptOssConfig()
    assert (ours["hidden_dim"], ours["num_layers"]) == (
        hf.hidden_size,
        hf.num_hidden_layers,
    )
    assert (ours["num_heads"], ours["num_kv_heads"], ours["head_dim"]) == (
        hf.num_attention_heads,
        hf.num_key_value_heads,
        hf.head_dim,
    )
    assert ours["intermediate_dim"] == hf.intermediate_size
    assert ours["vocabulary_size"] == hf.vocab_size
    assert ours["sliding_window"] == hf.sliding_window
    assert list(ours["layer_types"]) == hf.layer_types
    assert ours["rope_max_wavelength"] == hf.rope_parameters["rope_theta"]
    rope = {k: v for k, v in hf.rope_parameters.items() if k != "rope_theta"}
    assert ours["rope_scaling"] == rope
    assert ours["moe"]["num_experts"] == hf.num_local_experts
    assert ours["moe"]["num_experts_per_token"] == hf.num_experts_per_tok
    assert ours["moe"]["glu_limit"] == hf.swiglu_limit


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(swiglu_alpha=1.5), "swiglu_alpha=1.5.*only swiglu_alpha=1.702"),
        (dict(num_experts_per_tok=5), "num_experts_per_tok=5"),
        (dict(sliding_window=None), "sliding_attention layers but sliding_window"),
        (dict(intermediate_size=20), "gate_up_proj.*shape"),
    ],
)
def test_errors_name_the_problem(hf_dir, tmp_path, changes, match):
    path = edited_hf_dir(hf_dir, tmp_path / "edited", **changes)
    with pytest.raises(ValueError, match=match):
        keras_transformers.from_preset(path)


def _mxfp4_dirs(tmp_path, rng):
    """A random gpt-oss (intermediate 32: MXFP4 groups 32 inputs) saved with
    MXFP4 experts (random codes and scales), and the same model with the
    experts dequantised by transformers: (quantised dir, float dir)."""
    from safetensors.numpy import save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    config = transformers.GptOssConfig(**{**TINY, "intermediate_size": 32})
    floats = tmp_path / "float"
    randomize(transformers.GptOssForCausalLM(config)).save_pretrained(floats)
    quantised = edited_hf_dir(
        floats, tmp_path / "mxfp4", quantization_config={"quant_method": "mxfp4"}
    )
    tensors, packed = _tensors(floats), {}
    for name in [n for n in tensors if n.endswith(("gate_up_proj", "down_proj"))]:
        e, i, o = tensors[name].shape
        blocks = rng.integers(0, 256, (e, o, i // 32, 16)).astype(np.uint8)
        scales = rng.integers(121, 126, (e, o, i // 32)).astype(np.uint8)
        packed[name + "_blocks"], packed[name + "_scales"] = blocks, scales
        tensors[name] = convert_moe_packed_tensors(
            torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32
        ).numpy()
    save_file(tensors, str(floats / "model.safetensors"), {"format": "pt"})
    rest = {n: t for n, t in tensors.items() if n + "_blocks" not in packed}
    save_file(
        {**rest, **packed}, str(quantised / "model.safetensors"), {"format": "pt"}
    )
    return quantised, floats


def test_mxfp4_experts_load_dequantised(tmp_path, rng):
    """Experts stored as MXFP4 blocks and scales (as gpt-oss is published)
    load with transformers' dequantised values: the same logits as
    transformers on the float checkpoint; damaged blocks fail naming them."""
    from keras_transformers.convert import mxfp4

    quantised, floats = _mxfp4_dirs(tmp_path, rng)
    ids, mask = padded_batch(VOCAB, LENGTH)
    lm = keras_transformers.from_preset(quantised)
    expected = hf_outputs(reference(floats), ids, mask)
    record("gpt_oss mxfp4", our_outputs(lm, ids, mask), expected, mask)
    with pytest.raises(ValueError, match=r"MXFP4 blocks \(2, 4, 1, 16\)"):
        mxfp4.dequantize(np.zeros((2, 4, 1, 16), np.uint8), np.zeros((2, 4), np.uint8))


def test_export_round_trip(hf_dir, tmp_path):
    """HF -> ours -> export gives back `save_pretrained`'s tensors exactly,
    and transformers loads the export with the same logits."""
    lm = keras_transformers.from_preset(hf_dir)
    export_hf(lm, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "gpt_oss"
    assert saved["architectures"] == ["GptOssForCausalLM"]
    original, exported = _tensors(hf_dir), _tensors(tmp_path)
    assert sorted(original) == sorted(exported)
    for name, value in original.items():
        np.testing.assert_array_equal(exported[name], value, err_msg=name)
    ids, mask = padded_batch(VOCAB, LENGTH)
    theirs = hf_outputs(reference(tmp_path), ids, mask)
    record("gpt_oss exported", our_outputs(lm, ids, mask), theirs, mask)


def test_export_refuses_what_gpt_oss_lacks(hf_dir):
    config = keras_transformers.load_config(hf_dir)
    with pytest.raises(ValueError, match="glu_limit"):
        gpt_oss.hf_config(config.replace(moe=config.moe.replace(glu_limit=None)))
    with pytest.raises(ValueError, match="attention_sinks"):
        gpt_oss.hf_config(config.replace(attention_sinks=False))
    with pytest.raises(ValueError, match="router_bias"):
        gpt_oss.hf_config(config.replace(moe=config.moe.replace(router_bias=False)))


def test_sinks_take_probability_from_the_keys():
    """With sinks, the attention output is the sink-free output times the
    keys' share `sum(exp(l)) / (sum(exp(l)) + exp(sink))`; a very negative
    sink gives the plain attention back."""
    x = np.random.default_rng(0).normal(size=(2, 5, 16)).astype("float32")
    plain = MultiHeadAttention(4, 4, num_kv_heads=2, use_bias=False, causal=True)
    sunk = MultiHeadAttention(
        4, 4, num_kv_heads=2, use_bias=False, causal=True, sinks=True
    )
    plain.build((None, None, 16))
    sunk.build((None, None, 16))
    assert sunk.sink_logits.shape == (4,) and plain.sink_logits is None
    for a, b in zip(plain.weights, [w for w in sunk.weights if w.name != "sinks"]):
        b.assign(a)
    sunk.sink_logits.assign(np.full((4,), -1e4, "float32"))
    expected = keras.ops.convert_to_numpy(plain(x))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(sunk(x)), expected, atol=1e-6)
    sunk.sink_logits.assign(np.full((4,), 30.0, "float32"))  # takes it all
    np.testing.assert_allclose(keras.ops.convert_to_numpy(sunk(x)), 0.0, atol=1e-6)
    restored = MultiHeadAttention.from_config(sunk.get_config())
    assert restored.sinks


def test_moe_knobs_validate_and_serialise():
    with pytest.raises(ValueError, match="glu_limit.*gated=True"):
        SparseMoE(4, 2, 8, gated=False, glu_limit=1.0)
    moe = SparseMoE(4, 2, 8, router_bias=True, expert_bias=True, glu_limit=1.0)
    moe.build((None, None, 16))
    shapes = {w.path.split("/")[-1]: tuple(w.shape) for w in moe.weights}
    assert shapes["router_bias"] == (4,)
    assert shapes["expert_gate_up_bias"] == (4, 16)
    assert shapes["expert_down_bias"] == (4, 16)
    restored = SparseMoE.from_config(moe.get_config())
    assert (restored.router_bias, restored.expert_bias, restored.glu_limit) == (
        True,
        True,
        1.0,
    )
