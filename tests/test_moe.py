"""SparseMoE: equivalences with the dense feed-forward, dense vs sparse
dispatch (forward and gradients), routing, auxiliary losses, capacity,
padding and configuration errors."""

import keras
import numpy as np
import pytest
from contracts import (
    assert_close,
    compiled,
    compiled_call,
    gradients,
    run_layer_test,
    to_numpy,
)

from keras_transformers import MoEConfig
from keras_transformers.layers import FeedForward, SparseMoE
from keras_transformers.layers.moe_dispatch import DispatchPlan, SortedPlan

D, F = 16, 24


def make(x, **kwargs):
    kwargs = {
        "num_experts": 4,
        "num_experts_per_token": 2,
        "intermediate_dim": F,
        **kwargs,
    }
    layer = SparseMoE(**kwargs)
    layer.build(x.shape)
    return layer


@pytest.fixture
def x(rng):
    return rng.standard_normal((3, 7, D)).astype("float32")


def copy_experts(moe, ff):
    """Puts the FeedForward's weights into every expert of `moe`."""
    gate, up = to_numpy(ff.gate_dense.kernel), to_numpy(ff.inner_dense.kernel)
    e = moe.num_experts
    moe.expert_gate_up.assign(np.stack([np.concatenate([gate, up], axis=1)] * e))
    moe.expert_down.assign(np.stack([to_numpy(ff.output_dense.kernel)] * e))


def feed_forward(x):
    ff = FeedForward(F, activation="silu", gated=True, use_bias=False)
    ff.build(x.shape)
    return ff


def test_layer_contract(x):
    run_layer_test(
        SparseMoE,
        dict(
            num_experts=4,
            num_experts_per_token=2,
            intermediate_dim=F,
            router_jitter=0.1,
            capacity_factor=2.0,
            num_shared_experts=1,
            seed=3,
        ),
        (x,),
        x.shape,
    )


@pytest.mark.parametrize("dispatch", ["sparse", "dense"])
def test_identical_experts_equal_the_feed_forward(x, dispatch):
    ff = feed_forward(x)
    moe = make(x, dispatch=dispatch)
    copy_experts(moe, ff)
    assert_close(moe(x), ff(x))  # renormalised weights sum to one


def test_one_expert_top1_equals_the_feed_forward(x):
    ff = feed_forward(x)
    moe = make(x, num_experts=1, num_experts_per_token=1)
    copy_experts(moe, ff)
    assert_close(moe(x), ff(x))


def test_routing_weights_sum_to_one_and_pick_the_top_experts(x):
    moe = make(x, num_experts=6, num_experts_per_token=3)
    _, probs, ids, weights = moe.route(keras.ops.reshape(x, (-1, D)))
    probs, ids, weights = to_numpy(probs), to_numpy(ids), to_numpy(weights)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)
    top = np.sort(np.argsort(-probs, axis=-1)[:, :3], axis=-1)
    np.testing.assert_array_equal(np.sort(ids, axis=-1), top)
    raw = make(
        x, num_experts=6, num_experts_per_token=3, normalize_router_weights=False
    )
    raw.set_weights(moe.get_weights())
    _, _, _, unnormalised = raw.route(keras.ops.reshape(x, (-1, D)))
    np.testing.assert_allclose(
        to_numpy(unnormalised), np.sort(probs, -1)[:, ::-1][:, :3], atol=1e-6
    )


@pytest.mark.parametrize("capacity_factor", [None, 100.0])
def test_sparse_equals_dense_forward_and_gradients(x, capacity_factor):
    sparse = make(x, num_shared_experts=1, capacity_factor=capacity_factor)
    dense = make(x, num_shared_experts=1, dispatch="dense")
    dense.set_weights(sparse.get_weights())
    xv_s, xv_d = keras.Variable(x), keras.Variable(x)
    assert_close(sparse(x), dense(x))
    target = keras.ops.convert_to_tensor(
        np.random.default_rng(1).standard_normal(x.shape).astype("float32")
    )

    def loss(layer, xv):
        return lambda: keras.ops.sum(layer(xv) * target)

    g_sparse = gradients(loss(sparse, xv_s), [xv_s, *sparse.trainable_variables])
    g_dense = gradients(loss(dense, xv_d), [xv_d, *dense.trainable_variables])
    assert len(g_sparse) == 7  # input, router, gate_up, down, 3 shared kernels
    for a, b in zip(g_sparse, g_dense):
        assert_close(a, b)


