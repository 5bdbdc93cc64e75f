"""Hugging Face Qwen3.5-MoE conversion: a tiny random-init
`Qwen3_5MoeForCausalLM` (a Gated DeltaNet layer and a gated full-attention
layer, each with a sparse MoE plus a gated shared expert)
loads into the Mixtral classes with the same logits on a right-padded
batch and the same cached greedy tokens, and exports back to the
checkpoint layout transformers loads, with the same tensors; the config maps field by
field; options we cannot express fail naming the option."""

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
from keras_transformers.convert import export_hf, qwen3_5_moe  # noqa: E402
from keras_transformers.models import MixtralBackbone, MixtralCausalLM  # noqa: E402

VOCAB, LENGTH = 96, 12
TINY = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=8,
    linear_value_head_dim=6,
    layer_types=["linear_attention", "full_attention"],
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=12,
    shared_expert_intermediate_size=20,
    max_position_embeddings=128,
    bos_token_id=0,
    eos_token_id=1,
    pad_token_id=0,
)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("hf_qwen3_5_moe") / "qwen3_5_moe"
    config = transformers.Qwen3_5MoeTextConfig(**TINY)
    randomize(transformers.Qwen3_5MoeForCausalLM(config)).save_pretrained(path)
    return path


def _tensors(path):
    with safetensors.safe_open(str(path / "model.safetensors"), "numpy") as f:
        return {name: f.get_tensor(name) for name in f.keys()}


def test_causal_lm_logits_match(hf_dir):
    ids, mask = padded_batch(VOCAB, LENGTH)
    hf_model = reference(hf_dir)
    lm = keras_transformers.from_preset(hf_dir)
    assert isinstance(lm, MixtralCausalLM)
    assert type(lm.backbone) is MixtralBackbone
    ours, theirs = our_outputs(lm, ids, mask), hf_outputs(hf_model, ids, mask)
    record("qwen3_5_moe padded", ours, theirs, mask)
    expected = hf_outputs(hf_model.model, ids, mask, base=True)
    record("qwen3_5_moe backbone", our_outputs(lm.backbone, ids, mask), expected, mask)
    hf_count = sum(p.numel() for p in hf_model.parameters())
    assert lm.backbone.config.num_params() == hf_count


def test_greedy_generation(hf_dir):
    prompt = np.array([[5, 17, 42, 90, 3]], "int32")
    assert_greedy_matches(hf_dir, prompt, max_new_tokens=6)


def test_config_mapping(hf_dir):
    config = keras_transformers.load_config(hf_dir)
    assert config.layer_types == ("linear_attention", "full_attention")
    assert config.attention_output_gate and config.qk_norm
    moe = config.moe
    assert (moe.num_experts, moe.num_experts_per_token) == (4, 2)
    assert (moe.expert_intermediate_dim, moe.shared_expert_intermediate_dim) == (12, 20)
    assert moe.normalize_router_weights and moe.shared_expert_gate
    assert (moe.num_shared_experts, moe.every_k_layers) == (1, 1)


def test_config_defaults_are_the_hf_class():
    ours = qwen3_5_moe.config_from_hf({"model_type": "qwen3_5_moe_text"})
    hf = transformers.Qwen3_5MoeTextConfig()
    assert (ours["hidden_dim"], ours["num_layers"], ours["num_kv_heads"]) == (
        hf.hidden_size,
        hf.num_hidden_layers,
        hf.num_key_value_heads,
    )
    assert list(ours["layer_types"]) == hf.layer_types
    moe = ours["moe"]
    assert (moe["num_experts"], moe["num_experts_per_token"]) == (
        hf.num_experts,
        hf.num_experts_per_tok,
    )
    assert moe["expert_intermediate_dim"] == hf.moe_intermediate_size
    assert moe["shared_expert_intermediate_dim"] == hf.shared_expert_intermediate_size
    assert moe["router_aux_loss_coef"] == hf.router_aux_loss_coef


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(num_experts_per_tok=5), "num_experts_per_tok=5"),
        (dict(attention_bias=True), "attention_bias=True"),
        (dict(moe_intermediate_size=10), "experts.0.gate_proj.*shape"),
    ],
)
def test_errors_name_the_problem(hf_dir, tmp_path, changes, match):
    path = edited_hf_dir(hf_dir, tmp_path / "edited", **changes)
    with pytest.raises(ValueError, match=match):
        keras_transformers.from_preset(path)


def test_export_round_trip(hf_dir, tmp_path):
    """HF -> ours -> export gives back `save_pretrained`'s tensors,
    and transformers loads the export with the same logits."""
    lm = keras_transformers.from_preset(hf_dir)
    export_hf(lm, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "qwen3_5_moe_text"
    assert saved["architectures"] == ["Qwen3_5MoeForCausalLM"]
    original, exported = _tensors(hf_dir), _tensors(tmp_path)
    assert sorted(original) == sorted(exported)
    for name, value in original.items():
        np.testing.assert_allclose(exported[name], value, atol=1e-7, err_msg=name)
    ids, mask = padded_batch(VOCAB, LENGTH)
    theirs = hf_outputs(reference(tmp_path), ids, mask)
    record("qwen3_5_moe exported", our_outputs(lm, ids, mask), theirs, mask)


def test_export_refuses_what_qwen3_5_moe_lacks(hf_dir, tmp_path):
    config = keras_transformers.load_config(hf_dir)
    unnormalised = config.moe.replace(normalize_router_weights=False)
    with pytest.raises(ValueError, match="normalize_router_weights"):
        qwen3_5_moe.hf_config(config.replace(moe=unnormalised))
    with pytest.raises(ValueError, match="without a `moe` group"):
        qwen3_5_moe.hf_config(config.replace(moe=None))
    lm = keras_transformers.from_preset(hf_dir, load_weights=False)
    with pytest.raises(ValueError, match="vision parts are not supported"):
        export_hf(lm, tmp_path / "out", model_type="qwen3_5_moe")
