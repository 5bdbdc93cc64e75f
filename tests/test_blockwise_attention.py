"""Blockwise (memory-efficient) attention gives explicit attention's outputs
and gradients: causal, sliding windows, padding (rows with every key
masked included), grouped K/V heads, soft-capping, sinks, encoders and
cross-attention; and a model's training step is unchanged by the switch."""

import contextlib

import keras
import numpy as np
import pytest
from contracts import assert_close, compiled, compiled_call, gradients, to_numpy

import keras_transformers as kt
from keras_transformers.layers.attention import MultiHeadAttention

B, T, D = 2, 11, 32
CASES = {
    "causal_gqa": dict(num_heads=4, num_kv_heads=2, causal=True),
    "causal_mha": dict(num_heads=4, causal=True),
    "causal_mha_window": dict(num_heads=4, causal=True, sliding_window=4),
    "padded_empty_rows": dict(num_heads=4, num_kv_heads=2, causal=True, padded=True),
    "softcap": dict(num_heads=4, num_kv_heads=1, causal=True, softcap=5.0),
    "sinks_padded": dict(
        num_heads=4, num_kv_heads=2, causal=True, sinks=True, padded=True
    ),
    "encoder_window": dict(num_heads=4, sliding_window=4, padded=True),
    "cross_attention": dict(num_heads=4, num_kv_heads=2, cross=True, padded=True),
}


def _layers(options):
    """An explicit layer and a blockwise one (blocks of 4) with its weights."""
    options = dict(options)
    options.pop("padded", None)
    cross = options.pop("cross", False)
    made = []
    for block_size in (0, 4):
        layer = MultiHeadAttention(
            head_dim=8, fused=False, block_size=block_size, **options
        )
        layer.build((B, T, D), (B, T + 3, D) if cross else None)
        made.append(layer)
    rng = np.random.default_rng(0)
    for variable in made[0].weights:
        variable.assign(rng.normal(size=variable.shape).astype("float32") * 0.5)
    for mine, theirs in zip(made[1].weights, made[0].weights):
        mine.assign(theirs)
    return made


def _no_gradient():
    """Where calls take no gradient (PyTorch: `torch.no_grad`; JAX: any
    call outside `jax.grad`; TensorFlow always computes the forward pass
    that keeps its residuals)."""
    if keras.config.backend() == "torch":
        import torch

        return torch.no_grad()
    return contextlib.nullcontext()


def _record_blockwise(monkeypatch, argument):
    """The list that each call of `blockwise_attention` from attention
    layers appends its keyword `argument` to."""
    from keras_transformers.layers import attention_scores

    calls = []
    real = attention_scores.blockwise_attention
    monkeypatch.setattr(
        attention_scores,
        "blockwise_attention",
        lambda *a, **k: calls.append(k[argument]) or real(*a, **k),
    )
    return calls


@pytest.mark.parametrize("key_block", [0, 3])
@pytest.mark.parametrize("case", sorted(CASES))
def test_blockwise_equals_explicit(case, key_block, monkeypatch):
    """Outputs without a gradient (in tiles of 3 keys: an online softmax;
    or all of a block's keys at once) and gradients."""
    from keras_transformers.layers import blockwise_attention

    monkeypatch.setattr(blockwise_attention, "KEY_BLOCK", key_block)
    monkeypatch.setattr(blockwise_attention, "QUERY_BLOCK", 4)
    options = CASES[case]
    rng = np.random.default_rng(1)
    query = rng.normal(size=(B, T, D)).astype("float32")
    source = rng.normal(size=(B, T + 3, D)).astype("float32")
    s = T + 3 if options.get("cross") else T
    padding = np.ones((B, s), bool)
    if options.get("padded"):  # left padding: the first queries see no key
        padding[0, :3] = False
        padding[1, -2:] = False
    weights = rng.normal(size=(B, T, D)).astype("float32")
    kwargs = {"key_padding_mask": padding} if options.get("padded") else {}
    if options.get("cross"):
        kwargs["key_value"] = source
    results = []
    for layer in _layers(options):

        def loss(layer=layer):
            return keras.ops.sum(layer(query, **kwargs) * keras.ops.array(weights))

        with _no_gradient():  # on JAX one compiled program, as the gradient's
            out = to_numpy(compiled_call(layer, query, **kwargs))
        results.append((out, gradients(loss, layer.trainable_weights)))
    (out_a, grads_a), (out_b, grads_b) = results
    assert_close(out_b, out_a, atol=2e-5)
    # Relative to the largest gradient: the key bias's is zero up to rounding.
    scale = max(np.abs(g).max() for g in grads_a)
    for grad_a, grad_b in zip(grads_a, grads_b):
        assert_close(grad_b, grad_a, atol=1e-5 * scale)


