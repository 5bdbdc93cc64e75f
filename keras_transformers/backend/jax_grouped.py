"""A grouped matmul for JAX on CPU: each expert's rows in chunks, in loops.

`jax.lax.ragged_dot` is the grouped matmul on GPU/TPU, but XLA:CPU lowers
it to a masked dense product (every group times every row). The
`keras.ops` block layout (`layers/moe_dispatch.py`) pads each group to
whole blocks and multiplies all blocks in one batched matmul: that gathers
a kernel per block and, under autodiff, writes a kernel gradient per block
(`[blocks, D, F]`, an output-bound product with a 128-row contraction).

Here a `lax.scan` walks the groups in order (one compiled body for all of
them). A group's rows are multiplied by its kernel in whole chunks of
`big` rows (a `fori_loop` with a run-time trip count), then the rest,
rounded up to `small` rows, in binary digits: at most one chunk of each
power of two times `small` rows up to `big` (512, 256, 128 and 64 rows for
an even share of 256). Products of hundreds of rows run near XLA:CPU's
peak (a 64-row product at about half the rate of a 256-row one), and
padding stays under `small` rows per group. A custom VJP computes the
input gradient the same way and each kernel's gradient as one accumulator
per group.

Rows are sorted by group (`group_sizes [G]`, summing to the row count). A
chunk may run past its group's end: in the forward pass and the input
gradient those rows are overwritten by the next group's own chunks (groups
run in order); the kernel gradient masks them out.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax import lax


def chunk_sizes(num_rows: int, num_groups: int) -> tuple[int, int]:
    """`(big, small)`: a group's rows go in whole chunks of `big` rows (a
    power of two near twice `num_rows / G`, in [16, 512], so that a group of
    an even share is one chunk), then its remainder, rounded up to a
    multiple of `small = big / 8` (at least 8) rows, in binary digits:
    less than `small` rows of padding per group."""
    target = max(1, 2 * num_rows // num_groups)
    big = int(min(512, max(16, 1 << (target.bit_length() - 1))))
    return big, max(8, big // 8)


def grouped_matmul(x, kernels, group_sizes, chunks=None):
    """`x [M, D]` (rows sorted by group) times its group's kernel of
    `kernels [G, D, F]` -> `[M, F]`. `chunks`: `(big, small)` rows, by
    default `chunk_sizes(M, G)`."""
    chunks = tuple(chunks or chunk_sizes(x.shape[0], kernels.shape[0]))
    return _grouped(x, kernels, group_sizes, chunks)


def _over_chunks(start, size, chunks, body, carry):
    """`body(start_row, num_rows, carry)` for each chunk of the group of
    `size` rows from `start`: its whole `big`-row chunks in a loop, then
    its remainder rounded up to `small` rows as at most one chunk of each
    of `big / small, ..., 2, 1` x `small` rows (binary digits, each a
    `lax.cond`)."""
    big, small = chunks
    carry = lax.fori_loop(
        0, size // big, lambda i, c: body(start + i * big, big, c), carry
    )
    rest = (size % big + small - 1) // small  # in [0, big / small]
    at = start + size // big * big
    digit = big // small
    while digit:
        taken = rest & digit
        carry = lax.cond(
            taken > 0, partial(body, at, digit * small), lambda c: c, carry
        )
        at, digit = at + taken * small, digit // 2
    return carry


def _pad(x, chunks):
    """`x` with rows added at the end: a remainder chunk may run past it by
    less than `small` rows, and no chunk may be longer than the array."""
    big, small = chunks
    return jnp.pad(x, ((0, max(small, big - x.shape[0])), (0, 0)))


def _groups(kernels, group_sizes):
    """What `lax.scan` walks, one group per step (in order, so that rows a
    chunk writes past its group are rewritten by the next group's own):
    `(kernel [D, F], first row, size)`."""
    return kernels, jnp.cumsum(group_sizes) - group_sizes, group_sizes


@partial(jax.custom_vjp, nondiff_argnums=(3,))
def _grouped(x, kernels, group_sizes, chunks):
    return _forward(x, kernels, group_sizes, chunks)[0]


def _forward(x, kernels, group_sizes, chunks):
    padded = _pad(x, chunks)

    def group(out, each):
        w, start, size = each

        def body(at, n, out):
            rows = lax.dynamic_slice_in_dim(padded, at, n)
            return lax.dynamic_update_slice_in_dim(out, rows @ w, at, 0)

        return _over_chunks(start, size, chunks, body, out), None

    out = jnp.zeros((padded.shape[0], kernels.shape[2]), jnp.result_type(x, kernels))
    out, _ = lax.scan(group, out, _groups(kernels, group_sizes))
    return out[: x.shape[0]], (x, kernels, group_sizes)


def _backward(chunks, residuals, grad):
    x, kernels, group_sizes = residuals
    padded_x, padded_grad = _pad(x, chunks), _pad(grad, chunks)

    def group(grad_x, each):
        w, start, size = each

        def body(at, n, carry):
            grad_x, grad_w = carry
            rows_grad = lax.dynamic_slice_in_dim(padded_grad, at, n)
            grad_x = lax.dynamic_update_slice_in_dim(grad_x, rows_grad @ w.T, at, 0)
            inside = at + jnp.arange(n) < start + size
            rows_grad = jnp.where(inside[:, None], rows_grad, 0)
            rows = lax.dynamic_slice_in_dim(padded_x, at, n)
            return grad_x, grad_w + rows.T @ rows_grad

        zero = jnp.zeros(w.shape, w.dtype)
        return _over_chunks(start, size, chunks, body, (grad_x, zero))

    grad_x = jnp.zeros_like(padded_x)
    grad_x, grad_kernels = lax.scan(group, grad_x, _groups(kernels, group_sizes))
    return grad_x[: x.shape[0]], grad_kernels, None


_grouped.defvjp(_forward, _backward)
