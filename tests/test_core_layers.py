"""The Keras core layers with PyTorch's fused kernels (`layers/core.py`) give
Keras' numbers, gradients and dtypes on every backend; the eager decode-loop
helpers of `backend/` behave like `keras.ops.while_loop`."""

import contextlib

import keras
import numpy as np
import pytest
from contracts import assert_close, to_numpy

from keras_transformers import backend
from keras_transformers.layers import core

PAIRS = [
    # (ours, Keras', constructor kwargs, input shape)
    (core.Dense, keras.layers.Dense, dict(units=12, activation="relu"), (3, 5, 8)),
    (core.Dense, keras.layers.Dense, dict(units=12, use_bias=False), (3, 5, 8)),
    (
        core.EinsumDense,
        keras.layers.EinsumDense,
        dict(equation="btd,dnh->btnh", output_shape=(None, 2, 6), bias_axes="nh"),
        (3, 5, 8),
    ),
    (
        core.EinsumDense,
        keras.layers.EinsumDense,
        dict(equation="btnh,nhd->btd", output_shape=(None, 8), bias_axes="d"),
        (3, 5, 2, 6),
    ),
    (  # not a flattened product: Keras' own einsum path
        core.EinsumDense,
        keras.layers.EinsumDense,
        dict(equation="btd,dnh->bnth", output_shape=(2, None, 6)),
        (3, 5, 8),
    ),
    (core.LayerNormalization, keras.layers.LayerNormalization, {}, (3, 5, 8)),
    (core.RMSNormalization, keras.layers.RMSNormalization, {}, (3, 5, 8)),
]


def _pair(ours_cls, keras_cls, kwargs, shape, rng, dtype=None):
    ours, ref = ours_cls(dtype=dtype, **kwargs), keras_cls(dtype=dtype, **kwargs)
    ours.build(shape), ref.build(shape)
    weights = [rng.normal(size=w.shape).astype("float32") for w in ref.weights]
    ref.set_weights(weights), ours.set_weights(weights)
    return ours, ref


