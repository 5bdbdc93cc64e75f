"""Hugging Face Qwen2-MoE and Qwen3-MoE conversion: tiny random-init
`transformers` models (one dense block, routed experts, Qwen2-MoE's gated
shared expert, Qwen3-MoE's query/key norms) load into the Mixtral classes
with the same hidden states, logits, cached decoding and greedy tokens;
both checkpoint layouts load; export round-trips; the config maps field by
field; options we cannot express fail naming the option.
The `SparseMoE` shared-expert knobs themselves: test_moe_shared_expert.py."""

import json

import numpy as np
import pytest
from contracts import (
    assert_close,
    compiled_cached_call,
    compiled_forward,
    edited_hf_dir,
    randomize_weights,
    to_numpy,
)

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
from keras_transformers.convert import (  # noqa: E402
    export_hf,
    hf_preset_data,
    qwen2_moe,
    qwen3_moe,
)
from keras_transformers.models import MixtralBackbone, MixtralCausalLM  # noqa: E402

VOCAB, LENGTH = 96, 12
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=48,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=24,
    max_position_embeddings=64,
    rope_parameters={"rope_type": "default", "rope_theta": 500.0},
    router_aux_loss_coef=0.01,
    bos_token_id=0,
    eos_token_id=1,
)
# Block 0 dense (intermediate_size), block 1 sparse, in both spellings.
QWEN2_MOE = dict(COMMON, shared_expert_intermediate_size=40, mlp_only_layers=[0])
QWEN3_MOE = dict(COMMON, head_dim=16, norm_topk_prob=True, decoder_sparse_step=2)
TYPES = {
    "qwen2_moe": (transformers.Qwen2MoeConfig, transformers.Qwen2MoeForCausalLM),
    "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM),
}


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """Per type: the `save_pretrained` directory (per-expert names), its
    base model (`...MoeModel`, no head) and the fused in-memory layout
    (`mlp.experts.gate_up_proj` ...)."""
    from safetensors.torch import save_file

    root, dirs = tmp_path_factory.mktemp("hf"), {}
    for kind, fields in (("qwen2_moe", QWEN2_MOE), ("qwen3_moe", QWEN3_MOE)):
        config_cls, model_cls = TYPES[kind]
        model = randomize(model_cls(config_cls(**fields)))
        dirs[kind], dirs[kind + " base"] = root / kind, root / f"{kind}_base"
        model.save_pretrained(dirs[kind])
        model.model.save_pretrained(dirs[kind + " base"])
        fused = edited_hf_dir(dirs[kind], root / f"{kind}_fused")
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        assert "model.layers.1.mlp.experts.gate_up_proj" in state
        save_file(state, str(fused / "model.safetensors"), {"format": "pt"})
        dirs[kind + " fused"] = fused
    return dirs


def _tensors(path):
    with safetensors.safe_open(str(path / "model.safetensors"), "numpy") as f:
        return {name: f.get_tensor(name) for name in f.keys()}


@pytest.mark.parametrize(
    "kind, attention",
    [
        ("qwen2_moe", "eager"),
        ("qwen2_moe fused", "eager"),
        ("qwen2_moe", "sdpa"),
        ("qwen3_moe", "eager"),
        ("qwen3_moe fused", "eager"),
    ],
)
def test_causal_lm_logits_match(hf_dirs, kind, attention):
    ids, mask = padded_batch(VOCAB, LENGTH)
    hf_model = reference(hf_dirs[kind], attention=attention)
    lm = keras_transformers.from_preset(hf_dirs[kind])
    assert isinstance(lm, MixtralCausalLM)
    case = f"{kind} {attention}"
    ours, theirs = our_outputs(lm, ids, mask), hf_outputs(hf_model, ids, mask)
    record(f"{case} padded", ours, theirs, mask)
    record(f"{case} unpadded", our_outputs(lm, ids), hf_outputs(hf_model, ids))


