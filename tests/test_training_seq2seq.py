"""Tests for the "Attention Is All You Need" training recipe pieces.

The paper's schedule and Adam settings, the label-smoothed loss against a
hand computation, and checkpoint averaging inside `fit()`. BLEU against
sacreBLEU: test_bleu.py.
"""

import warnings

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformers.training import (
    CheckpointAveraging,
    InverseSquareRootSchedule,
    MaskedSparseCategoricalCrossentropy,
    transformer_adam,
)

VOCAB = 11


def to_numpy(x):
    return np.asarray(ops.convert_to_numpy(x))


def paper_rate(step_num, d_model, warmup):
    """Vaswani et al. eq. (3); `step_num` is 1-based."""
    return d_model**-0.5 * min(step_num**-0.5, step_num * warmup**-1.5)


# --------------------------------------------------------- schedule and Adam
class TestPaperSchedule:
    @pytest.mark.parametrize("step_num", [1, 4000, 100_000])
    def test_paper_values(self, step_num):
        # The schedule takes the 0-based `optimizer.iterations`, so the
        # paper's 1-based step_num is iteration step_num - 1.
        schedule = InverseSquareRootSchedule(hidden_dim=512, warmup_steps=4000)
        got = float(to_numpy(schedule(step_num - 1)))
        np.testing.assert_allclose(got, paper_rate(step_num, 512, 4000), rtol=1e-6)

    def test_named_values(self):
        schedule = InverseSquareRootSchedule(hidden_dim=512, warmup_steps=4000)
        # Peak at step_num 4000: (512 * 4000) ** -0.5; then 1 / sqrt decay.
        np.testing.assert_allclose(
            float(to_numpy(schedule(3999))), 6.987712429686844e-4, rtol=1e-6
        )
        np.testing.assert_allclose(
            float(to_numpy(schedule(99_999))), 512**-0.5 * 100_000**-0.5, rtol=1e-6
        )

    def test_transformer_adam(self):
        optimizer = transformer_adam(hidden_dim=512, warmup_steps=4000, scale=2.0)
        assert isinstance(optimizer, keras.optimizers.Adam)
        assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (
            0.9,
            0.98,
            1e-9,
        )
        schedule = optimizer._learning_rate
        assert isinstance(schedule, InverseSquareRootSchedule)
        assert schedule.get_config() == {
            "hidden_dim": 512,
            "warmup_steps": 4000,
            "scale": 2.0,
        }
        # optimizer.iterations == 0 is the paper's step_num 1.
        np.testing.assert_allclose(
            float(to_numpy(optimizer.learning_rate)),
            2.0 * paper_rate(1, 512, 4000),
            rtol=1e-6,
        )
        restored = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
        assert restored.get_config() == optimizer.get_config()

    def test_transformer_adam_kwargs(self):
        optimizer = transformer_adam(64, warmup_steps=10, beta_2=0.997, clipnorm=1.0)
        assert optimizer.beta_2 == 0.997 and optimizer.clipnorm == 1.0
        assert optimizer.epsilon == 1e-9
        with pytest.raises(ValueError, match="Received: learning_rate=0.1"):
            transformer_adam(64, learning_rate=0.1)
        with pytest.raises(ValueError, match="Received: warmup_steps=0"):
            transformer_adam(64, warmup_steps=0)


