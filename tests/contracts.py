"""Shared test contracts: a family's tests call these instead of repeating them."""

from __future__ import annotations

import functools
import inspect
import json
import os
import shutil
import weakref

import keras
import numpy as np


def jax_test_settings():
    """JAX's settings for test processes, as `jax.config` names and values:
    XLA's costly LLVM passes off, and (unless
    KERAS_TRANSFORMERS_JAX_TEST_CACHE is "off"; it may name the folder) a
    compilation cache shared by the xdist workers and across runs. No
    cache size limit: with one, every write lists and stats the whole
    folder under a lock the workers share (thousands of entries)."""
    settings = {"jax_disable_most_optimizations": True}
    default = os.path.join(os.path.expanduser("~"), ".cache", "kt_jax_tests")
    cache = os.environ.get("KERAS_TRANSFORMERS_JAX_TEST_CACHE", default)
    if cache != "off":
        settings["jax_compilation_cache_dir"] = cache
        settings["jax_persistent_cache_min_compile_time_secs"] = 0
        settings["jax_persistent_cache_min_entry_size_bytes"] = 0
    return settings


def toy_run_env(**extra):
    """The environment of a subprocess that runs an example at toy size,
    where compiling is most of the time: `jax_test_settings()` as JAX's
    environment variables (the other backends ignore them). Not for a run
    whose steps take the time."""
    jax_env = {name.upper(): str(value) for name, value in jax_test_settings().items()}
    return {**os.environ, **jax_env, **extra}


def compiled(fn):
    """`fn`, on JAX as one compiled program per input shape (eager JAX
    compiles each op of a new model or shape on its own: several times the
    cost); unchanged on the other backends."""
    if keras.config.backend() != "jax":
        return fn
    import jax

    return jax.jit(fn)


def compiled_call(layer, *args, **kwargs):
    """`layer(*args, **kwargs)`; on JAX as one compiled program (see
    `compiled`; `kwargs` are constants of it) whose new values of the
    layer's non-trainable variables (statistics, seed states) are assigned
    as an eager call assigns them. (Losses the call adds are not kept.)"""
    if keras.config.backend() != "jax":
        return layer(*args, **kwargs)

    trainable = [v.value for v in layer.trainable_variables]
    other = [v.value for v in layer.non_trainable_variables]
    out, state = _stateless_program(layer, kwargs)(trainable, other, *args)
    for variable, value in zip(layer.non_trainable_variables, state):
        variable.assign(value)
    return out


def stateless(fn, variables):
    """`pure(values, *args)`: `fn(*args)` reading the Keras `variables` from
    `values` instead (their updates discarded), as `jax.jit` and `jax.grad`
    take a function."""

    def pure(values, *args):
        with keras.StatelessScope(state_mapping=list(zip(variables, values))):
            return fn(*args)

    return pure


def compiled_reading(fn, variables):
    """`fn(*args)` reading the Keras `variables`; on JAX one compiled
    program per input shape that takes the variables' current values as
    arguments (their updates discarded); unchanged on the other backends."""
    if keras.config.backend() != "jax":
        return fn
    program = compiled(stateless(fn, variables))
    return lambda *args: program([v.value for v in variables], *args)


def compiled_cached_call(model, traced_index=True, **constants):
    """`call(token_ids, cache, index)`: `model.call_with_cache(token_ids,
    cache, index, **constants)` (`constants`: what every step passes on,
    e.g. a seq2seq model's `encoder_padding_mask`). On JAX one compiled
    program per input shape whose position `index` (a Python int) is a
    traced int32 scalar, as generation's loop passes it: every
    single-token step runs one program where eager JAX compiles each op
    again for each new position. `traced_index=False` keeps the position a
    Python int (a prefill at 0, as generation's prefill calls it)."""
    if keras.config.backend() != "jax":
        return functools.partial(model.call_with_cache, **constants)
    import jax

    variables = model.variables

    def step(token_ids, cache, index, constants):
        return model.call_with_cache(token_ids, cache, index, **constants)

    program = jax.jit(
        stateless(step, variables), static_argnums=() if traced_index else (3,)
    )

    def call(token_ids, cache, index):
        index = jax.numpy.asarray(index, "int32") if traced_index else int(index)
        values = [v.value for v in variables]
        return program(values, token_ids, cache, index, constants)

    return call


