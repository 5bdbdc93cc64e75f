"""Tests for DPO preference tuning (`keras_transformers.training.preference`):
the data layout, the loss and reward metrics against a NumPy reference,
learning toy preferences with `fit()` (compiled or not, LoRA), and errors.
"""

import math

import keras
import numpy as np
import pytest
from contracts import to_numpy, without_inductor

from keras_transformers.models import GPTCausalLM, MixtralCausalLM
from keras_transformers.training import (
    DPOModel,
    completion_logps,
    precompute_reference_logps,
    preference_arrays,
)
from keras_transformers.training.preference import copy_model

CHOSEN, REJECTED = [5, 6, 5, 6], [7, 8, 7]  # the toy preference


def tiny_lm(**overrides):
    return GPTCausalLM.from_preset("gpt2_tiny", num_layers=1, **overrides)


def toy_data(n=8, seed=0, max_length=None):
    """Prompts of 1-4 random tokens; chosen completions one fixed pattern,
    rejected another (shorter: padded)."""
    rng = np.random.default_rng(seed)
    prompts = [list(rng.integers(10, 500, size=rng.integers(1, 5))) for _ in range(n)]
    return preference_arrays(prompts, [CHOSEN] * n, [REJECTED] * n, max_length)


# ------------------------------------------------------------- references
def np_completion_logps(logits, token_ids, loss_mask):
    """`[B]` float64 sum of log p(token_t | tokens_<t) where loss_mask[t]."""
    logits = np.asarray(logits, dtype=np.float64)[:, :-1]
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    picked = np.take_along_axis(log_probs, token_ids[:, 1:, None], -1)[..., 0]
    return (picked * loss_mask[:, 1:]).sum(-1)


def np_logps(model, data, side):
    logits = to_numpy(
        model(
            {
                "token_ids": data[f"{side}_token_ids"],
                "padding_mask": data[f"{side}_padding_mask"],
            }
        )
    )
    return np_completion_logps(
        logits, data[f"{side}_token_ids"], data[f"{side}_loss_mask"]
    )


def log_sigmoid(x):
    return -np.logaddexp(0.0, -x)


