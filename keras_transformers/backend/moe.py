"""Mixture-of-experts primitives: grouped matmul, top-k routing and the
sorting of routed assignments by expert (`layers/moe_dispatch.py`).

Each is one function with a backend fast path (PyTorch's own ops: Keras'
per-op overhead, ~10 us, is most of a decoding step's dispatch cost) and a
pure `keras.ops` fallback that gives the same numbers.
"""

from __future__ import annotations

import keras

from keras_transformers.backend import _torch_tensor, torch_compiling


def has_grouped_matmul() -> bool:
    """Whether `grouped_matmul` beats the `keras.ops` block layout here:
    JAX (`jax.lax.ragged_dot` on GPU/TPU; on CPU, where XLA lowers that to
    a masked dense product, loops over row chunks, see
    `jax_grouped.grouped_matmul`), PyTorch (`grouped_mm`, CPU and CUDA; a
    per-expert loop where torch lacks it) and TensorFlow outside XLA (a
    per-expert loop over `tf.split` groups). Not under `torch.compile`,
    whose fake-tensor check of `grouped_mm` takes bfloat16 inputs only, and
    whose loop fallback would need the group sizes on the host: compiled
    programs use the block layout."""
    backend = keras.config.backend()
    if backend == "jax":
        return True
    if backend == "tensorflow":  # a per-expert loop; XLA needs static shapes
        return not _in_xla_context()
    return backend == "torch" and not torch_compiling()


def grouped_matmul_loops() -> bool:
    """Whether `grouped_matmul` loops over row chunks (JAX on CPU), a cost
    per group that decoding a handful of tokens should not pay."""
    if keras.config.backend() != "jax":
        return False
    import jax

    return jax.default_backend() == "cpu"


def _in_xla_context() -> bool:
    """Whether TensorFlow is tracing for XLA (`jit_compile=True`)."""
    import tensorflow as tf
    from tensorflow.python.ops import control_flow_util

    graph = tf.compat.v1.get_default_graph()
    return bool(control_flow_util.GraphOrParentsInXlaContext(graph))


def group_sizes_for_matmul(group_sizes):
    """Group sizes as `grouped_matmul` wants them: PyTorch's `grouped_mm`
    takes int32 end offsets (no host sync); its loop fallback a host list."""
    if keras.config.backend() == "torch":
        import torch

        if _torch_grouped_mm() is not None:
            return torch.cumsum(_torch_tensor(group_sizes), 0, dtype=torch.int32)
        return [int(s) for s in group_sizes.tolist()]
    return group_sizes


def _torch_grouped_mm():
    import torch

    return getattr(torch.nn.functional, "grouped_mm", None) or getattr(
        torch, "_grouped_mm", None
    )


def grouped_matmul(x, kernels, group_sizes):
    """Rows of `x [M, D]`, sorted into consecutive groups (sizes from
    `group_sizes_for_matmul`, summing to M), times their group's kernel from
    `kernels [G, D, F]`: `[M, F]`. Same numbers as the `keras.ops` block
    layout in `layers/moe_dispatch.py`."""
    backend = keras.config.backend()
    if backend == "jax":
        import jax

        from keras_transformers.backend import jax_grouped

        sizes = group_sizes.astype("int32")
        if grouped_matmul_loops():
            return jax_grouped.grouped_matmul(x, kernels, sizes)
        return jax.lax.ragged_dot(x, kernels, sizes)
    if backend == "tensorflow":
        import tensorflow as tf

        parts = tf.split(x, group_sizes, num=kernels.shape[0])
        # unstack, not kernels[g]: the gradient of each slice is a zero-filled
        # [G, D, F] tensor, that of unstack one stack of the G gradients.
        experts = tf.unstack(kernels, num=kernels.shape[0])
        return tf.concat([p @ w for p, w in zip(parts, experts)], axis=0)
    if backend == "torch":
        import torch

        x, kernels = _torch_tensor(x), _torch_tensor(kernels)
        if isinstance(group_sizes, list):  # no grouped_mm in this torch
            # unbind, not kernels[g] (each slice's gradient a zeroed copy of all).
            parts, experts = torch.split(x, group_sizes), kernels.unbind(0)
            return torch.cat([p @ w for p, w in zip(parts, experts)], dim=0)
        out = _torch_grouped_mm()(x.to(kernels.dtype), kernels, offs=group_sizes)
        if out.requires_grad:  # its backward rejects stride-0 (expanded) grads
            out.register_hook(lambda grad: grad.contiguous())
        return out
    raise NotImplementedError(f"No grouped matmul on {backend}; use the block layout.")


