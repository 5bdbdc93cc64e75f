"""Sharded checkpoints: a model's training state saved and restored by
every process, each writing and reading only its own shards (JAX, Orbax).

`save_state(model, directory)` writes every variable of the model (weights,
seed-generator states, MoE router statistics, LoRA adapters unmerged) and
of its optimizer (moments, step count) as it lies on the devices: no
process gathers the model. `load_state(model, directory)` reads each array
straight into the layout of the model it loads into, so a checkpoint saved
by 2 processes over 4 devices loads into 1 process with 2 devices, into a
different mesh, or back into 2 processes. Variables are matched by their
order in the model (the same architecture builds them in the same order),
and their shapes are checked.

`ShardedBackupAndRestore` is `keras_transformers.training.BackupAndRestore`
(exact mid-epoch resume, `resumable(dataset)`) with this format, so an
interrupted multi-process `fit()` resumes as a single-process one does, on
any number of processes. The backup directory must be one that every
process sees (a shared file system), as Orbax requires; process 0 writes the
small metadata files.
"""

from __future__ import annotations

import json
import os
import shutil

import keras

from keras_transformers import multiprocess
from keras_transformers._atomic import atomic_file
from keras_transformers.training.resume import BATCHES_DONE, BackupAndRestore

MANIFEST = "variables.json"  # paths and shapes, for the checks at load time
STATE_KEY = "state"  # training_metadata.json: the state directory it goes with


def _backend():
    if keras.config.backend() != "jax":
        raise ValueError(
            "Sharded checkpoints need the JAX backend (KERAS_BACKEND is "
            f"{keras.config.backend()!r}). On one process use "
            "keras_transformers.training.BackupAndRestore or model.save_weights."
        )
    from keras_transformers.backend import multiprocess as backend

    return backend


def _groups(model) -> dict:
    """`{group: [variables]}`: the model's variables and its optimizer's."""
    groups = {"model": list(model.variables)}
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and optimizer.built:
        groups["optimizer"] = list(optimizer.variables)
    return groups


def _key(group: str, index: int) -> str:
    return f"{group}_{index:05d}"


def save_state(model, directory: str) -> None:
    """Saves the training state of `model` into `directory` (a new
    directory), from every process at once; see the module docstring.

    Every process must call it (it is a collective), with the same path.
    """
    backend = _backend()
    groups = _groups(model)
    arrays = {
        _key(group, i): variable.value
        for group, variables in groups.items()
        for i, variable in enumerate(variables)
    }
    backend.save_arrays(os.path.join(directory, "arrays"), arrays)
    if multiprocess.is_primary():
        manifest = {
            group: [[v.path, list(v.shape), str(v.dtype)] for v in variables]
            for group, variables in groups.items()
        }
        with atomic_file(os.path.join(directory, MANIFEST)) as partial:
            with open(partial, "w") as f:
                json.dump(manifest, f, indent=0)
    multiprocess.sync(f"save_state:{directory}")


def load_state(model, directory: str) -> None:
    """Loads `save_state`'s checkpoint into `model` (built, compiled; its
    optimizer built, e.g. with `model.optimizer.build(model.trainable_variables)`),
    each array straight into the layout of the variable it fills.

    Raises:
        FileNotFoundError: `directory` holds no sharded checkpoint.
        ValueError: the checkpoint's variables do not fit the model's (another
            architecture, or an optimizer missing on one side).
    """
    backend = _backend()
    manifest_path = os.path.join(directory, MANIFEST)
    if not os.path.isfile(manifest_path):
        raise FileNotFoundError(
            f"{directory} holds no sharded checkpoint (no {MANIFEST}); save one "
            "with keras_transformers.training.sharded_checkpoint.save_state."
        )
    with open(manifest_path) as f:
        saved = json.load(f)
    groups = _groups(model)
    for group, variables in groups.items():
        entries = saved.get(group)
        shapes = [tuple(shape) for _, shape, _ in entries or []]
        if shapes != [tuple(v.shape) for v in variables]:
            raise ValueError(
                f"The checkpoint in {directory} does not fit this model's {group} "
                f"variables ({len(entries or [])} saved, {len(variables)} here, or "
                "different shapes): load it into the architecture (and optimizer) "
                "that saved it."
            )
    targets = {
        _key(group, i): variable.value
        for group, variables in groups.items()
        for i, variable in enumerate(variables)
    }
    values = backend.load_arrays(os.path.join(directory, "arrays"), targets)
    for group, variables in groups.items():
        for i, variable in enumerate(variables):
            variable.assign(values[_key(group, i)])


class ShardedBackupAndRestore(BackupAndRestore):
    """`BackupAndRestore` whose backups are sharded checkpoints.

    Same arguments, `resumable(dataset)` and exact mid-epoch resume as
    `keras_transformers.training.BackupAndRestore`; every process of a
    multi-process run passes it to its `fit()` with the same `backup_dir`.
    Each backup is written by every process at once (`save_state`, into
    `state-<step>`), then process 0 points `training_metadata.json` at it and
    removes the backup before it (or keeps it, with `double_checkpoint`). A
    resumed `fit()` may run on another number of processes or devices than
    the interrupted one.

    Example:

    ```py
    backup = ShardedBackupAndRestore("/shared/run1/backup", save_freq=100)
    model.fit(backup.resumable(ProcessBatches(train)), shuffle=False,
              callbacks=[backup])
    ```
    """

    def _state_dir(self, step: int) -> str:
        return os.path.join(self.backup_dir, f"state-{step}")

    def _load_model(self) -> None:
        if not self.model.built:
            raise ValueError(
                "Build the model (call it on a batch, or create it with from_preset) "
                "before fit() with ShardedBackupAndRestore."
            )
        metadata = self._training_metadata_path
        if os.path.exists(metadata):
            with open(metadata) as f:
                state = json.load(f).get(STATE_KEY)
            if state:
                optimizer = self.model.optimizer
                if optimizer is not None and not optimizer.built:
                    optimizer.build(self.model.trainable_variables)
                load_state(self.model, os.path.join(self.backup_dir, state))
        # The epoch and the position in the data: BackupAndRestore's
        # (it finds no weights file of its own to load).
        super()._load_model()

    def _load_lora(self) -> None:
        pass  # LoRA variables are among the model's, in the state

    def _save_model(self) -> None:
        epoch, done = divmod(self._step, self._steps())
        state = self._state_dir(self._step)
        previous = None
        if os.path.exists(self._training_metadata_path):
            with open(self._training_metadata_path) as f:
                previous = json.load(f).get(STATE_KEY)
        if os.path.exists(state):  # a save that died before its metadata
            if multiprocess.is_primary():
                shutil.rmtree(state)
            multiprocess.sync(f"backup:cleared:{state}")
        save_state(self.model, state)
        if multiprocess.is_primary():
            record = {
                "epoch": epoch,
                "batch": done - 1,
                BATCHES_DONE: done,
                STATE_KEY: os.path.basename(state),
            }
            with atomic_file(self._training_metadata_path) as partial:
                with open(partial, "w") as f:
                    json.dump(record, f)
            stale = previous and previous != os.path.basename(state)
            if stale and not self.double_checkpoint:
                shutil.rmtree(os.path.join(self.backup_dir, previous), True)
        multiprocess.sync(f"backup:{state}")

    def on_train_end(self, logs=None) -> None:
        self.model._initial_epoch = None
        multiprocess.sync("backup:end")
        if self.delete_checkpoint and multiprocess.is_primary():
            shutil.rmtree(self.backup_dir, ignore_errors=True)
        multiprocess.sync("backup:deleted")
