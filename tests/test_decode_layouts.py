"""Decoding-step layouts chosen for speed give the numbers of the general
path on every backend: attention of one query token by reduction
(`attention_scores._one_query`) against the explicit attention, with
grouped heads, masks, biases, soft caps and sinks; the LM head's logits
vocabulary first (`TextBackbone.logits(..., vocabulary_first=True)`)
against the usual ones, tied and untied, with a logits bias and a soft
cap."""

import keras
import numpy as np
import pytest
from contracts import assert_close, to_numpy

from keras_transformers import from_preset, layers
from keras_transformers.layers import attention_scores

CASES = {
    "grouped": dict(num_heads=4, num_kv_heads=2),
    "ungrouped": dict(num_heads=4),
    "softcap": dict(num_heads=4, num_kv_heads=2, softcap=5.0),
    "sinks": dict(num_heads=4, num_kv_heads=1, sinks=True),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("with_bias", [False, True])
def test_one_query_attention_by_reduction_equals_explicit(rng, name, with_bias):
    layer = layers.MultiHeadAttention(head_dim=8, fused=False, **CASES[name])
    layer(np.zeros((1, 3, 32), "float32"))  # builds the sink logits
    if layer.sinks:
        layer.sink_logits.assign(rng.normal(size=(4,)).astype("float32"))
    b, s, k = 3, 7, layer.num_kv_heads
    q = rng.normal(size=(b, 1, 4, 8)).astype("float32")
    keys = rng.normal(size=(b, s, k, 8)).astype("float32")
    values = rng.normal(size=(b, s, k, 8)).astype("float32")
    mask = rng.random((b, 1, 1, s)) < 0.7
    mask[:, ..., 0] = True  # every row sees a key
    bias = rng.normal(size=(b, 4, 1, s)).astype("float32") if with_bias else None
    scale = 8**-0.5
    expected = attention_scores._grouped(
        layer, q, keys, values, mask, False, scale, False, bias
    )
    got = attention_scores._one_query(layer, q, keys, values, mask, scale, bias)
    assert tuple(got.shape) == (b, 1, 4, 8)
    assert_close(got, expected, atol=1e-5)


@pytest.mark.parametrize("tied", [True, False])
def test_vocabulary_first_logits_are_the_transposed_logits(rng, tied):
    lm = from_preset(
        "gpt_llama_tiny",
        tie_embeddings=tied,
        logits_bias=True,
        logit_softcap=3.0,
        num_layers=1,
    )
    backbone = lm.backbone
    bias = backbone.logits_bias
    bias.assign(rng.normal(size=tuple(bias.shape)).astype("float32"))
    hidden = rng.normal(size=(3, backbone.config.hidden_dim)).astype("float32")
    expected = to_numpy(backbone.logits(hidden[:, None]))[:, 0]  # [N, V]
    got = to_numpy(backbone.logits(hidden, vocabulary_first=True))  # [V, N]
    np.testing.assert_allclose(got, expected.T, atol=1e-5)
    assert_close(keras.ops.argmax(got, 0), keras.ops.argmax(expected, -1), atol=0)