def without_inductor(monkeypatch):
    """`torch.compile(fn)` (Keras' compiled steps, `compile_step`) with
    `backend="aot_eager"` for the test: the same Dynamo graphs, guards and
    AOTAutograd backward, without Inductor's C++ code generation."""
    import torch

    monkeypatch.setattr(
        torch, "compile", functools.partial(torch.compile, backend="aot_eager")
    )


def compiled_forward(model, x):
    """`model(x)`; on JAX as one compiled program (see `compiled`)."""
    if keras.config.backend() != "jax":
        return model(x)
    trainable = [v.value for v in model.trainable_variables]
    other = [v.value for v in model.non_trainable_variables]
    return _stateless_program(model, {})(trainable, other, x)[0]


# `compiled_call` / `compiled_forward`'s programs, kept per layer and call
# keywords: a new `jax.jit` at every call traces, lowers and compiles the
# layer again (a loop of calls: one compilation per call).
_PROGRAMS = weakref.WeakKeyDictionary()


def _stateless_program(layer, kwargs):
    """`jax.jit` of `layer.stateless_call(trainable, non_trainable, *args,
    **kwargs)`, made once per layer and (hashable) `kwargs`."""
    try:
        key = tuple(sorted(kwargs.items()))
        hash(key)
    except TypeError:  # unhashable keywords: a program for this call only
        key = None
    programs = _PROGRAMS.setdefault(layer, {})
    if key is None or key not in programs:
        layer_ref = weakref.ref(layer)  # the cache must not keep the layer alive

        def call(trainable, non_trainable, *args):
            return layer_ref().stateless_call(trainable, non_trainable, *args, **kwargs)

        if key is None:
            return compiled(call)
        programs[key] = compiled(call)
    return programs[key]


def to_numpy(x):
    if isinstance(x, dict):
        return {k: to_numpy(v) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(to_numpy(v) for v in x)
    if not isinstance(x, (np.ndarray, np.generic, float, int)):
        x = keras.ops.stop_gradient(x)  # torch tensors that require grad
    return np.asarray(keras.ops.convert_to_numpy(x))


def to_float(x):
    """A scalar tensor of any backend as a Python float."""
    return float(to_numpy(x))


def round_trip(obj):
    """`obj` (a Keras schedule, loss, metric, ...) serialized and revived:
    checks the type and the config survive, returns the revived object."""
    restored = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(obj)
    )
    assert type(restored) is type(obj)
    assert restored.get_config() == obj.get_config()
    return restored


def assert_close(a, b, atol=1e-5, rtol=0.0):
    a, b = to_numpy(a), to_numpy(b)
    if isinstance(a, dict):
        for key in a:
            assert_close(a[key], b[key], atol, rtol)
        return
    np.testing.assert_allclose(a, b, atol=atol, rtol=rtol)


