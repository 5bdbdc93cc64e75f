"""Memory: per-block rematerialisation (`remat=True`), gradient accumulation
through the optimizer, and `estimate_memory` (checked against the compiled
JAX training step)."""

import keras
import numpy as np
import pytest
from contracts import (
    assert_close,
    compiled_forward,
    gradients,
    run_fit_test,
    to_numpy,
)

import keras_transformers as kt
from keras_transformers import estimate_memory, load_config
from keras_transformers.layers import block as block_module
from keras_transformers.memory import training_flops_per_token
from keras_transformers.models import GPTCausalLM
from keras_transformers.training import (
    InverseSquareRootSchedule,
    WarmupCosineDecay,
    transformer_adam,
)
from keras_transformers.training.optimizers import PerUpdateSchedule

IDS = np.random.default_rng(0).integers(1, 100, size=(2, 8)).astype("int32")


def _inputs(config):
    if config.stacks == "encoder_decoder":
        return {"encoder_token_ids": IDS, "decoder_token_ids": IDS}
    return IDS


def _loss_gradients(model, x):
    """Gradients of `mean(out**2) + sum(model.losses)` (MoE losses count)."""
    if keras.config.backend() == "jax":
        import jax

        state = [v.value for v in model.non_trainable_variables]

        def loss(values):
            out, _, losses = model.stateless_call(
                values, state, x, training=True, return_losses=True
            )
            return keras.ops.mean(keras.ops.square(out)) + sum(losses)

        values = [v.value for v in model.trainable_variables]
        return to_numpy(jax.jit(jax.grad(loss))(values))

    def loss():
        out = model(x, training=True)
        return keras.ops.mean(keras.ops.square(out)) + sum(model.losses)

    return gradients(loss, model.trainable_variables)


@pytest.fixture
def remat_calls(monkeypatch):
    """Names of the layers `rematerialized` wraps, in call order."""
    calls = []
    original = block_module.rematerialized

    def counting(layer, layer_call):
        calls.append(layer.name)
        return original(layer, layer_call)

    monkeypatch.setattr(block_module, "rematerialized", counting)
    return calls


# ------------------------------------------------------------------- remat
def test_remat_config_field():
    config = load_config("gpt2_tiny")
    assert config.remat is False
    assert load_config("gpt2_tiny", remat=True).remat is True
    data = config.replace(remat=True).to_dict()
    assert kt.TransformerConfig.from_dict(data).remat is True
    data.pop("remat")  # a config saved before the field existed
    assert kt.TransformerConfig.from_dict(data) == config
    matmuls = config.replace(remat="matmuls")
    assert kt.TransformerConfig.from_dict(matmuls.to_dict()).remat == "matmuls"
    for bad in ("yes", 1, None):
        with pytest.raises(ValueError, match="remat"):
            config.replace(remat=bad)


@pytest.mark.parametrize(
    "preset, overrides, mode",
    [
        ("gpt2_tiny", {"dropout": 0.1, "attention_dropout": 0.1}, True),
        ("mixtral_tiny", {}, True),  # the router's aux loss leaves the remat unit
        ("transformer_tiny", {"dropout": 0.1}, True),  # encoder + cross-attention
        # Keeping the weight products: fused / blockwise attention, dropout.
        ("gpt_llama_tiny", {"dropout": 0.1, "attention_block_size": 4}, "matmuls"),
        ("mixtral_tiny", {}, "matmuls"),
    ],
)
def test_remat_gradients_equal(preset, overrides, mode, remat_calls):
    plain = kt.from_preset(preset, num_layers=1, **overrides)
    remat = kt.from_preset(preset, num_layers=1, remat=mode, **overrides)
    for source, target in zip(plain.variables, remat.variables):
        target.assign(source)  # weights and dropout seeds
    x = _inputs(plain.config)
    keras.utils.set_random_seed(5)  # torch draws dropout from its global RNG
    expected = _loss_gradients(plain, x)
    assert remat_calls == []
    keras.utils.set_random_seed(5)
    got = _loss_gradients(remat, x)
    blocks = sorted(
        layer.name
        for layer in remat._flatten_layers()
        if isinstance(layer, kt.layers.TransformerBlock)
    )
    assert sorted(remat_calls) == blocks  # each block once, as one unit
    assert max(np.abs(g).max() for g in expected) > 1e-4
    for a, b in zip(expected, got):
        assert_close(a, b, atol=1e-6)


