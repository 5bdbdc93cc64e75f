"""Sliding-window attention with a ring KV cache bounded by the window:
cached decoding (token by token, in chunks, in `generate`) equals the full
forward pass with the sliding-window mask."""

import keras
import numpy as np
import pytest
from contracts import (
    assert_close,
    compiled_cached_call,
    compiled_forward,
    compiled_reading,
    randomize_weights,
    stateless,
    to_numpy,
)

from keras_transformers import layers
from keras_transformers.layers import ring_cache
from keras_transformers.models import GPTCausalLM

WINDOW = 5


def _attention(window=WINDOW):
    return layers.MultiHeadAttention(
        num_heads=4,
        head_dim=8,
        num_kv_heads=2,
        causal=True,
        sliding_window=window,
        rope_max_wavelength=10000,
    )


def _x():
    return np.random.default_rng(0).normal(size=(2, 17, 32)).astype("float32")


@pytest.fixture
def x():
    return _x()


def _stepper(layer):
    """`step(x, cache, index)`: `layer(x, cache=cache, cache_index=index)`;
    on JAX one compiled program per shape whose position is traced, as
    generation's loop passes it, except at 0 (a Python int, as generation's
    prefill passes it)."""
    call = lambda x, cache, i: layer(x, cache=cache, cache_index=i)  # noqa: E731
    if keras.config.backend() != "jax":
        return call
    import jax

    pure = stateless(call, layer.variables)
    traced, at_zero = jax.jit(pure), jax.jit(pure, static_argnums=(3,))

    def step(x, cache, index):
        values = [v.value for v in layer.variables]
        if index == 0:
            return at_zero(values, x, cache, 0)
        return traced(values, x, cache, jax.numpy.asarray(index, "int32"))

    return step


def _cached(step, x, cache_length, chunk):
    cache = tuple(np.zeros((2, cache_length, 2, 8), "float32") for _ in range(2))
    outputs = []
    for i in range(0, x.shape[1], chunk):
        out, cache = step(x[:, i : i + chunk], cache, i)
        assert tuple(cache[0].shape) == (2, cache_length, 2, 8)
        outputs.append(to_numpy(out))
    return np.concatenate(outputs, axis=1), cache


@pytest.fixture(scope="module")
def ring():
    """The window-`WINDOW` layer the ring tests share, its compiled cached
    step, its full-sequence output on `_x()` and its rotated keys."""
    x, layer = _x(), _attention()
    layer.build(x.shape)

    def keys(x):
        return layer.rotary(layer.key_dense(x), np.arange(x.shape[1]))

    keys = to_numpy(compiled_reading(keys, layer.variables)(x))
    return layer, _stepper(layer), to_numpy(compiled_forward(layer, x)), keys


@pytest.mark.parametrize("cache_length", [WINDOW, WINDOW + 5])
@pytest.mark.parametrize("chunk", [1, 3, 7])
def test_ring_cache_equals_full_sequence(x, ring, cache_length, chunk):
    layer, step, full, keys = ring
    cached, cache = _cached(step, x, cache_length, chunk)
    assert_close(cached, full, atol=1e-5)
    # The ring holds the keys of the last `cache_length` positions, position
    # p in slot p % cache_length.
    last = np.arange(x.shape[1] - cache_length, x.shape[1])
    slots = np.argsort(last % cache_length)
    assert_close(cache[0], keys[:, last[slots]], atol=1e-5)


def test_ring_positions():
    # a 4-slot ring after writing position 5: slots hold 4, 5, 2, 3
    np.testing.assert_array_equal(to_numpy(ring_cache.positions(5, 4)), [4, 5, 2, 3])
    # after position 1 only: slots 2 and 3 are empty (negative)
    np.testing.assert_array_equal(to_numpy(ring_cache.positions(1, 4)), [0, 1, -2, -1])


def test_short_cache_holding_every_position_is_exact(x):
    layer = _attention(window=40)  # cache 17 < window, but never wraps
    layer.build(x.shape)
    cached, _ = _cached(_stepper(layer), x, x.shape[1], chunk=3)
    assert_close(cached, compiled_forward(layer, x), atol=1e-5)


def test_too_short_cache_raises(x, ring):
    layer = ring[0]
    cache = tuple(np.zeros((2, WINDOW - 1, 2, 8), "float32") for _ in range(2))
    with pytest.raises(ValueError, match=rf"{WINDOW - 1} positions.*{WINDOW}"):
        layer(x[:, :1], cache=cache, cache_index=WINDOW)


def test_mask_with_key_positions():
    mask = to_numpy(
        layers.attention_mask(
            2,
            5,
            causal=True,
            sliding_window=3,
            query_offset=1,
            key_positions=np.array([-2, -1, 0, 1, 2]),
        )
    )
    # keys at positions -2..2, queries at 1 and 2
    expected = np.array([[0, 0, 1, 1, 0], [0, 0, 1, 1, 1]], bool)
    np.testing.assert_array_equal(mask[0, 0], expected)


