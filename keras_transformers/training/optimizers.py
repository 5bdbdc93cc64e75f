"""The optimizer of "Attention Is All You Need" in one call."""

from __future__ import annotations

from typing import Any

import keras

from keras_transformers.training.schedules import InverseSquareRootSchedule

# Section 5.3 of Vaswani et al. (2017).
PAPER_ADAM = {"beta_1": 0.9, "beta_2": 0.98, "epsilon": 1e-9}


def transformer_adam(
    hidden_dim: int, warmup_steps: int = 4000, scale: float = 1.0, **kwargs: Any
) -> keras.optimizers.Adam:
    """Adam with the paper's betas, epsilon and inverse-square-root warmup.

    Returns `keras.optimizers.Adam(learning_rate=InverseSquareRootSchedule(
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
            `beta_2` or `epsilon`. `learning_rate` is not accepted.

    Returns:
        A `keras.optimizers.Adam`; it serializes with the model (the schedule
        is registered under "keras_transformers").

    Example:

    >>> optimizer = transformer_adam(hidden_dim=512)
    >>> optimizer.beta_2, optimizer.epsilon
    (0.98, 1e-09)
    >>> round(float(optimizer.learning_rate), 10)  # 512**-0.5 * 4000**-1.5
    1.747e-07
    """
    if "learning_rate" in kwargs:
        raise ValueError(
            "`transformer_adam` sets the learning rate from `hidden_dim`, "
            "`warmup_steps` and `scale`. Received: "
            f"learning_rate={kwargs['learning_rate']!r}"
        )
    schedule = InverseSquareRootSchedule(
        hidden_dim=hidden_dim, warmup_steps=warmup_steps, scale=scale
    )
    return keras.optimizers.Adam(learning_rate=schedule, **{**PAPER_ADAM, **kwargs})
