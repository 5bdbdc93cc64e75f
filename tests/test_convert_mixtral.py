"""Hugging Face Mixtral conversion: logits and hidden states match
`transformers` (torch, float32) on tiny random-init sparse-MoE models, with
and without padding and with a sliding window shorter than the sequence;
both checkpoint layouts (per-expert `block_sparse_moe` names and the fused
transformers-5 `mlp.experts` tensors) load; export round-trips; errors name
the problem."""

import json

import numpy as np
import pytest
from contracts import edited_hf_dir, randomize_weights

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
from keras_transformers import MoEConfig, TransformerConfig  # noqa: E402
from keras_transformers.convert import export_hf, hf_preset_data, mixtral  # noqa: E402
from keras_transformers.models import MixtralBackbone, MixtralCausalLM  # noqa: E402

VOCAB, LENGTH, WINDOW = 96, 12, 4
MIXTRAL = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=48,
    num_local_experts=4,
    num_experts_per_tok=2,
    max_position_embeddings=64,
    rope_parameters={"rope_type": "default", "rope_theta": 500.0},
    router_aux_loss_coef=0.01,
    bos_token_id=0,
    eos_token_id=1,
)


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """mixtral (per-expert names, as `save_pretrained` writes), window (the
    same weights, sliding_window=4), fused (the in-memory state dict:
    `mlp.experts.gate_up_proj` ...) and base (`MixtralModel`, no head)."""
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("hf")
    model = randomize(
        transformers.MixtralForCausalLM(transformers.MixtralConfig(**MIXTRAL))
    )
    dirs = {"mixtral": root / "mixtral", "base": root / "base"}
    model.save_pretrained(dirs["mixtral"])
    model.model.save_pretrained(dirs["base"])
    dirs["window"] = edited_hf_dir(
        dirs["mixtral"], root / "window", sliding_window=WINDOW
    )
    dirs["fused"] = edited_hf_dir(dirs["mixtral"], root / "fused")
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    assert "model.layers.0.mlp.experts.gate_up_proj" in state
    save_file(state, str(dirs["fused"] / "model.safetensors"), {"format": "pt"})
    return dirs


@pytest.mark.parametrize(
    "kind, attention",
    [("mixtral", "eager"), ("fused", "eager"), ("window", "eager"), ("window", "sdpa")],
)
def test_causal_lm_logits_match(hf_dirs, kind, attention):
    ids, mask = padded_batch(VOCAB, LENGTH)
    hf_model = reference(hf_dirs[kind], attention=attention)
    lm = keras_transformers.from_preset(hf_dirs[kind])
    assert isinstance(lm, MixtralCausalLM)
    case = f"{kind} {attention}"
    record(
        f"{case} padded",
        our_outputs(lm, ids, mask),
        hf_outputs(hf_model, ids, mask),
        mask,
    )
    record(f"{case} unpadded", our_outputs(lm, ids), hf_outputs(hf_model, ids))
    same = MixtralCausalLM.from_preset(hf_dirs[kind])
    np.testing.assert_allclose(our_outputs(same, ids), our_outputs(lm, ids), atol=1e-6)


def test_sliding_window_is_applied(hf_dirs):
    """The window changes HF's logits, so the window parity above is real."""
    ids, _ = padded_batch(VOCAB, LENGTH)
    full = hf_outputs(reference(hf_dirs["mixtral"]), ids)
    window = hf_outputs(reference(hf_dirs["window"]), ids)
    assert np.abs(full[:, :WINDOW] - window[:, :WINDOW]).max() < 1e-6
    assert np.abs(full[:, WINDOW:] - window[:, WINDOW:]).max() > 1e-2