# ------------------------------------------------------ label-smoothed loss
def test_label_smoothed_loss_by_hand():
    """eps = 0.1, vocab 5, four positions of which the last is padding (0)."""
    logits = np.array(
        [
            [
                [2.0, 1.0, 0.5, -1.0, 0.0],
                [0.0, 3.0, -2.0, 1.0, 0.5],
                [1.5, -0.5, 0.0, 2.5, -1.0],
                [-4.0, 5.0, 4.0, 0.0, 1.0],  # padded: must not count
            ]
        ],
        dtype="float32",
    )
    labels = np.array([[2, 1, 3, 0]], dtype="int32")
    eps, vocab = 0.1, 5
    # Smoothed target: (1 - eps) on the label plus eps / V everywhere.
    per_token = []
    for t in range(4):
        z = logits[0, t].astype("float64")
        log_p = z - np.log(np.exp(z).sum())
        target = np.full(vocab, eps / vocab)
        target[labels[0, t]] += 1.0 - eps
        per_token.append(-(target * log_p).sum())
    expected = sum(per_token[:3]) / 3  # the padded position is left out
    loss = MaskedSparseCategoricalCrossentropy(ignore_class=0, label_smoothing=eps)
    got = float(to_numpy(loss(labels, logits)))
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    # Counting the padded token, or dividing by all 4 positions, would differ.
    assert abs(got - np.mean(per_token)) > 0.1
    assert abs(got - sum(per_token[:3]) / 4) > 0.1
    unreduced = MaskedSparseCategoricalCrossentropy(
        ignore_class=0, label_smoothing=eps, reduction=None
    )
    np.testing.assert_allclose(
        to_numpy(unreduced(labels, logits))[0], per_token[:3] + [0.0], rtol=1e-6
    )


# ------------------------------------------------------- checkpoint averaging
class CallCounter(keras.layers.Layer):
    """Identity that counts its training calls in an int32 weight."""

    def build(self, input_shape):
        self.calls = self.add_weight(
            shape=(), dtype="int32", initializer="zeros", trainable=False, name="calls"
        )

    def call(self, x, training=False):
        if training:
            self.calls.assign(self.calls + 1)
        return x


class Recorder(keras.callbacks.Callback):
    """Snapshots weights and optimizer state at epoch or batch ends."""

    def __init__(self, every_batch=False):
        super().__init__()
        self.every_batch = every_batch
        self.weights, self.optimizer_state = [], []

    def _record(self):
        model = self.model
        self.weights.append([to_numpy(w).copy() for w in model.weights])
        self.optimizer_state.append(
            [to_numpy(v).copy() for v in model.optimizer.variables]
        )

    def on_train_batch_end(self, batch, logs=None):
        if self.every_batch:
            self._record()

    def on_epoch_end(self, epoch, logs=None):
        if not self.every_batch:
            self._record()


def tiny_model(compiled=True):
    model = keras.Sequential(
        [
            keras.Input((None,), dtype="int32"),
            keras.layers.Embedding(VOCAB, 8),
            keras.layers.BatchNormalization(),  # float non-trainable weights
            CallCounter(),  # int32 non-trainable weight
            keras.layers.Dense(VOCAB),
        ]
    )
    if not compiled:
        return model
    model.compile(
        optimizer=transformer_adam(hidden_dim=8, warmup_steps=4, scale=0.2),
        loss=MaskedSparseCategoricalCrossentropy(ignore_class=0, label_smoothing=0.1),
    )
    return model


def toy_data(rng, samples=32, length=6):
    x = rng.integers(1, VOCAB, size=(samples, length)).astype("int32")
    y = ((x * 3) % (VOCAB - 1) + 1).astype("int32")
    y[:, -1] = 0  # padding
    return x, y


def assert_mean_of(model, snapshots):
    """Float weights equal the mean of `snapshots`, others the newest one."""
    for i, weight in enumerate(model.weights):
        got = to_numpy(weight)
        values = [s[i] for s in snapshots]
        if keras.backend.is_float_dtype(weight.dtype):
            expected = np.mean(np.stack(values).astype("float64"), axis=0)
            np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
        else:
            np.testing.assert_array_equal(got, values[-1])


