"""Checkpoint averaging: the final model is the mean of the last N checkpoints.

Vaswani et al. (2017, section 6.1) evaluate "a single model obtained by
averaging the last 5 checkpoints, which were written at 10-minute intervals"
(base models; the last 20 for big models). `CheckpointAveraging` does this
inside `model.fit()`.
"""

from __future__ import annotations

import numbers
import os
import warnings
from collections import deque
from typing import Any

import keras
import numpy as np
from keras import ops


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(
            f"`{name}` must be an integer >= 1. Received: {name}={value!r}"
        )
    return int(value)


def _weight_values(model: keras.Model) -> list[np.ndarray]:
    """Numpy copies of `model.weights` (trainable and non-trainable)."""
    return [np.array(ops.convert_to_numpy(w)) for w in model.weights]


@keras.saving.register_keras_serializable(package="keras_transformers")
class CheckpointAveraging(keras.callbacks.Callback):
    """Keeps the last `num_checkpoints` weight snapshots and averages them.

    A checkpoint is taken at the end of every epoch, or every
    `every_n_steps` optimizer steps when that is given. Only the model's
    weights are kept (`model.weights`: trainable and non-trainable, e.g.
    normalization statistics), never optimizer state, metric state or random
    seeds. At `on_train_end` the model's weights are set to the element-wise
    mean of the kept checkpoints (fewer than `num_checkpoints` if fewer were
    taken); floating-point weights are averaged in float64 and cast back,
    other weights (e.g. integer counters) are copied from the newest
    checkpoint. The optimizer state is left as it is. If no checkpoint was
    taken, the weights are left unchanged and a warning is issued.

    The checkpoints live in host memory as numpy arrays (one copy of the
    weights each), or, with `directory`, as `.weights.h5` files written by
    `model.save_weights` (loadable with `model.load_weights`); only the last
    `num_checkpoints` files written by this callback are kept. Averaging from
    files holds one checkpoint plus a float64 running sum in memory.

    Every `fit()` call starts a fresh window: checkpoints of an earlier
    `fit()` are forgotten (their files, if any, are left on disk).

    Args:
        num_checkpoints: how many of the latest checkpoints to average
            (paper: 5 for base models, 20 for big models).
        every_n_steps: take a checkpoint every this many optimizer steps
            (counted over the `fit()` call; with `steps_per_execution=k`,
            checked every `k` steps). None (default): at the end of every
            epoch.
        directory: folder for the checkpoint files, created if needed; None
            (default) keeps them in memory.

    Returns:
        A `keras.callbacks.Callback`. `average_into(model)` applies the
        average to any model with the same weight structure.

    Example:

    ```python
    averaging = CheckpointAveraging(num_checkpoints=5, every_n_steps=2000)
    model.fit(dataset, epochs=10, callbacks=[averaging])
    # model now holds the mean of the last 5 checkpoints.
    ```

    Reference:
        Vaswani et al., "Attention Is All You Need", NeurIPS 2017.
    """

    def __init__(
        self,
        num_checkpoints: int = 5,
        every_n_steps: int | None = None,
        directory: str | os.PathLike | None = None,
    ) -> None:
        super().__init__()
        self.num_checkpoints = _positive_int("num_checkpoints", num_checkpoints)
        if every_n_steps is not None:
            every_n_steps = _positive_int("every_n_steps", every_n_steps)
        self.every_n_steps = every_n_steps
        if directory is not None and not isinstance(directory, (str, os.PathLike)):
            raise ValueError(
                f"`directory` must be a path or None. Received: directory={directory!r}"
            )
        self.directory = None if directory is None else os.fspath(directory)
        self._reset()

    def _reset(self) -> None:
        # Each entry: a list of numpy arrays, or a file path (directory mode).
        self._checkpoints: deque = deque()
        self._step = 0
        self._epoch_start_step = 0
        self._last_checkpoint_step = 0

    @property
    def num_checkpoints_kept(self) -> int:
        """How many checkpoints are currently kept (at most `num_checkpoints`)."""
        return len(self._checkpoints)

    # ------------------------------------------------------------- snapshots
    def _checkpoint(self) -> None:
        model = self.model  # On JAX, this attaches the training state.
        self._last_checkpoint_step = self._step
        if self.directory is None:
            self._checkpoints.append(_weight_values(model))
        else:
            os.makedirs(self.directory, exist_ok=True)
            step = int(ops.convert_to_numpy(model.optimizer.iterations))
            path = os.path.join(self.directory, f"checkpoint-{step:09d}.weights.h5")
            model.save_weights(path)
            if path in self._checkpoints:
                self._checkpoints.remove(path)
            self._checkpoints.append(path)
        while len(self._checkpoints) > self.num_checkpoints:
            dropped = self._checkpoints.popleft()
            if isinstance(dropped, str) and os.path.exists(dropped):
                os.remove(dropped)

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._reset()

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._epoch_start_step = self._step

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        # `batch` is the epoch-local index of the last step just run.
        self._step = self._epoch_start_step + batch + 1
        if self.every_n_steps is None:
            return
        n = self.every_n_steps
        if self._step // n > self._last_checkpoint_step // n:
            self._checkpoint()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self.every_n_steps is None:
            self._checkpoint()

    def on_train_end(self, logs: dict | None = None) -> None:
        if not self._checkpoints:
            warnings.warn(
                "CheckpointAveraging took no checkpoint during training "
                f"(every_n_steps={self.every_n_steps}, steps run={self._step}); "
                "the weights are left unchanged.",
                stacklevel=2,
            )
            return
        self.average_into(self.model)

    # --------------------------------------------------------------- average
    def _iter_checkpoints(self, model: keras.Model):
        """Yields each kept checkpoint, oldest first, as numpy arrays."""
        if self.directory is None:
            yield from self._checkpoints
            return
        # `load_weights` also restores optimizer (and other) state saved in
        # the file; keep the current one and put it back afterwards.
        state = list(model.variables) + list(model.metrics_variables)
        optimizer = getattr(model, "optimizer", None)
        if optimizer is not None and optimizer.built:
            state += list(optimizer.variables)
        saved = [np.array(ops.convert_to_numpy(v)) for v in state]
        try:
            for path in self._checkpoints:
                model.load_weights(path)
                yield _weight_values(model)
        finally:
            for variable, value in zip(state, saved):
                variable.assign(value)

    def average_into(self, model: keras.Model) -> None:
        """Sets `model`'s weights to the mean of the kept checkpoints.

        Args:
            model: a built model whose `model.weights` match the checkpoints
                in number and shapes (normally the trained model itself).

        Raises:
            ValueError: if no checkpoint is kept yet, or the model's weights
                do not match the checkpoints.
        """
        if not self._checkpoints:
            raise ValueError(
                "No checkpoint to average yet: train with this callback first."
            )
        weights = model.weights
        count = len(self._checkpoints)
        sums: list[np.ndarray] | None = None
        for values in self._iter_checkpoints(model):
            shapes = [tuple(w.shape) for w in weights]
            if [v.shape for v in values] != shapes:
                raise ValueError(
                    "The model's weights do not match the checkpoints: "
                    f"{len(weights)} weights with shapes {shapes}, checkpoints "
                    f"have {len(values)} with shapes {[v.shape for v in values]}."
                )
            if sums is None:
                sums = [np.zeros(v.shape, dtype="float64") for v in values]
            for total, value in zip(sums, values):
                total += value.astype("float64")
            newest = values
        for weight, total, last in zip(weights, sums, newest):
            if keras.backend.is_float_dtype(weight.dtype):
                weight.assign((total / count).astype(last.dtype))
            else:
                weight.assign(last)

    def get_config(self) -> dict[str, Any]:
        return {
            "num_checkpoints": self.num_checkpoints,
            "every_n_steps": self.every_n_steps,
            "directory": self.directory,
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> CheckpointAveraging:
        return cls(**config)
