"""KV-cache writes: a step's entries at one position for every row
(`update_cache`), and for rows at different positions (continuous
batching): one entry per row, a whole row, or the rows one decoding step
runs on."""

from __future__ import annotations

import keras


def update_cache(cache, update, index):
    """Writes `update [B, T, ...]` into `cache [B, S, ...]` at position `index`.

    PyTorch without autograd (decoding) writes in place, avoiding a copy of
    the whole cache per token (at a tensor `index`, a compiled step's, with
    `index_copy_`, which `torch.compile` traces); everywhere else this is
    `keras.ops.slice_update`, which XLA performs in place inside loops.
    """
    if keras.config.backend() == "torch":
        import torch

        if not torch.is_grad_enabled():
            if isinstance(index, torch.Tensor):
                rows = index.long() + torch.arange(update.shape[1], device=index.device)
                return cache.index_copy_(1, rows, update.to(cache.dtype))
            start = int(index)
            cache[:, start : start + update.shape[1]] = update  # casts too
            return cache
    update = keras.ops.cast(update, cache.dtype)
    starts = (0, index) + (0,) * (len(cache.shape) - 2)
    return keras.ops.slice_update(cache, starts, update)


def update_cache_rows(cache, update, index):
    """Writes `update [n, 1, ...]` into `cache [B, S, ...]` (`B >= n`), row
    `b < n` at its own position `index[b]` (`index`: `[n]` int): a decoding
    step of rows that are at different positions (continuous batching).

    PyTorch without autograd writes in place (`index_put_`); elsewhere a
    `keras.ops.scatter_update` of one entry per row, which XLA performs in
    place inside a compiled step whose cache is donated."""
    if keras.config.backend() == "torch":
        import torch

        if not torch.is_grad_enabled():
            position = torch.as_tensor(index, device=cache.device).long()
            rows = torch.arange(position.shape[0], device=cache.device)
            return cache.index_put_((rows, position), update[:, 0].to(cache.dtype))
    update = keras.ops.cast(update[:, 0], cache.dtype)  # [B, ...]
    index = keras.ops.cast(index, "int32")
    rows = keras.ops.arange(keras.ops.shape(index)[0], dtype="int32")
    return keras.ops.scatter_update(cache, keras.ops.stack([rows, index], -1), update)


def leading_rows(cache, rows: int, index, span=None):
    """The first `rows` rows of `cache [B, L, ...]` just written by a
    decoding step (`update_cache_rows` at the `[rows]` positions `index`,
    never negative), and of those their first `span` positions (None: all
    `L`): the keys or values that step attends to, `[rows, span, ...]`. On
    JAX a gather by ids XLA cannot fold into a static slice: XLA:CPU fuses
    such a slice, with the step's write, into the consumer's fusion and
    then copies the whole cache to keep the write in place (4 copies per
    layer: with attention by reduction, `one_query_by_reduction`, a 1-row
    step of SmolLM2-135M on 8 rows of 256 positions took 52 ms instead of
    35). Elsewhere a slice (a view on PyTorch)."""
    span = None if span is None or span >= cache.shape[1] else span
    if rows == cache.shape[0] and span is None:
        return cache
    if keras.config.backend() != "jax":
        return cache[:rows, :span]
    offset = keras.ops.minimum(keras.ops.min(keras.ops.cast(index, "int32")), 0)
    ids = keras.ops.arange(rows, dtype="int32") + offset  # 0 .. rows - 1
    if span is None:
        return keras.ops.take(cache, ids, axis=0)
    length, tail = cache.shape[1], cache.shape[2:]
    ids = ids[:, None] * length + keras.ops.arange(span, dtype="int32")[None]
    flat = keras.ops.reshape(cache, (-1, *tail))  # [B * L, ...]
    picked = keras.ops.take(flat, keras.ops.reshape(ids, (-1,)), axis=0)
    return keras.ops.reshape(picked, (rows, span, *tail))


def write_row(cache, row, index):
    """`cache [B, L, ...]` with row `index` (an int or a scalar int tensor)
    replaced by `row [1, R, ...]` (`R <= L`: its first `R` positions):
    PyTorch without autograd writes in place, elsewhere
    `keras.ops.slice_update`."""
    if keras.config.backend() == "torch":
        import torch

        if not torch.is_grad_enabled():
            cache[int(index), : row.shape[1]] = row[0].to(cache.dtype)
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


def copy_row(cache, source, target, span=None):
    """`cache [B, L, ...]` with row `target` replaced by row `source` (ints
    or scalar int tensors), or only its first `span` positions."""
    row = keras.ops.take(cache, keras.ops.reshape(source, (1,)), axis=0)
    return write_row(cache, row if span is None else row[:, :span], target)


def take_rows(cache, rows):
    """The rows of `cache [B, ...]` a decoding step runs on: `rows` an int
    `n` (the first `n` rows: on PyTorch a view, written in place by the
    step) or a `[n]` int tensor of distinct row ids (`keras.ops.take`).

    Inside a compiled step whose cache is donated, take the rows by a
    tensor of ids rather than by a static slice: XLA fuses a static slice
    of fewer rows than the cache into the step's last write of them and
    then copies the whole cache twice per step (JAX on CPU, SmolLM2-135M,
    8 rows of 256 positions: a 1-row step took 39 ms instead of 31),
    while a gather copies only the rows it takes. A step that needs
    neither (attention caches: `keras_transformers.layers.row_cache`)
    is cheaper still."""
    if isinstance(rows, int):
        return cache[:rows]
    return keras.ops.take(cache, rows, axis=0)


def put_rows(cache, part, rows):
    """`cache [B, ...]` with the rows `take_rows(cache, rows)` took replaced
    by `part [n, ...]` (a step's updated rows). An int `rows`:
    `write_leading_rows`; a tensor: one `keras.ops.scatter_update` of whole
    rows (in place inside a compiled step whose cache is donated, and on
    PyTorch without autograd: `index_copy_`)."""
    if isinstance(rows, int):
        return write_leading_rows(cache, part)
    if keras.config.backend() == "torch":
        import torch

        if not torch.is_grad_enabled():
            ids = torch.as_tensor(rows, device=cache.device).long()
            return cache.index_copy_(0, ids, part.to(cache.dtype))
    ids = keras.ops.reshape(keras.ops.cast(rows, "int32"), (-1, 1))  # [n, 1]
    return keras.ops.scatter_update(cache, ids, keras.ops.cast(part, cache.dtype))
