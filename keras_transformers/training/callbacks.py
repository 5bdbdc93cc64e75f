"""Training throughput and model-FLOPs-utilisation (MFU) measurement.

`training_flops_per_token` lives in `keras_transformers.memory` (with the
memory estimator) and is re-exported here.
"""

from __future__ import annotations

import numbers
import time
from typing import Any

import keras

from keras_transformers.memory import training_flops_per_token


def _positive(name: str, value: Any, integer: bool) -> Any:
    kind = numbers.Integral if integer else numbers.Real
    if isinstance(value, bool) or not isinstance(value, kind) or not value > 0:
        what = "a positive integer" if integer else "a positive number"
        raise ValueError(f"`{name}` must be {what}. Received: {name}={value!r}")
    return int(value) if integer else float(value)


@keras.saving.register_keras_serializable(package="keras_transformers")
class ThroughputCallback(keras.callbacks.Callback):
    """Adds `tokens_per_second` (and `mfu`) to the epoch logs.

    The wall time of every training batch is measured from
    `on_train_batch_begin` to `on_train_batch_end`. Keras turns the batch's
    logs into Python floats before `on_train_batch_end`, which waits for the
    device, so asynchronous dispatch (JAX, TF) does not hide work. The first
    `warmup_batches` batches of the run (tracing / compilation) are not
    measured. At the end of each epoch the callback writes

    * `tokens_per_second` = measured tokens / measured seconds, and
    * `mfu` = `tokens_per_second * flops_per_token / peak_flops` (only when
      both are given),

    into the epoch `logs`, so they appear in `History` (pass this callback in
    `callbacks=[...]`; Keras adds its `History` after user callbacks). An
    epoch with no measured batch gets no entry. With `steps_per_execution >
    1`, each callback batch counts as that many steps. `tokens_per_step` is
    assumed constant, so a smaller final batch is over-counted; use
    `drop_remainder` or full batches for exact figures.

    Args:
        tokens_per_step: tokens processed per optimizer step (global batch
            size times sequence length). Give this or both `batch_size` and
            `sequence_length`.
        flops_per_token: training FLOPs per token, e.g. from
            `training_flops_per_token(config, sequence_length)`.
        peak_flops: the accelerators' peak FLOP/s (e.g. 989e12 for one H100
            SXM in bf16 dense), summed over devices.
        log_every: if > 0, print the running throughput every `log_every`
            measured batches.
        batch_size: sequences per step (with `sequence_length`).
        sequence_length: tokens per sequence (with `batch_size`).
        warmup_batches: number of first batches of the run left unmeasured.

    Returns:
        A `keras.callbacks.Callback`; epoch logs gain `tokens_per_second`
        (float) and, when configured, `mfu` (float, a fraction of 1).

    Example:

    ```python
    callback = ThroughputCallback(
        batch_size=32, sequence_length=1024,
        flops_per_token=training_flops_per_token(config, 1024),
        peak_flops=989e12,
    )
    history = model.fit(dataset, epochs=3, callbacks=[callback])
    history.history["tokens_per_second"], history.history["mfu"]
    ```
    """

    def __init__(
        self,
        tokens_per_step: int | None = None,
        flops_per_token: float | None = None,
        peak_flops: float | None = None,
        log_every: int = 0,
        batch_size: int | None = None,
        sequence_length: int | None = None,
        warmup_batches: int = 1,
    ) -> None:
        super().__init__()
        if tokens_per_step is None:
            if batch_size is None or sequence_length is None:
                raise ValueError(
                    "Pass `tokens_per_step`, or both `batch_size` and "
                    "`sequence_length`. Received: tokens_per_step=None, "
                    f"batch_size={batch_size!r}, sequence_length={sequence_length!r}"
                )
            batch_size = _positive("batch_size", batch_size, integer=True)
            sequence_length = _positive("sequence_length", sequence_length, True)
            tokens_per_step = batch_size * sequence_length
        elif batch_size is not None or sequence_length is not None:
            raise ValueError(
                "Pass either `tokens_per_step` or `batch_size` and "
                f"`sequence_length`, not both. Received: "
                f"tokens_per_step={tokens_per_step!r}, batch_size={batch_size!r}, "
                f"sequence_length={sequence_length!r}"
            )
        self.tokens_per_step = _positive("tokens_per_step", tokens_per_step, True)
        self.batch_size = batch_size
        self.sequence_length = sequence_length
        if (flops_per_token is None) != (peak_flops is None):
            raise ValueError(
                "`flops_per_token` and `peak_flops` go together (both or "
                f"neither). Received: flops_per_token={flops_per_token!r}, "
                f"peak_flops={peak_flops!r}"
            )
        if flops_per_token is not None:
            flops_per_token = _positive("flops_per_token", flops_per_token, False)
            peak_flops = _positive("peak_flops", peak_flops, False)
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops
        if (
            isinstance(log_every, bool)
            or not isinstance(log_every, int)
            or log_every < 0
        ):
            raise ValueError(
                f"`log_every` must be an integer >= 0. Received: log_every={log_every!r}"
            )
        self.log_every = log_every
        if (
            isinstance(warmup_batches, bool)
            or not isinstance(warmup_batches, int)
            or warmup_batches < 0
        ):
            raise ValueError(
                "`warmup_batches` must be an integer >= 0. "
                f"Received: warmup_batches={warmup_batches!r}"
            )
        self.warmup_batches = warmup_batches
        self._batches_seen = 0
        self._reset_epoch()

    def _reset_epoch(self) -> None:
        self._start: float | None = None
        self._begin_step = 0
        self._seconds = 0.0
        self._tokens = 0
        self._measured = 0

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._batches_seen = 0

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._reset_epoch()

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self._begin_step = batch
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self._start is None:
            return
        elapsed = time.perf_counter() - self._start
        self._start = None
        self._batches_seen += 1
        if self._batches_seen <= self.warmup_batches:
            return
        steps = max(batch - self._begin_step + 1, 1)
        self._seconds += elapsed
        self._tokens += steps * self.tokens_per_step
        self._measured += 1
        if self.log_every and self._measured % self.log_every == 0:
            print(self._summary(f"batch {batch}"))

    def _metrics(self) -> dict[str, float]:
        if not self._measured or self._seconds <= 0:
            return {}
        tokens_per_second = self._tokens / self._seconds
        out = {"tokens_per_second": tokens_per_second}
        if self.flops_per_token is not None:
            out["mfu"] = tokens_per_second * self.flops_per_token / self.peak_flops
        return out

    def _summary(self, where: str) -> str:
        parts = [f"{k}={v:.4g}" for k, v in self._metrics().items()]
        return f"[ThroughputCallback] {where}: " + ", ".join(parts)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs is not None:
            logs.update(self._metrics())

    def get_config(self) -> dict[str, Any]:
        config = {
            "flops_per_token": self.flops_per_token,
            "peak_flops": self.peak_flops,
            "log_every": self.log_every,
            "warmup_batches": self.warmup_batches,
        }
        if self.batch_size is not None:
            config.update(
                batch_size=self.batch_size, sequence_length=self.sequence_length
            )
        else:
            config["tokens_per_step"] = self.tokens_per_step
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ThroughputCallback:
        return cls(**config)


__all__ = ["ThroughputCallback", "training_flops_per_token"]