def test_remat_fit_generate_and_preset(tmp_path, remat_calls):
    model = GPTCausalLM.from_preset("gpt_llama_tiny", num_layers=1, remat=True)
    plain = GPTCausalLM.from_preset("gpt_llama_tiny", num_layers=1)
    plain.set_weights(model.get_weights())
    expected = to_numpy(plain.generate(IDS[:, :3], max_new_tokens=4))
    assert_close(model.generate(IDS[:, :3], max_new_tokens=4), expected, atol=0)
    assert remat_calls == []  # cached decoding needs no remat
    run_fit_test(model, IDS, IDS)
    assert remat_calls  # training did rematerialise
    model.save_to_preset(tmp_path / "preset")
    restored = kt.from_preset(str(tmp_path / "preset"))
    assert restored.config.remat is True
    assert_close(
        compiled_forward(restored, IDS), compiled_forward(model, IDS), atol=1e-6
    )


# ----------------------------------------------------- gradient accumulation
@pytest.mark.parametrize(
    "make_optimizer",
    [
        lambda **kw: keras.optimizers.SGD(0.5, **kw),
        lambda **kw: keras.optimizers.Adam(1e-3, **kw),
        lambda **kw: keras.optimizers.AdamW(1e-3, weight_decay=0.1, **kw),
    ],
    ids=["sgd", "adam", "adamw"],
)
def test_accumulation_equals_large_batch(make_optimizer):
    """4 micro-batches of 2, accumulated, give the weights of one step on
    the batch of 8 (twice, so Adam's bias correction counts updates)."""
    x = np.random.default_rng(1).integers(1, 100, size=(16, 8)).astype("int32")
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    weights = GPTCausalLM.from_preset("gpt2_tiny", num_layers=1).get_weights()
    models = []
    for batch_size, steps in ((8, None), (2, 4)):
        model = GPTCausalLM.from_preset("gpt2_tiny", num_layers=1)
        model.set_weights(weights)
        model.compile(make_optimizer(gradient_accumulation_steps=steps), loss)
        model.fit(x, x, batch_size=batch_size, shuffle=False, verbose=0)
        assert int(model.optimizer.iterations) == 2  # real updates
        models.append(model)
    for a, b, start in zip(models[0].weights, models[1].weights, weights):
        assert np.abs(to_numpy(a) - start).max() > 0 or "norm" in a.path
        assert_close(a, b, atol=2e-6)


def test_per_update_schedule():
    base = WarmupCosineDecay(1e-3, warmup_steps=4, decay_steps=20)
    schedule = PerUpdateSchedule(base, 4)
    for micro_step in (0, 3, 7, 13, 40):
        assert_close(schedule(micro_step), base(micro_step // 4), atol=0)
    revived = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(schedule)
    )
    assert_close(revived(9), base(2), atol=0)
    optimizer = transformer_adam(64, warmup_steps=10, gradient_accumulation_steps=2)
    assert isinstance(optimizer._learning_rate, PerUpdateSchedule)
    # In training, the rate follows real updates (`iterations`), not micro-steps.
    model = GPTCausalLM.from_preset("gpt2_tiny", num_layers=1)
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(True))
    model.fit(IDS[:1].repeat(6, 0), IDS[:1].repeat(6, 0), batch_size=1, verbose=0)
    assert int(optimizer.iterations) == 3
    paper = InverseSquareRootSchedule(64, warmup_steps=10)
    assert_close(optimizer.learning_rate, paper(3), atol=1e-12)
    with pytest.raises(ValueError, match="gradient_accumulation_steps"):
        PerUpdateSchedule(base, 0)
    with pytest.raises(TypeError, match="LearningRateSchedule"):
        PerUpdateSchedule(1e-3, 2)


