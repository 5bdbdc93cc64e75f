"""Mixtral family: presets and parameter counts, router statistics in
`fit()`, dense vs sparse dispatch in the full model, XLA-compiled training,
MoE every k-th layer and configuration errors. The decoder contract
(causality, padding, cache, generation, saving, input errors) runs on
`mixtral_tiny` in test_gpt.py."""

import keras
import numpy as np
import pytest
from contracts import assert_close, to_numpy, toy_run_env

import keras_transformers as kt
from keras_transformers.layers import FeedForward, SparseMoE
from keras_transformers.models import MixtralBackbone, MixtralCausalLM
from keras_transformers.training import MaskedSparseCategoricalCrossentropy


@pytest.mark.parametrize(
    "name, total, active, active_tolerance",
    [
        ("mixtral_8x7b", 46.7e9, 12.9e9, 0.005),
        ("mixtral_8x22b", 141e9, 39e9, 0.005),
        # Qwen-MoE's published active counts are rounded to one decimal.
        ("qwen1.5_moe_a2.7b", 14.3e9, 2.7e9, 0.02),
        ("qwen3_30b_a3b", 30.5e9, 3.3e9, 0.02),
    ],
)
def test_full_size_presets_count_without_weights(name, total, active, active_tolerance):
    config = kt.load_config(name)
    assert abs(config.num_params() - total) / total < 0.005
    assert abs(config.num_active_params() - active) / active < active_tolerance
    entry = kt.list_presets("mixtral")[name]
    assert entry["params"] == config.num_params()
    assert entry["active_params"] == config.num_active_params()


def test_tiny_preset_counts_and_classes():
    lm = kt.from_preset("mixtral_tiny")
    assert isinstance(lm, MixtralCausalLM)
    moe = [b.feed_forward for b in lm.backbone.blocks]
    assert all(isinstance(m, SparseMoE) for m in moe)
    trainable = sum(int(np.prod(w.shape)) for w in lm.trainable_weights)
    assert trainable == lm.config.num_params()
    stats = sum(int(np.prod(w.shape)) for w in lm.non_trainable_weights)
    assert stats == len(moe) * (lm.config.moe.num_experts + 3)


def _data(rng, batch=8, length=16):
    ids = rng.integers(3, 512, (batch, length + 1)).astype("int32")
    mask = np.ones((batch, length), bool)
    mask[0, 10:] = False
    return {"token_ids": ids[:, :-1], "padding_mask": mask}, ids[:, 1:]


# XLA-compiled training: `jit_compile=True`. On JAX "auto" is XLA too (the
# same program; asserted below), so only TensorFlow (no XLA on CPU unless
# asked) runs both; PyTorch compiles through torch.compile, not XLA.
JIT_COMPILE = ["auto", True] if keras.config.backend() == "tensorflow" else ["auto"]


@pytest.mark.parametrize("jit_compile", JIT_COMPILE)
def test_fit_logs_router_statistics(rng, jit_compile, backend):
    keras.utils.set_random_seed(0)
    lm = MixtralCausalLM.from_preset("mixtral_tiny", moe={"capacity_factor": 1.0})
    x, y = _data(rng)
    lm.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=MaskedSparseCategoricalCrossentropy(from_logits=True),
        jit_compile=jit_compile,
    )
    if backend == "jax":
        assert lm.jit_compile is True  # "auto" is the XLA-compiled case
    history = lm.fit(x, y, batch_size=4, epochs=2, verbose=0, validation_data=(x, y))
    logs = history.history
    e = lm.config.moe.num_experts
    names = ["router_aux_loss", "router_z_loss", "dropped_tokens"]
    names += [f"expert_load_{i}" for i in range(e)]
    for name in names:
        assert name in logs and f"val_{name}" in logs, name
    load = np.array([logs[f"expert_load_{i}"][-1] for i in range(e)])
    assert_close(load.sum(), 1.0, atol=1e-5)
    assert 1.0 <= logs["router_aux_loss"][-1] * e / e  # >= its minimum (k / E * E)
    assert logs["router_aux_loss"][-1] >= lm.config.moe.num_experts_per_token - 1e-4
    assert 0.0 < logs["dropped_tokens"][-1] < 1.0  # capacity 1.0 drops some
    assert np.isfinite(logs["loss"]).all()