@pytest.mark.parametrize("on_disk", [False, True])
def test_averages_last_two_epochs(rng, tmp_path, on_disk):
    x, y = toy_data(rng)
    model = tiny_model()
    directory = str(tmp_path / "ckpt") if on_disk else None
    averaging = CheckpointAveraging(num_checkpoints=2, directory=directory)
    recorder = Recorder()
    model.fit(x, y, batch_size=8, epochs=3, verbose=0, callbacks=[averaging, recorder])
    assert len(recorder.weights) == 3 and averaging.num_checkpoints_kept == 2
    assert_mean_of(model, recorder.weights[-2:])
    # The average is not just the last epoch, and the int counter is copied
    # from the last checkpoint (12 training steps), not averaged (10).
    last = recorder.weights[-1]
    assert max(np.abs(to_numpy(w) - v).max() for w, v in zip(model.weights, last)) > 0
    counter = model.layers[2].calls
    assert int(to_numpy(counter)) == 12
    # The optimizer state is the one training ended with.
    for variable, value in zip(model.optimizer.variables, recorder.optimizer_state[-1]):
        np.testing.assert_array_equal(to_numpy(variable), value)
    if on_disk:
        files = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
        assert files == [
            "checkpoint-000000008.weights.h5",
            "checkpoint-000000012.weights.h5",
        ]
        # Each file is a plain Keras checkpoint of that epoch's weights.
        other = tiny_model(compiled=False)
        other.load_weights(str(tmp_path / "ckpt" / files[0]))
        for weight, value in zip(other.weights, recorder.weights[1]):
            np.testing.assert_array_equal(to_numpy(weight), value)


@pytest.mark.parametrize("on_disk", [False, True])
def test_every_n_steps_and_fewer_checkpoints_than_asked(rng, tmp_path, on_disk):
    x, y = toy_data(rng)
    model = tiny_model()
    # 4 steps per epoch, 2 epochs: checkpoints after steps 3 and 6 only.
    averaging = CheckpointAveraging(
        num_checkpoints=5, every_n_steps=3, directory=tmp_path if on_disk else None
    )
    recorder = Recorder(every_batch=True)
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[averaging, recorder])
    assert len(recorder.weights) == 8 and averaging.num_checkpoints_kept == 2
    assert_mean_of(model, [recorder.weights[2], recorder.weights[5]])
    assert int(to_numpy(model.layers[2].calls)) == 6
    # Training ran 2 steps past the last checkpoint: the optimizer keeps the
    # state of step 8, even when the checkpoints were read back from files.
    assert int(to_numpy(model.optimizer.iterations)) == 8
    for variable, value in zip(model.optimizer.variables, recorder.optimizer_state[-1]):
        np.testing.assert_array_equal(to_numpy(variable), value)


def test_average_into_other_models_and_refit_starts_fresh(rng):
    x, y = toy_data(rng)
    model = tiny_model()
    averaging = CheckpointAveraging(num_checkpoints=3)
    recorder = Recorder()
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[averaging, recorder])
    other = tiny_model(compiled=False)
    averaging.average_into(other)
    assert_mean_of(other, recorder.weights)
    small = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="do not match the checkpoints"):
        averaging.average_into(small)
    # A second fit forgets the first one's checkpoints.
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[averaging])
    assert averaging.num_checkpoints_kept == 1


def test_no_checkpoint_warns_and_keeps_weights(rng):
    x, y = toy_data(rng)
    model = tiny_model()
    averaging = CheckpointAveraging(every_n_steps=100)
    with pytest.raises(ValueError, match="No checkpoint to average yet"):
        averaging.average_into(model)
    recorder = Recorder(every_batch=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(
            x, y, batch_size=8, epochs=1, verbose=0, callbacks=[averaging, recorder]
        )
    assert any("took no checkpoint" in str(w.message) for w in caught)
    for weight, value in zip(model.weights, recorder.weights[-1]):
        np.testing.assert_array_equal(to_numpy(weight), value)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_checkpoints": 0}, "Received: num_checkpoints=0"),
        ({"num_checkpoints": 2.5}, "Received: num_checkpoints=2.5"),
        ({"every_n_steps": 0}, "Received: every_n_steps=0"),
        ({"every_n_steps": True}, "Received: every_n_steps=True"),
        ({"directory": 3}, "Received: directory=3"),
    ],
)
def test_averaging_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CheckpointAveraging(**kwargs)


def test_averaging_config_round_trip(tmp_path):
    callback = CheckpointAveraging(
        num_checkpoints=20, every_n_steps=500, directory=tmp_path / "avg"
    )
    restored = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(callback)
    )
    assert type(restored) is CheckpointAveraging
    assert (
        restored.get_config()
        == callback.get_config()
        == {
            "num_checkpoints": 20,
            "every_n_steps": 500,
            "directory": str(tmp_path / "avg"),
        }
    )
