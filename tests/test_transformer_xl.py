"""Transformer-XL: relative positional attention against a NumPy
transcription of the paper (relative shift included), segment memory
(a second segment with memory equals a joint causal pass; no gradient reaches
the memory), stateful `fit()` over consecutive segments, generation with
memory, saving, and config errors."""

import functools

import keras
import numpy as np
import pytest
from contracts import compiled_call, compiled_forward, compiled_reading
from keras import ops

import keras_transformers as kt
from keras_transformers.data import segment_batches
from keras_transformers.layers import MultiHeadAttention
from keras_transformers.layers.relative_xl import TransformerXLBias
from keras_transformers.models import GPTCausalLM
from keras_transformers.training import MaskedSparseCategoricalCrossentropy

TINY = dict(
    vocabulary_size=40,
    num_layers=2,
    hidden_dim=16,
    num_heads=2,
    intermediate_dim=32,
    max_sequence_length=64,
    position_embedding="transformer_xl",
    memory_length=6,
)


# ------------------------------------------------------- NumPy reference
def np_rel_shift(x):
    """The paper's shift (`_rel_shift` of the reference code) on the last
    two axes `[..., T, S]`: pad a zero column, view as `[S + 1, T]`, drop
    the first row, view back."""
    *lead, t, s = x.shape
    padded = np.concatenate([np.zeros((*lead, t, 1), x.dtype), x], axis=-1)
    return padded.reshape(*lead, s + 1, t)[..., 1:, :].reshape(*lead, t, s)


def np_sinusoid(positions, dim):
    inverse = 1.0 / 10000 ** (np.arange(0, dim, 2.0) / dim)
    angles = np.outer(positions, inverse)
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=-1)


