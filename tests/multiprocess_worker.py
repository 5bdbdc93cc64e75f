"""The child side of tests/test_multiprocess.py: one process of a run on
this machine's CPU on JAX (the test sets the simulated device count in
XLA_FLAGS).

`python tests/multiprocess_worker.py SPEC_JSON` with SPEC:
- `coordinator`, `num_processes`, `process_id`: join a multi-process run
  (absent: one process);
- `fits`: a list of `[preset, distribution]`; each trains a tiny model for
  `STEPS` steps on the same global batches and reports its per-step losses;
- `save`: a directory to save the last fit's state into; then `THEN` more
  steps are trained (their losses: `then`);
- `restore` (a saved state) and `restore_into` (`[preset, distribution]`):
  a fresh model loads the state and trains `THEN` steps (`restored`).
- `backup` (with `interrupt`, `weights`): `resumed_fit`;
- `unreachable`: first, `initialize` with this coordinator nobody serves
  (its `TimeoutError` reported); `cli`: last, run `keras-transformers` with
  these arguments.
Process 0 writes the losses to `out` as JSON.
"""

from __future__ import annotations

import json
import os
import sys

os.environ["KERAS_BACKEND"] = "jax"

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_transformers import cli, data, from_preset, multiprocess  # noqa: E402
from keras_transformers.training import (  # noqa: E402
    AdamW,
    MaskedSparseCategoricalCrossentropy,
    sharded_checkpoint,
)

STEPS, THEN, BATCH, LENGTH = 3, 2, 4, 8
SMALL = dict(num_layers=1, hidden_dim=16, num_heads=4, intermediate_dim=32)


class StepLosses(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.losses = []

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss"]))


def build(preset, distribution, dropout=0.0):
    keras.utils.set_random_seed(0)
    overrides = dict(SMALL, dropout=dropout)
    if preset.startswith("mixtral"):
        overrides["num_kv_heads"] = 2
    model = from_preset(preset, distribution=distribution, **overrides)
    model.compile(
        optimizer=AdamW(1e-2, weight_decay=0.01),
        loss=MaskedSparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def batches(seed=0):
    stream = np.random.default_rng(seed).integers(3, 64, 600).astype("int32")
    train = data.lm_dataset(
        stream, LENGTH, BATCH, shuffle=True, seed=1, num_batches=STEPS
    )
    return multiprocess.ProcessBatches(train)


def train(model, steps, seed=0):
    record = StepLosses()
    data_ = batches(seed)
    model.fit(
        data_,
        epochs=1,
        steps_per_epoch=steps,
        shuffle=False,
        verbose=0,
        callbacks=[record],
    )
    return record.losses


def main(spec):
    out = {"losses": []}
    if spec.get("unreachable"):  # a coordinator nobody serves
        try:
            multiprocess.initialize(spec["unreachable"], 2, 1, timeout=1)
        except TimeoutError as error:
            out["unreachable"] = str(error)
    if spec.get("num_processes", 1) > 1:
        multiprocess.initialize(
            spec["coordinator"], spec["num_processes"], spec["process_id"], timeout=60
        )
    model = None
    for preset, distribution in spec.get("fits", []):
        model = build(preset, distribution)
        out["losses"].append(train(model, STEPS))
    if spec.get("save"):
        sharded_checkpoint.save_state(model, spec["save"])
        out["then"] = train(model, THEN, seed=1)
    if spec.get("restore"):
        model = build(*spec["restore_into"])
        model.optimizer.build(model.trainable_variables)
        sharded_checkpoint.load_state(model, spec["restore"])
        out["restored"] = train(model, THEN, seed=1)
    if spec.get("backup"):
        out["resumed_fit"] = resumed_fit(spec)
    if multiprocess.is_primary():
        with open(spec["out"], "w") as f:
            json.dump(out, f)
    if spec.get("cli"):  # last: the command sets its own distribution
        assert cli.main(spec["cli"]) == 0


class Interrupt(keras.callbacks.Callback):
    def __init__(self, at):
        super().__init__()
        self.at, self.seen = at, 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen == self.at:
            raise RuntimeError("interrupted")


def resumed_fit(spec):
    """2 epochs of 2 steps of a data-parallel GPT with dropout, backed up
    every step into `backup`: stopped after step `interrupt` (if given),
    else run to the end (resuming the backup if there is one) and its
    weights saved to `weights`. Returns the losses of the steps it ran."""
    model = build("gpt2_tiny", "data", dropout=0.1)
    backup = sharded_checkpoint.ShardedBackupAndRestore(spec["backup"], save_freq=1)
    stream = np.random.default_rng(2).integers(3, 64, 600).astype("int32")
    train = data.lm_dataset(stream, LENGTH, BATCH, shuffle=True, seed=1, num_batches=2)
    record = StepLosses()
    callbacks = [backup, record]
    if spec.get("interrupt"):
        callbacks.append(Interrupt(spec["interrupt"]))
    try:
        model.fit(
            backup.resumable(multiprocess.ProcessBatches(train)),
            epochs=2,
            shuffle=False,
            verbose=0,
            callbacks=callbacks,
        )
    except RuntimeError as error:
        assert str(error) == "interrupted"
        return record.losses
    weights = {
        str(i): multiprocess.gather(v.value) for i, v in enumerate(model.variables)
    }
    if multiprocess.is_primary():
        np.savez(spec["weights"], **weights)
    return record.losses


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