# ---------------------------------------------------------------- estimator
def test_estimate_formula_one_block():
    """The documented per-token count, by hand, for a one-block encoder."""
    config = kt.TransformerConfig(
        vocabulary_size=50,
        num_layers=1,
        hidden_dim=8,
        num_heads=2,
        intermediate_dim=16,
        stacks="encoder",
    )
    e = estimate_memory(config, batch_size=3, sequence_length=5, optimizer="adam")
    assert e.parameters == e.gradients == 4 * config.num_params()
    assert e.optimizer_state == 2 * e.parameters
    # 2D + (2N + 2K)H + 2D + 3F elements, N log-sum-exp floats; 3D outside.
    per_token = (16 + 8 * 4 + 16 + 48) * 4 + 2 * 4 + 3 * 8 * 4
    assert e.activations == 15 * per_token
    assert e.total == 4 * e.parameters + e.activations
    assert e.flops_per_token == training_flops_per_token(config, 5)
    explicit = estimate_memory(config, 3, 5, fused_attention=False)
    assert explicit.activations - e.activations == 15 * (3.25 * 2 * 5 - 2) * 4


def test_estimate_options_move_the_right_parts():
    config = load_config("gpt_llama_tiny", num_layers=4)
    base = estimate_memory(config, 4, 64)
    assert estimate_memory(config, 4, 64, optimizer="sgd").optimizer_state == 0
    momentum = keras.optimizers.SGD(0.1, momentum=0.9)
    assert estimate_memory(config, 4, 64, optimizer=momentum).optimizer_state == (
        base.parameters
    )
    accumulate = keras.optimizers.AdamW(gradient_accumulation_steps=4)
    assert estimate_memory(config, 4, 64, optimizer=accumulate).optimizer_state == (
        3 * base.parameters
    )
    mixed = estimate_memory(config, 4, 64, dtype="mixed_bfloat16")
    assert mixed.parameters == base.parameters
    assert mixed.activations < 0.65 * base.activations
    half = estimate_memory(config, 4, 64, dtype="bfloat16")
    assert half.parameters * 2 == base.parameters
    remat = estimate_memory(config, 4, 64, remat=True)
    assert remat.activations < 0.7 * base.activations
    assert remat.recompute_flops_per_token > 0 == base.recompute_flops_per_token
    assert estimate_memory(config.replace(remat=True), 4, 64) == remat
    matmuls = estimate_memory(config, 4, 64, remat="matmuls")
    assert matmuls.activations < base.activations
    if keras.config.backend() == "tensorflow":  # the whole block again
        assert matmuls.activations == remat.activations
    else:
        assert remat.activations < matmuls.activations
    # Element-wise work only, except on TensorFlow (the whole block again).
    again = (
        remat.recompute_flops_per_token if keras.config.backend() == "tensorflow" else 0
    )
    assert matmuls.recompute_flops_per_token == again
    # Explicit attention keeps [B, N, T, T] scores: quadratic in T.
    short = estimate_memory(config, 4, 64, fused_attention=False).activations
    long = estimate_memory(config, 4, 256, fused_attention=False).activations
    assert long > 4.5 * short
    # MoE activations scale with top-k, parameters with all experts.
    moe = load_config("mixtral_tiny")
    top1 = moe.replace(moe={"num_experts_per_token": 1})
    assert estimate_memory(top1, 4, 64).activations < (
        estimate_memory(moe, 4, 64).activations
    )
    assert estimate_memory(top1, 4, 64).parameters == (
        estimate_memory(moe, 4, 64).parameters
    )


