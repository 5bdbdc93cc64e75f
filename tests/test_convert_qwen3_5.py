"""Hugging Face Qwen3.5 conversion: a tiny random-init `Qwen3_5ForCausalLM`
(Gated DeltaNet "linear_attention" layers between gated full-attention
layers with q/k norms and partial rotary) loads into `GPTCausalLM` with the
same logits on a right-padded batch, the same cached greedy tokens (a
prefill through the recurrent states and KV caches, then one token at a
time), and exports back to a checkpoint transformers loads with the same
tensors; a multimodal `qwen3_5` directory loads its text model; the config
maps field by field; options we cannot express fail naming the option."""

import json

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
from keras_transformers.convert import export_hf, qwen3_5  # noqa: E402
from keras_transformers.models import GPTCausalLM  # noqa: E402

VOCAB, LENGTH = 96, 12
TINY = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=8,
    linear_value_head_dim=6,
    linear_conv_kernel_dim=3,
    max_position_embeddings=128,
    rope_parameters=dict(
        rope_type="default", rope_theta=500.0, partial_rotary_factor=0.5
    ),
    bos_token_id=0,
    eos_token_id=1,
    pad_token_id=0,
)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("hf_qwen3_5") / "qwen3_5"
    config = transformers.Qwen3_5TextConfig(**TINY)
    randomize(transformers.Qwen3_5ForCausalLM(config)).save_pretrained(path)
    return path


def _tensors(path):
    with safetensors.safe_open(str(path / "model.safetensors"), "numpy") as f:
        return {name: f.get_tensor(name) for name in f.keys()}


def test_causal_lm_logits_match(hf_dir):
    ids, mask = padded_batch(VOCAB, LENGTH)
    hf_model = reference(hf_dir)
    lm = keras_transformers.from_preset(hf_dir)
    assert isinstance(lm, GPTCausalLM)
    ours, theirs = our_outputs(lm, ids, mask), hf_outputs(hf_model, ids, mask)
    record("qwen3_5 padded", ours, theirs, mask)
    expected = hf_outputs(hf_model.model, ids, mask, base=True)
    record("qwen3_5 backbone", our_outputs(lm.backbone, ids, mask), expected, mask)


def test_greedy_generation(hf_dir):
    """Cached greedy decoding: recurrent states and KV caches (compiled
    loops feed a prompt this short token by token; eager PyTorch prefills
    it; `tests/test_gated_deltanet.py` covers a compiled prefill)."""
    prompt = np.array([[5, 17, 42, 90, 3, 61, 7]], "int32")
    assert_greedy_matches(hf_dir, prompt, max_new_tokens=6)


def test_config_mapping(hf_dir):
    config = keras_transformers.load_config(hf_dir)
    assert config.layer_types == ("linear_attention",) * 3 + ("full_attention",)
    assert config.qk_norm and config.attention_output_gate and not config.use_bias
    assert (config.head_dim, config.rotary_fraction) == (16, 0.5)
    assert config.rope_max_wavelength == 500.0 and config.norm_type == "rms"
    group = config.linear_attention
    assert (group.num_key_heads, group.num_value_heads) == (2, 4)
    assert (group.key_head_dim, group.value_head_dim, group.conv_kernel_size) == (
        8,
        6,
        3,
    )


