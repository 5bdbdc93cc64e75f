"""Mixed precision (`mixed_bfloat16`, `mixed_float16`) for every family.

Per family and policy: variables stay float32 and outputs have the compute
dtype; norms, softmax (attention, MoE router) and losses compute in float32;
a few `fit()` steps (loss-scaled under float16) stay finite and lower the
loss; generation runs with a KV cache in the compute dtype.
"""

import keras
import ml_dtypes
import numpy as np
import pytest
from contracts import compiled_forward, compiled_reading, to_numpy

from keras_transformers.layers import SparseMoE
from keras_transformers.models import (
    BertClassifier,
    BertMaskedLM,
    BertTokenClassifier,
    GPTCausalLM,
    MixtralCausalLM,
    Seq2SeqLM,
    ViTClassifier,
)
from keras_transformers.training import MaskedSparseCategoricalCrossentropy

POLICIES = ["mixed_bfloat16", "mixed_float16"]
LOW = {"mixed_bfloat16": ml_dtypes.bfloat16, "mixed_float16": np.float16}
V = 512  # vocabulary of the text presets (BERT's is overridden to it)
TEXT = dict(num_layers=1, dropout=0.0, attention_dropout=0.0)
BERT = dict(TEXT, vocabulary_size=V, max_sequence_length=64)

# name: (class, preset, config overrides and task arguments)
FAMILIES = {
    "gpt2": (GPTCausalLM, "gpt2_tiny", TEXT),
    "llama": (GPTCausalLM, "gpt_llama_tiny", TEXT),
    "mixtral": (MixtralCausalLM, "mixtral_tiny", TEXT),
    "bert_masked_lm": (BertMaskedLM, "bert_tiny", BERT),
    "bert_classifier": (BertClassifier, "bert_tiny", dict(BERT, num_classes=3)),
    "bert_token_classifier": (
        BertTokenClassifier,
        "bert_tiny",
        dict(BERT, num_classes=3),
    ),
    "seq2seq": (Seq2SeqLM, "transformer_tiny", TEXT),
    "vit": (ViTClassifier, "vit_tiny_28", dict(num_layers=1, num_classes=4)),
}
# One BERT task in the slower tests; the other two only add a dense head
# (see `test_bert_classifier_heads`).
MAIN = ["gpt2", "llama", "mixtral", "bert_masked_lm", "seq2seq", "vit"]
GENERATORS = ["gpt2", "llama", "mixtral", "seq2seq"]


def batch(name, rng):
    """`(x, y)`: a small batch of 4 for family `name`."""
    ids = rng.integers(3, V, (4, 9)).astype("int32")
    mask = np.ones((4, 8), bool)
    if name in ("gpt2", "llama", "mixtral"):
        return {"token_ids": ids[:, :-1], "padding_mask": mask}, ids[:, 1:]
    if name == "seq2seq":
        source = rng.integers(3, V, (4, 6)).astype("int32")
        x = {
            "encoder_token_ids": source,
            "encoder_padding_mask": np.ones((4, 6), bool),
            "decoder_token_ids": ids[:, :-1],
            "decoder_padding_mask": mask,
        }
        return x, ids[:, 1:]
    if name == "vit":
        # Two of the four classes, one brightness each: learnable in a few steps.
        labels = np.arange(4) % 2
        images = 120 * labels[:, None, None, None] + rng.uniform(0, 120, (4, 28, 28, 1))
        return images.astype("float32"), labels
    x = {"token_ids": ids[:, :-1], "padding_mask": mask}
    if name == "bert_masked_lm":
        x["mask_positions"] = np.tile(np.array([[1, 4, 6]], "int32"), (4, 1))
        return x, ids[:, [1, 4, 6]]
    if name == "bert_classifier":
        return x, np.arange(4) % 3
    return x, ids[:, :-1] % 3  # token classifier


def build(name, policy, **overrides):
    cls, preset, fields = FAMILIES[name]
    return cls.from_preset(preset, dtype=policy, **{**fields, **overrides})