def np_xl_attention(x, mem, mem_mask, weights, clamp_len=None):
    """Relative multi-head attention of Transformer-XL (section 3.3) over
    `concat(mem, x)`, causal, float64. `weights`: query / key / value
    kernels `[D, N|K, H]`, output kernel `[N, H, D]`, u, v `[N, H]`,
    W_r `[D, N, H]`."""
    wq, wk, wv, wo, u, v, wr = weights
    n, h = u.shape
    cat = np.concatenate([mem, x], axis=1)  # [B, S, D]
    (b, t, d), s = x.shape, cat.shape[1]
    q = np.einsum("btd,dnh->btnh", x, wq)
    k = np.einsum("bsd,dkh->bskh", cat, wk)
    val = np.einsum("bsd,dkh->bskh", cat, wv)
    k = np.repeat(k, n // k.shape[2], axis=2)  # grouped heads
    val = np.repeat(val, n // val.shape[2], axis=2)
    pos_seq = np.arange(s - 1, -1, -1.0)
    if clamp_len is not None:
        pos_seq = np.minimum(pos_seq, clamp_len)
    r = np.einsum("sd,dnh->snh", np_sinusoid(pos_seq, d), wr)  # [S, N, H]
    ac = np.einsum("binh,bjnh->bnij", q + u, k)
    bd = np_rel_shift(np.einsum("binh,jnh->bnij", q + v, r))
    score = (ac + bd) / np.sqrt(h)
    m = mem.shape[1]
    allowed = np.arange(s)[None, :] <= np.arange(t)[:, None] + m  # [T, S]
    keys = np.concatenate([mem_mask, np.ones((b, t), bool)], axis=1)
    allowed = allowed[None, None] & keys[:, None, None, :]
    score = np.where(allowed, score, -1e30)
    prob = np.exp(score - score.max(-1, keepdims=True))
    prob /= prob.sum(-1, keepdims=True)
    out = np.einsum("bnij,bjnh->binh", prob, val)
    return np.einsum("btnh,nhd->btd", out, wo)


def test_rel_shift_reference_is_the_distance_table(rng):
    """The NumPy shift puts the score of distance `M + i - j` at `(i, j)`."""
    t, s = 3, 7
    table = rng.normal(size=(t, s))  # column c: distance s - 1 - c
    shifted = np_rel_shift(table)
    for i in range(t):
        for j in range(s - t + i + 1):
            assert shifted[i, j] == table[i, s - 1 - (s - t + i - j)]


@pytest.mark.parametrize("num_kv_heads, clamp_len", [(None, None), (1, 3)])
def test_relative_attention_matches_numpy_reference(rng, num_kv_heads, clamp_len):
    b, t, m, d, n, h = 2, 5, 4, 8, 2, 4
    kw = dict(num_kv_heads=num_kv_heads)
    attention = MultiHeadAttention(n, h, causal=True, use_bias=False, **kw)
    bias = TransformerXLBias(n, h, d, clamp_len=clamp_len, **kw)
    x = rng.normal(size=(b, t, d)).astype("float32")
    mem = rng.normal(size=(b, m, d)).astype("float32")
    mem_mask = np.ones((b, m), bool)
    mem_mask[1, :2] = False  # row 1: its first two memory slots are stale
    attention.build(x.shape)
    bias.build()
    for w in (bias.content_bias, bias.position_bias):  # non-zero biases
        w.assign(rng.normal(size=w.shape).astype("float32"))
    out = compiled_reading(
        lambda x, mem, mask: attention(
            x, attention_bias=bias.bias_fn(), memory=mem, memory_mask=mask
        ),
        attention.variables + bias.variables,
    )(x, mem, mem_mask)
    to_np = lambda w: ops.convert_to_numpy(w).astype("float64")  # noqa: E731
    weights = [
        to_np(layer.kernel)
        for layer in (
            attention.query_dense,
            attention.key_dense,
            attention.value_dense,
            attention.output_dense,
        )
    ]
    weights += [to_np(bias.content_bias), to_np(bias.position_bias)]
    weights += [to_np(bias.position_kernel)]
    expected = np_xl_attention(x, mem, mem_mask, weights, clamp_len)
    np.testing.assert_allclose(ops.convert_to_numpy(out), expected, atol=2e-5)


# ------------------------------------------------------------ the memory
@pytest.mark.parametrize("norm_position", ["pre", "post"])
def test_second_segment_with_memory_equals_joint_pass(rng, norm_position):
    """Memory = one previous segment: the second segment's outputs equal a
    joint causal pass over both (padding at the end of the second)."""
    model = kt.models.GPTBackbone(**TINY, norm_position=norm_position)
    ids = rng.integers(0, 40, (2, 12)).astype("int32")
    mask = np.ones((2, 12), bool)
    mask[1, 10:] = False
    joint = compiled_forward(model, {"token_ids": ids, "padding_mask": mask})
    joint = ops.convert_to_numpy(joint)
    with_memory = compiled_reading(model.call_with_memory, model.variables)
    first, memory, memory_mask = with_memory(ids[:, :6])
    second, _, _ = with_memory(
        {"token_ids": ids[:, 6:], "padding_mask": mask[:, 6:]}, memory, memory_mask
    )
    assert tuple(memory.shape) == (2, 2, 6, 16)  # [L, B, M, D]
    np.testing.assert_allclose(ops.convert_to_numpy(first), joint[:, :6], atol=1e-5)
    second = np.where(mask[:, 6:, None], ops.convert_to_numpy(second), 0)
    np.testing.assert_allclose(
        second, np.where(mask[:, 6:, None], joint[:, 6:], 0), atol=1e-5
    )


def _gradient(fn, x):
    """d sum(fn(x)) / dx on the current backend (zeros where unconnected)."""
    name = keras.config.backend()
    if name == "jax":
        import jax

        return np.asarray(jax.jit(jax.grad(lambda m: fn(m).sum()))(x))
    if name == "tensorflow":
        import tensorflow as tf

        x = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.reduce_sum(fn(x))
        grad = tape.gradient(y, x)
        return np.zeros(x.shape) if grad is None else grad.numpy()
    import torch

    x = torch.tensor(x, requires_grad=True)
    (grad,) = torch.autograd.grad(fn(x).sum(), x, allow_unused=True)
    return np.zeros(x.shape) if grad is None else grad.numpy()


def test_no_gradient_reaches_the_memory(rng):
    model = kt.models.GPTBackbone(**TINY)
    ids = rng.integers(0, 40, (2, 6)).astype("int32")
    memory = rng.normal(size=(2, 2, 6, 16)).astype("float32")
    hidden = compiled_reading(
        lambda m: model.call_with_memory(ids, m)[0], model.variables
    )
    other = ops.convert_to_numpy(hidden(memory[:, :, ::-1].copy()))
    assert np.abs(ops.convert_to_numpy(hidden(memory)) - other).max() > 1e-5
    assert np.abs(_gradient(hidden, memory)).max() == 0.0


# --------------------------------------------------- state, fit, resets
def test_segment_batches_layout():
    docs = [np.arange(100, 111), np.arange(200, 205)]  # 10 + 4 pairs
    data = segment_batches(docs, batch_size=2, segment_length=4, pad_id=0)
    assert len(data) == 2 and data.num_tokens == 14  # 7 pairs per row
    (x0, y0, w0), (x1, _, _) = data[0], data[1]
    assert x0["token_ids"].tolist() == [[100, 101, 102, 103], [107, 108, 109, 0]]
    assert y0[1].tolist() == [108, 109, 110, 0] and w0[1].tolist() == [1, 1, 1, 0]
    assert x0["memory_reset"].tolist() == [True, True]
    # Row 0 continues its document; row 1 starts the next one (reset).
    assert x1["token_ids"].tolist() == [[104, 105, 106, 0], [200, 201, 202, 203]]
    assert x1["memory_reset"].tolist() == [False, True]
    with pytest.raises(ValueError, match="batch_size=9"):
        segment_batches([np.arange(5)], batch_size=9, segment_length=2)


def test_stateful_calls_continue_rows_and_reset(rng):
    lm = GPTCausalLM(**TINY)
    ids = rng.integers(0, 40, (2, 12)).astype("int32")
    call = functools.partial(compiled_call, lm)
    joint = ops.convert_to_numpy(call(ids))
    lm.reset_memory(batch_size=2)
    call(ids[:, :6])
    np.testing.assert_allclose(
        ops.convert_to_numpy(call(ids[:, 6:])), joint[:, 6:], atol=2e-5
    )
    lm.reset_memory()
    alone = ops.convert_to_numpy(call(ids[:, 6:]))  # an empty memory
    reset = np.array([True, False])
    x = {"token_ids": ids[:, 6:], "memory_reset": reset}
    lm.reset_memory()
    call(ids[:, :6])
    out = ops.convert_to_numpy(call(x))
    np.testing.assert_allclose(out[0], alone[0], atol=2e-5)  # row 0 forgot
    np.testing.assert_allclose(out[1], joint[1, 6:], atol=2e-5)


def test_fit_and_predict_over_consecutive_segments(rng):
    lm = GPTCausalLM(**{**TINY, "eval_memory_length": 12})
    stream = rng.integers(0, 40, 19)
    data = segment_batches(stream, batch_size=1, segment_length=6)
    joint = compiled_forward(lm, stream[None, :18].astype("int32"))
    joint = ops.convert_to_numpy(joint)
    lm.reset_memory(batch_size=1)
    # predict(): eval memory of 12 covers both earlier segments.
    logits = np.concatenate(list(lm.predict(data, verbose=0)), axis=0)
    np.testing.assert_allclose(logits, joint[0], atol=2e-5)
    lm.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=MaskedSparseCategoricalCrossentropy(from_logits=True),
    )
    before = lm.evaluate(data, verbose=0)
    lm.fit(data, epochs=3, verbose=0)
    assert lm.evaluate(data, verbose=0) < before
    valid = ops.convert_to_numpy(lm.backbone.segment_memory.valid)
    assert valid.shape == (1, 12) and valid.sum() == 12  # the state advanced


def test_training_attends_to_the_last_training_memory_slots(rng):
    """The state keeps `eval_memory_length` slots; training reads only the
    last `memory_length` of them."""
    lm = GPTCausalLM(**{**TINY, "eval_memory_length": 12})
    ids = rng.integers(0, 40, (2, 18)).astype("int32")
    lm.reset_memory(batch_size=2)
    call = functools.partial(compiled_call, lm)
    call(ids[:, :6])
    call(ids[:, 6:12])
    states = ops.convert_to_numpy(lm.backbone.segment_memory.states)
    assert states.shape == (2, 2, 12, 16)
    out = compiled_call(lm.backbone, ids[:, 12:], training=True)
    with_memory = compiled_reading(lm.backbone.call_with_memory, lm.backbone.variables)
    expected, _, _ = with_memory(ids[:, 12:], states[:, :, -6:])
    np.testing.assert_allclose(
        ops.convert_to_numpy(out), ops.convert_to_numpy(expected), atol=2e-5
    )


def test_memory_batch_errors(rng):
    lm = GPTCausalLM(**TINY)
    lm.compile(optimizer="adam", loss=MaskedSparseCategoricalCrossentropy(True))
    data = segment_batches(rng.integers(0, 40, 40), batch_size=3, segment_length=6)
    with pytest.raises(ValueError, match="reset_memory"):
        lm.fit(data, epochs=1, verbose=0)  # training without the state
    lm.reset_memory(batch_size=2)
    with pytest.raises(ValueError, match="holds 2 rows, but the batch has 3"):
        lm.fit(data, epochs=1, verbose=0)
    with pytest.raises(ValueError, match="holds 2 rows"):
        lm(np.zeros((3, 4), "int32"))
    lm.reset_memory(batch_size=3)  # new state variables; compiled steps retrace
    lm.fit(data, epochs=1, verbose=0)
    assert lm.backbone.segment_memory.states.shape == (2, 3, 6, 16)
    assert len(lm.non_trainable_weights) == 2  # the old state is gone
    plain = GPTCausalLM(**{**TINY, "memory_length": 0})
    with pytest.raises(ValueError, match="no Transformer-XL memory"):
        plain.reset_memory(2)


# ----------------------------------------------- generation and saving
def test_generation_attends_to_the_memory(rng):
    """A prompt longer than the memory: its first segment is read into the
    memory; the tokens equal those of one pass over the whole prompt."""
    lm = GPTCausalLM(**TINY)
    prompts = [list(rng.integers(0, 40, 9)), list(rng.integers(0, 40, 11))]
    out = lm.generate(prompts, max_new_tokens=5, stop_token_ids=None)
    joint = GPTCausalLM(**{**TINY, "memory_length": 0})
    joint.set_weights(lm.get_weights()[: len(joint.get_weights())])
    expected = joint.generate(prompts, max_new_tokens=5, stop_token_ids=None)
    np.testing.assert_array_equal(out, expected)
    assert lm.backbone.segment_memory.valid is not None  # memory was used
    with pytest.raises(ValueError, match="stop_token_ids"):
        lm.generate(prompts, max_new_tokens=2, stop_strings=["x"])


def test_save_load_keeps_the_knobs(tmp_path, rng):
    config = {**TINY, "eval_memory_length": 10, "clamp_len": 5}
    lm = GPTCausalLM(**config)
    lm.reset_memory(batch_size=2)  # state is not saved with the weights
    ids = rng.integers(0, 40, (1, 8)).astype("int32")
    lm.save_to_preset(tmp_path / "xl")
    restored = kt.from_preset(str(tmp_path / "xl"))
    assert restored.config == lm.config and restored.config.clamp_len == 5
    assert restored.backbone.segment_memory.states is None
    fresh = GPTCausalLM(**config)
    fresh.set_weights(restored.get_weights())
    expected = ops.convert_to_numpy(compiled_forward(fresh, ids))
    out = ops.convert_to_numpy(compiled_call(restored, ids))
    np.testing.assert_allclose(out, expected, atol=1e-6)
    restored.reset_memory(batch_size=1)  # any batch size after loading
    compiled_call(restored, ids)


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"stacks": "encoder"}, 'stacks="decoder"'),
        ({"sliding_window": 4}, "sliding_window"),
        ({"position_embedding": "rotary"}, "memory_length=6"),
        ({"clamp_len": 0}, "clamp_len=0"),
        ({"memory_length": -1}, "memory_length=-1"),
        (
            {"position_embedding": "learned", "memory_length": 0, "clamp_len": 4},
            "clamp_len",
        ),
    ],
)
def test_config_errors(changes, match):
    with pytest.raises(ValueError, match=match):
        kt.TransformerConfig(**{**TINY, **changes})