def test_config_defaults_are_the_hf_class():
    """Keys a config.json leaves out take Qwen3_5TextConfig's defaults
    (layer types from `full_attention_interval`, a quarter of each head
    rotating)."""
    ours = qwen3_5.config_from_hf({"model_type": "qwen3_5_text"})
    hf = transformers.Qwen3_5TextConfig()
    assert (ours["hidden_dim"], ours["num_layers"]) == (
        hf.hidden_size,
        hf.num_hidden_layers,
    )
    head_dim = ours["head_dim"] or ours["hidden_dim"] // ours["num_heads"]
    assert (ours["num_heads"], ours["num_kv_heads"], head_dim) == (
        hf.num_attention_heads,
        hf.num_key_value_heads,
        hf.head_dim,
    )
    assert ours["intermediate_dim"] == hf.intermediate_size
    assert ours["vocabulary_size"] == hf.vocab_size
    assert list(ours["layer_types"]) == hf.layer_types
    assert ours["rotary_fraction"] == hf.rope_parameters["partial_rotary_factor"]
    assert ours["rope_max_wavelength"] == hf.rope_parameters["rope_theta"]
    assert ours["linear_attention"] == dict(
        num_key_heads=hf.linear_num_key_heads,
        num_value_heads=hf.linear_num_value_heads,
        key_head_dim=hf.linear_key_head_dim,
        value_head_dim=hf.linear_value_head_dim,
        conv_kernel_size=hf.linear_conv_kernel_dim,
    )
    assert ours["tie_embeddings"] == hf.tie_word_embeddings


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(attention_bias=True), "attention_bias=True"),
        (dict(hidden_act="gelu"), "hidden_act='gelu'"),
        (dict(layer_types=["sliding_attention"] * 4), "layer_types=.*sliding"),
        (dict(layer_types=["full_attention"] * 3), "expected 4 entries"),
        (dict(linear_num_value_heads=3), "num_value_heads.*multiple"),
    ],
)
def test_errors_name_the_problem(hf_dir, tmp_path, changes, match):
    path = edited_hf_dir(hf_dir, tmp_path / "edited", **changes)
    with pytest.raises(ValueError, match=match):
        keras_transformers.from_preset(path)


def test_export_round_trip(hf_dir, tmp_path):
    """HF -> ours -> export gives back `save_pretrained`'s tensors exactly
    (the gate merged back into `q_proj`, norm offsets), and transformers
    loads the export with the same logits."""
    lm = keras_transformers.from_preset(hf_dir)
    export_hf(lm, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "qwen3_5_text"
    assert saved["architectures"] == ["Qwen3_5ForCausalLM"]
    original, exported = _tensors(hf_dir), _tensors(tmp_path)
    assert sorted(original) == sorted(exported)
    for name, value in original.items():
        np.testing.assert_allclose(exported[name], value, atol=1e-7, err_msg=name)
    ids, mask = padded_batch(VOCAB, LENGTH)
    theirs = hf_outputs(reference(tmp_path), ids, mask)
    record("qwen3_5 exported", our_outputs(lm, ids, mask), theirs, mask)


def test_multimodal_directory_loads_its_text_model(hf_dir, tmp_path):
    """A `qwen3_5` directory (`text_config` nested, tensors under
    `model.language_model.`, a vision tower) loads the text model with
    the text checkpoint's logits; exporting as `qwen3_5` is refused
    (vision parts are not supported)."""
    from safetensors.numpy import save_file

    text = json.loads((hf_dir / "config.json").read_text())
    path = tmp_path / "multimodal"
    path.mkdir()
    config = dict(
        model_type="qwen3_5",
        architectures=["Qwen3_5ForConditionalGeneration"],
        text_config={**text, "model_type": "qwen3_5_text"},
        vision_config={"model_type": "qwen3_5_vision", "depth": 1},
        tie_word_embeddings=False,
    )
    (path / "config.json").write_text(json.dumps(config))
    tensors = {
        name.replace("model.", "model.language_model.", 1): value
        for name, value in _tensors(hf_dir).items()
    }
    tensors["model.visual.patch_embed.proj.weight"] = np.zeros((2, 2), np.float32)
    save_file(tensors, str(path / "model.safetensors"), {"format": "pt"})
    with pytest.warns(UserWarning, match="model.visual"):
        lm = keras_transformers.from_preset(path)
    ids, mask = padded_batch(VOCAB, LENGTH)
    expected = our_outputs(keras_transformers.from_preset(hf_dir), ids, mask)
    record("qwen3_5 multimodal text", our_outputs(lm, ids, mask), expected, mask)
    with pytest.raises(ValueError, match="vision parts are not supported"):
        export_hf(lm, tmp_path / "out", model_type="qwen3_5")


def test_export_refuses_other_layer_types():
    fields = qwen3_5.config_from_hf(TINY)
    fields.update(layer_types=None, linear_attention=None)
    config = keras_transformers.TransformerConfig.from_dict(fields)
    with pytest.raises(ValueError, match="layer_types"):
        qwen3_5.hf_config(config)