def dtype_of(x):
    return keras.backend.standardize_dtype(x.dtype)


@pytest.fixture(scope="module")
def models():
    """`models(name, policy)`: `build(name, policy)`, built once per file
    (each from the same seed) and shared by the tests below, which read it
    or (`fit`) train it a few steps; `fresh=True` first restores the
    weights it was built with."""
    cache = {}

    def get(name, policy, fresh=False):
        if (name, policy) not in cache:
            keras.utils.set_random_seed(1234)
            model = build(name, policy)
            cache[name, policy] = model, model.get_weights()
        model, weights = cache[name, policy]
        if fresh:
            model.set_weights(weights)
        return model

    return get


def traced(fn, *args):
    """`fn(*args)`; on JAX only its outputs' shapes and dtypes, by tracing
    (compiling each op of an eager call costs more than `generate`)."""
    if keras.config.backend() == "jax":
        import jax

        return jax.eval_shape(fn, *args)
    return fn(*args)


class RecordingLoss(MaskedSparseCategoricalCrossentropy):
    """The package loss, noting the dtype of the logits it receives (inside
    the compiled train step: the runtime dtype)."""

    def __init__(self):
        super().__init__()
        self.logits_dtypes = set()

    def __call__(self, y_true, y_pred, sample_weight=None):
        self.logits_dtypes.add(dtype_of(y_pred))
        return super().__call__(y_true, y_pred, sample_weight)


# ---------------------------------------------------------------- training
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", MAIN)
def test_fit_is_finite_and_lowers_the_loss(name, policy, rng, models):
    model = models(name, policy, fresh=True)
    assert model.dtype_policy.name == policy
    assert {dtype_of(w) for w in model.weights} == {"float32"}
    x, y = batch(name, rng)
    loss = RecordingLoss()
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss=loss)
    # Keras wraps the optimizer for float16 only (auto_scale_loss=True).
    scaled = isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert scaled == (policy == "mixed_float16")
    epochs = 12 if name == "vit" else 6  # the ViT head starts at zero
    losses = model.fit(x, y, epochs=epochs, batch_size=4, verbose=0).history["loss"]
    assert np.all(np.isfinite(losses)), losses
    assert min(losses[-3:]) < 0.85 * losses[0], losses
    assert loss.logits_dtypes == {model.compute_dtype}  # logits: compute dtype
    assert {dtype_of(w) for w in model.weights} == {"float32"}
    assert all(np.isfinite(to_numpy(w)).all() for w in model.trainable_weights)
    if scaled:
        assert np.isfinite(float(to_numpy(model.optimizer.dynamic_scale)))


# -------------------------------------------------------------- generation
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", GENERATORS)
def test_generation_with_a_compute_dtype_cache(name, policy, models):
    model = models(name, policy)
    compute = model.compute_dtype
    backbone = model.backbone
    if name == "seq2seq":
        caches = traced(
            lambda ids: backbone.init_cache(backbone.encode(ids), 8),
            np.array([[5, 6, 7, 2]], "int32"),
        )
        caches = [*caches[0], *caches[1]]  # self- and cross-attention
        outputs = [
            model.generate([[5, 6, 7, 2], [8, 9, 2]], max_new_tokens=4),
            model.generate([[5, 6, 7, 2]], max_new_tokens=4, num_beams=2),
        ]
    else:
        prompts = np.array([[5, 6, 7], [8, 9, 10]], "int32")
        # One cached step by hand: logits and the updated cache keep the dtype.
        logits, caches = traced(
            lambda p, c: model.call_with_cache(p, c, 0),
            prompts,
            backbone.init_cache(2, 8),
        )
        assert dtype_of(logits) == compute
        outputs = [model.generate(prompts, max_new_tokens=4, stop_token_ids=None)]
        for out in outputs:
            assert out.shape == (2, 7) and np.array_equal(out[:, :3], prompts)
    assert {dtype_of(t) for pair in caches for t in pair} == {compute}
    for out in outputs:
        assert out.dtype == np.int32 and out.shape[-1] >= 1
        assert out.min() >= 0 and out.max() < V


