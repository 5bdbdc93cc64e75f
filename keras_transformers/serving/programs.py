"""The serving `Engine`'s model programs, compiled once per shape where the
backend compiles (see `backend.compile_function`): a decoding step of the
first `n` rows of the batch's cache attending to their first `span`
positions (the greedy choices and the logits; one program per span, see
`row_cache.attending_to`), the
prefill of a prompt into a cache of one row, the prefill of the
remaining tokens of `k` prompts after a beginning other prompts left in
rows (`extend`, all from one position), and the row copies (`insert`,
`move`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import keras
from keras import ops

from keras_transformers import backend
from keras_transformers.backend.choices import vocabulary_first_head
from keras_transformers.backend.rows import copy_row, put_rows, take_rows, write_row
from keras_transformers.config.layer_types import recurrent, sliding_windows
from keras_transformers.layers import row_cache

SPAN = 64  # the fewest positions a compiled step attends to
WARM_SPAN = 512  # `Engine(warm_up=True)` compiles the steps up to this span


def power_of_two(n: int, least: int, most: int) -> int:
    """The next power of two from `n`, at least `least`, at most `most`:
    a few compiled shapes serve every size."""
    return min(max(1 << (int(n) - 1).bit_length(), least), most)


def rows_for(busy: int, slots: int) -> int:
    """Rows a step (or a prefill of prompts together) takes for `busy`."""
    return power_of_two(busy, 1, slots)


def span_for(filled: int, length: int) -> int:
    """Positions a step attends to when its rows hold `filled` at most:
    exactly those where PyTorch runs the step eagerly, else the next power
    of two from `SPAN`, at most the cache's `length`."""
    if backend.eager_loops():
        return int(filled)
    return power_of_two(filled, SPAN, length)


def short_rows(config) -> bool:
    """Whether a prefilled row holds only its prompt's span of positions
    (`span_for`), written into the batch's row as such, rather than the
    whole `max_length`: models whose layers all cache plain attention (a
    sliding window's ring cache and a recurrent state have one layout
    whatever the row holds)."""
    return not any(sliding_windows(config)) and not recurrent(config)


def resize(row, size: int):
    """`row` (a cache of one row, see `short_rows`) holding `size`
    positions: its first ones, or zeros after its own."""

    def one(c):
        if c.shape[1] >= size:
            return c[:, :size]
        pad = [[0, 0], [0, size - c.shape[1]]] + [[0, 0]] * (len(c.shape) - 2)
        return ops.pad(c, pad)

    return keras.tree.map_structure(one, row)


def warm_spans(length: int) -> list:
    """The spans `Engine(warm_up=True)` compiles for caches of `length`:
    up to `WARM_SPAN` (longer ones compile when a row first reaches them,
    seconds once each)."""
    top = span_for(min(length, WARM_SPAN), length)
    return sorted({span_for(n, length) for n in range(1, top + 1)})


@dataclass
class Programs:
    """Callables of tensors (see `build`)."""

    decode: object  # span -> a step (see `build`)
    prefill: object  # (ids [1, P], last) -> (logits [1, V], row cache)
    extend: object  # (k rows, ids [k, T], start, last [k]) -> ([k, V], k rows)
    insert: object  # (cache, row cache, slot) -> cache (a row's positions)
    move: object  # span -> (cache, source, target) -> cache (see `build`)


