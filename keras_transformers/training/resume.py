"""Resuming an interrupted `fit()` exactly where it stopped.

`keras.callbacks.BackupAndRestore` saves the weights (optimizer state
included) every `save_freq` batches, but a resumed `fit()` starts the
interrupted epoch again from its first batch, so the batches trained before
the interruption are trained twice and the result differs from an
uninterrupted run. This module's `BackupAndRestore` also records how many
batches of the epoch were done and, given the training data through
`resumable(dataset)`, continues from the next one: the resumed run trains
the same batches, in the same order, with the same dropout masks (see
`random_state.py`) and learning rates (the schedule is a function of
`optimizer.iterations`) as an uninterrupted one, and ends with the same
weights.

How: the data is one stream of batches numbered by the global step
(`epoch * steps_per_epoch + batch`). A run resumed `k` batches into an
epoch reads the stream from there, so its epochs (and the validation and
epoch logs after them) end `k` batches later than the uninterrupted run's,
and its last epoch stops `k` batches early, at the same final step. Ending
the first epoch early instead is not possible: Keras' data adapters expect
full epochs, and on TensorFlow a step that finds the data exhausted still
advances `optimizer.iterations` and the dropout seeds.

Two more differences from Keras 3.15's callback: a resumed run backs up its
real position (Keras' writes epoch 0 until the resumed run ends an epoch,
so a second interruption would restart from epoch 0 with later weights),
and the restored epoch is cleared from the model when `fit()` ends. The
wrapped dataset moves only with the stream: Keras' own `on_epoch_end`
calls (one of them before the first epoch, when `fit()` peeks at a batch
to build the step) do not reshuffle it.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

import keras
import numpy as np

from keras_transformers._atomic import atomic_file

BATCHES_DONE = "batches_done"  # key in Keras' training_metadata.json
LORA_STATE = "lora_state.npz"  # LoRA layers' kernels and adapters, unmerged


def _lora_variables(model) -> dict:
    """`{key: variable}` of each LoRA layer's frozen kernel and its `A` and
    `B`, which Keras' weight files store only merged into the kernel (and
    restore with `A = B = 0`, ending the adapter's training)."""
    layers = [
        layer
        for layer in model._flatten_layers(include_self=False)
        if getattr(layer, "lora_enabled", False)
    ]
    return {
        f"{i}/{name}": getattr(layer, attr)
        for i, layer in enumerate(layers)
        for name, attr in (
            ("kernel", "_kernel"),
            ("a", "lora_kernel_a"),
            ("b", "lora_kernel_b"),
        )
    }


class ResumableBatches(keras.utils.PyDataset):
    """Batches of a dataset as one stream numbered by the global step.

    Index `i` of a `fit()` epoch that starts at global step `s` (set by
    `BackupAndRestore`) is batch `(s + i) % n` of the wrapped dataset's
    epoch `(s + i) // n`, `n = len(dataset)`. Epoch `e` of the wrapped
    dataset is what it serves after `e` calls of its `on_epoch_end()` (its
    reshuffling) from fresh, so a dataset whose order depends only on its
    seed and the epoch (e.g. `keras_transformers.data.lm_dataset(...,
    shuffle=True, seed=0)`) gives the same batches in a resumed process.
    Make one with `BackupAndRestore.resumable(dataset)` and train with
    `fit(..., shuffle=False)`: the order is the dataset's own (Keras would
    otherwise shuffle the batch indices with Python's global `random`).

    Args:
        dataset: a `keras.utils.PyDataset` (or any sequence of batches with
            `__len__`, `__getitem__` and optionally `on_epoch_end`), read in
            order by one worker.
    """

    def __init__(self, dataset: Any) -> None:
        super().__init__()
        if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            raise TypeError(
                "`dataset` must be a keras.utils.PyDataset (or a sequence of "
                f"batches). Received: {type(dataset).__name__}. Wrap arrays in "
                "a PyDataset whose order is fixed by a seed, e.g. "
                "keras_transformers.data.ShuffledBatches."
            )
        self.dataset = dataset
        self.epoch = 0  # the wrapped dataset's epoch
        self.start, self._next = 0, 0

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        if index not in (0, self._next):
            raise ValueError(
                f"Batch {index} was requested after batch {self._next - 1}: "
                "batches must be read in order. Pass `shuffle=False` to `fit()` "
                "(the dataset shuffles itself) and use one worker."
            )
        self._next = index + 1
        epoch, batch = divmod(self.start + index, len(self.dataset))
        self._advance(epoch)
        return self.dataset[batch]

    def seek(self, step: int) -> None:
        """Makes index 0 the batch of global step `step`.

        Raises:
            ValueError: the dataset already served a later epoch (make a
                fresh one: epochs can only be replayed forward).
        """
        epoch = step // len(self.dataset)
        if epoch < self.epoch:
            raise ValueError(
                f"Cannot resume at epoch {epoch}: this dataset is already at "
                f"epoch {self.epoch}. Pass a freshly made dataset (same seed) "
                "to `resumable()` for the resumed `fit()`."
            )
        self._advance(epoch)
        self.start, self._next = step, 0

    def _advance(self, epoch: int) -> None:
        while self.epoch < epoch:
            if hasattr(self.dataset, "on_epoch_end"):
                self.dataset.on_epoch_end()
            self.epoch += 1

    # `seek` and the stream move the position, not Keras' epoch hooks.
    def on_epoch_begin(self) -> None:
        pass

    def on_epoch_end(self) -> None:
        pass


