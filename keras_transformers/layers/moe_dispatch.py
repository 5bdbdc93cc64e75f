"""Routing tokens to experts and back: dense reference and sparse dispatch.

Shape letters: N tokens (batch x time, flattened), D model width, E experts,
k experts per token, A = N * k routed assignments, F expert hidden size,
C expert capacity.

The sparse path sorts the A assignments by expert and multiplies each
expert's rows by that expert's weights only (a grouped matmul), so expert
FLOPs and activation memory scale with k, not E:

* `backend.grouped_matmul` where the backend has a grouped matmul that
  pays off (`jax.lax.ragged_dot` on GPU/TPU, loops over row chunks with a
  custom gradient on JAX's CPU, PyTorch's `grouped_mm`, a per-expert loop
  in eager TensorFlow): `SortedPlan` (one argsort);
* otherwise (TensorFlow under XLA) `DispatchPlan`'s "blocks" layout:
  pure `keras.ops`, static shapes: each expert's rows are padded to a
  multiple of a block size, and every block is multiplied by its expert's
  kernel in one batched matmul. Padding adds at most `E * (block - 1)`
  rows.

With a capacity (`DispatchPlan`'s "capacity" layout) each expert takes at
most C assignments in `[E, C, D]` buckets; the overflow is dropped (those
assignments add nothing; the residual connection carries the token).
Priority: first choices before second choices, then earlier tokens,
padding last.
"""

from __future__ import annotations

import math

from keras import ops

from keras_transformers.backend import moe as backend


def flatten_assignments(expert_ids, token_mask):
    """Flattens top-k routing choice-major (all first choices first).

    Args:
        expert_ids: `[N, k]` int expert of each choice.
        token_mask: `[N]` bool, True for real (non-padding) tokens.

    Returns:
        `(experts [A] int32, tokens [A] int32, real [A] bool)`.
    """
    n, k = ops.shape(expert_ids)
    experts = ops.reshape(ops.transpose(expert_ids), (-1,))
    tokens = ops.tile(ops.arange(n, dtype="int32"), (k,))
    return ops.cast(experts, "int32"), tokens, ops.tile(token_mask, (k,))


def expert_ranks(experts, real, num_experts):
    """Each assignment's place in its expert's queue, without sorting.

    Priority: real tokens before padding, then choice-major order (first
    choices before second choices, earlier tokens first).

    Returns `(ranks [A] int32, group_sizes [E] int32)`."""
    one_hot = ops.one_hot(experts, num_experts, dtype="int32")  # [A, E]
    real_hot = one_hot * ops.cast(real, "int32")[:, None]
    pad_hot = one_hot - real_hot
    real_rank = ops.cumsum(real_hot, axis=0) - 1
    pad_rank = ops.sum(real_hot, axis=0)[None, :] + ops.cumsum(pad_hot, axis=0) - 1
    ranks = ops.sum(real_rank * real_hot + pad_rank * pad_hot, axis=1)
    return ranks, ops.sum(one_hot, axis=0)


