"""`training.Adam` / `training.AdamW`: Keras' optimizers with an in-place
PyTorch update. Same numbers as Keras' on every backend."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformers.training import Adam, AdamW, WarmupCosineDecay

SHAPES = [(7, 5), (5,), (3, 4, 2)]


def run(optimizer, steps=6, seed=0):
    """`steps` updates of three variables with fixed random gradients ->
    the variables' final values."""
    rng = np.random.default_rng(seed)
    variables = [
        keras.Variable(rng.standard_normal(s).astype("float32"), name=f"v{i}")
        for i, s in enumerate(SHAPES)
    ]
    optimizer.build(variables)
    for _ in range(steps):
        grads = [
            ops.convert_to_tensor(rng.standard_normal(s).astype("float32"))
            for s in SHAPES
        ]
        optimizer.apply(grads, variables)
    return [ops.convert_to_numpy(v) for v in variables], optimizer


@pytest.fixture(params=["fused", "multi_tensor"])
def kernels(request, monkeypatch):
    """Both PyTorch update paths on this CPU: the fused kernel (CPU) and the
    multi-tensor kernels (GPU), the latter by taking the CPU off the fused
    kernel's devices. Other backends: Keras' update, the same either way."""
    if request.param == "multi_tensor":
        from keras_transformers.backend import optimizer

        monkeypatch.setattr(optimizer, "FUSED_DEVICES", ())
    return request.param


@pytest.mark.parametrize(
    "ours, theirs, kwargs",
    [
        (AdamW, keras.optimizers.AdamW, dict(learning_rate=1e-2, weight_decay=0.05)),
        (
            AdamW,
            keras.optimizers.AdamW,
            dict(learning_rate=0.1, beta_2=0.95, clipnorm=1.0),
        ),
        (Adam, keras.optimizers.Adam, dict(learning_rate=3e-3, epsilon=1e-9)),
        # An epsilon the size of sqrt(v): where it sits in the update shows.
        (Adam, keras.optimizers.Adam, dict(learning_rate=1e-2, epsilon=0.5)),
        (Adam, keras.optimizers.Adam, dict(learning_rate=1e-2, amsgrad=True)),
        (
            AdamW,
            keras.optimizers.AdamW,
            dict(learning_rate=1e-2, gradient_accumulation_steps=2),
        ),
    ],
)
def test_same_updates_as_keras(ours, theirs, kwargs, kernels):
    mine, optimizer = run(ours(**kwargs))
    reference, _ = run(theirs(**kwargs))
    for a, b in zip(mine, reference):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # The state advanced too (Keras' bias correction reads `iterations`).
    assert int(ops.convert_to_numpy(optimizer.iterations)) == 6 // kwargs.get(
        "gradient_accumulation_steps", 1
    )


def test_weight_decay_skips_excluded_variables_as_keras_does(kernels):
    """The decoupled decay, which the PyTorch update folds into its kernel,
    leaves out the variables Keras would (`exclude_from_weight_decay`)."""

    def excluding(cls):
        optimizer = cls(learning_rate=1e-2, weight_decay=0.2)
        optimizer.exclude_from_weight_decay(var_names=["v1"])
        return optimizer

    mine, _ = run(excluding(AdamW))
    reference, _ = run(excluding(keras.optimizers.AdamW))
    decayed_everywhere, _ = run(keras.optimizers.AdamW(1e-2, weight_decay=0.2))
    for a, b in zip(mine, reference):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert not np.allclose(mine[1], decayed_everywhere[1], rtol=1e-5, atol=1e-6)


def test_schedule_and_serialization():
    schedule = WarmupCosineDecay(1e-2, warmup_steps=2, decay_steps=6)
    optimizer = AdamW(learning_rate=schedule, weight_decay=0.01, beta_2=0.98)
    mine, _ = run(optimizer)
    reference, _ = run(
        keras.optimizers.AdamW(learning_rate=schedule, weight_decay=0.01, beta_2=0.98)
    )
    for a, b in zip(mine, reference):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert type(restored) is AdamW
    assert restored.get_config() == optimizer.get_config()


def test_fit_save_and_load_keep_the_optimizer(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((32, 4)).astype("float32")
    y = x @ rng.standard_normal((4, 1)).astype("float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=AdamW(learning_rate=0.1, weight_decay=0.0), loss="mse")
    first = model.evaluate(x, y, verbose=0)
    model.fit(x, y, epochs=20, batch_size=8, verbose=0)
    assert model.evaluate(x, y, verbose=0) < 0.1 * first
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    assert type(loaded.optimizer) is AdamW
    for a, b in zip(loaded.optimizer.variables, model.optimizer.variables):
        np.testing.assert_array_equal(ops.convert_to_numpy(a), ops.convert_to_numpy(b))