def test_window_covering_the_sequence_is_full_causal_attention(x):
    windowed = _attention(window=x.shape[1])
    full = layers.MultiHeadAttention(
        num_heads=4, head_dim=8, num_kv_heads=2, causal=True, rope_max_wavelength=10000
    )
    windowed.build(x.shape)
    full.build(x.shape)
    full.set_weights(windowed.get_weights())
    expected = to_numpy(compiled_forward(full, x))
    assert_close(compiled_forward(windowed, x), expected, atol=1e-5)
    cached, _ = _cached(_stepper(windowed), x, x.shape[1], chunk=1)
    assert_close(cached, expected, atol=1e-5)


_MODELS = {}


def _lm(window):
    if window not in _MODELS:
        lm = GPTCausalLM(
            vocabulary_size=97,
            num_layers=2,
            hidden_dim=32,
            num_heads=4,
            num_kv_heads=2,
            intermediate_dim=64,
            max_sequence_length=128,
            position_embedding="rotary",
            norm_type="rms",
            gated_feed_forward=True,
            activation="silu",
            use_bias=False,
            tie_embeddings=False,
            sliding_window=window,
        )
        _MODELS[window] = randomize_weights(lm, seed=window)
    return _MODELS[window]


def _reference_greedy(lm, prompts, steps, length=64):
    """Greedy decoding that recomputes the full forward pass every step, on a
    fixed-length buffer (causal: the zeros after a row do not change it)."""
    buffer = np.zeros((len(prompts), length), "int32")
    lengths = [len(p) for p in prompts]
    for row, prompt in enumerate(prompts):
        buffer[row, : len(prompt)] = prompt
    for _ in range(steps):
        logits = to_numpy(compiled_forward(lm, buffer))
        for row, n in enumerate(lengths):
            buffer[row, n] = int(logits[row, n - 1].argmax())
            lengths[row] += 1
    return [buffer[row, :n].tolist() for row, n in enumerate(lengths)]


def _prompts(rng, lengths):
    return [rng.integers(3, 97, size=n).tolist() for n in lengths]


def test_init_cache_is_bounded_by_the_window():
    lm = _lm(8)
    cache = lm.backbone.init_cache(2, 100)
    assert len(cache) == 2
    assert tuple(cache[0][0].shape) == (2, 8, 2, 8)
    assert tuple(lm.backbone.init_cache(2, 5)[1][1].shape) == (2, 5, 2, 8)


def test_model_cached_decoding_equals_full_forward(rng):
    lm = _lm(8)
    ids = rng.integers(3, 97, size=(2, 20)).astype("int32")
    cache = lm.backbone.init_cache(2, 100)
    prefill = compiled_cached_call(lm, traced_index=False)
    logits, cache = prefill(ids[:, :6], cache, 0)  # a prefill chunk
    steps, step = [to_numpy(logits)], compiled_cached_call(lm)
    for i in range(6, 20):
        logits, cache = step(ids[:, i : i + 1], cache, i)
        steps.append(to_numpy(logits))
    full = to_numpy(compiled_forward(lm, ids))
    assert_close(np.concatenate(steps, axis=1), full, atol=1e-5)


@pytest.mark.parametrize(
    "window, lengths, new",
    [
        # (8, (3, 13), 20), no prefill: test_generate_streaming
        (8, (35, 40), 12),  # a 32-token prefill, then a ring cache of 8
        (40, (4, 9), 12),  # buffer of 32 < window: a short cache, never full
    ],
)
def test_generate_greedy_equals_full_forward(rng, window, lengths, new):
    lm = _lm(window)
    prompts = _prompts(rng, lengths)
    out = lm.generate(prompts, max_new_tokens=new, stop_token_ids=None)
    for row, expected in zip(out, _reference_greedy(lm, prompts, new)):
        assert row[: len(expected)].tolist() == expected


def test_generate_streaming(rng):
    """Also the no-prefill case of test_generate_greedy_equals_full_forward:
    the loop feeds every prompt token, the compiled and the streamed loop."""
    lm = _lm(8)
    prompts = _prompts(rng, (3, 13))
    out = lm.generate(prompts, max_new_tokens=20, stop_token_ids=None)
    streamed = []
    again = lm.generate(
        prompts,
        max_new_tokens=20,
        stop_token_ids=None,
        stream=lambda t: streamed.append(np.asarray(t)),
    )
    np.testing.assert_array_equal(again, out)
    for row, expected in zip(out, _reference_greedy(lm, prompts, 20)):
        assert row[: len(expected)].tolist() == expected
    streamed = np.stack(streamed)  # [steps, B]
    for row, prompt, tokens in zip(out, prompts, streamed.T):
        assert tokens[tokens >= 0].tolist() == row[len(prompt) :][:20].tolist()
