"""Decoding steps whose rows are at different positions (a `[B]`
`cache_index`, as continuous batching runs them): each row's logits equal
the same row decoded alone, for rotary and learned positions, GQA, sliding
windows (ring caches shorter than the buffer), sparse MoE and linear
attention; a step of the first rows of a bigger cache (a server's busy
rows) decodes them alike and leaves the other rows as they were, also when
it attends to the first positions only (`row_cache.attending_to`); the
errors name the fix."""

import keras
import numpy as np
import pytest
from contracts import assert_close, compiled_cached_call, to_numpy
from test_gated_deltanet import _config as linear_attention_config

from keras_transformers import from_preset
from keras_transformers.layers import row_cache
from keras_transformers.models import GPTBackbone, GPTCausalLM

BUFFER = 12
PROMPTS = ([5, 9, 2], [7, 1, 3, 8, 4, 6, 2], [3])


def _linear_attention():
    return GPTCausalLM(GPTBackbone(linear_attention_config()))


MODELS = {
    "llama": lambda: from_preset("gpt_llama_tiny"),
    "gpt2": lambda: from_preset("gpt2_tiny"),
    "sliding": lambda: from_preset(
        "gpt_llama_tiny",
        num_layers=2,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=4,
    ),
    "mixtral": lambda: from_preset("mixtral_tiny_sliding"),
    "linear": _linear_attention,
}


def _stack(caches):
    return keras.tree.map_structure(
        lambda *rows: keras.ops.concatenate(rows, axis=0), *caches
    )


@pytest.mark.parametrize("name", sorted(MODELS))
def test_rows_at_their_own_positions_decode_as_alone(name):
    _decode_rows_as_alone(MODELS[name](), spare_rows=0)


@pytest.mark.parametrize("name", ["llama", "sliding"])
def test_the_first_rows_of_a_bigger_cache_decode_as_alone(name):
    _decode_rows_as_alone(MODELS[name](), spare_rows=2)


@pytest.mark.parametrize("name", ["llama", "sliding"])
def test_rows_attending_to_their_first_positions_decode_as_alone(name):
    _decode_rows_as_alone(MODELS[name](), spare_rows=2, span=SPAN)


SPAN = 10  # the longest row's positions: 7 prompt tokens and 3 steps


def test_a_span_gives_the_first_positions_of_the_rows_and_leaves_the_rest():
    rng = np.random.default_rng(1)
    cache = tuple(
        rng.standard_normal((4, BUFFER, 2, 3)).astype("float32") for _ in "kv"
    )
    new = [rng.standard_normal((2, 1, 2, 3)).astype("float32") for _ in "kv"]
    index = keras.ops.convert_to_tensor(np.array([4, 1], "int32"))
    whole = row_cache.update(cache, *new, index, None)
    with row_cache.attending_to(6):
        keys, values, written, visible = row_cache.update(cache, *new, index, None)
    assert tuple(keys.shape) == (2, 6, 2, 3) and tuple(visible.shape) == (2, 6)
    assert_close(to_numpy(keys), to_numpy(whole[0])[:2, :6], atol=0)
    assert_close(to_numpy(values), to_numpy(whole[1])[:2, :6], atol=0)
    np.testing.assert_array_equal(to_numpy(visible), to_numpy(whole[3])[:, :6])
    for got, want in zip(written, whole[2]):
        np.testing.assert_array_equal(to_numpy(got), to_numpy(want))


def _decode_rows_as_alone(lm, spare_rows, span=None):
    """Decodes `PROMPTS`' rows together, at their own positions, in a cache
    with `spare_rows` more rows after them (filled with noise, which the
    steps must leave as it is), attending to the first `span` positions
    (None: all)."""
    rng = np.random.default_rng(0)
    vocabulary = lm.backbone.config.vocabulary_size
    steps = rng.integers(1, vocabulary, (3, len(PROMPTS)))  # fed tokens
    # On JAX one program per shape, as generation runs them (the rows'
    # steps traced under `attending_to(span)`); eager elsewhere.
    prefill = compiled_cached_call(lm, traced_index=False)
    step = compiled_cached_call(lm)
    rows_step = compiled_cached_call(lm)
    alone, caches = [], []
    for row, prompt in enumerate(PROMPTS):
        cache = lm.backbone.init_cache(1, BUFFER)
        _, cache = prefill(np.array([prompt], "int32"), cache, 0)
        caches.append(cache)
        logits = []
        for k, token in enumerate(steps[:, row]):
            ids = np.array([[token]], "int32")
            out, cache = step(ids, cache, len(prompt) + k)
            logits.append(to_numpy(out)[0, 0])
        alone.append(logits)
    spare = keras.tree.map_structure(
        lambda c: rng.standard_normal((spare_rows, *c.shape[1:])).astype("float32"),
        caches[0],
    )
    cache = _stack([*caches, spare] if spare_rows else caches)
    for k in range(len(steps)):
        index = np.array([len(p) + k for p in PROMPTS], "int32")
        ids = steps[k][:, None].astype("int32")
        with row_cache.attending_to(span):
            out, cache = rows_step(ids, cache, keras.ops.convert_to_tensor(index))
        assert to_numpy(out).shape[0] == len(PROMPTS)
        for row in range(len(PROMPTS)):
            assert_close(to_numpy(out)[row, 0], alone[row][k], atol=1e-5)
    if spare_rows:
        kept = keras.tree.map_structure(lambda c: to_numpy(c)[len(PROMPTS) :], cache)
        for got, want in zip(keras.tree.flatten(kept), keras.tree.flatten(spare)):
            np.testing.assert_array_equal(got, want)


def test_a_row_index_takes_one_token_per_row():
    lm = from_preset("gpt_llama_tiny")
    cache = lm.backbone.init_cache(2, BUFFER)
    index = keras.ops.convert_to_tensor(np.array([0, 3], "int32"))
    with pytest.raises(ValueError, match="one token per row.*Prefill each row"):
        lm.call_with_cache(np.ones((2, 2), "int32"), cache, index)


def test_transformer_xl_refuses_a_row_index():
    lm = from_preset("gpt_transfo_xl_tiny")
    cache = lm.backbone.init_cache(2, BUFFER)
    index = keras.ops.convert_to_tensor(np.array([0, 3], "int32"))
    with pytest.raises(ValueError, match="Transformer-XL.*memory_length"):
        lm.call_with_cache(np.ones((2, 1), "int32"), cache, index)