# ------------------------------------------------------------ float32 parts
def norm_inputs(policy, dim, rng):
    """`[3, 2, D]` values exact in the compute dtype on which that dtype's
    arithmetic visibly fails: `2^k` and `2^k + 2` alternate, so the mean
    `2^k + 1` is not representable (bf16: k=8; f16: k=11, whose squares and
    sums also overflow), then random rows."""
    base = 256.0 if policy == "mixed_bfloat16" else 2048.0
    steps = np.resize([0.0, 2.0], dim)
    rows = [base + steps, base + rng.permutation(steps)]
    rows += list(rng.standard_normal((4, dim)) * 3)
    x = np.stack(rows).reshape(3, 2, dim).astype(LOW[policy])
    return x.astype("float32")


def reference_norm(layer, x, dtype):
    """The norm in float64 (`exact`) and in per-op `dtype` arithmetic (`low`)."""
    eps = layer.epsilon
    rms = isinstance(layer, keras.layers.RMSNormalization)
    weights = [to_numpy(w).astype("float64") for w in layer.weights]

    def norm(x, dt):
        d = dt(x.shape[-1])
        center = (
            x if rms else x - (np.sum(x, -1, keepdims=True, dtype=dt) / d).astype(dt)
        )
        var = (np.sum(center * center, -1, keepdims=True, dtype=dt) / d).astype(dt)
        out = center * (dt(1) / np.sqrt(var + dt(eps))).astype(dt)
        if rms:
            return out * weights[0].astype(dt)
        return out * weights[0].astype(dt) + weights[1].astype(dt)

    exact = norm(x.astype("float64"), np.float64)
    with np.errstate(over="ignore", invalid="ignore"):  # float16 overflows
        low = norm(x.astype(dtype), dtype).astype("float64")
    return exact, low


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", ["gpt2", "llama", "bert_masked_lm", "seq2seq", "vit"])
def test_norms_compute_in_float32(name, policy, rng, models):
    """Every norm of the model gives the exact result rounded once to the
    compute dtype, on inputs where compute-dtype arithmetic is further off."""
    model = models(name, policy, fresh=True)
    kinds = (keras.layers.LayerNormalization, keras.layers.RMSNormalization)
    norms = [layer for layer in model._flatten_layers() if isinstance(layer, kinds)]
    assert norms
    dim = model.config.hidden_dim
    x = norm_inputs(policy, dim, rng)
    for layer in norms:
        out = layer(keras.ops.cast(x, model.compute_dtype))
        assert dtype_of(out) == model.compute_dtype
        out = to_numpy(keras.ops.cast(out, "float32")).astype("float64")
        exact, low = reference_norm(layer, x, LOW[policy])
        # Rounded once: within half an ulp of the exact value; per-op
        # compute-dtype arithmetic is off by more (or overflows).
        bits = 8 if policy == "mixed_bfloat16" else 11  # significand bits
        half_ulp = 2.0 ** (np.floor(np.log2(np.abs(exact) + 1e-30)) - bits)
        assert np.all(np.abs(out - exact) <= half_ulp * 1.001 + 1e-7), layer.path
        bad = ~np.isfinite(low) | (np.abs(low - exact) > 2 * half_ulp)
        assert bad.any(), "inputs too easy: compute-dtype arithmetic would pass"


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", MAIN)
def test_softmax_and_loss_inputs_are_float32(name, policy, rng, monkeypatch):
    """Spies on `keras.ops.softmax` / `log_softmax` while tracing the model
    symbolically (fast everywhere): attention probabilities (the explicit
    path, taken with attention dropout in training), the MoE router and the
    loss all see float32."""
    seen = []
    for op in ("softmax", "log_softmax"):
        real = getattr(keras.ops, op)

        def spy(x, *args, _real=real, _op=op, **kwargs):
            seen.append((_op, dtype_of(x)))
            return _real(x, *args, **kwargs)

        monkeypatch.setattr(keras.ops, op, spy)
    model = build(name, policy, attention_dropout=0.1)
    x, y = batch(name, rng)
    symbolic = lambda a: keras.KerasTensor(a.shape, dtype=str(a.dtype))  # noqa: E731
    logits = model(keras.tree.map_structure(symbolic, x), training=True)
    loss = MaskedSparseCategoricalCrossentropy()(symbolic(y), logits)
    assert dtype_of(logits) == model.compute_dtype and dtype_of(loss) == "float32"
    assert {dtype_of(w) for w in model.weights} == {"float32"}
    attention = sum(op == "softmax" for op, _ in seen)
    assert attention >= model.config.num_layers  # one per attention layer at least
    assert ("log_softmax", "float32") in seen  # the loss
    assert {dtype for _, dtype in seen} == {"float32"}, seen