def test_estimate_large_presets_and_model_method():
    llama = estimate_memory(load_config("llama2_7b"), 1, 4096, "mixed_bfloat16")
    assert llama.parameters == 4 * load_config("llama2_7b").num_params()
    assert 6.7e9 * 16 < llama.total < 6.7e9 * 16 + 100 * 2**30
    mixtral = load_config("mixtral_8x7b")
    e = estimate_memory(mixtral, 1, 4096, "bfloat16", remat=True)
    assert e.parameters == 2 * mixtral.num_params()  # every expert is stored
    assert "GiB" in str(e) and e.to_dict()["total"] == e.total
    vit = load_config("vit_tiny_28")
    assert estimate_memory(vit, 2) == estimate_memory(
        vit, 2, vit.vision.num_patches + 1
    )
    model = GPTCausalLM.from_preset("gpt2_tiny")
    assert model.estimate_memory(2, 16) == estimate_memory(model.config, 2, 16)
    model.compile(keras.optimizers.SGD(0.1), "mse")
    assert model.estimate_memory(2, 16).optimizer_state == 0


def test_estimate_errors():
    config = load_config("gpt2_tiny")
    for kwargs, name in (
        ({"batch_size": 0}, "batch_size"),
        ({"sequence_length": -1}, "sequence_length"),
        ({"dtype": "int8"}, "dtype"),
        ({"optimizer": "sophia"}, "optimizer"),
        ({"remat": "yes"}, "remat"),
        ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps"),
    ):
        with pytest.raises(ValueError, match=name):
            estimate_memory(config, **{"batch_size": 2, **kwargs})
    assert kt.training.training_flops_per_token is training_flops_per_token


# ------------------------------------------- the estimate against JAX's XLA
def _compiled_memory(model, batch, length, step=True):
    """Memory of a compiled JAX training step (AdamW, like Keras' trainer:
    stateless call, value_and_grad, donated state) and of the forward pass's
    residuals (what the backward pass keeps, without the weights)."""
    import jax

    optimizer = keras.optimizers.AdamW(1e-3)
    optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    state = [v.value for v in model.non_trainable_variables]
    x = np.ones((batch, length), "int32")

    def forward(values):
        logits, _, losses = model.stateless_call(
            values, state, x, training=True, return_losses=True
        )
        return loss_fn(x, logits) + sum(losses)

    def train_step(values, slots):
        loss, grads = jax.value_and_grad(forward)(values)
        return loss, *optimizer.stateless_apply(slots, grads, values)

    weights = [v.value for v in model.trainable_variables]
    vjp = jax.jit(lambda values: jax.vjp(forward, values)[1])
    r = vjp.lower(weights).compile().memory_analysis()
    weight_bytes = sum(w.size * w.dtype.itemsize for w in weights)
    out = {"residuals": r.output_size_in_bytes - weight_bytes}
    if step:
        slots = [v.value for v in optimizer.variables]
        s = jax.jit(train_step, donate_argnums=(0, 1)).lower(weights, slots)
        s = s.compile().memory_analysis()
        out["state"] = s.argument_size_in_bytes
        out["peak"] = (
            s.argument_size_in_bytes
            + s.output_size_in_bytes
            - s.alias_size_in_bytes
            + s.temp_size_in_bytes
        )
    return out


