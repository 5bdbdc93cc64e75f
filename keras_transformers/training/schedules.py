"""Learning-rate schedules for transformer training.

Both schedules are `keras.optimizers.schedules.LearningRateSchedule`s: pass
them as the `learning_rate` of any Keras optimizer. They accept the step as a
Python number or an int/float tensor (an optimizer's `iterations` variable is
int64 on some backends) and compute in float32. Step 0 always gets a learning
rate > 0, so the very first update is not wasted.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import keras
from keras import ops


def _check_int(name: str, value: Any, minimum: int) -> int:
    """Returns `value` as an int or raises naming the argument."""
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
        or value < minimum
    ):
        raise ValueError(
            f"`{name}` must be an integer >= {minimum}. Received: {name}={value!r}"
        )
    return int(value)


def _check_number(name: str, value: Any, minimum: float, strict: bool) -> float:
    """Returns `value` as a float or raises naming the argument."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    ok = ok and math.isfinite(value)
    ok = ok and (value > minimum if strict else value >= minimum)
    if not ok:
        relation = ">" if strict else ">="
        raise ValueError(
            f"`{name}` must be a finite number {relation} {minimum}. "
            f"Received: {name}={value!r}"
        )
    return float(value)


@keras.saving.register_keras_serializable(package="keras_transformers")
class WarmupCosineDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup followed by cosine decay to a floor.

    With `w = warmup_steps` and `d = decay_steps`:

    * `step < w`: `lr = peak * (step + 1) / w` (linear, > 0 at step 0,
      reaching `peak` at step `w - 1`);
    * `w <= step < d`: `lr = min + (peak - min) * 0.5 * (1 + cos(pi * p))`
      with `p = (step - w) / (d - w)` (equals `peak` at step `w`);
    * `step >= d`: `lr = min`.

    Args:
        peak_learning_rate: the largest learning rate, reached at the end of
            warmup. Must be > 0.
        warmup_steps: number of linear-warmup steps (0 disables warmup).
        decay_steps: step at which the cosine reaches `min_learning_rate`,
            counted from step 0 (so it includes the warmup). Must be
            >= `warmup_steps` and >= 1.
        min_learning_rate: the floor after decay; in `[0, peak_learning_rate]`.

    Returns:
        Calling the schedule with a step (scalar int or float, tensor or
        Python number) returns a float32 scalar tensor, shape `()`.

    Example:

    ```python
    schedule = WarmupCosineDecay(3e-4, warmup_steps=2000, decay_steps=100_000,
                                 min_learning_rate=3e-5)
    optimizer = keras.optimizers.AdamW(learning_rate=schedule)
    float(schedule(0))  # 1.5e-07
    ```
    """

    def __init__(
        self,
        peak_learning_rate: float,
        warmup_steps: int,
        decay_steps: int,
        min_learning_rate: float = 0.0,
    ) -> None:
        super().__init__()
        self.peak_learning_rate = _check_number(
            "peak_learning_rate", peak_learning_rate, 0.0, strict=True
        )
        self.warmup_steps = _check_int("warmup_steps", warmup_steps, 0)
        self.decay_steps = _check_int("decay_steps", decay_steps, 1)
        if self.decay_steps < self.warmup_steps:
            raise ValueError(
                "`decay_steps` counts from step 0 and must be >= `warmup_steps`"
                f"={self.warmup_steps}. Received: decay_steps={decay_steps!r}"
            )
        self.min_learning_rate = _check_number(
            "min_learning_rate", min_learning_rate, 0.0, strict=False
        )
        if self.min_learning_rate > self.peak_learning_rate:
            raise ValueError(
                "`min_learning_rate` must be <= `peak_learning_rate`="
                f"{self.peak_learning_rate}. "
                f"Received: min_learning_rate={min_learning_rate!r}"
            )

    def __call__(self, step: Any) -> Any:
        step = ops.cast(step, "float32")
        peak = ops.cast(self.peak_learning_rate, "float32")
        floor = ops.cast(self.min_learning_rate, "float32")
        warmup = float(self.warmup_steps)
        decay_span = float(max(self.decay_steps - self.warmup_steps, 1))
        progress = ops.clip((step - warmup) / decay_span, 0.0, 1.0)
        cosine = 0.5 * (1.0 + ops.cos(math.pi * progress))
        decayed = floor + (peak - floor) * cosine
        if self.warmup_steps == 0:
            return decayed
        warming = peak * (step + 1.0) / warmup
        return ops.where(step < warmup, warming, decayed)

    def get_config(self) -> dict[str, Any]:
        return {
            "peak_learning_rate": self.peak_learning_rate,
            "warmup_steps": self.warmup_steps,
            "decay_steps": self.decay_steps,
            "min_learning_rate": self.min_learning_rate,
        }


@keras.saving.register_keras_serializable(package="keras_transformers")
class InverseSquareRootSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """The "Attention Is All You Need" (Vaswani et al., 2017) schedule.

    `lr = scale * hidden_dim**-0.5 * min(s**-0.5, s * warmup_steps**-1.5)`
    with `s = step + 1` (so step 0 gets a learning rate > 0). It rises
    linearly for `warmup_steps` steps, peaks at `s = warmup_steps` (step
    `warmup_steps - 1`) with `scale * (hidden_dim * warmup_steps)**-0.5`, then
    decays as `1 / sqrt(s)`.

    Args:
        hidden_dim: model width `d_model`.
        warmup_steps: steps of linear warmup (paper: 4000).
        scale: a constant factor on the whole schedule (> 0).

    Returns:
        Calling the schedule with a step (scalar int or float, tensor or
        Python number) returns a float32 scalar tensor, shape `()`.

    Example:

    ```python
    schedule = InverseSquareRootSchedule(hidden_dim=512, warmup_steps=4000)
    optimizer = keras.optimizers.Adam(schedule, beta_2=0.98, epsilon=1e-9)
    float(schedule(3999))  # 512**-0.5 * 4000**-0.5 ~= 7.0e-4
    ```
    """

    def __init__(
        self, hidden_dim: int, warmup_steps: int = 4000, scale: float = 1.0
    ) -> None:
        super().__init__()
        self.hidden_dim = _check_int("hidden_dim", hidden_dim, 1)
        self.warmup_steps = _check_int("warmup_steps", warmup_steps, 1)
        self.scale = _check_number("scale", scale, 0.0, strict=True)

    def __call__(self, step: Any) -> Any:
        s = ops.cast(step, "float32") + 1.0
        rising = s * float(self.warmup_steps) ** -1.5
        falling = ops.rsqrt(s)
        factor = self.scale * float(self.hidden_dim) ** -0.5
        return factor * ops.minimum(falling, rising)

    def get_config(self) -> dict[str, Any]:
        return {
            "hidden_dim": self.hidden_dim,
            "warmup_steps": self.warmup_steps,
            "scale": self.scale,
        }
