"""Preference tuning with Direct Preference Optimization (DPO).

DPO (Rafailov et al., 2023, https://arxiv.org/abs/2305.18290) trains a
causal LM (the *policy*) on pairs of completions of one prompt, a chosen
and a rejected one, against a frozen *reference* model, with no reward
model and no sampling. With `logp(y | x)` the sum of the log-probabilities
of a completion's tokens (prompt and padding excluded), the loss of an
example is

    -log sigmoid(beta * ((pc - rc) - (pr - rr)))

where `pc`, `pr` are the policy's log-probabilities of the chosen and the
rejected completion and `rc`, `rr` the reference's. With `label_smoothing`
`e` (conservative DPO, as TRL computes it) and `d = (pc - rc) - (pr - rr)`
it is `-(1 - e) * log sigmoid(beta * d) - e * log sigmoid(-beta * d)`.

This module is the model side: sequence log-probabilities, the reference
model and `DPOModel`. The batch layout, and `preference_arrays` that
builds it, are in `keras_transformers.training.preference_data`
(`preference_arrays` is importable from here too).
"""

from __future__ import annotations

import inspect

import keras
import numpy as np
from keras import ops

from keras_transformers.backend import scale_loss_for_distribution
from keras_transformers.backend.compiled import (
    prepare_tensorflow_step,
    train_function,
)
from keras_transformers.training.preference_data import (
    INPUT_KEYS,
    REFERENCE_KEYS,
    SIDES,
    check_preference_batch,
    preference_arrays,
)

REFERENCE_MODES = ("copy", "base")


# --------------------------------------------------------------- log-probs
def completion_logps(model, token_ids, padding_mask, loss_mask, training=False):
    """Sum of the log-probabilities of the tokens where `loss_mask` is True.

    Args:
        model: a causal LM (`{"token_ids", "padding_mask"}` -> logits
            `[B, T, V]`).
        token_ids: `[B, T]` int.
        padding_mask: `[B, T]` bool, True on real tokens.
        loss_mask: `[B, T]` bool, True on the tokens that count (never
            position 0, which nothing predicts).
        training: passed to the model.

    Returns:
        `[B]` float32: `sum_t loss_mask[t] * log p(token_t | tokens_<t)`.
    """
    logits = model(
        {"token_ids": token_ids, "padding_mask": padding_mask}, training=training
    )
    logits = ops.cast(logits[:, :-1], "float32")  # [B, T-1, V]: predict 1..T-1
    targets = ops.expand_dims(ops.cast(token_ids[:, 1:], "int32"), -1)
    picked = ops.squeeze(ops.take_along_axis(logits, targets, axis=-1), -1)
    token_logps = picked - ops.logsumexp(logits, axis=-1)  # [B, T-1]
    weights = ops.cast(loss_mask[:, 1:], "float32")
    return ops.sum(token_logps * weights, axis=-1)


class CompletionScorer(keras.Model):
    """`[B, 2]` log-probabilities of the chosen and rejected completions
    under `model` (for `predict`)."""

    def __init__(self, model, **kwargs):
        super().__init__(**kwargs)
        self.scored = model
        self.built = True

    def call(self, inputs):
        return ops.stack(
            [
                completion_logps(
                    self.scored,
                    inputs[f"{side}_token_ids"],
                    inputs[f"{side}_padding_mask"],
                    inputs[f"{side}_loss_mask"],
                )
                for side in SIDES
            ],
            axis=-1,
        )


def precompute_reference_logps(reference, data: dict, batch_size: int = 8) -> dict:
    """`data` (from `preference_arrays`) plus `reference_chosen_logps` and
    `reference_rejected_logps` (`[N]` float32) under `reference`, for a
    `DPOModel` without a reference model (one model in memory while
    training). Run it before training: on the policy itself, its logps are
    then the reference's."""
    check_preference_batch(data, needs_reference=False, has_reference=False)
    inputs = {key: data[key] for key in INPUT_KEYS}
    logps = CompletionScorer(reference).predict(
        inputs, batch_size=batch_size, verbose=0
    )
    logps = np.asarray(logps, dtype="float32")
    return {**data, REFERENCE_KEYS[0]: logps[:, 0], REFERENCE_KEYS[1]: logps[:, 1]}