def build(model, length: int) -> Programs:
    """`model`'s serving programs for caches of `length` positions (the
    batch's cache is donated on JAX: updated in place). `decode(span)`
    gives the step (compiled when first asked for): `(tokens [n, 1],
    cache, index [n], rows) -> (greedy ids [n], logits [n, V], cache)`,
    every row's position `index` below `span`. `move(span)` gives the copy
    of a row whose positions are below `span` into another row (its first
    `span` positions with `short_rows`, else the whole row)."""
    policy = model.dtype_policy
    direct = policy.compute_dtype == policy.variable_dtype
    backbone = model.backbone

    def decode(tokens, cache, index, rows):  # [n, 1], [n], rows
        if rows is None and vocabulary_first_head(tokens.shape[0]):
            hidden, cache = backbone(tokens, cache=cache, cache_index=index)
            logits = backbone.logits(hidden[:, 0], vocabulary_first=True)
            logits = ops.cast(logits, "float32")  # [V, n]
            return _first_max(logits), ops.transpose(logits), cache
        if rows is None:  # the whole cache; its first n rows decode in place
            logits, cache = model.call_with_cache(tokens, cache, index)
        else:
            part = keras.tree.map_structure(lambda c: take_rows(c, rows), cache)
            logits, part = model.call_with_cache(tokens, part, index)
            cache = keras.tree.map_structure(
                lambda c, p: put_rows(c, p, rows), cache, part
            )
        logits = ops.cast(logits[:, 0, :], "float32")  # [n, V]
        return ops.argmax(logits, -1), logits, cache

    variables, compile_ = model.variables, backend.compile_function

    def step(span):
        def run(tokens, cache, index, rows):
            with row_cache.attending_to(span):
                return decode(tokens, cache, index, rows)

        return compile_(run, variables, direct, donate=(1,))

    def last_logits(hidden, last):  # [k, T, D], [k] (or a scalar) -> [k, V]
        last = ops.reshape(last, (-1, 1, 1))
        hidden = ops.take_along_axis(hidden, last, axis=1)
        return ops.cast(backbone.logits(hidden)[:, 0, :], "float32")

    short = short_rows(model.config)

    def prefill(token_ids, last):  # [1, P], scalar -> [1, V], row cache
        size = span_for(token_ids.shape[1], length) if short else length
        cache = backbone.init_cache(1, size)
        hidden, cache = backbone(token_ids, cache=cache, cache_index=0)
        return last_logits(hidden, last), cache

    def extend(rows, token_ids, start, last):  # k row caches, [k, T], [k]
        if len(rows) > 1:  # one cache of k rows
            cache = keras.tree.map_structure(lambda *r: ops.concatenate(r, 0), *rows)
        elif backend.eager_loops():  # eager layers write in place: keep the row
            cache = keras.tree.map_structure(ops.copy, rows[0])
        else:
            cache = rows[0]
        hidden, cache = backbone(token_ids, cache=cache, cache_index=start)
        logits = last_logits(hidden, last)  # [k, V]
        if len(rows) == 1:
            return logits, (cache,)
        own = ops.copy if backend.eager_loops() else (lambda c: c)  # not views
        split = [slice(j, j + 1) for j in range(len(rows))]
        return logits, tuple(
            keras.tree.map_structure(lambda c, j=j: own(c[j]), cache) for j in split
        )

    def insert(cache, row, slot):
        return keras.tree.map_structure(lambda c, r: write_row(c, r, slot), cache, row)

    @functools.cache
    def mover(span):
        def run(cache, source, target):
            copy = lambda c: copy_row(c, source, target, span)  # noqa: E731
            return keras.tree.map_structure(copy, cache)

        return compile_(run, [], direct, donate=(0,))

    def move(span):  # whole rows unless they hold their positions only
        return mover(span if short else None)

    return Programs(
        decode=functools.cache(step),
        prefill=compile_(prefill, variables, direct),
        extend=compile_(extend, variables, direct),
        insert=compile_(insert, [], direct, donate=(0,)),
        move=move,
    )


def _first_max(logits):
    """`argmax(logits, 0)` of `[V, n]` logits, as their maximum and the first
    index holding it (two reductions XLA:CPU vectorizes: SmolLM2's 49,152
    logits of 8 rows in 0.5-1.0 ms, against 1.0-1.9 ms for its argmax)."""
    size = logits.shape[0]
    top = ops.max(logits, axis=0, keepdims=True)  # [1, n]
    ids = ops.arange(size, dtype="int32")[:, None]  # [V, 1]
    first = ops.min(ops.where(logits == top, ids, size), axis=0)  # [n]
    return ops.minimum(first, size - 1)  # NaN logits: the last id, not V
