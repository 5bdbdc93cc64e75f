"""Adam and AdamW updating in place on PyTorch, the optimizer of "Attention
Is All You Need" in one call, and learning rate schedules under gradient
accumulation.

Gradient accumulation is Keras' own: `gradient_accumulation_steps=k` on any
Keras optimizer averages the gradients of k calls (micro-batches; with
`fit`, k batches) and updates the weights on every k-th. Keras counts
micro-steps in its private `_iterations` and exposes
`optimizer.iterations = _iterations // k` (real updates, which Adam's bias
correction uses), but it calls a learning-rate schedule with the micro-step
count: warmup would end k times too early. `PerUpdateSchedule` (which
`transformer_adam(..., gradient_accumulation_steps=k)` applies itself) feeds
the schedule the update count instead.
"""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from keras_transformers.backend.choices import optimizer_updates_in_place
from keras_transformers.backend.compiled import run_eagerly
from keras_transformers.backend.optimizer import adam_update
from keras_transformers.training.schedules import InverseSquareRootSchedule

# Section 5.3 of Vaswani et al. (2017).
PAPER_ADAM = {"beta_1": 0.9, "beta_2": 0.98, "epsilon": 1e-9}


class _InPlaceUpdate:
    """Keras' Adam update for all variables at once, in place on PyTorch
    (see `Adam`)."""

    def apply(self, grads, trainable_variables=None):
        """Keras' `apply`; under `torch.compile` (PyTorch, `jit_compile=True`)
        it runs outside the compiled graph, as `torch.optim` updates do:
        compiling the update of every variable took 106 of the 237 s that
        GPT-2 small's first compiled training step took on a 2-core CPU,
        for an update that runs as a few multi-tensor kernels anyway."""
        return run_eagerly(super().apply, grads, trainable_variables)

    def build(self, variables):
        super().build(variables)
        # Keras decides per variable whether weight decay applies on the
        # first update and caches it on the optimizer; deciding here, before
        # any update, spares a `torch.compile`d train step the recompile
        # that the cache's appearance triggers at its second step.
        for variable in variables:
            self._use_weight_decay(variable)

    def _in_place(self):
        return not self.amsgrad and optimizer_updates_in_place()

    def _apply_weight_decay(self, variables):
        if not self._in_place():  # else `adam_update` decays with the update
            super()._apply_weight_decay(variables)

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        if not self._in_place():
            return super()._backend_update_step(
                grads, trainable_variables, learning_rate
            )
        slots = [self._get_variable_index(v) for v in trainable_variables]
        rate = self.weight_decay or 0.0
        adam_update(
            trainable_variables,
            grads,
            [self._momentums[i] for i in slots],
            [self._velocities[i] for i in slots],
            learning_rate,
            self.iterations + 1,
            (self.beta_1, self.beta_2),
            self.epsilon,
            [rate if self._use_weight_decay(v) else 0.0 for v in trainable_variables],
        )


@keras.saving.register_keras_serializable(package="keras_transformers")
class Adam(_InPlaceUpdate, keras.optimizers.Adam):
    """`keras.optimizers.Adam` (same arguments, math, state and saved
    config) whose PyTorch update runs in place.

    Keras' PyTorch Adam allocates five temporaries the size of each
    variable per step, and on a CPU every one is a fresh allocation that
    the kernel page-faults in. This one (`backend.optimizer.adam_update`)
    runs PyTorch's fused Adam kernel on a CPU, one pass over each variable
    and its two slots with the weight decay folded in (BERT-base, 109M
    weights, on a 2-core CPU: 0.15 s per update against Keras' 1.55 s and
    `torch.optim.AdamW`'s default 0.51 s), and multi-tensor kernels on a
    GPU (one launch per operation for all variables). Other backends, and
    `amsgrad=True`, use Keras' update unchanged (XLA fuses it). Results
    agree with Keras' to float32 rounding.
    """


@keras.saving.register_keras_serializable(package="keras_transformers")
class AdamW(_InPlaceUpdate, keras.optimizers.AdamW):
    """`keras.optimizers.AdamW` whose PyTorch update runs in place (see
    `Adam`); the decoupled weight decay is Keras' own (in place already).

    Examples:
        >>> optimizer = AdamW(learning_rate=1e-3, weight_decay=0.01)
        >>> optimizer.weight_decay
        0.01
    """