@pytest.mark.parametrize("kind", ["qwen2_moe", "qwen3_moe"])
def test_backbone_hidden_states_match(hf_dirs, kind):
    ids, mask = padded_batch(VOCAB, LENGTH)
    expected = hf_outputs(reference(hf_dirs[kind]).model, ids, mask, base=True)
    backbone = MixtralBackbone.from_preset(hf_dirs[kind])  # causal-LM file
    assert type(backbone) is MixtralBackbone
    record(f"{kind} backbone", our_outputs(backbone, ids, mask), expected, mask)
    base = keras_transformers.from_preset(hf_dirs[kind + " base"])
    assert type(base) is MixtralBackbone
    record(f"{kind} base checkpoint", our_outputs(base, ids, mask), expected, mask)
    with pytest.raises(ValueError, match="lm_head.weight"):
        MixtralCausalLM.from_preset(hf_dirs[kind + " base"])


@pytest.mark.parametrize("kind", ["qwen2_moe", "qwen3_moe"])
def test_cached_decoding_equals_full_forward(hf_dirs, kind):
    lm = keras_transformers.from_preset(hf_dirs[kind])
    ids, _ = padded_batch(VOCAB, LENGTH)
    full = to_numpy(compiled_forward(lm, ids))
    cache = lm.backbone.init_cache(2, 16)
    prefill = compiled_cached_call(lm, traced_index=False)
    logits, cache = prefill(ids[:, :5], cache, 0)  # a prefill chunk
    step = compiled_cached_call(lm)  # JAX: one program for every position
    steps = [to_numpy(logits)]
    for i in range(5, LENGTH):
        logits, cache = step(ids[:, i : i + 1], cache, i)
        steps.append(to_numpy(logits))
    assert_close(np.concatenate(steps, axis=1), full, atol=1e-5)


@pytest.mark.parametrize("kind", ["qwen2_moe", "qwen3_moe"])
def test_greedy_generation_matches(hf_dirs, kind):
    prompt = np.array([[5, 17, 42, 90, 3]], "int32")
    assert_greedy_matches(hf_dirs[kind], prompt, max_new_tokens=6)


def _expected_config(**fields):
    """The TransformerConfig the tiny checkpoints map to (`fields` differ)."""
    return TransformerConfig(
        vocabulary_size=VOCAB,
        num_layers=2,
        hidden_dim=32,
        num_heads=4,
        num_kv_heads=2,
        intermediate_dim=48,
        max_sequence_length=64,
        norm_type="rms",
        norm_epsilon=1e-6,
        position_embedding="rotary",
        rope_max_wavelength=500.0,
        activation="silu",
        gated_feed_forward=True,
        use_bias=False,
        tie_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,  # eos, as HF pads when a config has no pad id
        **fields,
    )


MOE = dict(
    num_experts=4,
    num_experts_per_token=2,
    expert_intermediate_dim=24,
    router_aux_loss_coef=0.01,
    every_k_layers=2,
)


def test_config_mapping(hf_dirs, tmp_path):
    for kind in ("qwen2_moe", "qwen3_moe"):
        data = hf_preset_data(hf_dirs[kind])
        assert (data["family"], data["class_name"]) == ("mixtral", "MixtralCausalLM")
        base = hf_preset_data(hf_dirs[kind + " base"])
        assert base["class_name"] == "MixtralBackbone"
    qwen2 = keras_transformers.load_config(hf_dirs["qwen2_moe"])
    shared = dict(
        num_shared_experts=1, shared_expert_intermediate_dim=40, shared_expert_gate=True
    )
    moe = MoEConfig(**MOE, normalize_router_weights=False, **shared)
    assert qwen2 == _expected_config(qkv_bias=True, moe=moe)
    qwen3 = keras_transformers.load_config(hf_dirs["qwen3_moe"])
    moe = MoEConfig(**MOE, normalize_router_weights=True)
    assert qwen3 == _expected_config(head_dim=16, qk_norm=True, moe=moe)
    # transformers 5 saves Qwen3-MoE's expert count as `num_local_experts`;
    # the published configs (and transformers 4) call it `num_experts`.
    saved = json.loads((hf_dirs["qwen3_moe"] / "config.json").read_text())
    assert saved["num_local_experts"] == 4 and "num_experts" not in saved
    published = {k: v for k, v in saved.items() if k != "num_local_experts"}
    fields = qwen3_moe.config_from_hf({**published, "num_experts": 4})
    assert fields["moe"]["num_experts"] == 4
    # Qwen2-MoE without `qkv_bias` (transformers 4) has the biases; with
    # false, none. No `mlp_only_layers`: `decoder_sparse_step` alone.
    no_key = {**QWEN2_MOE, "model_type": "qwen2_moe"}
    assert qwen2_moe.config_from_hf(no_key)["qkv_bias"] is True
    assert qwen2_moe.config_from_hf({**no_key, "qkv_bias": False})["qkv_bias"] is False
    every = qwen2_moe.config_from_hf({**no_key, "mlp_only_layers": []})
    assert every["moe"]["every_k_layers"] == 1


