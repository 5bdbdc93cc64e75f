"""Interrupted training resumes exactly: `BackupAndRestore` (an exception
from a callback at step k, a killed process), `ModelCheckpoint` to `.keras`.

Each family trains one tiny compiled model (dropout on, float32, a warmup +
cosine schedule): uninterrupted, then interrupted twice and resumed from
the backup, every variable set back to its initial value before each resume
(so state missing from the backup shows up as a difference). All weights,
optimizer slots and iterations, seed-generator states and MoE router
statistics must be equal.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import keras
import numpy as np
import pytest

from keras_transformers import data
from keras_transformers.models import (
    BertClassifier,
    GPTCausalLM,
    MixtralCausalLM,
    Seq2SeqLM,
    ViTClassifier,
)
from keras_transformers.training import (
    AdamW,
    BackupAndRestore,
    MaskedSparseCategoricalCrossentropy,
    ResumableBatches,
    WarmupCosineDecay,
)

EPOCHS, STEPS, BATCH, LENGTH = 2, 2, 2, 8
SMALL = dict(num_layers=1, hidden_dim=16, num_heads=2, intermediate_dim=32)


class Interrupt(keras.callbacks.Callback):
    """Raises after the `at`-th training batch (counted over the fit)."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.seen = at, 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen == self.at:
            raise RuntimeError("interrupted")


def _compile(model):
    schedule = WarmupCosineDecay(1e-2, warmup_steps=2, decay_steps=EPOCHS * STEPS)
    model.compile(
        optimizer=AdamW(schedule, weight_decay=0.01),
        loss=MaskedSparseCategoricalCrossentropy(from_logits=True),
    )
    model.optimizer.build(model.trainable_variables)
    return model


def _ids(rng, shape, vocabulary=64):
    return rng.integers(3, vocabulary, shape).astype("int32")


def _lm_data(rng):
    stream = _ids(rng, 400)
    return lambda: data.lm_dataset(
        stream, LENGTH, BATCH, shuffle=True, seed=1, num_batches=STEPS
    )


def _batches(x, y):
    return lambda: data.ShuffledBatches(x, y, BATCH, seed=1)


def _gpt(rng, preset="gpt2_tiny", cls=GPTCausalLM, **extra):
    lm = cls.from_preset(preset, dropout=0.1, **SMALL, **extra)
    return lm, _lm_data(rng)


def _bert(rng):
    model = BertClassifier.from_preset("bert_tiny", num_classes=3, dropout=0.1, **SMALL)
    n = BATCH * STEPS
    x = {"token_ids": _ids(rng, (n, LENGTH)), "padding_mask": np.ones((n, LENGTH))}
    return model, _batches(x, rng.integers(0, 3, n))


def _seq2seq(rng):
    lm = Seq2SeqLM.from_preset("transformer_tiny", dropout=0.1, **SMALL)
    n, mask = BATCH * STEPS, np.ones((BATCH * STEPS, LENGTH), bool)
    x = {
        "encoder_token_ids": _ids(rng, (n, LENGTH)),
        "encoder_padding_mask": mask,
        "decoder_token_ids": _ids(rng, (n, LENGTH)),
        "decoder_padding_mask": mask,
    }
    return lm, _batches(x, _ids(rng, (n, LENGTH)))


def _vit(rng):
    model = ViTClassifier.from_preset(
        "vit_tiny_28", num_classes=3, dropout=0.1, image_size=8, patch_size=4, **SMALL
    )
    n = BATCH * STEPS
    images = rng.random((n, 8, 8, model.config.vision.num_channels), "float32")
    return model, _batches(images, rng.integers(0, 3, n))


FAMILIES = {
    "gpt2": _gpt,
    "llama": lambda rng: _gpt(rng, "gpt_llama_tiny", num_kv_heads=1),
    "mixtral": lambda rng: _gpt(
        rng, "mixtral_tiny", MixtralCausalLM, num_kv_heads=1, router_jitter=0.1
    ),
    "bert": _bert,
    "seq2seq": _seq2seq,
    "vit": _vit,
}


_BUILT = {}


def _built(family):
    """`(model, make_data, initial)` of a family: its model, built once (seed
    0) and compiled, shared by the tests, which each start by setting the
    `initial` state back (the same model as a fresh build, and no second
    trace of its training step)."""
    if family not in _BUILT:
        keras.utils.set_random_seed(0)
        model, make_data = FAMILIES[family](np.random.default_rng(0))
        _compile(model)
        _BUILT[family] = model, make_data, _state(model)
    model, make_data, initial = _BUILT[family]
    _set_state(model, initial)
    return model, make_data, initial


def _state(model):
    return [keras.ops.convert_to_numpy(v) for v in _variables(model)]


def _variables(model):
    return list(model.variables) + list(model.optimizer.variables)


def _set_state(model, state):
    for variable, value in zip(_variables(model), state):
        variable.assign(value)


def _fit(model, make_data, backup_dir, *callbacks):
    backup = BackupAndRestore(str(backup_dir), save_freq=1)
    return model.fit(
        backup.resumable(make_data()),
        epochs=EPOCHS,
        shuffle=False,
        verbose=0,
        callbacks=[backup, *callbacks],
    )