def transformer_adam(
    hidden_dim: int, warmup_steps: int = 4000, scale: float = 1.0, **kwargs: Any
) -> keras.optimizers.Adam:
    """Adam with the paper's betas, epsilon and inverse-square-root warmup.

    Returns `Adam(learning_rate=InverseSquareRootSchedule(
    hidden_dim, warmup_steps, scale), beta_1=0.9, beta_2=0.98, epsilon=1e-9)`
    (Vaswani et al. 2017, section 5.3). The learning rate at optimizer step
    `t` (0-based `optimizer.iterations`) is
    `scale * hidden_dim**-0.5 * min(s**-0.5, s * warmup_steps**-1.5)` with
    `s = t + 1`, the paper's 1-based `step_num`.

    Args:
        hidden_dim: model width `d_model` (paper: 512 base, 1024 big).
        warmup_steps: linear warmup steps (paper: 4000).
        scale: constant factor on the learning rate (> 0).
        **kwargs: further `keras.optimizers.Adam` arguments (e.g.
            `clipnorm`, `weight_decay`), which may also override `beta_1`,
            `beta_2` or `epsilon`. `learning_rate` is not accepted. With
            `gradient_accumulation_steps=k` the schedule counts real updates
            (see `PerUpdateSchedule`).

    Returns:
        This module's `Adam` (a `keras.optimizers.Adam` updating in place on
        PyTorch); it serializes with the model (it and the schedule are
        registered under "keras_transformers").

    Examples:
        >>> optimizer = transformer_adam(hidden_dim=512)
        >>> optimizer.beta_2, optimizer.epsilon
        (0.98, 1e-09)
        >>> round(float(optimizer.learning_rate), 10)  # 512**-0.5 * 4000**-1.5
        1.747e-07
    """
    steps = kwargs.get("gradient_accumulation_steps")
    if "learning_rate" in kwargs:
        raise ValueError(
            "`transformer_adam` sets the learning rate from `hidden_dim`, "
            "`warmup_steps` and `scale`. Received: "
            f"learning_rate={kwargs['learning_rate']!r}"
        )
    schedule = InverseSquareRootSchedule(
        hidden_dim=hidden_dim, warmup_steps=warmup_steps, scale=scale
    )
    if steps:
        schedule = PerUpdateSchedule(schedule, steps)
    return Adam(learning_rate=schedule, **{**PAPER_ADAM, **kwargs})


@keras.saving.register_keras_serializable(package="keras_transformers")
class PerUpdateSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """`schedule` advanced once per weight update under gradient accumulation.

    Keras calls a schedule with its micro-step counter; this wrapper calls
    `schedule(step // gradient_accumulation_steps)`, so step `u` of the
    schedule is the `u`-th real update (`optimizer.iterations`).

    Args:
        schedule: a `LearningRateSchedule` (e.g. `WarmupCosineDecay`).
        gradient_accumulation_steps: the optimizer's
            `gradient_accumulation_steps` (an integer >= 1).

    Example:

    ```python
    schedule = WarmupCosineDecay(3e-4, warmup_steps=100, decay_steps=1000)
    optimizer = keras.optimizers.AdamW(
        PerUpdateSchedule(schedule, 4), gradient_accumulation_steps=4
    )
    ```
    """

    def __init__(self, schedule, gradient_accumulation_steps: int) -> None:
        if isinstance(schedule, dict):
            schedule = keras.saving.deserialize_keras_object(schedule)
        if not isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
            raise TypeError(
                "`schedule` must be a keras.optimizers.schedules."
                f"LearningRateSchedule. Received: {type(schedule).__name__}"
            )
        steps = gradient_accumulation_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(
                "`gradient_accumulation_steps` must be an integer >= 1. "
                f"Received: gradient_accumulation_steps={steps!r}"
            )
        self.schedule = schedule
        self.gradient_accumulation_steps = steps

    def __call__(self, step: Any) -> Any:
        return self.schedule(ops.floor_divide(step, self.gradient_accumulation_steps))

    def get_config(self) -> dict[str, Any]:
        return {
            "schedule": keras.saving.serialize_keras_object(self.schedule),
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
        }
