"""The `SparseMoE` shared-expert knobs (`shared_expert_intermediate_dim`,
`shared_expert_gate`, as Qwen2-MoE uses them): the layer's contract and
output, config validation, parameter counts of the built model and of the
full-size Qwen-MoE presets (equal to `transformers`' count on the meta
device)."""

import json

import numpy as np
import pytest
from contracts import assert_close, run_layer_test, to_numpy

import keras_transformers
from keras_transformers import MoEConfig
from keras_transformers.convert import qwen2_moe, qwen3_moe
from keras_transformers.layers import SparseMoE
from keras_transformers.models import MixtralCausalLM

HF_CLASSES = {"qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}
D, F = 16, 8


def test_shared_expert_layer_contract():
    x = np.random.default_rng(0).standard_normal((2, 5, D)).astype("float32")
    kwargs = dict(
        num_experts=4,
        num_experts_per_token=2,
        intermediate_dim=F,
        num_shared_experts=1,
        shared_expert_intermediate_dim=12,
        shared_expert_gate=True,
    )
    moe, _ = run_layer_test(SparseMoE, kwargs, (x,), x.shape)
    assert moe.shared_experts.intermediate_dim == 12
    assert tuple(moe.shared_gate.kernel.shape) == (D, 1)
    # Output = routed + sigmoid(x w) * shared, per token.
    plain = SparseMoE(**{**kwargs, "shared_expert_gate": False})
    plain.build(x.shape)
    weights = {w.path.split("/", 1)[1]: w for w in moe.weights}
    for w in plain.weights:
        w.assign(weights[w.path.split("/", 1)[1]])
    shared = to_numpy(moe.shared_experts(x))
    gate = 1 / (1 + np.exp(-(x @ to_numpy(moe.shared_gate.kernel))))
    routed = to_numpy(plain(x)) - shared
    assert_close(moe(x), routed + gate * shared, atol=1e-5)
    dense = SparseMoE(**kwargs, dispatch="dense")
    dense.build(x.shape)
    dense.set_weights(moe.get_weights())
    assert_close(dense(x), moe(x), atol=1e-5)


@pytest.mark.parametrize(
    "moe, match",
    [
        (dict(shared_expert_gate=True), "moe.num_shared_experts=0.*shared_expert_"),
        (dict(shared_expert_intermediate_dim=8), "moe.num_shared_experts=0"),
        (
            dict(num_shared_experts=1, shared_expert_intermediate_dim=0),
            "moe.shared_expert_intermediate_dim=0",
        ),
        (dict(num_shared_experts=1, shared_expert_gate=1), "moe.shared_expert_gate=1"),
    ],
)
def test_shared_expert_config_is_validated(moe, match):
    with pytest.raises(ValueError, match=match):
        MoEConfig(**moe)
    with pytest.raises(ValueError, match="num_shared_experts"):
        SparseMoE(4, 2, F, shared_expert_gate=True)


def test_shared_expert_params_are_counted():
    """num_params() and the built model agree; the shared expert and its gate
    are active for every token."""
    lm = MixtralCausalLM.from_preset("qwen_moe_tiny", num_layers=4)
    config = lm.backbone.config
    trainable = sum(int(np.prod(w.shape)) for w in lm.trainable_weights)
    assert trainable == config.num_params()
    moe = config.moe
    d = config.hidden_dim
    idle = (moe.num_experts - moe.num_experts_per_token) * 3 * d * 32
    assert config.num_params() - config.num_active_params() == idle * 2  # 2 MoE
    ungated = config.replace(moe=moe.replace(shared_expert_gate=False))
    assert config.num_params() - ungated.num_params() == 2 * d
    wider = config.replace(moe=moe.replace(shared_expert_intermediate_dim=80))
    assert wider.num_params() - config.num_params() == 2 * 3 * d * 16


@pytest.mark.parametrize("name", ["qwen1.5_moe_a2.7b", "qwen3_30b_a3b"])
def test_full_size_presets_equal_transformers_meta_count(name, tmp_path):
    """The preset's config.json (as export writes it) builds, on the meta
    device, a transformers model with exactly `num_params()` parameters."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = keras_transformers.load_config(name)
    module = qwen2_moe if name.startswith("qwen1.5") else qwen3_moe
    (tmp_path / "config.json").write_text(json.dumps(module.hf_config(config)))
    hf_config = transformers.AutoConfig.from_pretrained(tmp_path)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_config)
    assert type(model) is getattr(transformers, HF_CLASSES[module.MODEL_TYPE])
    assert sum(p.numel() for p in model.parameters()) == config.num_params()