def _assert_same(model, expected):
    variables = _variables(model)
    assert len(variables) == len(expected)
    for variable, value in zip(variables, expected):
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(variable),
            value,
            atol=1e-6,
            err_msg=variable.path,
        )


_REFERENCES = {}


def _reference(family, backup_dir):
    """`(model, make_data, initial, expected)`: `_built(family)` and the state
    after its uninterrupted fit (backing up to `backup_dir`), fitted once per
    family and kept for the tests that resume it; the model is left in its
    `initial` state."""
    model, make_data, initial = _built(family)
    if family not in _REFERENCES:
        _fit(model, make_data, backup_dir)
        assert int(model.optimizer.iterations) == EPOCHS * STEPS
        _REFERENCES[family] = _state(model)
        _set_state(model, initial)
    return model, make_data, initial, _REFERENCES[family]


@pytest.mark.parametrize("family", FAMILIES)
def test_resumed_fit_matches_uninterrupted(family, tmp_path):
    model, make_data, initial, expected = _reference(family, tmp_path / "reference")

    # Interrupted after step 1 (mid-epoch), resumed and interrupted again
    # after step 3 (one batch into the second epoch), resumed to the end.
    for at in (1, 2):
        _set_state(model, initial)  # nothing may survive but the backup
        with pytest.raises(RuntimeError, match="interrupted"):
            _fit(model, make_data, tmp_path / "backup", Interrupt(at))
    _set_state(model, initial)
    history = _fit(model, make_data, tmp_path / "backup")
    assert history.epoch == [1]
    _assert_same(model, expected)
    assert not (tmp_path / "backup").exists()  # deleted once fit completes


def test_model_checkpoint_keras_file_continues_identically(tmp_path):
    model, make_data, _ = _built("gpt2")
    path = str(tmp_path / "model.keras")
    checkpoint = keras.callbacks.ModelCheckpoint(path)
    model.fit(make_data(), epochs=1, shuffle=False, verbose=0, callbacks=[checkpoint])
    restored = keras.saving.load_model(path)  # no custom_objects needed
    assert int(restored.optimizer.iterations) == STEPS
    batches = make_data()
    model.fit(batches, epochs=1, shuffle=False, verbose=0)
    restored.fit(make_data(), epochs=1, shuffle=False, verbose=0)
    _assert_same(restored, _state(model))


def test_resumable_batches_errors():
    with pytest.raises(TypeError, match="PyDataset"):
        ResumableBatches(object())
    batches = ResumableBatches(data.ShuffledBatches(np.arange(8), None, 2))
    batches[0]
    with pytest.raises(ValueError, match="shuffle=False"):
        batches[2]  # what `fit(shuffle=True)` would ask for
    batches.seek(9)  # epoch 2, batch 1
    assert batches.epoch == 2
    with pytest.raises(ValueError, match="freshly made dataset"):
        batches.seek(0)
    with pytest.raises(ValueError, match="same number of rows"):
        data.ShuffledBatches({"a": np.zeros(4)}, np.zeros(3))


def test_backup_without_resumable_data_warns(tmp_path):
    """Without `resumable`, an interrupted epoch restarts (Keras' way)."""
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((6, 2)), np.ones((6, 1))
    backup = BackupAndRestore(str(tmp_path), save_freq=1)
    fit = dict(batch_size=2, epochs=1, shuffle=False, verbose=0)
    with pytest.raises(RuntimeError):
        model.fit(x, y, callbacks=[backup, Interrupt(2)], **fit)
    with pytest.warns(UserWarning, match="restarts from its first batch"):
        model.fit(x, y, callbacks=[backup], **fit)
    assert int(model.optimizer.iterations) == 2 + 3


KILLED_RUN = """
import os, sys, time
import keras, numpy as np
sys.path.insert(0, {tests!r})
from test_resume import _compile, _fit, _gpt

class Hang(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations) == {k}:
            open({marker!r}, "w").close()
            time.sleep(600)

keras.utils.set_random_seed(0)
model, make_data = _gpt(np.random.default_rng(0))
_compile(model)
_fit(model, make_data, {backup!r}, Hang())
"""


@pytest.mark.once  # a killed process: run once; resuming per backend: test_resumed_fit_matches_uninterrupted
def test_killed_process_resumes(tmp_path):
    """A process killed (SIGKILL) after the backup of step k resumes in
    another process to the uninterrupted weights."""
    marker, backup, k = tmp_path / "at_k", tmp_path / "backup", STEPS + 1
    script = KILLED_RUN.format(
        tests=os.path.dirname(__file__), k=k, marker=str(marker), backup=str(backup)
    )
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)])
    try:
        deadline = time.monotonic() + 300
        while not marker.exists() and child.poll() is None:
            assert time.monotonic() < deadline, "the child never reached step k"
            time.sleep(0.2)
        assert child.poll() is None, "the child exited before step k"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL

    # Resumed here, by the model and reference run of the tests above.
    model, make_data, _, expected = _reference("gpt2", tmp_path / "reference")
    history = _fit(model, make_data, backup)
    assert history.epoch == [1]
    _assert_same(model, expected)