class BackupAndRestore(keras.callbacks.BackupAndRestore):
    """`keras.callbacks.BackupAndRestore` that resumes mid-epoch exactly.

    Same arguments and files as Keras' callback (`latest.weights.h5`: the
    weights, optimizer state and seed-generator states;
    `training_metadata.json`: the epoch, plus `batches_done`, the batches of
    that epoch already trained). Train with
    `fit(backup.resumable(dataset), shuffle=False, callbacks=[backup])`: a
    resumed `fit()` then continues with the batch after the last one backed
    up and stops at the uninterrupted run's last step (see the module
    docstring for where its epochs end). Without `resumable`, an
    interrupted epoch restarts from its first batch, as in Keras, with a
    warning. A model with LoRA enabled (`enable_lora`) resumes with its
    adapters and frozen kernels as they were (`lora_state.npz` beside the
    weights), not merged.

    Args:
        backup_dir: directory of the backup (used by this callback only).
        save_freq: `"epoch"` or a number of batches between backups.
        double_checkpoint: also keep the previous backup.
        delete_checkpoint: delete the backup when `fit()` completes.

    Example:

    ```python
    backup = BackupAndRestore("checkpoints/run1", save_freq=100)
    model.fit(backup.resumable(train), epochs=3, shuffle=False, callbacks=[backup])
    # Killed? Run the same script again: it continues from the last backup.
    ```
    """

    def __init__(
        self,
        backup_dir: str,
        save_freq: Any = "epoch",
        double_checkpoint: bool = False,
        delete_checkpoint: bool = True,
    ) -> None:
        super().__init__(
            backup_dir,
            save_freq=save_freq,
            double_checkpoint=double_checkpoint,
            delete_checkpoint=delete_checkpoint,
        )
        self.data: ResumableBatches | None = None
        self._step: int | None = None  # global steps trained

    def resumable(self, dataset: Any) -> ResumableBatches:
        """Wraps the training data so that a resumed `fit()` continues
        with the next batch; pass the result to `fit(..., shuffle=False)`."""
        self.data = ResumableBatches(dataset)
        return self.data

    def _steps(self) -> int:
        return int(self.params["steps"])

    def on_train_begin(self, logs=None) -> None:
        self._step = None
        super().on_train_begin(logs)

    def _load_model(self) -> None:
        super()._load_model()
        if not os.path.exists(self._training_metadata_path):
            return
        with open(self._training_metadata_path) as f:
            done = int(json.load(f).get(BATCHES_DONE, 0))
        epoch = self.model._initial_epoch or 0
        self._load_lora()
        if done and self.data is None:
            warnings.warn(
                f"The backup in {self.backup_dir} is {done} batches into epoch "
                f"{epoch}; that epoch restarts from its first batch. Train on "
                "`backup.resumable(dataset)` to continue with the next batch.",
                stacklevel=2,
            )
            done = 0
        self._step = epoch * self._steps() + done

    def on_epoch_begin(self, epoch: int, logs=None) -> None:
        if self._step is None:
            self._step = epoch * self._steps()
        # Keras' own callback backs up epoch 0 until a resumed run ends its
        # first epoch; this one backs up the position of the stream.
        self._current_epoch = self._step // self._steps()
        if self.data is not None:
            self.data.seek(self._step)

    def on_train_batch_end(self, batch: int, logs=None) -> None:
        self._step += 1
        if (
            self.data is not None
            and self._step >= self.params["epochs"] * self._steps()
        ):
            self.model.stop_training = True  # the uninterrupted run's last step
        super().on_train_batch_end(batch, logs)

    def on_train_end(self, logs=None) -> None:
        # Keras leaves the restored epoch on the model; a later fit() of
        # the same model would start there.
        self.model._initial_epoch = None
        super().on_train_end(logs)

    def _lora_path(self) -> str:
        return os.path.join(self.backup_dir, LORA_STATE)

    def _load_lora(self) -> None:
        variables = _lora_variables(self.model)
        if not variables:
            return
        if not os.path.exists(self._lora_path()):
            raise ValueError(
                f"The backup in {self.backup_dir} has no {LORA_STATE}, but the model "
                "has LoRA enabled: it was backed up without LoRA. Resume it with the "
                "same model, or delete the backup to start over."
            )
        with np.load(self._lora_path(), allow_pickle=False) as saved:
            for key, variable in variables.items():
                variable.assign(keras.ops.cast(saved[key], variable.dtype))

    def _save_model(self) -> None:
        super()._save_model()
        variables = _lora_variables(self.model)
        if variables:
            arrays = {
                key: keras.ops.convert_to_numpy(keras.ops.cast(v, "float32"))
                for key, v in variables.items()
            }
            with atomic_file(self._lora_path()) as partial, open(partial, "wb") as f:
                np.savez(f, **arrays)
        epoch, done = divmod(self._step, self._steps())
        with open(self._training_metadata_path, "w") as f:
            json.dump({"epoch": epoch, "batch": done - 1, BATCHES_DONE: done}, f)