def test_backbone_hidden_states_match(hf_dirs):
    ids, mask = padded_batch(VOCAB, LENGTH)
    expected = hf_outputs(reference(hf_dirs["mixtral"]).model, ids, mask, base=True)
    backbone = MixtralBackbone.from_preset(hf_dirs["mixtral"])  # causal-LM file
    assert type(backbone) is MixtralBackbone
    record("backbone", our_outputs(backbone, ids, mask), expected, mask)
    base = keras_transformers.from_preset(hf_dirs["base"])  # MixtralModel file
    assert type(base) is MixtralBackbone
    record("base checkpoint", our_outputs(base, ids, mask), expected, mask)
    with pytest.raises(ValueError, match="lm_head.weight"):
        MixtralCausalLM.from_preset(hf_dirs["base"])


def test_greedy_generation_matches(hf_dirs):
    prompt = np.array([[5, 17, 42, 90, 3]], "int32")
    assert_greedy_matches(hf_dirs["mixtral"], prompt, max_new_tokens=6)


def test_config_mapping(hf_dirs, tmp_path):
    data = hf_preset_data(hf_dirs["mixtral"])
    assert (data["family"], data["class_name"]) == ("mixtral", "MixtralCausalLM")
    assert hf_preset_data(hf_dirs["base"])["class_name"] == "MixtralBackbone"
    config = keras_transformers.load_config(hf_dirs["mixtral"])
    assert (config.num_kv_heads, config.intermediate_dim) == (2, 48)
    assert (config.rope_max_wavelength, config.sliding_window) == (500.0, None)
    assert (config.norm_epsilon, config.use_bias, config.tie_embeddings) == (
        1e-5,
        False,
        False,
    )
    assert config.moe == MoEConfig(
        num_experts=4, num_experts_per_token=2, router_aux_loss_coef=0.01
    )
    edited = edited_hf_dir(
        hf_dirs["mixtral"],
        tmp_path / "edited",
        router_jitter_noise=0.1,
        sliding_window=16,
        output_router_logits=True,
        rope_parameters={"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0},
    )
    config = keras_transformers.load_config(edited)
    assert (config.moe.router_jitter, config.sliding_window) == (0.1, 16)
    assert (config.rope_max_wavelength, config.rope_scaling_factor) == (1e4, 2.0)
    # MixtralConfig's defaults, not Llama's, for keys a config leaves out;
    # a transformers-4 config keeps `rope_theta` at the top level.
    sparse = mixtral.config_from_hf({"model_type": "mixtral", "rope_theta": 3e5})
    assert (sparse["norm_epsilon"], sparse["num_kv_heads"]) == (1e-5, 8)
    assert sparse["rope_max_wavelength"] == 3e5
    assert sparse["moe"]["num_experts"] == 8
    assert sparse["moe"]["router_aux_loss_coef"] == 0.001
    assert mixtral.config_from_hf({})["rope_max_wavelength"] == 1e6


def _config(sliding_window=None, expert_dim=None, tied=False):
    return TransformerConfig(
        vocabulary_size=VOCAB,
        num_layers=2,
        hidden_dim=32,
        num_heads=4,
        num_kv_heads=2,
        intermediate_dim=64,
        max_sequence_length=64,
        norm_type="rms",
        position_embedding="rotary",
        rope_max_wavelength=1000.0,
        activation="silu",
        gated_feed_forward=True,
        use_bias=False,
        tie_embeddings=tied,
        sliding_window=sliding_window,
        bos_token_id=0,
        eos_token_id=1,
        moe=MoEConfig(
            num_experts=4,
            num_experts_per_token=2,
            expert_intermediate_dim=expert_dim,
            router_aux_loss_coef=0.03,
        ),
    )


def _random_keras_lm(**fields):
    return randomize_weights(MixtralCausalLM(config=_config(**fields)))


@pytest.mark.parametrize(
    "fields",
    [{}, dict(sliding_window=WINDOW, expert_dim=40, tied=True)],
    ids=["plain", "window_expert_dim_tied"],
)
def test_export_round_trip(tmp_path, fields):
    lm = _random_keras_lm(**fields)
    export_hf(lm, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "mixtral"
    assert saved["architectures"] == ["MixtralForCausalLM"]
    assert saved["intermediate_size"] == fields.get("expert_dim", 64)
    assert saved["sliding_window"] == fields.get("sliding_window")
    assert (saved["num_local_experts"], saved["router_aux_loss_coef"]) == (4, 0.03)
    assert "model.layers.1.block_sparse_moe.experts.3.w2.weight" in _tensors(tmp_path)
    ids, mask = padded_batch(VOCAB, LENGTH)
    ours = our_outputs(lm, ids, mask)
    hf_model = reference(tmp_path)
    assert hf_model.config.sliding_window == fields.get("sliding_window")
    name = "export " + "-".join(sorted(fields)) if fields else "export"
    record(name, ours, hf_outputs(hf_model, ids, mask), mask)
    back = keras_transformers.from_preset(tmp_path)
    assert isinstance(back, MixtralCausalLM)
    np.testing.assert_allclose(
        our_outputs(back, ids, mask)[mask], ours[mask], atol=1e-6
    )


def _tensors(path):
    with safetensors.safe_open(str(path / "model.safetensors"), "numpy") as f:
        return {name: f.get_tensor(name) for name in f.keys()}


@pytest.mark.parametrize("kind", ["mixtral", "fused"])
def test_hf_weights_round_trip(hf_dirs, tmp_path, kind):
    """HF -> ours -> export gives back the per-expert file exactly."""
    export_hf(keras_transformers.from_preset(hf_dirs[kind]), tmp_path)
    original, exported = _tensors(hf_dirs["mixtral"]), _tensors(tmp_path)
    assert sorted(exported) == sorted(original)
    for name, value in original.items():
        np.testing.assert_array_equal(exported[name], value, err_msg=name)


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(hidden_act="gelu"), "Mixtral hidden_act='gelu'.*only 'silu'"),
        (
            dict(rope_parameters={"rope_type": "llama3", "factor": 8.0}),
            "Mixtral config's rope_scaling is invalid: Rotary scaling 'llama3' needs "
            "low_freq_factor",
        ),
        (dict(num_experts_per_tok=5), "num_experts_per_tok=5.*num_local_experts"),
        (dict(num_local_experts=5), "block_sparse_moe.experts.4.w1.weight"),
        (dict(intermediate_size=40), "experts.0.w1.weight.*shape"),
        (dict(num_hidden_layers=3), "model.layers.2"),
        (dict(sliding_window=0), "sliding_window"),
    ],
)
def test_errors_name_the_problem(hf_dirs, tmp_path, changes, match):
    path = edited_hf_dir(hf_dirs["mixtral"], tmp_path / "edited", **changes)
    with pytest.raises(ValueError, match=match):
        keras_transformers.from_preset(path)


def test_fused_layout_shape_errors(hf_dirs, tmp_path):
    path = edited_hf_dir(hf_dirs["fused"], tmp_path / "edited", intermediate_size=40)
    with pytest.raises(ValueError, match="mlp.experts.gate_up_proj.*shape"):
        keras_transformers.from_preset(path)


@pytest.mark.parametrize(
    "moe, match",
    [
        (dict(capacity_factor=1.0), "moe.capacity_factor"),
        (dict(num_shared_experts=1), "moe.num_shared_experts"),
        (dict(every_k_layers=2), "moe.every_k_layers"),
        (dict(normalize_router_weights=False), "moe.normalize_router_weights"),
    ],
)
def test_export_rejects_unrepresentable(tmp_path, moe, match):
    config = _config()  # no model built for it
    bad = MixtralCausalLM(config=config.replace(moe=config.moe.replace(**moe)))
    with pytest.raises(ValueError, match=match):
        export_hf(bad, tmp_path)
    biased = MixtralCausalLM(config=config.replace(use_bias=True))
    with pytest.raises(ValueError, match="use_bias"):
        export_hf(biased, tmp_path)
