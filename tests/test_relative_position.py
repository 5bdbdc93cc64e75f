"""T5's relative position buckets against a NumPy transcription of the
Hugging Face formula; `RelativePositionBias`; and the attention layer's
additive `attention_bias` (fused and explicit paths, grouped heads, padding,
cached decoding) and `attention_scale`."""

import math

import keras
import numpy as np
import pytest

from keras_transformers.layers import (
    MultiHeadAttention,
    RelativePositionBias,
    TransformerBlock,
)
from keras_transformers.layers.positions import relative_position_bucket

# (num_buckets, max_distance)
SETTINGS = [(32, 128), (8, 16), (16, 20), (4, 3), (6, 7)]


def hf_bucket(relative_position, bidirectional, num_buckets, max_distance):
    """`T5Attention._relative_position_bucket`, in NumPy (float32 as torch)."""
    buckets = np.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative_position > 0).astype(relative_position.dtype) * num_buckets
        relative_position = np.abs(relative_position)
    else:
        relative_position = -np.minimum(relative_position, 0)
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    with np.errstate(divide="ignore", invalid="ignore"):
        large = max_exact + (
            np.log(relative_position.astype(np.float32) / max_exact)
            / np.float32(math.log(max_distance / max_exact))
            * (num_buckets - max_exact)
        ).astype(np.int64)
    large = np.minimum(large, num_buckets - 1)
    return buckets + np.where(is_small, relative_position, large)


def _numpy(x):
    return keras.ops.convert_to_numpy(x)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets, max_distance", SETTINGS)
def test_buckets_match_hf_formula(bidirectional, num_buckets, max_distance):
    relative = np.arange(-300, 300)[None, :] - np.arange(6)[:, None]  # key - query
    expected = hf_bucket(relative, bidirectional, num_buckets, max_distance)
    ours = relative_position_bucket(
        keras.ops.convert_to_tensor(relative.astype("int32")),
        bidirectional,
        num_buckets,
        max_distance,
    )
    np.testing.assert_array_equal(_numpy(ours), expected)
    assert expected.min() >= 0 and expected.max() == num_buckets - 1


def test_buckets_match_transformers():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    bucket = transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket
    relative = np.arange(-200, 200)[None, :] - np.arange(4)[:, None]
    for bidirectional in (True, False):
        expected = bucket(torch.tensor(relative), bidirectional, 32, 128).numpy()
        ours = relative_position_bucket(
            keras.ops.convert_to_tensor(relative.astype("int32")),
            bidirectional,
            32,
            128,
        )
        np.testing.assert_array_equal(_numpy(ours), expected)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_bias_layer_reads_the_table(bidirectional):
    layer = RelativePositionBias(4, 8, 16, bidirectional=bidirectional)
    layer.build()
    table = np.random.default_rng(0).normal(size=(8, 4)).astype("float32")
    layer.embeddings.assign(table)
    queries, keys = np.arange(3, 8), np.arange(20)  # queries from cache index 3
    bias = _numpy(layer(keras.ops.arange(3, 8), keras.ops.arange(20)))
    assert bias.shape == (1, 4, 5, 20)
    buckets = hf_bucket(keys[None] - queries[:, None], bidirectional, 8, 16)
    np.testing.assert_allclose(bias[0], table[buckets].transpose(2, 0, 1))
    copy = RelativePositionBias.from_config(layer.get_config())
    assert (copy.num_buckets, copy.max_distance) == (8, 16)
    assert copy.bidirectional == bidirectional


def _reference(q, k, v, bias, mask, scale):
    """NumPy attention: `[B, T, N, H]` queries, `[B, S, N, H]` keys/values."""
    logits = np.einsum("btnh,bsnh->bnts", q, k) * scale + bias
    logits = np.where(mask, logits, -1e9)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.einsum("bnts,bsnh->btnh", probs, v)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("num_kv_heads", [4, 2])
@pytest.mark.parametrize("scale", [None, 1.0])
def test_attention_bias_is_added_to_the_logits(fused, num_kv_heads, scale):
    layer = MultiHeadAttention(
        4, 8, num_kv_heads=num_kv_heads, causal=True, attention_scale=scale, fused=fused
    )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 6, 16)).astype("float32")
    layer(x)
    bias = rng.normal(size=(1, 4, 6, 6)).astype("float32") * 3
    padding = np.ones((2, 6), bool)
    padding[1, 4:] = False
    out = _numpy(layer(x, key_padding_mask=padding, attention_bias=bias))
    q, k, v = (
        _numpy(d(x)) for d in (layer.query_dense, layer.key_dense, layer.value_dense)
    )
    groups = 4 // num_kv_heads
    k, v = np.repeat(k, groups, axis=2), np.repeat(v, groups, axis=2)
    mask = np.tril(np.ones((6, 6), bool))[None, None] & padding[:, None, None, :]
    expected = _reference(q, k, v, bias, mask, 8**-0.5 if scale is None else scale)
    expected = _numpy(layer.output_dense(expected.astype("float32")))
    np.testing.assert_allclose(out[0], expected[0], atol=1e-4)
    np.testing.assert_allclose(out[1, :4], expected[1, :4], atol=1e-4)
    copy = MultiHeadAttention.from_config(layer.get_config())
    assert copy.attention_scale == scale


def test_cached_decoding_with_bias_equals_full_forward():
    """A block with a causal relative bias: one cached step at a time gives
    the full-sequence outputs (the bias covers the whole cache)."""
    block = TransformerBlock(4, 32, norm_type="rms", use_bias=False, causal=True)
    block.build((None, None, 16))
    relative = RelativePositionBias(4, 8, 16, bidirectional=False)
    relative.build()
    relative.embeddings.assign(np.random.default_rng(2).normal(size=(8, 4)) * 2)
    x = np.random.default_rng(1).normal(size=(2, 20, 16)).astype("float32")
    positions = keras.ops.arange(20)
    full = _numpy(block(x, attention_bias=relative(positions, positions)))
    zeros = keras.ops.zeros((2, 20, 4, 4))
    cache, steps = (zeros, zeros), []
    for i in range(20):
        bias = relative(keras.ops.arange(i, i + 1), positions)  # [1, N, 1, S_max]
        out, cache = block(
            x[:, i : i + 1], cache=cache, cache_index=i, attention_bias=bias
        )
        steps.append(_numpy(out))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-4)
    copy = TransformerBlock.from_config({**block.get_config(), "attention_scale": 1.0})
    assert copy.attention_scale == 1.0