@pytest.mark.parametrize("policy", POLICIES)
def test_moe_router_multiplies_in_float32(policy, rng, monkeypatch, models):
    """The router kernel is not autocast: router logits inside the mixed
    model equal the float32 product (a compute-dtype kernel is off by ~1e-3)."""
    model = models("mixtral", policy)
    moe = next(
        layer for layer in model._flatten_layers() if isinstance(layer, SparseMoE)
    )
    captured = []
    real_route = moe.route

    def route(tokens, training=None):
        out = real_route(tokens, training)
        captured.append((keras.ops.cast(tokens, "float32"), out[0]))
        return out

    def forward(x):
        # Returns what the router saw: on JAX one compiled program (each op
        # of an eager mixed-precision call compiles alone).
        captured.clear()
        model(x)
        return captured[0]

    monkeypatch.setattr(moe, "route", route)
    x, _ = batch("mixtral", rng)
    tokens, logits = to_numpy(compiled_reading(forward, model.variables)(x))
    assert logits.dtype == np.float32
    kernel = to_numpy(moe.router_kernel).astype("float64")
    np.testing.assert_allclose(
        logits, tokens.astype("float64") @ kernel, rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize("policy", POLICIES)
def test_bert_classifier_heads(policy, rng, models):
    """Sequence and token classifiers: float32 variables, compute-dtype
    logits, float32 loss (their fit runs like the masked LM's)."""
    for name in ("bert_classifier", "bert_token_classifier"):
        model = models(name, policy)
        x, y = batch(name, rng)
        logits = compiled_forward(model, x)
        assert dtype_of(logits) == model.compute_dtype
        assert {dtype_of(w) for w in model.weights} == {"float32"}
        loss = MaskedSparseCategoricalCrossentropy()(y, logits)
        assert dtype_of(loss) == "float32" and np.isfinite(float(to_numpy(loss)))


@pytest.mark.skipif(
    keras.config.backend() != "torch",
    reason="PyTorch traces symbolic calls on its 'meta' device",
)
# Keras' `take_along_axis` (BERT's masked-token gather) does not run on the
# meta device; Keras then traces on the real one, as it does for any failure.
@pytest.mark.parametrize("name", [n for n in MAIN if n != "bert_masked_lm"])
def test_meta_device_trace_has_the_compute_dtype(name, rng):
    """Keras traces a symbolic call on PyTorch's "meta" device, where a
    variable's stand-in has the variable's dtype (float32): the model's
    output must still have the compute dtype there (a float32 stand-in
    reaching a product promoted the ViT logits to float32)."""
    import torch

    model = build(name, "mixed_bfloat16")
    x, _ = batch(name, rng)

    def meta(a):
        return torch.empty(a.shape, dtype=getattr(torch, str(a.dtype)), device="meta")

    with keras.device("meta"):
        logits = model(keras.tree.map_structure(meta, x))
    assert logits.device.type == "meta" and dtype_of(logits) == "bfloat16"
