import keras
import numpy as np
import pytest
from contracts import assert_close, run_layer_test, to_numpy

from keras_transformers import layers


@pytest.fixture
def x(rng):
    return rng.normal(size=(2, 6, 32)).astype("float32")


def test_multi_head_attention_contract(x):
    run_layer_test(
        layers.MultiHeadAttention,
        dict(
            num_heads=4,
            head_dim=8,
            num_kv_heads=2,
            causal=True,
            use_bias=False,
            rope_max_wavelength=10000.0,
        ),
        (x,),
        (2, 6, 32),
    )


def test_attention_qkv_bias_and_qk_norm(x):
    """`qkv_bias` puts biases on query / key / value only; `qk_norm` adds
    one `[H]` RMSNorm scale each for queries and keys (none when off)."""
    layer, _ = run_layer_test(
        layers.MultiHeadAttention,
        dict(
            num_heads=4,
            head_dim=12,
            num_kv_heads=2,
            causal=True,
            use_bias=False,
            qkv_bias=True,
            qk_norm=True,
            norm_epsilon=1e-5,
            rope_max_wavelength=10000.0,
        ),
        (x,),
        (2, 6, 32),
    )
    shapes = {w.path.split("/", 1)[1]: tuple(w.shape) for w in layer.weights}
    assert shapes["query/bias"] == (4, 12) and shapes["key/bias"] == (2, 12)
    assert "attention_output/bias" not in shapes
    assert shapes["query_norm/scale"] == shapes["key_norm/scale"] == (12,)
    # Unit scales: each query head has RMS 1 before rotary positions.
    q = to_numpy(layer.query_norm(layer.query_dense(x)))
    np.testing.assert_allclose(np.sqrt((q**2).mean(-1)), 1.0, atol=1e-3)
    plain = layers.MultiHeadAttention(num_heads=4, head_dim=12, use_bias=False)
    plain(x)
    assert plain.query_norm is None and len(plain.weights) == 4


def test_fused_and_grouped_attention_agree(x):
    mask = np.ones((2, 6), bool)
    mask[1, 4:] = False
    kwargs = dict(
        num_heads=4,
        head_dim=8,
        num_kv_heads=2,
        causal=True,
        rope_max_wavelength=10000.0,
    )
    fused = layers.MultiHeadAttention(fused=True, **kwargs)
    grouped = layers.MultiHeadAttention(fused=False, **kwargs)
    fused(x), grouped(x)
    grouped.set_weights(fused.get_weights())
    assert_close(
        fused(x, key_padding_mask=mask), grouped(x, key_padding_mask=mask), atol=1e-5
    )
    assert_close(fused(x), grouped(x), atol=1e-5)


def test_gqa_equals_mha_with_repeated_kv(x):
    """GQA with K heads equals MHA whose K/V weights repeat each KV head G times."""
    gqa = layers.MultiHeadAttention(
        num_heads=4, head_dim=8, num_kv_heads=2, fused=False
    )
    mha = layers.MultiHeadAttention(num_heads=4, head_dim=8, fused=False)
    gqa(x), mha(x)
    weights = []
    for w_gqa in gqa.get_weights():
        if w_gqa.ndim >= 2 and w_gqa.shape[-2] == 2:  # kernels [D, K, H]
            w_gqa = np.repeat(w_gqa, 2, axis=-2)
        elif w_gqa.ndim == 2 and w_gqa.shape[0] == 2:  # biases [K, H]
            w_gqa = np.repeat(w_gqa, 2, axis=0)
        weights.append(w_gqa)
    mha.set_weights(weights)
    assert_close(gqa(x), mha(x), atol=1e-5)


def test_causal_attention_ignores_future(x):
    layer = layers.MultiHeadAttention(num_heads=4, head_dim=8, causal=True)
    changed = x.copy()
    changed[:, 4:] += 5.0
    assert_close(to_numpy(layer(x))[:, :4], to_numpy(layer(changed))[:, :4], atol=1e-5)


def test_sliding_window_limits_context(x):
    layer = layers.MultiHeadAttention(
        num_heads=4, head_dim=8, causal=True, sliding_window=2
    )
    changed = x.copy()
    changed[:, 0] += 5.0  # outside the window of positions >= 2
    out, out2 = to_numpy(layer(x)), to_numpy(layer(changed))
    assert_close(out[:, 2:], out2[:, 2:], atol=1e-5)
    assert np.abs(out[:, 1] - out2[:, 1]).max() > 1e-3


def test_mask_helper():
    mask = to_numpy(
        layers.attention_mask(3, 5, causal=True, sliding_window=2, query_offset=2)
    )
    expected = np.array([[0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]], bool)
    np.testing.assert_array_equal(mask[0, 0], expected)
    padded = to_numpy(layers.attention_mask(2, 2, key_padding_mask=np.array([[1, 0]])))
    np.testing.assert_array_equal(
        np.broadcast_to(padded[0, 0], (2, 2)), [[True, False], [True, False]]
    )


def test_cross_attention_cache_matches(x, rng):
    encoder = rng.normal(size=(2, 9, 32)).astype("float32")
    enc_mask = np.ones((2, 9), bool)
    enc_mask[0, 7:] = False
    layer = layers.MultiHeadAttention(num_heads=4, head_dim=8)
    full = layer(x, key_value=encoder, key_padding_mask=enc_mask)
    cache = layer.project_key_value(encoder)
    cached, same = layer(x, key_value=encoder, key_padding_mask=enc_mask, cache=cache)
    assert_close(full, cached, atol=1e-5)
    assert_close(cache, same, atol=0)


