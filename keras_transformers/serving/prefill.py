"""How the serving `Engine` turns prompts into cache rows: a whole prompt
padded to a bucket (`generate`'s prefill), or, when a kept row's prompt
begins with the same tokens (`PrefixStore`), only the rest from a copy of
that row: one prompt at a time, or several that arrive together in one
program (a `[k, T]` prefill from one position: the weights are read once
for all of them)."""

from __future__ import annotations

import itertools

import keras
import numpy as np
from keras import ops

from keras_transformers import backend
from keras_transformers.generation.generate import BUCKET
from keras_transformers.serving import programs
from keras_transformers.serving.prefixes import PrefixStore

CHUNK = 16  # a prompt's tokens after a kept beginning, padded to a multiple
WARM_PROMPT = 128  # `warm_up` compiles the prefills of prompts up to this,
WARM_CHUNK = 64  # of one prompt's end after a kept beginning up to this,
WARM_MANY = 32  # and of several prompts' ends up to this


class Prefiller:
    """Prefills for an engine of `slots` rows of `max_length` positions.

    Args:
        model: the served causal LM.
        run: its `programs.Programs`.
        prefix_memory: MiB for kept rows (0: none; none either for models
            with sliding-window or recurrent layers).
    """

    def __init__(self, model, run, max_length, slots, prefix_memory):
        self.short = programs.short_rows(model.config)
        self.run, self.max_length, self.slots = run, max_length, slots
        memory = prefix_memory if self.short else 0
        self.store = PrefixStore.within(memory)
        self.reused = 0  # prompt tokens taken from kept rows

    def one(self, prompt: list, prefix: int):
        """`(logits [1, V], row cache)` of `prompt`'s first `prefix`
        positions (padded when longer): from a kept row when one begins
        with enough of the prompt's tokens that its end takes a shorter
        program, else all of it."""
        size, whole = len(prompt), prefix >= len(prompt)
        start, kept = self.store.find(prompt) if whole else (0, None)
        chunk = self._chunk(size - start)
        if kept is not None and chunk < prefix and start + chunk <= self.max_length:
            logits, (row,) = self._extend([prompt], [kept], start, chunk)
            self.reused += start
        else:
            ids = [prompt[:prefix] + [0] * (prefix - size)]
            logits, row = self.run.prefill(_tensor(ids), _tensor(min(prefix, size) - 1))
        if whole:
            self.store.add(prompt, row)
        return logits, row

    def many(self, prompts: list) -> list | None:
        """`[(logits [V], row cache)]` of whole prompts that arrived together,
        prefilled in one program from the latest position all their kept
        beginnings reach; None when they do not all have one, or when
        their ends would not take a shorter program than a whole prefill
        (then each goes through `one`)."""
        found = [self.store.find(p) for p in prompts]
        if len(prompts) < 2 or any(row is None for _, row in found):
            return None
        start = min(n for n, _ in found)
        chunk = self._chunk(max(len(p) for p in prompts) - start)
        eager = backend.eager_loops()  # a whole prefill of the shortest:
        shortest = min(
            len(p) if eager else -(-len(p) // BUCKET) * BUCKET for p in prompts
        )
        if chunk >= shortest or start + chunk > self.max_length:
            return None
        size = programs.rows_for(len(prompts), self.slots)  # as steps
        padded = prompts + prompts[-1:] * (size - len(prompts))  # whole programs
        rows = [row for _, row in found] + [found[-1][1]] * (size - len(prompts))
        logits, rows = self._extend(padded, rows, start, chunk)
        logits = np.asarray(ops.convert_to_numpy(logits))
        self.reused += start * len(prompts)
        for prompt, row in zip(prompts, rows):
            self.store.add(prompt, row)
        return list(zip(logits, rows))[: len(prompts)]

    def warm_up(self, rows: list) -> list:
        """Compiles the prefills (see `Engine`'s `warm_up`); `rows`: the
        numbers of prompts `many` may take together. Returns a row of each
        length they give (for the engine's `insert`)."""
        made = {}
        for size in range(BUCKET, min(WARM_PROMPT, self.max_length) + 1, BUCKET):
            logits, row = self.run.prefill(_tensor([[0] * size]), _tensor(size - 1))
            ops.convert_to_numpy(logits)
            made[_length(row)] = row
        if not made or not self.store.capacity:
            return list(made.values())
        spans = [s for s in programs.warm_spans(self.max_length) if s <= WARM_PROMPT]
        for count, top in itertools.product([1, *rows], spans):
            limit = WARM_CHUNK if count == 1 else WARM_MANY
            for size in range(CHUNK, min(limit, self.max_length) + 1, CHUNK):
                start = max(0, top - size)  # rows made `top` long
                prompts = [[0] * (start + size)] * count
                logits, _ = self._extend(prompts, [row] * count, start, size)
                ops.convert_to_numpy(logits)
        return list(made.values())

    def _chunk(self, size: int) -> int:
        """Positions prefilled for `size` tokens after a kept beginning."""
        return size if backend.eager_loops() else -(-size // CHUNK) * CHUNK

    def _extend(self, prompts, rows, start: int, chunk: int):
        """Prefills the prompts' tokens from `start` (`chunk` positions) after
        the kept `rows`, made as long as `start + chunk` needs first."""
        if self.short:
            size = programs.span_for(start + chunk, self.max_length)
            rows = [programs.resize(row, size) for row in rows]
        ids = [p[start:] + [0] * (chunk - len(p) + start) for p in prompts]
        last = [len(p) - start - 1 for p in prompts]
        return self.run.extend(tuple(rows), _tensor(ids), _tensor(start), _tensor(last))


def _length(row) -> int:
    """Positions a row cache holds."""
    return keras.tree.flatten(row)[0].shape[1]


def _tensor(values):
    return ops.convert_to_tensor(np.asarray(values, "int32"))