def route_top_k(tokens, router_kernel, k, normalize, router_bias=None):
    """Top-k routing in float32: `logits = tokens [N, D] @ router_kernel
    [D, E]` (`+ router_bias [E]` if given), `probs = softmax(logits)`, the
    k largest probabilities
    (renormalised to sum to one when `normalize`) and their experts.
    Returns `(logits, probs, expert_ids [N, k], weights [N, k])`; PyTorch
    with its own ops (see `expert_groups`)."""
    if keras.config.backend() != "torch":
        ops = keras.ops
        logits = ops.matmul(
            ops.cast(tokens, "float32"), ops.cast(router_kernel, "float32")
        )
        if router_bias is not None:
            logits = logits + ops.cast(router_bias, "float32")
        probs = ops.softmax(logits, axis=-1)
        weights, expert_ids = ops.top_k(probs, k)
        if normalize:
            weights = weights / ops.sum(weights, axis=-1, keepdims=True)
        return logits, probs, expert_ids, weights
    import torch

    x, kernel = _torch_tensor(tokens), _torch_tensor(router_kernel)
    logits = x.float() @ kernel.float()
    if router_bias is not None:
        logits = logits + _torch_tensor(router_bias).float()
    probs = torch.softmax(logits, dim=-1)
    weights, expert_ids = torch.topk(probs, k, dim=-1)
    if normalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return logits, probs, expert_ids, weights


def take_rows(x, indices):
    """`keras.ops.take(x, indices, axis=0)`; PyTorch: `index_select`."""
    if keras.config.backend() != "torch":
        return keras.ops.take(x, indices, axis=0)
    import torch

    return torch.index_select(_torch_tensor(x), 0, _torch_tensor(indices))


def expert_groups(expert_ids, num_experts):
    """Dropless grouping of the `A = N * k` assignments of `expert_ids
    [N, k]` (token-major) by expert, for `grouped_matmul`.

    Returns `(source [A], inverse [A], group_sizes)`: the token of each
    expert-sorted row, the row of each assignment, and the group sizes as
    `grouped_matmul` takes them. PyTorch computes it with its own ops (Keras'
    per-op overhead, ~10 us, is most of a decoding step's dispatch cost)."""
    if keras.config.backend() != "torch":
        ops = keras.ops
        experts = ops.reshape(expert_ids, (-1,))
        order = ops.argsort(experts)
        sizes = ops.sum(ops.one_hot(experts, num_experts, dtype="int32"), axis=0)
        k = ops.shape(expert_ids)[1]
        return order // k, ops.argsort(order), group_sizes_for_matmul(sizes)
    import torch

    ids = _torch_tensor(expert_ids)
    experts = ids.reshape(-1)
    order = torch.argsort(experts)
    # Counted on the device (bincount would sync it to size its output).
    sizes = torch.zeros(num_experts, dtype=torch.int32, device=ids.device)
    sizes.index_add_(0, experts, torch.ones_like(experts, dtype=torch.int32))
    return order // ids.shape[1], torch.argsort(order), group_sizes_for_matmul(sizes)


def combine_rows(rows, inverse, weights):
    """Expert rows `[A, D]` back to tokens: `sum_j weights[n, j] *
    rows[inverse[n * k + j]]` -> `[N, D]` (`weights [N, k]`)."""
    if keras.config.backend() != "torch":
        ops = keras.ops
        n, k = ops.shape(weights)
        out = ops.reshape(ops.take(rows, inverse, axis=0), (n, k, ops.shape(rows)[-1]))
        return ops.sum(out * ops.cast(weights, out.dtype)[..., None], axis=1)
    rows, weights = _torch_tensor(rows), _torch_tensor(weights)
    out = rows[_torch_tensor(inverse)].view(*weights.shape, rows.shape[-1])
    return (out * weights.to(out.dtype)[..., None]).sum(1)


def segment_sum(data, segment_ids, num_segments):
    """`keras.ops.segment_sum` of `data [A]` by `segment_ids [A]` (each in
    `[0, num_segments)`) -> `[num_segments]`. PyTorch: one `index_add`
    (Keras' version sizes an intermediate from the data, which
    `torch.compile` cannot trace); integer sums, so the same numbers."""
    if keras.config.backend() != "torch":
        return keras.ops.segment_sum(data, segment_ids, num_segments=num_segments)
    import torch

    data, segment_ids = _torch_tensor(data), _torch_tensor(segment_ids)
    out = torch.zeros(num_segments, dtype=data.dtype, device=data.device)
    return out.index_add(0, segment_ids, data)
