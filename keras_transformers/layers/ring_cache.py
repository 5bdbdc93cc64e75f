"""The ring KV cache of a causal sliding-window attention layer.

A sliding-window layer never looks further back than its window, so its
cache holds `L = min(max_length, sliding_window)` slots and position `p`
lives in slot `p % L`: a decoding step writes its one new key and value in
place (`backend.update_cache`, as a full-length cache does) and attends to
the `L` slots directly, whatever position it is at. The slots are out of
order, so the attention mask reads each slot's position (`positions`):
slot `s` holds the latest position `p <= last` with `p % L == s`, and is
empty while that is negative.
"""

from __future__ import annotations

import numbers

from keras import ops

from keras_transformers import backend


def positions(last, length: int):
    """`[L]` int32: the position slot `s` holds once position `last` (an int
    or a scalar tensor) is written; negative for slots not yet written.
    A `[B, 1]` `last` (a position per row) gives `[B, L]`."""
    last = ops.cast(last, "int32")
    slots = ops.arange(length, dtype="int32")
    return last - ops.mod(last - slots, length)


def check_length(length: int, window: int, cache_index, new: int) -> None:
    """A ring shorter than the window is exact only while it never wraps
    (it then holds every earlier position).

    Raises:
        ValueError: writing positions up to `cache_index + new` would wrap it.
    """
    if length >= window or not isinstance(cache_index, numbers.Integral):
        return
    if cache_index + new > length:
        raise ValueError(
            f"A sliding-window KV cache of {length} positions cannot hold position "
            f"{cache_index + new - 1}: it needs sliding_window={window} slots, or one "
            "per position written. Build it with init_cache(batch_size, max_length) "
            "for the full length you decode."
        )


def update(cache, key, value, cache_index, window: int):
    """Writes `key`, `value` (`[B, T, K, H]`, positions `cache_index ..
    cache_index + T - 1`) into the ring `cache` (a `(key, value)` pair of
    `[B, L, K, H]`).

    Returns:
        `(key, value, cache, key_positions)`: the keys and values the new
        queries attend to, the updated ring and the `[S]` positions of those
        keys (None when every key is visible to the one query: an eager
        decoding step with a ring no longer than the window, which then
        needs no mask). One new token (decoding)
        attends to the ring after its write; several (a prefill) attend to
        the old slots and the new tokens, and the ring keeps the last `L`.

    Raises:
        ValueError: a ring shorter than the window would wrap.
    """
    length, new = cache[0].shape[1], key.shape[1]
    check_length(length, window, cache_index, new)
    key, value = ops.cast(key, cache[0].dtype), ops.cast(value, cache[1].dtype)
    if new == 1:
        slot = cache_index % length
        ring_key = backend.update_cache(cache[0], key, slot)  # in place
        ring_value = backend.update_cache(cache[1], value, slot)
        ring = (ring_key, ring_value)
        eager = backend.eager_loops() and isinstance(cache_index, numbers.Integral)
        if eager and length <= window:
            filled = min(cache_index + 1, length)  # all in the window
            return ring_key[:, :filled], ring_value[:, :filled], ring, None
        return ring_key, ring_value, ring, positions(cache_index, length)
    start = ops.cast(cache_index, "int32")
    fresh = start + ops.arange(new, dtype="int32")  # the new tokens' positions
    keys = ops.concatenate([cache[0], key], axis=1)  # [B, L + T, K, H]
    values = ops.concatenate([cache[1], value], axis=1)
    # Slot s then holds position `latest`: a new token's row, or its old one.
    latest = positions(start + new - 1, length)
    slots = ops.arange(length, dtype="int32")
    rows = ops.where(latest >= start, latest - start + length, slots)
    ring = (ops.take(keys, rows, axis=1), ops.take(values, rows, axis=1))
    if isinstance(cache_index, numbers.Integral) and cache_index == 0:
        return key, value, ring, fresh  # nothing cached yet: the new tokens only
    return keys, values, ring, ops.concatenate([positions(start - 1, length), fresh], 0)