@pytest.mark.parametrize("layout", ["blocks", "grouped"])
def test_dispatch_layouts_multiply_each_row_by_its_expert(rng, layout):
    e, n, k = 5, 37, 2
    ids = rng.integers(0, e, (n, k)).astype("int32")
    x = rng.standard_normal((n, D)).astype("float32")
    kernels = rng.standard_normal((e, D, F)).astype("float32")
    weights = rng.random((n, k)).astype("float32")

    def dispatch(ids, x, kernels, weights):
        if layout == "grouped":
            plan = SortedPlan(ids, e)
        else:
            plan = DispatchPlan(ids, keras.ops.ones((n,), "bool"), e, layout)
        return plan.combine(plan.matmul(plan.gather(x), kernels), weights)

    expected = sum(
        weights[:, j, None] * np.einsum("nd,ndf->nf", x, kernels[ids[:, j]])
        for j in range(k)
    )
    args = [keras.ops.convert_to_tensor(a) for a in (ids, x, kernels, weights)]
    assert_close(compiled(dispatch)(*args), expected, atol=1e-4)


@pytest.mark.skipif(keras.config.backend() != "jax", reason="JAX's CPU chunk loops")
@pytest.mark.parametrize("chunks", [None, (8, 4), (32, 4)])
@pytest.mark.parametrize("sizes", [(0, 19, 1, 0, 20), (8, 8, 0, 16, 8)])
def test_chunk_loop_grouped_matmul_and_its_gradients(rng, sizes, chunks):
    """Empty groups, groups ending mid-chunk, several whole chunks, and
    remainders in one or several binary-digit chunks: each row times its
    group's kernel, and the custom VJP's gradients equal autodiff's of that
    per-row product."""
    import jax

    from keras_transformers.backend.jax_grouped import grouped_matmul

    groups = np.repeat(np.arange(len(sizes)), sizes)
    x = rng.standard_normal((len(groups), D)).astype("float32")
    kernels = rng.standard_normal((len(sizes), D, F)).astype("float32")
    target = rng.standard_normal((len(groups), F)).astype("float32")
    sizes = np.asarray(sizes, "int32")

    def ours(x, w):
        return (grouped_matmul(x, w, sizes, chunks) * target).sum()

    def reference(x, w):
        return (jax.numpy.einsum("md,mdf->mf", x, w[groups]) * target).sum()

    assert_close(jax.jit(ours)(x, kernels), reference(x, kernels), atol=1e-3)
    for a, b in zip(
        compiled(jax.grad(ours, (0, 1)))(x, kernels),
        compiled(jax.grad(reference, (0, 1)))(x, kernels),
    ):
        assert_close(a, b, atol=1e-4)


@pytest.mark.skipif(keras.config.backend() != "torch", reason="PyTorch's paths")
@pytest.mark.parametrize("with_grouped_mm", [True, False])
def test_torch_grouped_matmul_and_its_gradients(rng, monkeypatch, with_grouped_mm):
    """`grouped_mm` and the per-expert loop where a torch lacks it: each row
    times its group's kernel, and the same gradients as the per-row product."""
    import torch

    from keras_transformers.backend import moe as backend_moe

    if not with_grouped_mm:
        monkeypatch.setattr(backend_moe, "_torch_grouped_mm", lambda: None)
    elif backend_moe._torch_grouped_mm() is None:
        pytest.skip("this torch has no grouped_mm")
    sizes = np.asarray([3, 0, 9, 4], "int32")
    groups = np.repeat(np.arange(len(sizes)), sizes)
    x = torch.tensor(rng.standard_normal((len(groups), D)), dtype=torch.float32)
    w = torch.tensor(rng.standard_normal((len(sizes), D, F)), dtype=torch.float32)
    target = torch.tensor(rng.standard_normal((len(groups), F)), dtype=torch.float32)
    grads = []
    for fn in (
        lambda x, w: backend_moe.grouped_matmul(
            x, w, backend_moe.group_sizes_for_matmul(torch.tensor(sizes))
        ),
        lambda x, w: torch.einsum("md,mdf->mf", x, w[torch.tensor(groups)]),
    ):
        xv, wv = x.clone().requires_grad_(), w.clone().requires_grad_()
        out = fn(xv, wv)
        (out * target).sum().backward()
        grads.append((out.detach(), xv.grad, wv.grad))
    for a, b in zip(*grads):
        assert_close(a, b, atol=1e-4)


def test_auxiliary_losses_only_in_training(x):
    moe = make(x, router_aux_loss_coef=0.01, router_z_loss_coef=0.001)
    moe(x)
    assert moe.losses == []
    moe(x, training=False)
    assert moe.losses == []
    moe(x, training=True)
    assert len(moe.losses) == 2
    aux, z = float(to_numpy(moe.aux_loss)), float(to_numpy(moe.z_loss))
    assert_close(moe.losses[0], 0.01 * aux)
    assert_close(moe.losses[1], 0.001 * z)