def test_config_defaults_are_the_hf_classes():
    """Keys a config.json leaves out take Qwen2MoeConfig's / Qwen3MoeConfig's
    defaults (the Qwen1.5-MoE-A2.7B and Qwen3-MoE shapes)."""
    for module, hf_cls in (
        (qwen2_moe, transformers.Qwen2MoeConfig),
        (qwen3_moe, transformers.Qwen3MoeConfig),
    ):
        ours = module.config_from_hf({"model_type": module.MODEL_TYPE})
        hf = hf_cls()
        assert ours["hidden_dim"] == hf.hidden_size
        assert ours["num_layers"] == hf.num_hidden_layers
        assert ours["num_heads"] == hf.num_attention_heads
        assert ours["num_kv_heads"] == hf.num_key_value_heads
        assert ours["intermediate_dim"] == hf.intermediate_size
        assert ours["vocabulary_size"] == hf.vocab_size
        assert ours["max_sequence_length"] == hf.max_position_embeddings
        moe = ours["moe"]
        assert moe["num_experts"] == hf.num_experts
        assert moe["num_experts_per_token"] == hf.num_experts_per_tok
        assert moe["expert_intermediate_dim"] == hf.moe_intermediate_size
        assert moe["normalize_router_weights"] == hf.norm_topk_prob
        assert moe["router_aux_loss_coef"] == hf.router_aux_loss_coef
    shared = qwen2_moe.config_from_hf({})["moe"]["shared_expert_intermediate_dim"]
    assert shared == transformers.Qwen2MoeConfig().shared_expert_intermediate_size