def test_long_sequences_choose_blockwise(monkeypatch):
    """By default a long causal self-attention runs blockwise (its fused
    kernel kept aside on PyTorch) and a short one does not."""
    from keras_transformers.layers import attention_scores

    calls = _record_blockwise(monkeypatch, "block_size")
    monkeypatch.setattr(attention_scores, "LONG_CAUSAL", 16)
    layer = MultiHeadAttention(num_heads=2, head_dim=4, causal=True, softcap=20.0)
    layer(np.zeros((1, 8, 8), "float32"))
    assert calls == []
    layer(np.zeros((1, 160, 8), "float32"))
    assert calls == [attention_scores.BLOCK_SIZE]


def test_training_step_unchanged_by_blockwise():
    """A decoder's loss and gradients with every attention blockwise (blocks
    of 4 over 12 tokens) equal those with explicit attention."""
    ids = np.random.default_rng(2).integers(3, 512, size=(2, 12))
    padding = np.ones((2, 12), bool)
    padding[1, 9:] = False
    inputs = {"token_ids": ids, "padding_mask": padding}
    results = []
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    for block_size in (0, 4):
        keras.utils.set_random_seed(3)
        model = kt.from_preset("gpt_llama_tiny", attention_block_size=block_size)

        def loss(model=model):
            return loss_fn(ids[:, 1:], model(inputs)[:, :-1])

        results.append(
            (to_numpy(compiled(loss)()), gradients(loss, model.trainable_weights))
        )
    assert_close(results[1][0], results[0][0], atol=1e-6)
    for grad_a, grad_b in zip(results[0][1], results[1][1]):
        assert_close(grad_b, grad_a, atol=2e-5)


STRUCTURES = {
    "causal": dict(causal=True),
    "causal_window": dict(causal=True, window=4),
    "encoder_window": dict(window=4),
}


@pytest.mark.parametrize("structure", sorted(STRUCTURES))
def test_structure_from_positions_equals_its_mask(structure):
    """Without a mask, aligned blocks build the causal or sliding-window
    structure from positions: the same outputs and gradients as with the
    explicit `[T, S]` mask (13 tokens in blocks of 4, the last one short;
    outputs in tiles of 2 keys)."""
    from keras_transformers.layers.blockwise_attention import blockwise_attention
    from keras_transformers.layers.masks import attention_mask

    options = STRUCTURES[structure]
    t, window = 13, options.get("window")
    causal = options.get("causal", False)
    rng = np.random.default_rng(4)
    q, k, v = (
        keras.Variable(rng.normal(size=(2, t, heads, 8)).astype("float32"))
        for heads in (6, 2, 2)
    )
    weights = keras.ops.array(rng.normal(size=(2, t, 6, 8)).astype("float32"))
    # An encoder's window reaches `window // 2` keys each way.
    mask = attention_mask(t, t, causal=causal, sliding_window=window)
    results = []
    for given in (mask, None):

        def loss(given=given):
            out = blockwise_attention(
                q,
                k,
                v,
                given,
                scale=0.3,
                block_size=4,
                aligned=True,
                key_block=2,
                query_block=4,
                **options,
            )
            return keras.ops.sum(out * weights), out

        with _no_gradient():
            out = to_numpy(loss()[1])
        results.append((out, gradients(lambda: loss()[0], [q, k, v])))
    (out_a, grads_a), (out_b, grads_b) = results
    assert_close(out_b, out_a, atol=1e-6)
    for grad_a, grad_b in zip(grads_a, grads_b):
        assert_close(grad_b, grad_a, atol=1e-5)


def test_prefill_from_position_zero_is_blockwise_and_unchanged(monkeypatch):
    """Generation's first call (a cache filled from position 0, its later
    slots masked) runs blockwise with the blocks skipping the keys after
    them, and gives the hidden states and cache of explicit attention."""
    calls = _record_blockwise(monkeypatch, "aligned")
    ids = np.random.default_rng(5).integers(3, 512, size=(2, 11))
    results = []
    for block_size in (0, 4):
        keras.utils.set_random_seed(3)
        model = kt.from_preset("gpt_llama_tiny", attention_block_size=block_size)
        cache = model.backbone.init_cache(2, 19)
        hidden, cache = model.backbone(ids, cache=cache, cache_index=0)
        results.append(
            (to_numpy(hidden), [to_numpy(c) for c in keras.tree.flatten(cache)])
        )
    assert calls and all(calls)
    assert_close(results[1][0], results[0][0], atol=1e-5)
    for theirs, mine in zip(results[0][1], results[1][1]):
        assert_close(mine, theirs, atol=1e-5)
