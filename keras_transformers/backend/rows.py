"""KV-cache writes for rows at different positions (continuous batching):
one entry per row, or a whole row."""

from __future__ import annotations

import keras


def update_cache_rows(cache, update, index):
    """Writes `update [B, 1, ...]` into `cache [B, S, ...]`, row `b` at its
    own position `index[b]` (`index`: `[B]` int): a decoding step of rows
    that are at different positions (continuous batching).

    PyTorch without autograd writes in place (`index_put_`); elsewhere a
    `keras.ops.scatter_update` of one entry per row, which XLA performs in
    place inside a compiled step whose cache is donated."""
    if keras.config.backend() == "torch":
        import torch

        if not torch.is_grad_enabled():
            rows = torch.arange(cache.shape[0], device=cache.device)
            position = torch.as_tensor(index, device=cache.device).long()
            return cache.index_put_((rows, position), update[:, 0].to(cache.dtype))
    update = keras.ops.cast(update[:, 0], cache.dtype)  # [B, ...]
    index = keras.ops.cast(index, "int32")
    rows = keras.ops.arange(keras.ops.shape(index)[0], dtype="int32")
    return keras.ops.scatter_update(cache, keras.ops.stack([rows, index], -1), update)


def write_row(cache, row, index):
    """`cache [B, ...]` with row `index` (an int or a scalar int tensor)
    replaced by `row [1, ...]`: PyTorch without autograd writes in place,
    elsewhere `keras.ops.slice_update`."""
    if keras.config.backend() == "torch":
        import torch

        if not torch.is_grad_enabled():
            cache[int(index)] = row[0].to(cache.dtype)
            return cache
    starts = (index,) + (0,) * (len(cache.shape) - 1)
    return keras.ops.slice_update(cache, starts, keras.ops.cast(row, cache.dtype))


def write_leading_rows(cache, part):
    """`cache [B, ...]` with its first `n` rows replaced by `part [n, ...]`
    (a decoding step run on the busy rows only). PyTorch without autograd:
    `part` is usually a view of `cache` already written in place (then
    nothing is copied); elsewhere `keras.ops.slice_update`."""
    if keras.config.backend() == "torch":
        import torch

        if not torch.is_grad_enabled():
            if part.data_ptr() != cache.data_ptr():
                cache[: part.shape[0]].copy_(part)
            return cache
    starts = (0,) * len(cache.shape)
    return keras.ops.slice_update(cache, starts, keras.ops.cast(part, cache.dtype))


def copy_row(cache, source, target):
    """`cache [B, ...]` with row `target` replaced by row `source` (ints or
    scalar int tensors)."""
    row = keras.ops.take(cache, keras.ops.reshape(source, (1,)), axis=0)
    return write_row(cache, row, target)
