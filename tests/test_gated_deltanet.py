"""The Gated DeltaNet token mixer ("linear_attention" layers): its chunked
(parallel) and recurrent forms give the same outputs and states; the layer
over a whole sequence equals the layer fed through its cache (a prefill,
then one token at a time); right-padded positions leave the real
positions' outputs unchanged and left padding gives the unpadded outputs;
gated attention multiplies each head by a sigmoid gate; a stack with
linear layers counts its parameters, generates as a full forward pass
does, and its config refuses what it cannot build."""

import keras
import numpy as np
import pytest
from contracts import (
    assert_close,
    compiled,
    gradients,
    run_fit_test,
    run_layer_test,
    to_numpy,
)

from keras_transformers import TransformerConfig
from keras_transformers.config import LinearAttentionConfig
from keras_transformers.layers import GatedDeltaNet, MultiHeadAttention
from keras_transformers.layers.gated_deltanet import (
    chunked_delta_rule,
    recurrent_delta_rule,
)
from keras_transformers.models import GPTBackbone, GPTCausalLM

LAYER = dict(num_key_heads=2, num_value_heads=4, key_head_dim=8, value_head_dim=6)


def _rule_inputs(batch=2, length=11, heads=3, dk=4, dv=5):
    rng = np.random.default_rng(0)
    q, k = (rng.normal(size=(batch, length, heads, dk)) for _ in range(2))
    q, k = (x / np.linalg.norm(x, axis=-1, keepdims=True) for x in (q, k))
    v = rng.normal(size=(batch, length, heads, dv))
    g = -rng.uniform(0, 1, (batch, length, heads))
    beta = rng.uniform(0, 1, (batch, length, heads))
    state = rng.normal(size=(batch, heads, dk, dv))
    arrays = (q, k, v, g, beta, state)
    return [keras.ops.convert_to_tensor(x.astype("float32")) for x in arrays]


@pytest.mark.parametrize("chunk", [4, 11, 64])
def test_chunked_form_equals_recurrent_form(chunk):
    """Chunks of any size (the last one padded, or the whole sequence)
    give the one-token-at-a-time outputs and final state."""
    inputs = _rule_inputs()
    out, state = compiled(recurrent_delta_rule)(*inputs)
    chunked, chunked_state = compiled(
        lambda *a: chunked_delta_rule(*a, chunk_size=chunk)
    )(*inputs)
    assert_close(chunked, out, atol=1e-5)
    assert_close(chunked_state, state, atol=1e-5)


def test_chunked_form_has_the_recurrent_forms_gradients():
    """Differentiating through the chunks (a scan over their states) gives
    the gradients of the one-token-at-a-time form, for every input."""
    variables = [keras.Variable(x) for x in _rule_inputs(length=9)]

    def loss(rule):
        out, state = rule(*[v.value for v in variables])
        weights = keras.ops.arange(out.shape[-1], dtype="float32")
        return keras.ops.sum(out * weights) + keras.ops.sum(state**2)

    want = gradients(lambda: loss(recurrent_delta_rule), variables)
    got = gradients(
        lambda: loss(lambda *a: chunked_delta_rule(*a, chunk_size=4)), variables
    )
    for name, g, w in zip(("q", "k", "v", "g", "beta", "state"), got, want):
        assert_close(g, w, atol=1e-4), name


def test_a_stack_with_linear_layers_fits():
    """`fit()` trains a stack of linear and full attention layers (a
    scan over two chunks of 64 tokens in each step) on every backend."""
    lm = GPTCausalLM(GPTBackbone(_config()))
    ids = np.random.default_rng(1).integers(1, 64, (2, 70)).astype("int32")
    x = {"token_ids": ids, "padding_mask": np.ones_like(ids, bool)}
    history = run_fit_test(lm, x, ids)
    assert len(history.history["loss"]) == 1


def test_layer_contract():
    x = np.random.default_rng(0).normal(size=(2, 5, 16)).astype("float32")
    run_layer_test(GatedDeltaNet, dict(LAYER, chunk_size=4), (x,), (2, 5, 16))


def test_cached_decoding_equals_the_full_sequence():
    """A 3-token prefill through the cache, then one token at a time,
    gives the outputs of one pass over 9 tokens (3 chunks of 4)."""
    layer = GatedDeltaNet(**LAYER, chunk_size=4)
    layer.build((2, 9, 16))
    x = np.random.default_rng(1).normal(size=(2, 9, 16)).astype("float32")
    full = to_numpy(compiled(layer)(x))
    cache = layer.init_cache(2, 9, "float32")
    assert [tuple(c.shape) for c in cache] == [(2, 3, 2 * 16 + 24), (2, 4, 8, 6)]
    step = compiled(lambda x, cache, t: layer(x, cache=cache, cache_index=t))
    out, cache = step(x[:, :3], cache, 0)
    steps = [to_numpy(out)]
    for t in range(3, 9):
        out, cache = step(x[:, t : t + 1], cache, t)
        steps.append(to_numpy(out))
    assert_close(np.concatenate(steps, axis=1), full, atol=1e-5)