def assert_same_greedy(model, got, want, tie=1e-5):
    """Greedy tokens `got` equal `want` (`[B, L]`, each row its prompt then
    its new tokens) up to a near tie: where a row first differs, the
    model's eager next-token logits for `want`'s prefix rank the two tokens
    within `tie` (relative to the largest logit) -- a one-ulp difference
    between two programs' float32 sums may pick either; the row's later
    tokens then follow a different prefix and are not compared."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    for row in np.flatnonzero((got != want).any(axis=-1)):
        p = int(np.flatnonzero(got[row] != want[row])[0])
        logits = to_numpy(model(want[row : row + 1, :p]))[0, -1]
        gap = abs(logits[want[row, p]] - logits[got[row, p]])
        assert gap <= tie * np.abs(logits).max(), (
            f"row {row} differs at {p}: {got[row]} vs {want[row]}, "
            f"logit gap {gap} is not a near tie"
        )


def run_layer_test(layer_cls, init_kwargs, call_args, expected_shape, call_kwargs=None):
    """Builds and calls a layer, then checks: output shape, every constructor
    argument round-trips through `get_config()`, `from_config` rebuilds a
    layer that gives the same output once weights are copied, and Keras
    serialization by name works."""
    call_kwargs = call_kwargs or {}
    layer = layer_cls(**init_kwargs)
    out = layer(*call_args, **call_kwargs)
    first = out[0] if isinstance(out, tuple) else out
    assert tuple(first.shape) == tuple(expected_shape)
    config = layer.get_config()
    signature = inspect.signature(layer_cls.__init__).parameters
    for name in signature:
        if name in ("self", "kwargs", "args"):
            continue
        assert name in config, f"{layer_cls.__name__}.get_config() lacks {name!r}"
    for name, value in init_kwargs.items():
        if not isinstance(value, (keras.layers.Layer, keras.initializers.Initializer)):
            assert config[name] == value, f"{name}: {config[name]!r} != {value!r}"
    clone = layer_cls.from_config(config)
    clone(*call_args, **call_kwargs)
    clone.set_weights(layer.get_weights())
    out2 = clone(*call_args, **call_kwargs)
    assert_close(out, out2, atol=1e-6)
    revived = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(layer)
    )
    assert type(revived) is layer_cls
    return layer, out


def run_saving_test(model, inputs, tmp_path, atol=1e-6):
    """`.keras` and preset-directory round trips give identical outputs."""
    expected = to_numpy(model(inputs))
    path = os.path.join(tmp_path, "model.keras")
    model.save(path)
    restored = keras.saving.load_model(path)
    assert type(restored) is type(model)
    assert_close(restored(inputs), expected, atol=atol)
    preset = os.path.join(tmp_path, "preset")
    model.save_to_preset(preset)
    reloaded = type(model).from_preset(preset)
    assert reloaded.config == model.config
    assert_close(reloaded(inputs), expected, atol=atol)
    return reloaded


def run_fit_test(model, x, y, loss=None, steps=2):
    """A couple of `fit` steps run and keep the loss finite."""
    model.compile(
        optimizer=keras.optimizers.AdamW(1e-3),
        loss=loss or keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    history = model.fit(x, y, batch_size=len(y) // steps or 1, epochs=1, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)), losses
    return history


def randomize_weights(model, seed=0):
    """Gives every weight random values (norm scales near 1, the rest small),
    identical on every backend, so parity tests see non-trivial weights."""
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        noise = rng.standard_normal(tuple(variable.shape)).astype("float32")
        is_scale = "norm" in variable.path and variable.path.endswith(
            ("gamma", "scale")
        )
        variable.assign(1 + 0.2 * noise if is_scale else 0.1 * noise)
    return model


def edited_hf_dir(src, dst, **changes):
    """A copy of the Hugging Face directory `src` at `dst` whose config.json
    has `changes` applied."""
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config.update(changes)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def graph_ancestors(op):
    """Every op of a TensorFlow graph that `op` depends on, through its
    inputs and control inputs."""
    seen, stack = set(), [op]
    while stack:
        current = stack.pop()
        for parent in [t.op for t in current.inputs] + list(current.control_inputs):
            if parent not in seen:
                seen.add(parent)
                stack.append(parent)
    return seen


def gradients(loss_fn, variables):
    """Gradients of the scalar `loss_fn()` with respect to the Keras
    `variables`, as NumPy arrays, on the current backend."""
    backend = keras.config.backend()
    if backend == "jax":
        import jax

        # One compiled program (see `compiled`): eager `jax.grad` runs, and
        # compiles, the forward and backward passes op by op.
        grad = jax.jit(jax.grad(stateless(loss_fn, variables)))
        return to_numpy(grad([v.value for v in variables]))
    if backend == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            tape.watch([v.value for v in variables])
            loss = loss_fn()
        return to_numpy(tape.gradient(loss, [v.value for v in variables]))
    import torch

    return to_numpy(list(torch.autograd.grad(loss_fn(), [v.value for v in variables])))