# ------------------------------------------------------------------- model
class DPOModel(keras.Model):
    """Direct Preference Optimization of a causal LM with `compile()` /
    `fit()`.

    `fit()` trains the trainable weights of `policy` (all of them, or only
    the LoRA adapters after `policy.enable_lora(...)`). The model's `call`
    returns the four sequence log-probabilities `[B, 4]` (policy chosen,
    policy rejected, reference chosen, reference rejected; the reference's
    without gradient); its `compute_loss` turns them into the DPO loss and
    its `compute_metrics` into the reward metrics. Keras 3 calls these two
    hooks in the train and test steps of every backend, compiled or not,
    so `fit()` needs no custom step. (A `keras.losses.Loss` taking the
    `[B, 4]` tensor as `y_pred` would give the loss too, but the reward
    metrics need the same numbers; one class keeps `beta` in one place.)
    `compile()` takes an optimizer and no loss; the MoE router losses of a
    Mixtral policy (`add_loss`) are added as in plain `fit()`.

    Metrics (in `fit()` / `evaluate()` logs, as TRL's `DPOTrainer` names
    them): `rewards/chosen` and `rewards/rejected` (mean of
    `beta * (policy - reference)` log-probabilities), `rewards/accuracies`
    (share of examples whose chosen reward is the larger),
    `rewards/margins` (mean chosen minus rejected reward),
    `logps/chosen` and `logps/rejected` (the policy's).

    Args:
        policy: the causal LM to train (`GPTCausalLM`, `MixtralCausalLM`).
        reference: where the reference log-probabilities come from:
            None (default): the batch (`reference_chosen_logps`,
            `reference_rejected_logps`; `precompute_reference_logps`);
            `"copy"`: a frozen copy of `policy` made now (twice the
            weights in memory; a LoRA policy is copied merged);
            `"base"`: `policy` itself with its LoRA adapters switched off
            (needs `policy.enable_lora(...)` first; no second copy);
            or a causal LM with the same vocabulary, set non-trainable.
        beta: the strength of the pull towards the reference (> 0).
        label_smoothing: the assumed share of flipped preferences in
            `[0, 0.5)` (conservative DPO); 0: plain DPO.
        disable_dropout: True (default, as TRL's `DPOTrainer`): set the
            rate of every Keras dropout layer of `policy` to 0 now, in
            place (the policy's config keeps its rates, so a saved preset
            does too; rebuild the policy from it for dropout again).
            Dropout would make the policy's log-probabilities noisy and
            its first rewards non-zero against an equal reference. The
            reference always runs without dropout (inference mode).

    Call arguments:
        inputs: a dict with the keys of `preference_arrays` (`[B, T]`
            each) and, without a reference model, the two
            `reference_*_logps` (`[B]`).

    Returns:
        `[B, 4]` float32 log-probabilities, columns as above.

    Save the trained policy (`policy.save_to_preset`, or
    `save_lora_weights` / `save_adapter` for an adapter), not this wrapper.

    Examples:
        >>> from keras_transformers.models import GPTCausalLM
        >>> lm = GPTCausalLM.from_preset("gpt2_tiny")
        >>> data = preference_arrays([[1, 2]] * 4, [[3, 4]] * 4, [[5]] * 4)
        >>> dpo = DPOModel(lm, reference="copy", beta=0.1)
        >>> dpo.compile(optimizer=keras.optimizers.Adam(1e-3))
        >>> history = dpo.fit(data, batch_size=4, epochs=2, verbose=0)
        >>> round(history.history["loss"][0], 4)  # log(2): policy == reference
        0.6931

    Reference:
        Rafailov et al., "Direct Preference Optimization: Your Language
        Model is Secretly a Reward Model", 2023.
    """

    def __init__(
        self,
        policy,
        reference=None,
        beta=0.1,
        label_smoothing=0.0,
        disable_dropout=True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or beta <= 0:
            raise ValueError(
                f"`beta` must be a number > 0, e.g. 0.1. Received: beta={beta!r}"
            )
        if (
            isinstance(label_smoothing, bool)
            or not isinstance(label_smoothing, (int, float))
            or not 0 <= label_smoothing < 0.5
        ):
            raise ValueError(
                "`label_smoothing` must be in [0, 0.5). "
                f"Received: label_smoothing={label_smoothing!r}"
            )
        self.beta, self.label_smoothing = float(beta), float(label_smoothing)
        self.policy = policy
        self.reference_mode = reference if isinstance(reference, str) else None
        self.reference = _reference_model(policy, reference)
        if disable_dropout:
            _disable_dropout(policy)
        names = ("rewards/chosen", "rewards/rejected", "rewards/accuracies")
        self.chosen_rewards, self.rejected_rewards, self.accuracies = (
            keras.metrics.Mean(name=name) for name in names
        )
        self.margins = keras.metrics.Mean(name="rewards/margins")
        self.chosen_logps = keras.metrics.Mean(name="logps/chosen")
        self.rejected_logps = keras.metrics.Mean(name="logps/rejected")
        self.built = True

    def compile(self, optimizer="adam", loss=None, **kwargs):
        """`keras.Model.compile` without `loss` (the DPO loss is built in)."""
        if loss is not None:
            raise ValueError(
                "DPOModel computes the DPO loss itself; compile it without "
                f"`loss`. Received: loss={loss!r}"
            )
        super().compile(optimizer=optimizer, **kwargs)

    def fit(self, *args, **kwargs):
        """`keras.Model.fit` on the batch dict alone: no `y`,
        `sample_weight` or `class_weight` (refused here: Keras would drop
        the weights of an `x` without `y` silently)."""
        _refuse_targets_of(keras.Model.fit, self, args, kwargs)
        return super().fit(*args, **kwargs)

    def evaluate(self, *args, **kwargs):
        """`keras.Model.evaluate` on the batch dict alone (as `fit`)."""
        _refuse_targets_of(keras.Model.evaluate, self, args, kwargs)
        return super().evaluate(*args, **kwargs)

    def make_train_function(self, force=False):
        """Keras' train function; compiled PyTorch and TensorFlow steps as
        for the package's models (`keras_transformers.backend.compiled`)."""
        prepare_tensorflow_step(self)
        function = train_function(self, force)
        return super().make_train_function(force) if function is None else function

    def call(self, inputs, training=None):
        needs_reference = self.reference is None and self.reference_mode != "base"
        check_preference_batch(
            inputs, needs_reference, has_reference=not needs_reference
        )
        token_ids, padding, loss_mask = (
            ops.concatenate([inputs[f"chosen_{p}"], inputs[f"rejected_{p}"]], axis=0)
            for p in ("token_ids", "padding_mask", "loss_mask")
        )  # [2B, T]: chosen rows then rejected rows
        policy = completion_logps(self.policy, token_ids, padding, loss_mask, training)
        if needs_reference:
            reference = ops.concatenate(
                [ops.cast(inputs[key], "float32") for key in REFERENCE_KEYS], axis=0
            )
        elif self.reference is not None:
            reference = completion_logps(self.reference, token_ids, padding, loss_mask)
        else:  # "base": the policy without its adapters
            with adapters_off(self.policy):
                reference = completion_logps(self.policy, token_ids, padding, loss_mask)
        reference = ops.stop_gradient(reference)
        pc, pr = ops.split(policy, 2)
        rc, rr = ops.split(reference, 2)
        return ops.stack([pc, pr, rc, rr], axis=-1)  # [B, 4]

    def _rewards(self, y_pred):
        """`[B]` chosen and rejected rewards `beta * (policy - reference)`."""
        y_pred = ops.cast(y_pred, "float32")
        chosen = self.beta * (y_pred[:, 0] - y_pred[:, 2])
        rejected = self.beta * (y_pred[:, 1] - y_pred[:, 3])
        return chosen, rejected

    def compute_loss(
        self, x=None, y=None, y_pred=None, sample_weight=None, training=True
    ):
        """Mean DPO loss over the batch, plus the policy's `add_loss` terms."""
        _refuse_targets(y, sample_weight)  # from a dataset's (x, y, w) tuples
        chosen, rejected = self._rewards(y_pred)
        logits = chosen - rejected  # beta * ((pc - rc) - (pr - rr))
        losses = -ops.log_sigmoid(logits)
        if self.label_smoothing:
            e = self.label_smoothing
            losses = (1 - e) * losses - e * ops.log_sigmoid(-logits)
        loss = scale_loss_for_distribution(ops.mean(losses))
        for extra in self.losses:  # `add_loss` terms (MoE router losses)
            loss = loss + ops.cast(self._aggregate_additional_loss(extra), "float32")
        return loss

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        """Updates the reward metrics, then Keras' (the loss tracker)."""
        chosen, rejected = self._rewards(y_pred)
        self.chosen_rewards.update_state(chosen)
        self.rejected_rewards.update_state(rejected)
        self.accuracies.update_state(ops.cast(ops.greater(chosen, rejected), "float32"))
        self.margins.update_state(chosen - rejected)
        self.chosen_logps.update_state(ops.cast(y_pred[:, 0], "float32"))
        self.rejected_logps.update_state(ops.cast(y_pred[:, 1], "float32"))
        return super().compute_metrics(x, y, y_pred, sample_weight)


def _refuse_targets(y=None, sample_weight=None, class_weight=None):
    """Raises ValueError naming the fix for a `y` or example weights."""
    if y is not None:
        raise ValueError(
            "DPOModel takes no `y`: pass the dict of `preference_arrays` "
            "alone as `x` to fit() / evaluate() (a dataset yields the dict "
            "alone, not an (x, y) pair)."
        )
    if sample_weight is not None or class_weight is not None:
        raise ValueError(
            "DPOModel does not weigh examples (its loss is the plain mean "
            "over the batch): pass no `sample_weight` or `class_weight` to "
            "fit() / evaluate(). To weigh an example more or less, repeat it "
            "in the data or leave it out."
        )


def _refuse_targets_of(method, model, args, kwargs):
    """`_refuse_targets` on the arguments of a `fit` / `evaluate` call,
    `validation_data` included."""
    bound = inspect.signature(method).bind(model, *args, **kwargs).arguments
    _refuse_targets(
        bound.get("y"), bound.get("sample_weight"), bound.get("class_weight")
    )
    validation = bound.get("validation_data")
    if isinstance(validation, tuple):  # (x, y) or (x, y, sample_weight)
        _refuse_targets(*validation[1:3])


# --------------------------------------------------------------- reference
def _vocabulary_size(model):
    config = getattr(getattr(model, "backbone", None), "config", None)
    return getattr(config, "vocabulary_size", None)


def _reference_model(policy, reference):
    """The frozen reference model of `DPOModel` (None: batch or "base")."""
    if reference is None:
        return None
    if isinstance(reference, str):
        if reference not in REFERENCE_MODES:
            raise ValueError(
                f"`reference` must be None, 'copy', 'base' or a model. Received: "
                f"reference={reference!r}"
            )
        if reference == "base":
            if getattr(policy, "_lora_state", None) is None:
                raise ValueError(
                    "reference='base' is the policy with its LoRA adapters off: "
                    "call `policy.enable_lora(...)` first, or use reference='copy'."
                )
            return None
        reference = copy_model(policy)
    if reference is policy:
        raise ValueError(
            "`reference` is the policy itself, whose weights train: pass "
            "reference='copy' for a frozen copy (or 'base' with LoRA)."
        )
    if not isinstance(reference, keras.Model):
        raise ValueError(
            f"`reference` must be None, 'copy', 'base' or a keras.Model. "
            f"Received: {type(reference).__name__}"
        )
    ours, theirs = _vocabulary_size(policy), _vocabulary_size(reference)
    if ours is not None and theirs is not None and ours != theirs:
        raise ValueError(
            f"The reference model's vocabulary ({theirs} tokens) differs from the "
            f"policy's ({ours}): both must score the same token ids."
        )
    reference.trainable = False
    return reference


def _disable_dropout(model):
    """Sets `rate = 0` on every Keras dropout layer of `model`, in place
    (their `call` then returns the input, in training too)."""
    kinds = (
        keras.layers.Dropout,
        keras.layers.GaussianDropout,
        keras.layers.AlphaDropout,
    )
    for layer in model._flatten_layers():
        if isinstance(layer, kinds):
            layer.rate = 0.0


def copy_model(model):
    """A new model of `model`'s class and config with its current weights
    (LoRA adapters merged in)."""
    clone = type(model).from_config(model.get_config())
    ours = list(model._flatten_layers())
    theirs = list(clone._flatten_layers())
    if len(ours) != len(theirs):
        raise ValueError(
            f"Cannot copy {type(model).__name__}: its layers differ from a fresh build."
        )
    for source, target in zip(ours, theirs):
        store = {}
        source.save_own_variables(store)  # a LoRA layer stores its merged kernel
        if store:  # host copies: the two models must not share buffers
            target.load_own_variables(
                {key: ops.convert_to_numpy(value) for key, value in store.items()}
            )
    return clone


class adapters_off:
    """Context manager: `model`'s LoRA layers compute without their
    adapters (`W` instead of `W + (alpha / rank) * A @ B`) inside it."""

    def __init__(self, model):
        self.layers = model._lora_state.layers

    def __enter__(self):
        for layer in self.layers:
            layer.lora_enabled = False

    def __exit__(self, *exc):
        for layer in self.layers:
            layer.lora_enabled = True


__all__ = [
    "DPOModel",
    "completion_logps",
    "precompute_reference_logps",
    "preference_arrays",
]