def test_padding():
    """Changing right-padded inputs leaves the real positions' outputs;
    a left-padded row gives the outputs of the unpadded row."""
    layer = GatedDeltaNet(**LAYER)
    layer.build((None, None, 16))
    run = compiled(lambda x, mask: layer(x, key_padding_mask=mask))
    rng = np.random.default_rng(2)
    x = rng.normal(size=(1, 6, 16)).astype("float32")
    mask = np.array([[1, 1, 1, 1, 0, 0]], bool)
    other = x.copy()
    other[:, 4:] = rng.normal(size=(1, 2, 16))
    a, b = (to_numpy(run(v, mask)) for v in (x, other))
    assert_close(a[:, :4], b[:, :4], atol=1e-6)
    left = np.concatenate([rng.normal(size=(1, 2, 16)).astype("float32"), x], 1)
    left_mask = np.array([[0, 0] + [1] * 6], bool)
    padded = to_numpy(run(left, left_mask))
    assert_close(padded[:, 2:], to_numpy(compiled(layer)(x)), atol=1e-5)


def test_gated_attention_multiplies_heads_by_a_sigmoid_gate():
    """With `output_gate`, the output is the output projection of each
    head's attention times `sigmoid(x @ W_gate)`: a zero gate kernel halves
    the ungated output (bias-free output projection)."""
    x = np.random.default_rng(3).normal(size=(2, 5, 16)).astype("float32")
    args = dict(num_heads=2, head_dim=8, causal=True, use_bias=False)
    gated, _ = run_layer_test(
        MultiHeadAttention, dict(args, output_gate=True), (x,), (2, 5, 16)
    )
    plain = MultiHeadAttention(**args)
    plain(x)
    for name in ("query", "key", "value", "output"):
        source = getattr(gated, f"{name}_dense" if name != "output" else "output_dense")
        target = getattr(plain, f"{name}_dense" if name != "output" else "output_dense")
        target.kernel.assign(source.kernel)
    gated.gate_dense.kernel.assign(np.zeros(gated.gate_dense.kernel.shape))
    assert_close(gated(x), 0.5 * to_numpy(plain(x)), atol=1e-6)


def _config(**changes):
    fields = dict(
        vocabulary_size=64,
        num_layers=2,
        hidden_dim=32,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_dim=48,
        position_embedding="rotary",
        rotary_fraction=0.25,
        norm_type="rms",
        activation="silu",
        gated_feed_forward=True,
        use_bias=False,
        qk_norm=True,
        tie_embeddings=False,
        attention_output_gate=True,
        layer_types=["linear_attention", "full_attention"],
        linear_attention=LinearAttentionConfig(**LAYER),
    )
    return TransformerConfig(**{**fields, **changes})


def test_stack_parameters_and_generation():
    """`num_params()` counts the built model; greedy `generate` of two
    prompts of different lengths (past one bucket: a prefill through the
    recurrent states, then the rest token by token) equals greedy
    decoding by full forward passes."""
    config = _config()
    lm = GPTCausalLM(GPTBackbone(config))
    assert lm.count_params() == config.num_params()
    rng = np.random.default_rng(4)
    rows = [rng.integers(1, 64, 34).tolist(), rng.integers(1, 64, 37).tolist()]
    ours = np.asarray(lm.generate(rows, max_new_tokens=4, stop_token_ids=None))
    forward = compiled(lm)
    for row, generated in zip(rows, ours):
        ids = np.zeros((1, 41), "int32")  # one shape: one compilation
        ids[0, : len(row)] = row
        for t in range(len(row), len(row) + 4):
            logits = to_numpy(forward(ids))
            ids[0, t] = logits[0, t - 1].argmax()
        assert generated[: len(row) + 4].tolist() == ids[0, : len(row) + 4].tolist()


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(linear_attention=None), "linear_attention.*LinearAttentionConfig"),
        (dict(layer_types=None), "linear_attention.*None unless layer_types"),
        (dict(linear_attention={"num_key_heads": 2}), "LinearAttentionConfig"),
    ],
)
def test_config_errors_name_the_field(changes, match):
    with pytest.raises(ValueError, match=match):
        _config(**changes)


def test_config_round_trips():
    with pytest.raises(ValueError, match="num_value_heads.*multiple of .*=3"):
        LinearAttentionConfig(3, 4, 8, 8)
    config = _config()
    assert TransformerConfig.from_dict(config.to_dict()) == config
    assert config.replace(conv_kernel_size=2).linear_attention.conv_kernel_size == 2


def test_mixed_precision_keeps_the_state_in_float32():
    """Under `mixed_bfloat16`, a block with a Gated DeltaNet computes in
    bfloat16 but its cached state stays float32 from step to step."""
    from keras_transformers.layers import TransformerBlock

    mixer = GatedDeltaNet(**LAYER, dtype="mixed_bfloat16", name="self_attention")
    block = TransformerBlock(
        num_heads=2,
        intermediate_dim=16,
        token_mixer=mixer,
        dtype="mixed_bfloat16",
    )
    x = np.random.default_rng(6).normal(size=(2, 3, 16)).astype("float32")
    x = keras.ops.cast(x, "bfloat16")  # as the embeddings give it
    block.build((None, None, 16))
    cache = block.init_cache(2, 8, "bfloat16")
    step = compiled(lambda x, cache, t: block(x, cache=cache, cache_index=t))
    out, cache = step(x, cache, 0)
    out, cache = step(x[:, :1], cache, 3)
    assert keras.backend.standardize_dtype(out.dtype) == "bfloat16"
    assert keras.backend.standardize_dtype(cache[1].dtype) == "float32"
