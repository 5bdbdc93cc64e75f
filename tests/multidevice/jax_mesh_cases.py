"""Cases run on 8 simulated JAX CPU devices (see tests/test_distribution.py,
which starts this file in its own pytest process with
`XLA_FLAGS=--xla_force_host_platform_device_count=8`).

For each family: `fit()` under `ModelParallel` (our layout map; and for
one family under `DataParallel`) gives the loss trajectory of the same
model on one device;
the variables are sharded as the layout says; `generate()` on the sharded
model gives the one-device tokens.
"""

import os

import keras
import numpy as np
import pytest
from families import FAMILIES, IDS

from keras_transformers import distribution as kd

pytestmark = pytest.mark.skipif(
    keras.config.backend() != "jax" or len(keras.distribution.list_devices()) != 8,
    reason="needs KERAS_BACKEND=jax and XLA_FLAGS=--xla_force_host_platform_device_count=8",
)


def _build(name, distribution=None):
    cls, preset, extra, data, *_ = FAMILIES[name]
    keras.utils.set_random_seed(7)
    model = cls.from_preset(
        preset, dropout=0.0, distribution=distribution, **{"num_layers": 1, **extra}
    )
    x, y, loss = data()
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss)
    return model, x, y


def _losses(model, x, y):
    history = model.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0)
    return history.history["loss"]


@pytest.fixture(autouse=True)
def _no_distribution():
    keras.distribution.set_distribution(None)
    yield
    keras.distribution.set_distribution(None)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_fit_matches_one_device(name):
    """Model parallelism (each family's own layout) for every family; data
    parallelism, which shards only the batch whatever the family, for one."""
    single, x, y = _build(name)
    weights = single.get_weights()
    expected = _losses(single, x, y)
    for kind in ("data", "model") if name == "llama" else ("model",):
        model, _, _ = _build(name, distribution=kind)
        model.set_weights(weights)
        np.testing.assert_allclose(
            _losses(model, x, y), expected, rtol=2e-5, err_msg=kind
        )
        keras.distribution.set_distribution(None)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_variables_sharded_as_the_layout_says(name):
    *_, suffix, axes = FAMILIES[name]
    model, _, _ = _build(name, distribution="model")
    mesh = keras.distribution.distribution().device_mesh
    layouts = kd.variable_layouts(model)
    matched = [path for path in layouts if path.endswith(suffix)]
    assert matched, f"no variable ends with {suffix}"
    for path in matched:
        assert layouts[path] == axes, path
        variable = next(v for v in model.variables if v.path == path)
        sharding = variable.value.sharding
        assert tuple(sharding.spec) + (None,) * (len(axes) - len(sharding.spec)) == axes
        shard = sharding.shard_shape(variable.shape)
        for size, full, axis in zip(shard, variable.shape, axes):
            split = dict(zip(mesh.axis_names, mesh.shape)).get(axis, 1)
            assert size == full // split, (path, shard)
    # Norms stay replicated.
    norms = [p for p in layouts if p.endswith(("gamma", "scale"))]
    assert norms and all(not any(layouts[p]) for p in norms)


@pytest.mark.parametrize(
    "name", ["gpt2", "llama", "mixtral", "qwen3_5", "qwen_moe", "seq2seq"]
)
def test_generate_on_sharded_model(name):
    single, x, _ = _build(name)
    weights = single.get_weights()
    if name == "seq2seq":
        args = (x["encoder_token_ids"][:2],)
    else:
        args = ({"token_ids": IDS[:2, :5], "padding_mask": np.ones((2, 5), bool)},)
    expected = single.generate(*args, max_new_tokens=4, stop_token_ids=None)
    model, _, _ = _build(name, distribution="auto")
    model.set_weights(weights)
    got = model.generate(*args, max_new_tokens=4, stop_token_ids=None)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


def test_auto_mesh_and_expert_axis():
    from keras_transformers import load_config

    dist = kd.make_distribution(load_config("mixtral_tiny"), "auto")
    mesh = dist.device_mesh
    assert dict(zip(mesh.axis_names, mesh.shape)) == {
        "batch": 1,
        "expert": 4,
        "model": 2,
    }
    dist = kd.make_distribution(load_config("gpt2_tiny"), {"batch": 4, "model": 2})
    assert dist.device_mesh.shape == (4, 2)
    with pytest.raises(ValueError, match="needs 6 devices"):
        kd.make_distribution(load_config("gpt2_tiny"), {"batch": 3, "model": 2})
    assert os.environ["XLA_FLAGS"].endswith("count=8")


def test_saved_preset_loads_sharded(tmp_path):
    single, x, _ = _build("llama")
    single.save_to_preset(tmp_path / "preset")
    expected = single.predict(x, verbose=0)
    model = type(single).from_preset(tmp_path / "preset", distribution="model")
    assert kd.variable_layouts(model)["token_embedding/embeddings"] == ("model", None)
    np.testing.assert_allclose(model.predict(x, verbose=0), expected, atol=2e-5)
