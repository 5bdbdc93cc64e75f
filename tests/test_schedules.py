"""Learning-rate schedules of `keras_transformers.training`: values against
closed forms (float64 references), serialization, and use by an optimizer,
on the backend named by `KERAS_BACKEND`."""

import math

import keras
import numpy as np
import pytest
from contracts import round_trip, to_float
from keras import ops

from keras_transformers.training import InverseSquareRootSchedule, WarmupCosineDecay


def np_warmup_cosine(step, peak, warmup, decay, floor):
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(max((step - warmup) / max(decay - warmup, 1), 0.0), 1.0)
    return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * progress))


class TestWarmupCosineDecay:
    ARGS = dict(
        peak_learning_rate=1e-3,
        warmup_steps=10,
        decay_steps=100,
        min_learning_rate=1e-5,
    )

    def test_matches_reference(self):
        schedule = WarmupCosineDecay(**self.ARGS)
        steps = list(range(0, 130, 3)) + [9, 10, 11, 99, 100]
        for step in steps:
            expected = np_warmup_cosine(step, 1e-3, 10, 100, 1e-5)
            for value in (step, np.int32(step), np.float32(step)):
                got = to_float(schedule(ops.convert_to_tensor(value)))
                np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-9)

    def test_shape_of_the_curve(self):
        schedule = WarmupCosineDecay(**self.ARGS)
        values = np.array([to_float(schedule(s)) for s in range(120)])
        assert values[0] > 0
        np.testing.assert_allclose(values[0], 1e-4, rtol=1e-5)
        np.testing.assert_allclose(values.max(), 1e-3, rtol=1e-6)
        np.testing.assert_allclose(values[[9, 10]], 1e-3, rtol=1e-6)
        assert np.all(np.diff(values[:10]) > 0)
        assert np.all(np.diff(values[10:101]) < 0)
        np.testing.assert_allclose(values[100:], 1e-5, rtol=1e-5)

    def test_no_warmup_starts_at_peak(self):
        schedule = WarmupCosineDecay(2.0, warmup_steps=0, decay_steps=4)
        got = [to_float(schedule(s)) for s in range(6)]
        np.testing.assert_allclose(
            got, [2.0, 1 + 2**-0.5, 1.0, 1 - 2**-0.5, 0, 0], atol=1e-6
        )

    def test_optimizer_iterations_step(self):
        optimizer = keras.optimizers.AdamW(WarmupCosineDecay(**self.ARGS))
        np.testing.assert_allclose(to_float(optimizer.learning_rate), 1e-4, rtol=1e-5)

    @pytest.mark.parametrize(
        "changes, message",
        [
            ({"warmup_steps": -1}, "Received: warmup_steps=-1"),
            ({"warmup_steps": 2.5}, "Received: warmup_steps=2.5"),
            ({"decay_steps": 5}, "Received: decay_steps=5"),
            ({"decay_steps": 0, "warmup_steps": 0}, "Received: decay_steps=0"),
            ({"peak_learning_rate": 0.0}, "Received: peak_learning_rate=0.0"),
            ({"min_learning_rate": -1.0}, "Received: min_learning_rate=-1.0"),
            ({"min_learning_rate": 1.0}, "Received: min_learning_rate=1.0"),
        ],
    )
    def test_validation(self, changes, message):
        with pytest.raises(ValueError, match=message):
            WarmupCosineDecay(**{**self.ARGS, **changes})

    def test_serialization(self):
        schedule = WarmupCosineDecay(**self.ARGS)
        restored = round_trip(schedule)
        assert to_float(restored(37)) == to_float(schedule(37))


class TestInverseSquareRootSchedule:
    def test_matches_reference(self):
        schedule = InverseSquareRootSchedule(hidden_dim=512, warmup_steps=40, scale=2.0)
        for step in [0, 1, 10, 38, 39, 40, 41, 100, 10_000]:
            s = step + 1
            expected = 2.0 * 512**-0.5 * min(s**-0.5, s * 40**-1.5)
            for value in (step, np.int32(step), np.float32(step)):
                got = to_float(schedule(ops.convert_to_tensor(value)))
                np.testing.assert_allclose(got, expected, rtol=1e-5)

    def test_peak(self):
        schedule = InverseSquareRootSchedule(hidden_dim=64, warmup_steps=30)
        values = np.array([to_float(schedule(s)) for s in range(100)])
        assert values[0] > 0
        assert int(np.argmax(values)) == 29  # s = step + 1 = warmup_steps
        np.testing.assert_allclose(values.max(), (64 * 30) ** -0.5, rtol=1e-5)

    @pytest.mark.parametrize(
        "changes, message",
        [
            ({"hidden_dim": 0}, "Received: hidden_dim=0"),
            ({"warmup_steps": 0}, "Received: warmup_steps=0"),
            ({"scale": -1.0}, "Received: scale=-1.0"),
        ],
    )
    def test_validation(self, changes, message):
        with pytest.raises(ValueError, match=message):
            InverseSquareRootSchedule(**{"hidden_dim": 8, **changes})

    def test_serialization(self):
        schedule = InverseSquareRootSchedule(
            hidden_dim=256, warmup_steps=100, scale=0.5
        )
        restored = round_trip(schedule)
        assert to_float(restored(7)) == to_float(schedule(7))