@pytest.mark.parametrize(
    "layers, step, dense, k",
    [
        (4, 1, [], 1),
        (4, 2, [], 2),
        (4, 1, [0, 2], 2),
        (6, 3, [], 3),
        (6, 1, [0, 1, 3, 4], 3),
        (4, 2, [1], 4),  # only block 3 is sparse
    ],
)
def test_sparse_layers_map_to_every_k_layers(layers, step, dense, k):
    hf = dict(num_hidden_layers=layers, decoder_sparse_step=step, mlp_only_layers=dense)
    assert qwen2_moe.every_k_layers(hf, "Qwen2-MoE") == k
    config = TransformerConfig.from_dict(
        {**qwen2_moe.config_from_hf(hf), "vocabulary_size": 64}
    )
    sparse = [i for i in range(layers) if (i + 1) % step == 0 and i not in dense]
    assert [i for i in range(layers) if config.moe_layer(i)] == sparse


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(mlp_only_layers=[1]), r"decoder_sparse_step=1 and mlp_only_layers=\[1\]"),
        (dict(mlp_only_layers=[0, 1]), r"mlp_only_layers=\[0, 1\].*sparse layers \[\]"),
        (dict(decoder_sparse_step=0), "decoder_sparse_step=0"),
        (
            dict(use_sliding_window=True, sliding_window=4),
            "use_sliding_window=True",
        ),
        (dict(num_experts_per_tok=5), "num_experts_per_tok=5.*num_experts"),
        (dict(hidden_act="gelu"), "Qwen2-MoE hidden_act='gelu'.*only 'silu'"),
        (
            dict(rope_parameters={"rope_type": "llama3", "factor": 8.0}),
            "rope_scaling.*'llama3' needs low_freq_factor",
        ),
        (dict(moe_intermediate_size=20), "mlp.experts.0.gate_proj.weight.*shape"),
        (
            dict(shared_expert_intermediate_size=8),
            "mlp.shared_expert.gate_proj.weight.*shape",
        ),
        (dict(intermediate_size=40), "layers.0.mlp.gate_proj.weight.*shape"),
        (dict(qkv_bias=False), "q_proj.bias"),  # unused: warned, not loaded
        (dict(num_experts=5), "mlp.experts.4.gate_proj.weight"),
    ],
)
def test_qwen2_moe_errors_name_the_problem(hf_dirs, tmp_path, changes, match):
    path = edited_hf_dir(hf_dirs["qwen2_moe"], tmp_path / "edited", **changes)
    if "qkv_bias" in changes:  # biases the config does not ask for stay unused
        with pytest.warns(UserWarning, match=match):
            keras_transformers.from_preset(path)
        return
    with pytest.raises(ValueError, match=match):
        keras_transformers.from_preset(path)


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(attention_bias=True), "Qwen3-MoE config has attention_bias=True"),
        (
            dict(use_sliding_window=True, sliding_window=4),
            "Qwen3-MoE config has use_sliding_window=True",
        ),
        (dict(decoder_sparse_step=1, mlp_only_layers=[1]), r"mlp_only_layers=\[1\]"),
        (dict(num_local_experts=3, num_experts_per_tok=4), "num_experts_per_tok=4"),
        (dict(head_dim=8), "q_proj.weight.*shape"),
    ],
)
def test_qwen3_moe_errors_name_the_problem(hf_dirs, tmp_path, changes, match):
    path = edited_hf_dir(hf_dirs["qwen3_moe"], tmp_path / "edited", **changes)
    with pytest.raises(ValueError, match=match):
        keras_transformers.from_preset(path)


