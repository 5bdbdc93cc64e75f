"""KV caches whose rows are at different positions: one decoding step for
rows that started at different times (continuous batching, see
`keras_transformers.serving`).

A decoding step normally writes every row at one position, `cache_index`
(an int or a scalar tensor). With a `[B]` `cache_index`, row `b` writes its
one new token at position `cache_index[b]` and attends to its own
positions `0 .. cache_index[b]` (for a causal sliding window, the last
`sliding_window` of them); rotary and learned positions are per row too
(`GPTBackbone.call`). A full-length cache keeps position `p` in slot `p`,
a ring cache (a sliding window's, see `ring_cache`) in slot `p % L`.

The cache may hold more rows than the step decodes (`B >= n` for `n` new
tokens): rows `0 .. n-1` decode and the rest stay as they are (a server's
free rows). A server then passes its whole cache to every step, whatever
the number of busy rows, and each step writes one entry per busy row in
place instead of taking and putting back their rows (see
`keras_transformers.serving`).

Rows rarely fill their cache: within `attending_to(span)` such a step
attends to the first `span` slots only (every row's position below
`span`), so its cost follows the longest row, not the cache's length (a
server's steps compile one program per span, see
`keras_transformers.serving.engine`).
"""

from __future__ import annotations

import contextlib
import numbers

from keras import ops

from keras_transformers.backend.rows import leading_rows, update_cache_rows
from keras_transformers.layers import ring_cache

_SPAN = [None]  # `attending_to`'s span (None: every slot)


@contextlib.contextmanager
def attending_to(span: int | None):
    """Within: decoding steps with a position per row attend to the first
    `span` slots of full-length caches (ring caches, which hold a sliding
    window's last positions anywhere, attend to all of theirs). Every row's
    position must be below `span`. A compiled step reads it when traced:
    compile one program per span."""
    previous, _SPAN[0] = _SPAN[0], span
    try:
        yield
    finally:
        _SPAN[0] = previous


def is_row_index(cache_index) -> bool:
    """Whether `cache_index` gives each row its own position (`[B]`)."""
    if cache_index is None or isinstance(cache_index, numbers.Integral):
        return False
    return len(getattr(cache_index, "shape", ())) == 1


def row_positions(cache_index, length: int):
    """`[B, T]` int32 positions `cache_index[b] + arange(T)`."""
    index = ops.cast(cache_index, "int32")
    return index[:, None] + ops.arange(length, dtype="int32")[None, :]


def update(cache, key, value, cache_index, window, padding_mask=None):
    """Writes one new `key`, `value` per row (`[n, 1, K, H]`, row `b` at
    position `cache_index[b]`) into `cache` (a `(key, value)` pair of
    `[B, L, K, H]`, `B >= n`: the first `n` rows are written; with a causal
    sliding `window` (an int; None or False: none), a ring of the last `L`
    positions, see `ring_cache`).

    Returns:
        `(key, value, cache, visible)`: the keys and values to attend to
        (the updated cache's first `n` rows, `[n, L, K, H]`), the whole
        updated cache, and `visible` `[n, L]` bool: the slots row `b`'s
        query sees (written, not after its position, within `window` of it
        when given, and True in `padding_mask` `[n, L]` when given). Within
        `attending_to(span)`, `span` slots instead of `L` (not for a ring).

    Raises:
        ValueError: more than one new token per row.
    """
    if key.shape[1] != 1:
        raise ValueError(
            "A decoding step with a position per row (`cache_index` of shape [B]) "
            f"writes one token per row; got {key.shape[1]}. Prefill each row on "
            "its own (a scalar `cache_index`), then decode."
        )
    length, ring = cache[0].shape[1], bool(window)
    index = ops.cast(cache_index, "int32")
    slot = ops.mod(index, length) if ring else index
    keys = update_cache_rows(cache[0], key, slot)  # [B, L, K, H]
    values = update_cache_rows(cache[1], value, slot)
    cache, rows = (keys, values), key.shape[0]
    span = None if ring or _SPAN[0] is None else min(_SPAN[0], length)
    keys = leading_rows(keys, rows, index, span)  # [n, S, K, H]
    values = leading_rows(values, rows, index, span)
    slots = ops.arange(span or length, dtype="int32")[None, :]  # [1, S]
    last = index[:, None]  # [B, 1]
    held = ring_cache.positions(last, length) if ring else slots  # [B|1, L]
    visible = ops.logical_and(held >= 0, held <= last)
    if ring:
        visible = ops.logical_and(visible, held > last - window)
    if padding_mask is not None:
        padding_mask = ops.cast(padding_mask[:, : span or length], "bool")
        visible = ops.logical_and(visible, padding_mask)
    return keys, values, cache, visible


__all__ = ["attending_to", "is_row_index", "row_positions", "update"]