@pytest.mark.parametrize("ours_cls, keras_cls, kwargs, shape", PAIRS)
def test_same_outputs_and_training_as_keras(ours_cls, keras_cls, kwargs, shape, rng):
    ours, ref = _pair(ours_cls, keras_cls, kwargs, shape, rng)
    x = rng.normal(size=shape).astype("float32")
    assert_close(ours(x), ref(x), atol=1e-5)
    assert_close(ours.call(x), ref(x), atol=1e-5)  # the direct call of decoding
    # Gradients: two SGD steps on a squared-output loss move both alike. One
    # model (one compiled step) trains both: each output's loss reaches only
    # its own layer's weights.
    y = np.zeros_like(to_numpy(ref(x)))
    inputs = keras.Input(shape[1:])
    model = keras.Model(inputs, [ours(inputs), ref(inputs)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss=["mse", "mse"])
    model.fit(x, [y, y], epochs=2, batch_size=shape[0], verbose=0)
    for a, b in zip(ours.get_weights(), ref.get_weights()):
        assert_close(a, b, atol=1e-5)


@pytest.mark.parametrize("ours_cls, keras_cls, kwargs, shape", PAIRS)
def test_mixed_precision_dtypes_match_keras(ours_cls, keras_cls, kwargs, shape, rng):
    ours, ref = _pair(ours_cls, keras_cls, kwargs, shape, rng, "mixed_bfloat16")
    x = rng.normal(size=shape).astype("float32")
    out, expected = ours(x), ref(x)
    assert keras.backend.standardize_dtype(out.dtype) == "bfloat16"
    assert out.dtype == expected.dtype
    assert_close(
        keras.ops.cast(out, "float32"), keras.ops.cast(expected, "float32"), atol=0.1
    )
    spec = ours.compute_output_spec(keras.KerasTensor(shape, "float32"))
    assert spec.dtype == ref.compute_output_spec(keras.KerasTensor(shape)).dtype


def test_int8_quantized_dense_matches_keras(rng):
    ours, ref = _pair(core.Dense, keras.layers.Dense, dict(units=12), (3, 8), rng)
    ours.quantize("int8"), ref.quantize("int8")  # Keras refuses subclasses by default
    x = rng.normal(size=(3, 8)).astype("float32")
    assert ours.quantization_mode == "int8"
    assert_close(ours(x), ref(x), atol=1e-6)
    assert_close(ours.call(x), ref(x), atol=1e-6)  # direct call: quantized too


def test_contracted_axes_recognises_flattened_products():
    axes = core._contracted_axes
    assert axes("btd,dnh->btnh", "nh") == 1
    assert axes("btd,dnh->btnh", None) == 1
    assert axes("btnh,nhd->btd", "d") == 2
    assert axes("btd,dnh->bnth", None) is None  # output axes reordered
    assert axes("btd,dnh->btnh", "h") is None  # bias over part of the output
    assert axes("btd,ndh->btnh", None) is None  # kernel axes in another order


@pytest.mark.parametrize("contracted", [1, 2])
def test_linear_fast_path_is_the_flattened_product(contracted, rng):
    """`backend.linear` is one fused product on PyTorch and a 2-D product on
    XLA:CPU and TensorFlow (no transposed copies in its gradient), with
    Keras' numbers; elsewhere it declines (None) and callers use Keras' ops."""
    x = rng.normal(size=(2, 5, 3, 4)[: 2 + contracted]).astype("float32")
    inner = x.shape[2:]
    kernel = rng.normal(size=(*inner, 2, 6)).astype("float32")
    bias = rng.normal(size=(2, 6)).astype("float32")
    out = backend.linear(keras.ops.convert_to_tensor(x), kernel, bias, contracted)
    expected_to_apply = (
        keras.config.backend() in ("torch", "tensorflow") or backend.xla_cpu()
    )
    assert (out is not None) == expected_to_apply
    if out is not None:
        flat = x.reshape(2, 5, -1) @ kernel.reshape(-1, 12) + bias.reshape(-1)
        assert tuple(out.shape) == (2, 5, 2, 6)
        assert_close(out, flat.reshape(2, 5, 2, 6), atol=1e-5)


def test_eager_while_loop_keeps_python_ints():
    seen = []

    def cond(i, total):
        return i < 5

    def body(i, total):
        seen.append(type(i))
        return i + 1, total + keras.ops.ones(())

    start = backend.loop_index(2)
    i, total = backend.while_loop(cond, body, (start, keras.ops.zeros(())))
    assert int(to_numpy(i)) == 5 and float(to_numpy(total)) == 3.0
    if backend.eager_loops():  # PyTorch: no tensor conversion per step
        assert seen == [int, int, int]
    else:
        assert not isinstance(start, int)


def test_memo_shares_values_only_inside_eager_decoding():
    calls = []

    def compute():
        calls.append(1)
        return keras.ops.ones((2,))

    def step(x):
        a = backend.memo(("k", 1), compute)
        b = backend.memo(("k", 1), compute)
        c = backend.memo(("k", 2), compute)
        return x + a + b + c

    variable = keras.Variable(np.zeros((2,), "float32"))
    run = backend.compile_function(step, [variable], direct_calls=True)
    out = run(keras.ops.zeros((2,)))
    assert_close(out, np.full((2,), 3.0))
    if keras.config.backend() == "torch":  # eager: computed once per key
        assert len(calls) == 2
        assert backend._MEMO[0] is None  # cleared after the call
    step(keras.ops.zeros((2,)))  # outside: computed every time
    assert len(calls) in (5, 6)  # 2 or 3 (traced) inside, 3 outside


def test_rotary_angles_shared_by_layers_match_a_fresh_computation(rng):
    from keras_transformers.layers import RotaryEmbedding

    rotary = RotaryEmbedding(max_wavelength=500.0, scaling_factor=2.0)
    q = rng.standard_normal((2, 3, 4, 8)).astype("float32")
    k = rng.standard_normal((2, 3, 2, 8)).astype("float32")
    positions = keras.ops.arange(3) + 5
    expected = rotary.rotate((q, k), positions)

    def step(q, k):
        first = rotary.rotate((q, k), positions)
        again = rotary.rotate((q, k), positions)  # memo hit while decoding
        return first + again

    out = backend.compile_function(step, [], direct_calls=True)(q, k)
    for got, want in zip(out, [*expected, *expected]):
        assert_close(got, want, atol=1e-6)


def test_none_if_all_true():
    full = keras.ops.ones((2, 4), "bool")
    padded = keras.ops.convert_to_tensor(np.array([[1, 1, 0, 0], [1, 1, 1, 1]], bool))
    assert backend.none_if_all_true(None) is None
    assert backend.none_if_all_true(padded) is padded
    if keras.config.backend() == "torch":  # known now: attention skips the mask
        assert backend.none_if_all_true(full) is None
    else:  # traced backends keep it
        assert backend.none_if_all_true(full) is full


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_direct_calls_in_training_change_nothing_but_the_bookkeeping(
    policy, rng, monkeypatch
):
    """PyTorch training calls a block's sub-layers directly (`direct_calls`)
    when nothing needs autocasting: same outputs, dropout masks and added
    losses as through `Layer.__call__`; with a mixed policy, every sub-layer
    still goes through `Layer.__call__`."""
    from keras_transformers.models import MixtralCausalLM

    lm = MixtralCausalLM.from_preset(
        "mixtral_tiny",
        dropout=0.2,
        attention_dropout=0.2,
        moe={"num_shared_experts": 1, "router_z_loss_coef": 0.01},
        dtype=policy,
    )
    ids = rng.integers(3, 512, (2, 12)).astype("int32")
    x = {"token_ids": ids, "padding_mask": np.ones((2, 12), bool)}
    seeds = [v.numpy() for v in lm.non_trainable_variables]
    called = []
    real_call = keras.layers.Layer.__call__

    def spy(layer, *args, **kwargs):
        called.append(type(layer).__name__)
        return real_call(layer, *args, **kwargs)

    monkeypatch.setattr(keras.layers.Layer, "__call__", spy)

    def forward():  # the same dropout masks each time:
        keras.utils.set_random_seed(7)  # the fused attention's (backend RNG)
        for v, value in zip(lm.non_trainable_variables, seeds):
            v.assign(value)  # Keras' seed generators
        called.clear()
        out = lm(x, training=True)
        return to_numpy(out), [to_numpy(loss) for loss in lm.losses], list(called)

    out, losses, calls = forward()
    direct = keras.config.backend() == "torch" and policy == "float32"
    assert ("EinsumDense" in calls) != direct  # the attention projections
    # the blocks too (Keras' `Layer.__call__` only for rematerialised ones)
    assert ("TransformerBlock" in calls) != direct
    monkeypatch.setattr(backend, "direct_calls", lambda layers: _nothing())
    ref_out, ref_losses, ref_calls = forward()
    assert "EinsumDense" in ref_calls
    assert_close(out, ref_out, atol=1e-6)
    assert len(losses) == len(ref_losses) == 2 * lm.config.num_layers
    assert_close(np.array(losses), np.array(ref_losses), atol=1e-6)
    again, _, _ = forward()
    assert not np.allclose(again, to_numpy(lm(x, training=False)))  # dropout was on


@contextlib.contextmanager
def _nothing():
    yield