def test_auxiliary_loss_enters_the_training_loss_only(rng):
    lm = MixtralCausalLM.from_preset("mixtral_tiny", moe={"router_z_loss_coef": 0.01})
    x, _ = _data(rng)
    lm(x)
    assert lm.losses == []
    lm(x, training=True)
    assert len(lm.losses) == 2 * lm.config.num_layers
    moe = [b.feed_forward for b in lm.backbone.blocks]
    expected = sum(0.02 * to_numpy(m.aux_loss) + 0.01 * to_numpy(m.z_loss) for m in moe)
    assert_close(sum(to_numpy(loss) for loss in lm.losses), expected)


def test_dense_and_sparse_dispatch_models_agree(rng):
    sparse = MixtralCausalLM.from_preset("mixtral_tiny")
    dense = MixtralCausalLM.from_preset("mixtral_tiny", moe={"dispatch": "dense"})
    dense.set_weights(sparse.get_weights())
    x, _ = _data(rng)
    a, b = to_numpy(sparse(x)), to_numpy(dense(x))
    mask = x["padding_mask"]
    assert_close(a[mask], b[mask], atol=1e-5)


def test_moe_every_k_layers_and_shared_experts():
    lm = MixtralCausalLM.from_preset(
        "mixtral_tiny", num_layers=4, moe={"every_k_layers": 2, "num_shared_experts": 1}
    )
    kinds = [type(b.feed_forward) for b in lm.backbone.blocks]
    assert kinds == [FeedForward, SparseMoE, FeedForward, SparseMoE]
    trainable = sum(int(np.prod(w.shape)) for w in lm.trainable_weights)
    assert trainable == lm.config.num_params()
    assert lm.config.num_active_params() < lm.config.num_params()


def test_configuration_errors():
    with pytest.raises(ValueError, match="moe"):
        MixtralBackbone(
            vocabulary_size=64,
            num_layers=1,
            hidden_dim=16,
            num_heads=2,
            intermediate_dim=32,
        )
    with pytest.raises(ValueError, match="moe.num_experts_per_token"):
        kt.from_preset("mixtral_tiny", moe={"num_experts_per_token": 9})
    with pytest.raises(ValueError, match="moe.capacity_factor"):
        kt.from_preset("mixtral_tiny", moe={"capacity_factor": 0.0})


def test_sliding_window_generation_equals_full_forward(rng):
    """Mixtral with a 16-token window: the cache holds 16 positions and
    greedy decoding past the window equals recomputing the full forward."""
    from test_sliding_window import _reference_greedy

    lm = kt.from_preset("mixtral_tiny_sliding")
    assert to_numpy(lm.backbone.init_cache(2, 100)[0][0]).shape[1] == 16
    prompts = [rng.integers(3, 512, n).tolist() for n in (5, 20)]
    out = lm.generate(prompts, max_new_tokens=14, stop_token_ids=None)
    for row, expected in zip(out, _reference_greedy(lm, prompts, 14)):
        assert row[: len(expected)].tolist() == expected


@pytest.mark.once
def test_train_mixtral_example_runs(tmp_path):
    """examples/train_mixtral.py end to end at toy size: both models train,
    the comparison and the expert-load curve are written."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).parents[1] / "examples" / "train_mixtral.py"
    args = "--epochs 1 --steps-per-epoch 4 --max-chars 60000 --vocabulary-size 512"
    subprocess.run(
        [sys.executable, str(script), *args.split(), "--output", str(tmp_path)],
        check=True,
        env=toy_run_env(),
        capture_output=True,
    )
    results = json.loads((tmp_path / "results.json").read_text())
    for model in ("moe", "dense"):
        assert np.isfinite(results[model]["validation_perplexity"])
    moe, dense = results["moe"], results["dense"]
    assert moe["active_params"] - dense["active_params"] == 4 * 128 * 8  # routers
    assert len(moe["expert_load_curve"]["values"]) > 0