@pytest.mark.skipif(keras.config.backend() != "jax", reason="XLA memory analysis")
@pytest.mark.parametrize("preset", ["gpt2_tiny", "gpt_llama_tiny", "mixtral_tiny"])
def test_estimate_matches_compiled_jax_step(preset):
    """Tolerances: weights + AdamW slots within 1% of the step's arguments;
    the total within 0.5x-2x of the step's peak (arguments + outputs -
    donated + temporaries); activations within 0.4x-2.5x of the forward
    residuals (MoE: from 0.25x, as the keras.ops block dispatch used on CPU
    also keeps per-block copies of the expert kernels, which the estimate
    does not count). Remat cuts the residuals > 3x and the estimate too
    (which adds one block's recomputation: 1x-5x of the residuals). XLA:CPU's
    step temporaries do not shrink with remat (its scheduler recomputes
    early), so the step peak is compared without remat only."""
    batch, length = 2, 32
    measured, estimated = {}, {}
    for remat in (False, True):
        model = kt.from_preset(preset, num_layers=2, remat=remat)
        measured[remat] = _compiled_memory(model, batch, length, step=not remat)
        estimated[remat] = model.estimate_memory(
            batch, length, optimizer="adamw", fused_attention=False
        )
    m, e = measured[False], estimated[False]
    assert abs(e.parameters + e.optimizer_state - m["state"]) < 0.01 * m["state"]
    assert 0.5 < e.total / m["peak"] < 2.0, (e.total, m)
    low = 0.25 if model.config.moe else 0.4
    assert low < e.activations / m["residuals"] < 2.5, (e.activations, m)
    assert measured[True]["residuals"] < m["residuals"] / 3
    assert estimated[True].activations < e.activations
    assert 1.0 < estimated[True].activations / measured[True]["residuals"] < 5.0


@pytest.mark.skipif(keras.config.backend() != "jax", reason="an XLA:CPU flag of JAX")
def test_xla_cpu_scheduler_flag_set_at_import_or_warned():
    """Models imported first turn XLA:CPU's concurrency-optimized scheduler
    off; imported after JAX computed, the package says it came too late."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["KERAS_BACKEND"] = "jax"
    first = (
        "import keras_transformers as kt, os; kt.models; print(os.environ['XLA_FLAGS'])"
    )
    late = "import jax; jax.numpy.ones(1).block_until_ready(); import keras_transformers.models"
    runs = [
        subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True
        )
        for code in (first, late)
    ]
    assert "concurrency_optimized_scheduler=false" in runs[0].stdout, runs[0].stderr
    assert "XLA:CPU's concurrency-optimized scheduler stays on" in runs[1].stderr
    assert "XLA_FLAGS=--xla_cpu_enable_concurrency_optimized_scheduler=false" in (
        runs[1].stderr
    )


@pytest.mark.skipif(keras.config.backend() != "jax", reason="JAX's remat policies")
def test_remat_matmuls_keeps_blockwise_attention_outputs():
    """`remat="matmuls"` keeps blockwise attention's output and log-sum-exp
    (named residuals), so the backward pass does not run its forward again;
    the other element-wise results are recomputed."""
    import contextlib
    import io

    import jax
    from jax.ad_checkpoint import print_saved_residuals

    model = kt.from_preset(
        "gpt_llama_tiny", num_layers=2, remat="matmuls", attention_block_size=8
    )
    x = np.ones((1, 32), "int32")
    state = [v.value for v in model.non_trainable_variables]

    def loss(values):
        logits, _ = model.stateless_call(values, state, x, training=True)
        return jax.numpy.sum(logits)

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        print_saved_residuals(loss, [v.value for v in model.trainable_variables])
    saved = printed.getvalue()
    for name in ("attention_output", "attention_logsumexp"):
        assert saved.count(f"named '{name}'") == 2, saved


@pytest.mark.skipif(keras.config.backend() != "jax", reason="XLA memory analysis")
def test_blockwise_attention_keeps_no_scores_per_layer():
    """A compiled training step at 1,024 tokens with blockwise attention
    grows by one layer's residuals per layer, not more: XLA:CPU merges
    identical products, and a backward pass that recomputed the scores
    exactly as the forward computed them kept every block's scores of every
    layer until the gradient arrived (2.3x the residuals per layer)."""
    measured = {}
    for layers in (1, 2):
        model = kt.from_preset(
            "gpt_llama_tiny",
            num_layers=layers,
            max_sequence_length=1024,
            attention_block_size=64,
        )
        measured[layers] = _compiled_memory(model, 1, 1024, step=True)
    peak = measured[2]["peak"] - measured[1]["peak"]
    residuals = measured[2]["residuals"] - measured[1]["residuals"]
    assert peak < 1.3 * residuals, (peak, residuals)