@pytest.mark.parametrize("k", [1, 2])
def test_load_balancing_loss_minimum_for_balanced_routing(k):
    e = 4
    moe = SparseMoE(e, k, F)
    moe.build((1, 8, e))
    # The router is the identity and token i prefers expert i % E, then
    # (i + 1) % E: every expert gets the same share of first and second
    # choices, and the mean router probability is uniform (cyclic
    # symmetry) -> the loss equals its minimum, k.
    moe.router_kernel.assign(np.eye(e, dtype="float32"))
    eye = np.eye(e, dtype="float32")
    x = (5.0 * eye[np.arange(8) % e] + 2.0 * eye[(np.arange(8) + 1) % e])[None]
    compiled_call(moe, x, training=True)
    assert_close(moe.aux_loss, float(k), atol=1e-5)
    assert_close(moe.expert_load, np.full(e, 1 / e))
    # Unbalanced: every token prefers expert 0 -> a larger loss.
    unbalanced = np.tile(np.eye(e, dtype="float32")[:1], (8, 1))[None]
    compiled_call(moe, unbalanced, training=True)
    assert float(to_numpy(moe.aux_loss)) > k + 0.1


def test_padding_does_not_affect_the_load_balancing_loss(x):
    moe = make(x)
    mask = np.ones(x.shape[:2], bool)
    mask[0, 4:] = False
    mask[2, 1:] = False
    moe(x, padding_mask=mask, training=True)
    stats = [to_numpy(v) for v in (moe.aux_loss, moe.z_loss, moe.expert_load)]
    changed = x.copy()
    changed[~mask] = 50.0 * np.random.default_rng(2).standard_normal(
        (~mask).sum(),
    ).reshape(-1, 1)
    moe(changed, padding_mask=mask, training=True)
    for before, v in zip(stats, (moe.aux_loss, moe.z_loss, moe.expert_load)):
        assert_close(v, before)
    moe(changed, training=True)  # without the mask the padding counts
    assert not np.allclose(to_numpy(moe.aux_loss), stats[0], atol=1e-5)


def test_capacity_drops_exactly_the_overflow(rng):
    e, n = 4, 10
    moe = SparseMoE(e, 1, F, capacity_factor=1.0)  # capacity ceil(10 / 4) = 3
    moe.build((1, n, e))
    moe.router_kernel.assign(np.eye(e, dtype="float32") * 5.0)
    choice = np.array([0, 0, 0, 0, 0, 1, 1, 2, 0, 3])  # expert 0 gets 6 tokens
    x = np.eye(e, dtype="float32")[choice][None]
    dropless = SparseMoE(e, 1, F)
    dropless.build((1, n, e))
    dropless.set_weights(moe.get_weights())
    out = to_numpy(compiled_call(moe, x, training=False))
    ref = to_numpy(compiled_call(dropless, x))
    dropped = [3, 4, 8]  # expert 0's 4th, 5th and 6th tokens (in order)
    kept = [i for i in range(n) if i not in dropped]
    assert_close(out[0, kept], ref[0, kept])
    assert_close(out[0, dropped], np.zeros((3, e)))
    assert_close(moe.dropped_fraction, 3 / n)
    # Padding is dropped first: pad tokens 0-2 -> real expert-0 tokens fit.
    mask = np.ones((1, n), bool)
    mask[0, :3] = False
    out = to_numpy(compiled_call(moe, x, padding_mask=mask, training=False))
    assert_close(out[0, 3:], ref[0, 3:])
    assert_close(moe.dropped_fraction, 0.0)


def test_jitter_only_in_training(x):
    moe = make(x, router_jitter=0.5, seed=0)
    assert_close(moe(x), moe(x, training=False))
    assert not np.allclose(to_numpy(moe(x, training=True)), to_numpy(moe(x)), atol=1e-6)


def test_bad_configs_give_clear_errors(x):
    with pytest.raises(ValueError, match="num_experts_per_token"):
        SparseMoE(4, 5, F)
    with pytest.raises(ValueError, match="capacity_factor"):
        SparseMoE(4, 2, F, capacity_factor=0.0)
    with pytest.raises(ValueError, match="dispatch"):
        SparseMoE(4, 2, F, dispatch="ragged")
    with pytest.raises(ValueError, match="moe.num_experts_per_token"):
        MoEConfig(num_experts=4, num_experts_per_token=5)
    with pytest.raises(ValueError, match="moe.capacity_factor"):
        MoEConfig(capacity_factor=-1.0)


def test_mixed_precision(x):
    moe = make(x, dtype="mixed_bfloat16", capacity_factor=2.0)
    out = moe(x, training=True)
    assert keras.backend.standardize_dtype(out.dtype) == "bfloat16"
    assert keras.backend.standardize_dtype(moe.aux_loss.dtype) == "float32"


@pytest.mark.parametrize("tokens", [1, 3])
def test_decoding_sizes_equal_the_dense_reference(rng, tokens):
    """A few tokens (decoding) take the gathered-kernel or all-expert path."""
    x = rng.standard_normal((tokens, 1, D)).astype("float32")
    sparse = make(x, num_experts=8)
    dense = make(x, num_experts=8, dispatch="dense")
    dense.set_weights(sparse.get_weights())
    assert_close(compiled_call(sparse, x), compiled_call(dense, x))