def test_rotary_embedding_relative(rng):
    rope = layers.RotaryEmbedding()
    q = rng.normal(size=(1, 1, 1, 16)).astype("float32")
    k = rng.normal(size=(1, 1, 1, 16)).astype("float32")

    def score(i, j):
        qi = to_numpy(rope(q, positions=np.array([i])))
        kj = to_numpy(rope(k, positions=np.array([j])))
        return float((qi * kj).sum())

    assert abs(score(3, 1) - score(10, 8)) < 1e-4  # depends on i - j only
    assert_close(rope(q, positions=np.array([0])), q, atol=1e-6)


def test_rotary_matches_reference_formula(rng):
    x = rng.normal(size=(1, 3, 2, 8)).astype("float32")
    out = to_numpy(layers.RotaryEmbedding(max_wavelength=100.0)(x))
    inv = 1.0 / 100.0 ** (np.arange(0, 8, 2) / 8)
    ang = np.arange(3)[:, None] * inv[None]
    cos, sin = (
        np.cos(np.concatenate([ang, ang], -1)),
        np.sin(np.concatenate([ang, ang], -1)),
    )
    rot = np.concatenate([-x[..., 4:], x[..., :4]], -1)
    expected = x * cos[None, :, None] + rot * sin[None, :, None]
    np.testing.assert_allclose(out, expected, atol=1e-5)


def test_sinusoidal_matches_paper(x):
    pe = to_numpy(layers.SinusoidalPositionEncoding()(x))[0]
    pos, i = 3, 5
    assert abs(pe[pos, 2 * i] - np.sin(pos / 10000 ** (2 * i / 32))) < 1e-6
    assert abs(pe[pos, 2 * i + 1] - np.cos(pos / 10000 ** (2 * i / 32))) < 1e-6
    halves = to_numpy(layers.SinusoidalPositionEncoding(interleave=False)(x))[0]
    assert abs(halves[pos, 16 + i] - np.cos(pos / 10000 ** (2 * i / 32))) < 1e-6


def test_position_embedding_contract(x):
    layer, out = run_layer_test(
        layers.PositionEmbedding, dict(sequence_length=10), (x,), (1, 6, 32)
    )
    assert_close(layer(x, start_index=2), to_numpy(layer.embeddings)[None, 2:8], atol=0)


def test_token_embedding_tied_and_untied():
    ids = np.array([[1, 2, 3]])
    tied = layers.TokenEmbedding(50, 16, scale=4.0)
    hidden = tied(ids)
    assert_close(hidden, to_numpy(tied.embeddings)[ids] * 4.0, atol=1e-6)
    assert tuple(tied(hidden, reverse=True).shape) == (1, 3, 50)
    run_layer_test(
        layers.TokenEmbedding,
        dict(input_dim=50, output_dim=16, tie_weights=False),
        (ids,),
        (1, 3, 16),
    )


@pytest.mark.parametrize(
    "gated,activation", [(False, "gelu"), (True, "silu"), (False, "relu")]
)
def test_feed_forward(x, gated, activation):
    layer, out = run_layer_test(
        layers.FeedForward,
        dict(intermediate_dim=48, activation=activation, gated=gated),
        (x,),
        (2, 6, 32),
    )
    assert len(layer.trainable_weights) == (6 if gated else 4)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_exact_gelu_is_keras_gelu(rng, dtype):
    from keras_transformers.layers.feed_forward import exact_gelu

    x = keras.ops.convert_to_tensor(4 * rng.normal(size=(3, 257)), dtype)
    ours, theirs = exact_gelu(x), keras.activations.gelu(x, approximate=False)
    assert keras.backend.standardize_dtype(ours.dtype) == dtype
    tol = 1e-6 if dtype == "float32" else 1e-2
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(keras.ops.cast(ours, "float32")),
        keras.ops.convert_to_numpy(keras.ops.cast(theirs, "float32")),
        rtol=tol,
        atol=tol,
    )


@pytest.mark.parametrize("norm_position", ["pre", "post"])
def test_transformer_block(x, norm_position):
    run_layer_test(
        layers.TransformerBlock,
        dict(
            num_heads=4,
            intermediate_dim=64,
            norm_position=norm_position,
            causal=True,
            norm_type="rms",
        ),
        (x,),
        (2, 6, 32),
    )


def test_block_with_cross_attention_and_injected_feed_forward(x, rng):
    encoder = rng.normal(size=(2, 4, 32)).astype("float32")
    injected = layers.FeedForward(16, activation="relu", name="custom_ff")
    block = layers.TransformerBlock(
        num_heads=4,
        intermediate_dim=64,
        cross_attention=True,
        causal=True,
        feed_forward=injected,
    )
    out = block(x, encoder_outputs=encoder)
    assert tuple(out.shape) == (2, 6, 32)
    assert block.feed_forward is injected
    clone = layers.TransformerBlock.from_config(block.get_config())
    clone(x, encoder_outputs=encoder)
    assert clone.feed_forward.intermediate_dim == 16
    clone.set_weights(block.get_weights())
    assert_close(clone(x, encoder_outputs=encoder), out, atol=1e-6)


def test_post_norm_block_is_normalised(x):
    block = layers.TransformerBlock(
        num_heads=4, intermediate_dim=64, norm_position="post"
    )
    out = to_numpy(block(x))
    np.testing.assert_allclose(out.mean(-1), 0.0, atol=1e-4)


def test_mixed_precision_attention_softmax_in_float32(x):
    layer = layers.MultiHeadAttention(
        num_heads=4, head_dim=8, fused=False, dtype="mixed_bfloat16"
    )
    out = layer(keras.ops.convert_to_tensor(x))
    assert keras.backend.standardize_dtype(out.dtype) == "bfloat16"
    assert np.all(np.isfinite(to_numpy(keras.ops.cast(out, "float32"))))
