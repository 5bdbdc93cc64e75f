"""Routing tokens to experts and back: dense reference and sparse dispatch.

Shape letters: N tokens (batch x time, flattened), D model width, E experts,
k experts per token, A = N * k routed assignments, F expert hidden size,
C expert capacity.

The sparse path sorts the A assignments by expert and multiplies each
expert's rows by that expert's weights only (a grouped matmul), so expert
FLOPs and activation memory scale with k, not E:

* `backend.grouped_matmul` where the backend has a grouped matmul that
  pays off (`jax.lax.ragged_dot` on GPU/TPU; a per-expert loop in eager
  PyTorch);
* otherwise `BlockLayout`: pure `keras.ops`, static shapes (XLA): each
  expert's rows are padded to a multiple of a block size, and every block is
  multiplied by its expert's kernel in one batched matmul. Padding adds at
  most `E * (block - 1)` rows.

With a capacity (`CapacityLayout`) each expert takes at most C assignments
in `[E, C, D]` buckets; the overflow is dropped (those assignments add
nothing; the residual connection carries the token). Priority: first
choices before second choices, then earlier tokens, padding last.
"""

from __future__ import annotations

import math

from keras import ops

from keras_transformers import backend


def flatten_assignments(expert_ids, weights, token_mask):
    """Flattens top-k routing choice-major (all first choices first).

    Args:
        expert_ids: `[N, k]` int expert of each choice.
        weights: `[N, k]` combine weights.
        token_mask: `[N]` bool, True for real (non-padding) tokens.

    Returns:
        `(experts [A], tokens [A], weights [A], real [A])`.
    """
    n, k = ops.shape(expert_ids)
    experts = ops.reshape(ops.transpose(expert_ids), (-1,))  # [A]
    tokens = ops.tile(ops.arange(n, dtype="int32"), (k,))  # [A]
    flat_weights = ops.reshape(ops.transpose(weights), (-1,))
    real = ops.tile(token_mask, (k,))
    return ops.cast(experts, "int32"), tokens, flat_weights, real


def sort_by_expert(experts, real, num_experts):
    """Orders assignments by expert; within an expert by priority.

    Returns `(order [A], group_sizes [E], ranks [A])`: `order` sorts the
    assignments, `ranks[i]` is the position of sorted assignment i inside its
    expert's group (0 = highest priority)."""
    a = ops.shape(experts)[0]
    priority = ops.arange(a, dtype="int32") + a * ops.cast(
        ops.logical_not(real), "int32"
    )
    order = ops.argsort(experts * (2 * a) + priority)  # keys are unique
    one_hot = ops.one_hot(experts, num_experts, dtype="int32")  # [A, E]
    group_sizes = ops.sum(one_hot, axis=0)  # [E]
    starts = ops.cumsum(group_sizes) - group_sizes
    sorted_experts = ops.take(experts, order)
    ranks = ops.arange(a, dtype="int32") - ops.take(starts, sorted_experts)
    return order, group_sizes, ranks