@pytest.mark.parametrize("kind", ["qwen2_moe", "qwen3_moe"])
@pytest.mark.parametrize("layout", ["", " fused"])
def test_hf_weights_round_trip(hf_dirs, tmp_path, kind, layout):
    """HF -> ours -> export gives back `save_pretrained`'s file exactly."""
    export_hf(keras_transformers.from_preset(hf_dirs[kind + layout]), tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == kind
    original, exported = _tensors(hf_dirs[kind]), _tensors(tmp_path)
    assert "model.layers.1.mlp.experts.3.down_proj.weight" in original
    assert sorted(exported) == sorted(original)
    for name, value in original.items():
        np.testing.assert_array_equal(exported[name], value, err_msg=name)


def _qwen3_config(**moe):
    return TransformerConfig(
        vocabulary_size=VOCAB,
        num_layers=2,
        hidden_dim=32,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_dim=64,
        max_sequence_length=64,
        norm_type="rms",
        position_embedding="rotary",
        rope_max_wavelength=1000.0,
        activation="silu",
        gated_feed_forward=True,
        use_bias=False,
        qk_norm=True,
        tie_embeddings=True,
        bos_token_id=0,
        eos_token_id=1,
        moe=MoEConfig(
            num_experts=4,
            num_experts_per_token=2,
            expert_intermediate_dim=40,
            router_aux_loss_coef=0.03,
            **moe,
        ),
    )


def _random_qwen3_lm(**moe):
    return randomize_weights(MixtralCausalLM(config=_qwen3_config(**moe)))


def _tiny_qwen2_lm(**overrides):
    lm = MixtralCausalLM.from_preset("qwen_moe_tiny", **overrides)
    return randomize_weights(lm)


@pytest.mark.parametrize("kind", ["qwen2_moe", "qwen3_moe"])
def test_export_round_trip(tmp_path, kind):
    lm = _tiny_qwen2_lm() if kind == "qwen2_moe" else _random_qwen3_lm()
    config = lm.backbone.config
    export_hf(lm, tmp_path)  # the type follows from the config
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == kind
    assert saved["architectures"] == [TYPES[kind][1].__name__]
    assert saved["num_experts"] == config.moe.num_experts
    assert saved["moe_intermediate_size"] == config.moe.expert_intermediate_dim
    assert saved["decoder_sparse_step"] == config.moe.every_k_layers
    assert saved["norm_topk_prob"] == config.moe.normalize_router_weights
    assert saved["router_aux_loss_coef"] == config.moe.router_aux_loss_coef
    tensors = _tensors(tmp_path)
    if kind == "qwen2_moe":  # block 0 dense, block 1 sparse with a shared expert
        assert saved["shared_expert_intermediate_size"] == 64 and saved["qkv_bias"]
        assert "model.layers.0.mlp.gate_proj.weight" in tensors
        assert tensors["model.layers.1.mlp.shared_expert_gate.weight"].shape == (1, 64)
    else:
        assert (saved["head_dim"], saved["tie_word_embeddings"]) == (16, True)
        assert "model.layers.0.self_attn.q_norm.weight" in tensors
    vocab = config.vocabulary_size
    ids, mask = padded_batch(vocab, LENGTH)
    ours = our_outputs(lm, ids, mask)
    hf_model = reference(tmp_path)
    assert type(hf_model) is TYPES[kind][1]
    record(f"export {kind}", ours, hf_outputs(hf_model, ids, mask), mask)
    back = keras_transformers.from_preset(tmp_path)
    assert isinstance(back, MixtralCausalLM)
    assert back.backbone.config.moe == config.moe.replace(router_z_loss_coef=0.0)
    np.testing.assert_allclose(
        our_outputs(back, ids, mask)[mask], ours[mask], atol=1e-6
    )


def test_export_type_follows_the_config_or_model_type(tmp_path):
    """qk_norm -> qwen3_moe; a gated shared expert or qkv_bias -> qwen2_moe;
    else mixtral; `model_type` must be a Mixtral-family type the config fits."""
    plain = MixtralCausalLM(config=_qwen3_config().replace(qk_norm=False))
    export_hf(plain, tmp_path / "mixtral")
    saved = json.loads((tmp_path / "mixtral" / "config.json").read_text())
    assert saved["model_type"] == "mixtral"
    with pytest.raises(ValueError, match="qk_norm"):
        export_hf(plain, tmp_path / "qwen3", model_type="qwen3_moe")
    with pytest.raises(ValueError, match="not a MIXTRAL-family checkpoint type"):
        export_hf(plain, tmp_path / "gpt", model_type="qwen2")
    with pytest.raises(ValueError, match="moe.num_shared_experts"):
        export_hf(plain, tmp_path / "qwen2", model_type="qwen2_moe")


@pytest.mark.parametrize(
    "kind, changes, match",
    [
        ("qwen2_moe", dict(moe=dict(capacity_factor=1.0)), "moe.capacity_factor"),
        ("qwen2_moe", dict(moe=dict(num_shared_experts=2)), "moe.num_shared_experts"),
        ("qwen2_moe", dict(use_bias=True), "use_bias"),
        ("qwen2_moe", dict(sliding_window=8), "sliding_window"),
        ("qwen3_moe", dict(moe=dict(num_shared_experts=1)), "moe.num_shared_experts"),
        ("qwen3_moe", dict(qkv_bias=True), "qkv_bias"),
    ],
)
def test_export_rejects_unrepresentable(tmp_path, kind, changes, match):
    qwen2 = keras_transformers.load_config("qwen_moe_tiny")  # no model built
    config = qwen2 if kind == "qwen2_moe" else _qwen3_config()
    changes = dict(changes)
    moe = config.moe.replace(**changes.pop("moe", {}))
    bad = MixtralCausalLM(config=config.replace(moe=moe, **changes))
    with pytest.raises(ValueError, match=match):
        export_hf(bad, tmp_path, model_type=kind)