def block_size(num_assignments, num_experts: int) -> int:
    """Rows per block: a power of two near A / (4 E), in [16, 512], so that
    padding costs at most about a quarter of the routed rows (64 when A is
    only known at run time, e.g. a TensorFlow graph with a `None` batch)."""
    if not isinstance(num_assignments, int):
        return 64
    target = max(1, num_assignments // (4 * num_experts))
    return int(min(512, max(16, 2 ** round(math.log2(target)))))


class DispatchPlan:
    """Where each routed assignment lives in an expert-grouped row space.

    Rows are grouped by expert (each assignment's place from its queue
    rank, no sort) and the expert network runs on them with a
    `matmul(rows, kernels)` that multiplies each row by its expert's kernel,
    in pure `keras.ops` with static shapes:

    * "blocks": each expert's rows padded to whole blocks; one batched
      matmul over blocks with each block's expert kernel;
    * "capacity": `[E, C]` buckets; assignments past an expert's capacity
      are dropped.

    Args:
        expert_ids: `[N, k]` chosen experts.
        token_mask: `[N]` bool, True for real tokens.
        num_experts: E.
        layout: "blocks" or "capacity".
        capacity: C (layout "capacity").
    """

    def __init__(self, expert_ids, token_mask, num_experts, layout, capacity=None):
        experts, tokens, real = flatten_assignments(expert_ids, token_mask)
        ranks, group_sizes = expert_ranks(experts, real, num_experts)
        a = ops.shape(experts)[0]
        self.num_tokens = ops.shape(expert_ids)[0]
        self.real = real
        self.kept = ops.ones((a,), "bool")
        if layout == "capacity":
            self.kept = ranks < capacity
            self.num_rows = num_experts * capacity
            self.matmul = self._bucket_matmul(num_experts, capacity)
            dest = experts * capacity + ranks
        else:
            block = block_size(a, num_experts)
            sizes = (group_sizes + block - 1) // block * block
            self.num_rows = -(-(a + num_experts * (block - 1)) // block) * block
            self.matmul = self._block_matmul(sizes, block, num_experts)
            dest = ops.take(ops.cumsum(sizes) - sizes, experts) + ranks
        # Dropped assignments point at a spare row past the end.
        self.dest = ops.where(self.kept, dest, self.num_rows)  # [A]
        # segment_sum, not ops.scatter (a Python loop on PyTorch); rows are
        # unique except the spare one, which is cut off.
        source = backend.segment_sum(tokens + 1, self.dest, self.num_rows + 1)
        source = source[: self.num_rows] - 1  # token of each row, -1 = empty
        # Empty rows (block padding, unused capacity) compute on token 0;
        # nothing reads their output.
        self.source = ops.maximum(source, 0)  # [R]

    def _block_matmul(self, padded_sizes, block, num_experts):
        starts = ops.arange(self.num_rows // block, dtype="int32")[:, None] * block
        ends = ops.cumsum(padded_sizes)[None, :]
        block_expert = ops.sum(ops.cast(starts >= ends, "int32"), axis=1)
        block_expert = ops.minimum(block_expert, num_experts - 1)  # [blocks]

        def matmul(x, kernels):  # x [R, D_in] -> [R, D_out]
            x = ops.reshape(x, (-1, block, ops.shape(x)[-1]))
            w = ops.take(kernels, block_expert, axis=0)  # [blocks, D_in, D_out]
            out = ops.einsum("bmd,bdf->bmf", x, w)
            return ops.reshape(out, (self.num_rows, ops.shape(kernels)[-1]))

        return matmul

    def _bucket_matmul(self, num_experts, capacity):
        def matmul(x, kernels):  # x [E * C, D_in] -> [E * C, D_out]
            x = ops.reshape(x, (num_experts, capacity, ops.shape(x)[-1]))
            out = ops.einsum("ecd,edf->ecf", x, kernels)
            return ops.reshape(out, (self.num_rows, ops.shape(kernels)[-1]))

        return matmul

    def gather(self, tokens):
        """`tokens [N, D]` -> expert rows `[R, D]`."""
        return ops.take(tokens, self.source, axis=0)

    def combine(self, rows, weights):
        """Expert rows `[R, D]` -> `[N, D]`: each token's kept assignments
        weighted by `weights [N, k]` and summed (dropped ones weigh 0)."""
        out = ops.take(rows, ops.minimum(self.dest, self.num_rows - 1), axis=0)
        w = ops.reshape(ops.transpose(weights), (-1,))
        w = ops.where(self.kept, w, ops.zeros_like(w))[:, None]  # [A, 1]
        out = out * ops.cast(w, out.dtype)  # [A, D]
        return ops.sum(ops.reshape(out, (-1, self.num_tokens, ops.shape(out)[-1])), 0)

    def dropped_fraction(self):
        """Share of real tokens' assignments dropped by the capacity."""
        lost = ops.logical_and(self.real, ops.logical_not(self.kept))
        total = ops.maximum(ops.sum(ops.cast(self.real, "float32")), 1.0)
        return ops.sum(ops.cast(lost, "float32")) / total


class SortedPlan:
    """Dropless rows sorted by expert (`backend.expert_groups`: one argsort;
    `A = N * k` rows); `backend.grouped_matmul` multiplies each expert's
    consecutive rows by its kernel. Fewer, cheaper ops than `DispatchPlan`'s
    queue ranks, which only a capacity needs.

    Args:
        expert_ids: `[N, k]` chosen experts.
        num_experts: E.
    """

    def __init__(self, expert_ids, num_experts):
        self.source, self.inverse, sizes = backend.expert_groups(
            expert_ids, num_experts
        )
        self.matmul = lambda x, w: backend.grouped_matmul(x, w, sizes)

    def gather(self, tokens):
        """`tokens [N, D]` -> expert rows `[A, D]`."""
        return backend.take_rows(tokens, self.source)

    def combine(self, rows, weights):
        """Expert rows `[A, D]` -> `[N, D]`: each token's k rows weighted by
        `weights [N, k]` and summed."""
        return backend.combine_rows(rows, self.inverse, weights)

    def dropped_fraction(self):
        """Dropless: nothing is dropped."""
        return 0.0


def expert_capacity(capacity_factor, num_assignments, num_experts):
    """C = ceil(capacity_factor * A / E), at least 1 (a scalar tensor when A
    is only known at run time)."""
    if isinstance(num_assignments, int):
        return max(1, math.ceil(capacity_factor * num_assignments / num_experts))
    c = ops.ceil(ops.cast(num_assignments, "float32") * capacity_factor / num_experts)
    return ops.maximum(ops.cast(c, "int32"), 1)


def sparse_experts(
    tokens, expert_ids, weights, token_mask, apply_experts, num_experts, capacity=None
):
    """Runs each token through its k experts only.

    Args:
        tokens: `[N, D]`.
        expert_ids: `[N, k]` int, chosen experts.
        weights: `[N, k]` combine weights.
        token_mask: a function returning the `[N]` bool mask of real tokens
            (called only by the layouts that queue padding last, so that a
            capacity drops it first).
        apply_experts: `apply_experts(rows, matmul) -> rows` runs the expert
            network on grouped rows with `matmul(rows, kernels)`.
        num_experts: E.
        capacity: C, or None for dropless.

    Returns:
        `(output [N, D], plan)`; `plan.dropped_fraction()` reports drops
        (`plan` is None when the dense path served a handful of tokens).
    """
    if capacity is not None:
        layout = "capacity"
    else:
        layout = "grouped" if backend.has_grouped_matmul() else "blocks"
    n, k = ops.shape(expert_ids)
    # Layouts that pay per group or block even for a handful of rows (the
    # block layout, the chunk loops of JAX on CPU), unlike PyTorch's
    # `grouped_mm`, hand decoding-size inputs to the two paths below.
    per_group_cost = layout == "blocks" or (
        layout == "grouped" and backend.grouped_matmul_loops()
    )
    if per_group_cost and isinstance(n, int) and n * k < num_experts:
        # Fewer routed assignments than experts (e.g. decoding one token):
        # each times its own expert's gathered kernel. Cheaper than E
        # blocks; same numbers.
        return gathered_experts(tokens, expert_ids, weights, apply_experts), None
    if per_group_cost and isinstance(n, int) and n <= block_size(n * k, num_experts):
        # At most one block of tokens (e.g. a decoding step): the blocks
        # would cost at least E * block >= E * N rows, more than every
        # expert on every token. Same numbers.
        out = dense_experts(tokens, expert_ids, weights, apply_experts, num_experts)
        return out, None
    if layout == "grouped":
        plan = SortedPlan(expert_ids, num_experts)
    else:
        plan = DispatchPlan(expert_ids, token_mask(), num_experts, layout, capacity)
    rows = apply_experts(plan.gather(tokens), plan.matmul)
    return plan.combine(rows, weights), plan


def gathered_experts(tokens, expert_ids, weights, apply_experts):
    """Each of the A assignments times its expert's gathered kernel: reads
    only the chosen experts' weights (decoding a handful of tokens)."""
    n, k = ops.shape(expert_ids)
    experts = ops.reshape(ops.transpose(expert_ids), (-1,))  # [A], choice-major
    x = ops.tile(tokens, (k, 1))  # [A, D]

    def matmul(h, kernels):
        return ops.einsum("ad,adf->af", h, ops.take(kernels, experts, axis=0))

    y = apply_experts(x, matmul) * ops.cast(
        ops.reshape(ops.transpose(weights), (-1, 1)), tokens.dtype
    )
    return ops.sum(ops.reshape(y, (k, n, -1)), axis=0)


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