def block_size(num_assignments: int, num_experts: int) -> int:
    """Rows per block: a power of two near A / (4 E), in [16, 512], so that
    padding costs at most about a quarter of the routed rows."""
    target = max(1, num_assignments // (4 * num_experts))
    return int(min(512, max(16, 2 ** round(math.log2(target)))))


class BlockLayout:
    """Sorted rows padded per expert to whole blocks (pure `keras.ops`).

    Args:
        group_sizes: `[E]` rows per expert, in sorted order.
        num_rows: A, the number of sorted rows (static).
        block: rows per block.
    """

    def __init__(self, group_sizes, num_rows, block):
        num_experts = ops.shape(group_sizes)[0]
        self.block = block
        self.padded_rows = -(-(num_rows + num_experts * (block - 1)) // block) * block
        padded = (group_sizes + block - 1) // block * block
        padded_ends = ops.cumsum(padded)
        ends = ops.cumsum(group_sizes)
        rows = ops.arange(num_rows, dtype="int32")
        row_expert = ops.sum(ops.cast(rows[:, None] >= ends[None, :], "int32"), 1)
        shift = (padded_ends - padded) - (ends - group_sizes)  # per expert
        self.dest = rows + ops.take(shift, row_expert)  # [A] padded row
        num_blocks = self.padded_rows // block
        block_start = ops.arange(num_blocks, dtype="int32")[:, None] * block
        block_expert = ops.sum(
            ops.cast(block_start >= padded_ends[None, :], "int32"), 1
        )
        self.block_expert = ops.minimum(block_expert, num_experts - 1)  # [blocks]

    def matmul(self, x, kernels):
        """`x [A, D]` (sorted) times its experts' `kernels [E, D, F]` -> `[A, F]`."""
        d = ops.shape(x)[-1]
        padded = ops.scatter(self.dest[:, None], x, (self.padded_rows, d))
        padded = ops.reshape(padded, (-1, self.block, d))  # [blocks, block, D]
        w = ops.take(kernels, self.block_expert, axis=0)  # [blocks, D, F]
        out = ops.einsum("bmd,bdf->bmf", padded, w)
        out = ops.reshape(out, (self.padded_rows, ops.shape(kernels)[-1]))
        return ops.take(out, self.dest, axis=0)


def grouped_matmul_fn(group_sizes, num_rows, num_experts):
    """`matmul(x [A, D], kernels [E, D, F]) -> [A, F]` for rows sorted into
    groups of `group_sizes`: the backend's grouped matmul or `BlockLayout`."""
    if backend.has_grouped_matmul():
        sizes = backend.group_sizes_for_matmul(group_sizes)
        return lambda x, kernels: backend.grouped_matmul(x, kernels, sizes)
    layout = BlockLayout(group_sizes, num_rows, block_size(num_rows, num_experts))
    return layout.matmul


def expert_capacity(capacity_factor, num_assignments, num_experts) -> int:
    """C = ceil(capacity_factor * A / E), at least 1."""
    return max(1, math.ceil(capacity_factor * num_assignments / num_experts))


def sparse_experts(
    tokens, expert_ids, weights, token_mask, apply_experts, num_experts, capacity=None
):
    """Runs each token through its k experts only.

    Args:
        tokens: `[N, D]`.
        expert_ids: `[N, k]` int, chosen experts.
        weights: `[N, k]` combine weights.
        token_mask: `[N]` bool, True for real tokens (padding is dispatched
            last, so it is dropped first under a capacity).
        apply_experts: `apply_experts(x, matmul) -> y` runs the expert
            network on sorted rows with `matmul(x, kernels)`.
        num_experts: E.
        capacity: C, or None for dropless.

    Returns:
        `(output [N, D], kept [A] bool in sorted order, real [A] bool sorted)`.
    """
    n = ops.shape(tokens)[0]
    experts, token_of, flat_weights, real = flatten_assignments(
        expert_ids, weights, token_mask
    )
    a = ops.shape(experts)[0]
    order, group_sizes, ranks = sort_by_expert(experts, real, num_experts)
    sorted_tokens = ops.take(token_of, order)
    sorted_experts = ops.take(experts, order)
    x = ops.take(tokens, sorted_tokens, axis=0)  # [A, D]
    if capacity is None:
        kept = ops.ones((a,), "bool")
        y = apply_experts(x, grouped_matmul_fn(group_sizes, a, num_experts))
    else:
        kept = ranks < capacity
        y = _capacity_experts(
            x, sorted_experts, ranks, kept, apply_experts, num_experts, capacity
        )
    w = ops.take(flat_weights, order) * ops.cast(kept, flat_weights.dtype)
    y = y * ops.cast(w, y.dtype)[:, None]
    out = ops.take(y, ops.argsort(order), axis=0)  # [A, D], choice-major again
    out = ops.sum(ops.reshape(out, (-1, n, ops.shape(y)[-1])), axis=0)
    return out, kept, ops.take(real, order)


def _capacity_experts(
    x, sorted_experts, ranks, kept, apply_experts, num_experts, capacity
):
    """Experts on `[E, C, D]` buckets; dropped rows come back as zeros."""
    d = ops.shape(x)[-1]
    slots = num_experts * capacity
    slot = ops.where(
        kept, sorted_experts * capacity + ranks, slots
    )  # overflow -> spare
    buckets = ops.scatter(slot[:, None], x, (slots + 1, d))[:slots]
    buckets = ops.reshape(buckets, (num_experts, capacity, d))

    def bucket_matmul(h, kernels):  # h [E * C, D_in]
        h = ops.reshape(h, (num_experts, capacity, ops.shape(h)[-1]))
        out = ops.einsum("ecd,edf->ecf", h, kernels)
        return ops.reshape(out, (slots, ops.shape(kernels)[-1]))

    y = apply_experts(ops.reshape(buckets, (slots, d)), bucket_matmul)  # [E*C, D]
    y = ops.concatenate([y, ops.zeros((1, ops.shape(y)[-1]), y.dtype)], axis=0)
    return ops.take(y, slot, axis=0)


def dense_experts(tokens, expert_ids, weights, apply_experts, num_experts):
    """Reference dispatch: every expert on every token, combined with the
    routing weights (zero for experts a token did not choose)."""
    n = ops.shape(tokens)[0]
    x = ops.tile(tokens, (num_experts, 1))  # [E * N, D]

    def all_matmul(h, kernels):  # h [E * N, D_in]
        h = ops.reshape(h, (num_experts, n, ops.shape(h)[-1]))
        out = ops.einsum("end,edf->enf", h, kernels)
        return ops.reshape(out, (num_experts * n, ops.shape(kernels)[-1]))

    y = ops.reshape(apply_experts(x, all_matmul), (num_experts, n, -1))  # [E, N, D]
    combine = ops.sum(
        ops.one_hot(expert_ids, num_experts, dtype=weights.dtype) * weights[..., None],
        axis=1,
    )  # [N, E]
    return ops.einsum("ne,end->nd", ops.cast(combine, y.dtype), y)