# ------------------------------------------------------------------- data
def test_preference_arrays_layout_truncation_and_errors():
    data = preference_arrays(
        [[1, 2, 3, 4], [9]], [[5, 6], [7, 7, 7, 7]], [[8], [6, 6]], max_length=5
    )
    assert sorted(data) == sorted(
        f"{s}_{p}"
        for s in ("chosen", "rejected")
        for p in ("token_ids", "padding_mask", "loss_mask")
    )
    assert data["chosen_token_ids"].dtype == np.int32
    np.testing.assert_array_equal(
        data["chosen_token_ids"], [[1, 2, 3, 4, 5], [9, 7, 7, 7, 7]]
    )  # the first chosen completion loses its end
    np.testing.assert_array_equal(
        data["chosen_loss_mask"], [[0, 0, 0, 0, 1], [0, 1, 1, 1, 1]]
    )
    np.testing.assert_array_equal(
        data["rejected_token_ids"], [[1, 2, 3, 4, 8], [9, 6, 6, 0, 0]]
    )
    np.testing.assert_array_equal(
        data["rejected_padding_mask"], [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    )
    np.testing.assert_array_equal(
        data["rejected_loss_mask"], [[0, 0, 0, 0, 1], [0, 1, 1, 0, 0]]
    )
    # max_prompt_length keeps a prompt's last tokens; no max_length: longest.
    data = preference_arrays(
        [[1, 2, 3]], [[4]], [[5, 6]], max_prompt_length=2, pad_token_id=9
    )
    np.testing.assert_array_equal(data["chosen_token_ids"], [[2, 3, 4, 9]])
    np.testing.assert_array_equal(data["rejected_loss_mask"], [[0, 0, 1, 1]])
    with pytest.raises(ValueError, match="leaves no room for the chosen completion"):
        preference_arrays([[1, 2, 3]], [[4]], [[5]], max_length=3)
    with pytest.raises(ValueError, match="empty prompt"):
        preference_arrays([[]], [[4]], [[5]])
    with pytest.raises(ValueError, match="empty rejected completion"):
        preference_arrays([[1]], [[4]], [[]])
    with pytest.raises(ValueError, match="one entry per example"):
        preference_arrays([[1], [2]], [[4]], [[5]])
    with pytest.raises(ValueError, match="max_length=0"):
        preference_arrays([[1]], [[4]], [[5]], max_length=0)


# ------------------------------------------------------- loss and metrics
def test_loss_and_metrics_match_numpy():
    """Policy and reference differ (two random inits), so rewards are not 0;
    the NumPy reference sums log-probs over completion tokens only."""
    policy = tiny_lm()
    keras.utils.set_random_seed(7)
    reference = tiny_lm()
    data = toy_data(n=4)
    beta, smoothing = 0.5, 0.1
    dpo = DPOModel(policy, reference=reference, beta=beta, label_smoothing=smoothing)
    got = to_numpy(dpo(data))  # [B, 4]
    pc, pr = np_logps(policy, data, "chosen"), np_logps(policy, data, "rejected")
    rc, rr = np_logps(reference, data, "chosen"), np_logps(reference, data, "rejected")
    np.testing.assert_allclose(
        got, np.stack([pc, pr, rc, rr], -1), rtol=1e-4, atol=1e-4
    )
    # Prompt and padding tokens excluded: the log-prob of all real tokens differs.
    everything = data["chosen_padding_mask"]
    logits = to_numpy(policy({"token_ids": data["chosen_token_ids"]}))
    assert not np.allclose(
        np_completion_logps(logits, data["chosen_token_ids"], everything), pc, atol=1e-3
    )
    chosen, rejected = beta * (pc - rc), beta * (pr - rr)
    margin = chosen - rejected
    loss = -(1 - smoothing) * log_sigmoid(margin) - smoothing * log_sigmoid(-margin)
    dpo.compile(optimizer="sgd")
    logs = dpo.evaluate(data, batch_size=4, verbose=0, return_dict=True)
    want = {
        "loss": loss.mean(),
        "rewards/chosen": chosen.mean(),
        "rewards/rejected": rejected.mean(),
        "rewards/margins": margin.mean(),
        "rewards/accuracies": (chosen > rejected).mean(),
        "logps/chosen": pc.mean(),
        "logps/rejected": pr.mean(),
    }
    assert sorted(logs) == sorted(want)
    for key, value in want.items():
        np.testing.assert_allclose(logs[key], value, rtol=1e-4, atol=1e-5, err_msg=key)
    # completion_logps alone gives the same numbers.
    alone = completion_logps(
        policy,
        data["chosen_token_ids"],
        data["chosen_padding_mask"],
        data["chosen_loss_mask"],
    )
    np.testing.assert_allclose(to_numpy(alone), pc, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------ fit()
def test_fit_learns_toy_preferences_with_a_frozen_copy():
    policy = tiny_lm()
    dpo = DPOModel(policy, reference="copy", beta=0.5)
    reference_weights = [to_numpy(w) for w in dpo.reference.weights]
    assert dpo.reference.trainable_weights == []
    dpo.compile(optimizer=keras.optimizers.Adam(1e-2))
    history = dpo.fit(toy_data(), batch_size=4, epochs=3, verbose=0).history
    assert history["rewards/margins"][-1] > history["rewards/margins"][0] + 1.0
    assert history["loss"][-1] < 0.5 * history["loss"][0]
    assert history["rewards/accuracies"][-1] == 1.0
    for before, after in zip(reference_weights, dpo.reference.weights):
        np.testing.assert_array_equal(before, to_numpy(after))


def no_inductor(jit_compile, monkeypatch):
    """Compiled steps on PyTorch through Dynamo and AOTAutograd without
    Inductor's code generation (`contracts.without_inductor`): the same
    graphs and guards; `tests/test_compiled.py` covers Inductor."""
    if jit_compile and keras.config.backend() == "torch":
        without_inductor(monkeypatch)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_precomputed_reference_starts_at_log_2(jit_compile, monkeypatch):
    no_inductor(jit_compile, monkeypatch)
    policy = tiny_lm()
    data = precompute_reference_logps(policy, toy_data(n=4))
    assert data["reference_chosen_logps"].shape == (4,)
    np.testing.assert_allclose(
        data["reference_chosen_logps"], np_logps(policy, data, "chosen"), rtol=1e-4
    )
    dpo = DPOModel(policy, beta=0.1)
    dpo.compile(optimizer=keras.optimizers.SGD(0.5), jit_compile=jit_compile)
    history = dpo.fit(data, batch_size=4, epochs=2, verbose=0).history
    np.testing.assert_allclose(history["loss"][0], math.log(2), rtol=1e-5)
    assert history["rewards/margins"][0] == pytest.approx(0.0, abs=1e-5)
    assert history["loss"][1] < history["loss"][0]  # the step moved the policy


@pytest.mark.parametrize("jit_compile", [False, True])
def test_lora_policy_against_its_base(jit_compile, monkeypatch):
    no_inductor(jit_compile, monkeypatch)
    policy = tiny_lm()
    base = copy_model(policy)  # the weights before LoRA
    policy.enable_lora(2, target=("query", "value"))
    frozen = [to_numpy(w) for w in policy.non_trainable_weights]
    dpo = DPOModel(policy, reference="base", beta=0.5)
    assert dpo.reference is None
    dpo.compile(optimizer=keras.optimizers.Adam(2e-2), jit_compile=jit_compile)
    graphs, callbacks = [], []  # on PyTorch, the graphs compiled after each step
    if keras.config.backend() == "torch":
        from torch._dynamo.utils import counters

        callbacks.append(
            keras.callbacks.LambdaCallback(
                on_train_batch_end=lambda batch, logs: graphs.append(
                    counters["stats"]["unique_graphs"]
                )
            )
        )
    history = dpo.fit(
        toy_data(), batch_size=8, epochs=3, verbose=0, callbacks=callbacks
    ).history
    if jit_compile and keras.config.backend() == "torch":
        # The DPO model is never called before its first compiled step:
        # `torch.compile` compiles its graphs then, and no step compiles
        # again (three epochs of one step).
        assert len(graphs) == 3 and len(set(graphs)) == 1, graphs
    # Fresh adapters (B = 0): the first step's policy is its base.
    np.testing.assert_allclose(history["loss"][0], math.log(2), rtol=1e-5)
    assert history["rewards/margins"][-1] > history["rewards/margins"][0]
    unseen = dpo.evaluate(toy_data(seed=1), verbose=0, return_dict=True)
    assert unseen["rewards/margins"] > 0
    for before, after in zip(frozen, policy.non_trainable_weights):
        np.testing.assert_array_equal(before, to_numpy(after))
    # The reference columns are the base model's log-probs (adapters off).
    data = toy_data(n=2)
    got = to_numpy(dpo(data))
    np.testing.assert_allclose(got[:, 2], np_logps(base, data, "chosen"), rtol=1e-4)
    assert all(layer.lora_enabled for layer in policy._lora_state.layers)


def test_lora_policy_copied_reference_is_merged():
    policy = tiny_lm()
    policy.enable_lora(2, target=("query", "value"))
    layer = policy._lora_state.layers[0]
    layer.lora_kernel_b.assign(np.full(layer.lora_kernel_b.shape, 0.3, "float32"))
    dpo = DPOModel(policy, reference="copy")
    data = toy_data(n=2)
    np.testing.assert_allclose(
        np_logps(dpo.reference, data, "chosen"),
        np_logps(policy, data, "chosen"),
        rtol=1e-4,
    )


def test_mixtral_policy_adds_its_router_loss():
    policy = MixtralCausalLM.from_preset("mixtral_tiny", num_layers=1)
    data = precompute_reference_logps(policy, toy_data(n=4))
    dpo = DPOModel(policy, beta=0.1)
    dpo.compile(optimizer=keras.optimizers.SGD(0.1))
    loss = dpo.fit(data, batch_size=4, epochs=1, verbose=0).history["loss"][0]
    assert loss > math.log(2) + 1e-4  # DPO's log(2) plus the load-balancing loss


# ---------------------------------------------------------------- dropout
@pytest.mark.parametrize("disable_dropout", [True, False])
def test_disable_dropout_makes_training_passes_deterministic(disable_dropout):
    policy = tiny_lm(dropout=0.3, attention_dropout=0.3)
    dpo = DPOModel(policy, reference="copy", disable_dropout=disable_dropout)
    data = toy_data(n=2)
    first, second = (
        float(to_numpy(dpo.compute_loss(y_pred=dpo(data, training=True))))
        for _ in range(2)
    )
    if disable_dropout:  # the policy equals its copy: the loss is log(2)
        assert first == second
        np.testing.assert_allclose(first, math.log(2), rtol=1e-5)
    else:
        assert first != second


# ----------------------------------------------------------------- errors
def test_y_and_sample_weight_are_refused_naming_the_fix():
    data = toy_data(n=2)
    dpo = DPOModel(tiny_lm(), reference="copy")
    dpo.compile(optimizer="sgd")
    with pytest.raises(ValueError, match="repeat it in the data or leave it out"):
        dpo.fit(data, sample_weight=np.ones(2), batch_size=2, verbose=0)
    with pytest.raises(ValueError, match="no `sample_weight`"):
        dpo.evaluate(data, sample_weight=np.ones(2), batch_size=2, verbose=0)
    with pytest.raises(ValueError, match="no `sample_weight` or `class_weight`"):
        dpo.fit(data, class_weight={0: 1.0}, verbose=0)
    with pytest.raises(ValueError, match="no `sample_weight`"):
        dpo.fit(data, epochs=1, validation_data=(data, None, np.ones(2)), verbose=0)
    with pytest.raises(ValueError, match="alone as `x`"):
        dpo.fit(data, np.zeros(2), batch_size=2, verbose=0)
    # A dataset's (x, y, sample_weight) batches reach compute_loss.
    batches = ((data, None, np.ones(2, "float32")) for _ in range(1))
    with pytest.raises(ValueError, match="repeat it in the data"):
        dpo.fit(batches, shuffle=False, verbose=0)


def test_clear_errors():
    policy = tiny_lm()
    data = toy_data(n=2)
    with pytest.raises(ValueError, match="beta"):
        DPOModel(policy, reference="copy", beta=0)
    with pytest.raises(ValueError, match="label_smoothing"):
        DPOModel(policy, reference="copy", label_smoothing=0.5)
    with pytest.raises(ValueError, match="vocabulary"):
        DPOModel(policy, reference=tiny_lm(vocabulary_size=300))
    with pytest.raises(ValueError, match="enable_lora"):
        DPOModel(policy, reference="base")
    with pytest.raises(ValueError, match="policy itself"):
        DPOModel(policy, reference=policy)
    with pytest.raises(ValueError, match="'copy', 'base'"):
        DPOModel(policy, reference="frozen")
    dpo = DPOModel(policy)
    with pytest.raises(ValueError, match="reference_chosen_logps.*precompute"):
        dpo(data)
    with pytest.raises(ValueError, match="without `loss`"):
        dpo.compile(optimizer="sgd", loss="mse")
    with_copy = DPOModel(policy, reference="copy")
    missing = {k: v for k, v in data.items() if k != "rejected_loss_mask"}
    with pytest.raises(ValueError, match=r"lacks \['rejected_loss_mask'\]"):
        with_copy(missing)
    short = {**data, "rejected_token_ids": data["rejected_token_ids"][:, :-1]}
    with pytest.raises(ValueError, match="`rejected_token_ids` has shape"):
        with_copy(short)
    with pytest.raises(ValueError, match="has a reference model"):
        with_copy(precompute_reference_logps(policy, data))
    bad = precompute_reference_logps(policy, data)
    bad["reference_chosen_logps"] = bad["reference_chosen_logps"][:1]
    with pytest.raises(ValueError, match="`reference_chosen_logps` has shape"):
        dpo(bad)
