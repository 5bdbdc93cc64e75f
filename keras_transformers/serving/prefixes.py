"""Prompts prefilled recently, kept with their cache rows, so that a new
prompt that begins with one of them prefills only the rest (chat requests
share the template's system prompt; a conversation's next turn repeats
the earlier ones)."""

from __future__ import annotations

import collections

import keras
import numpy as np


class PrefixStore:
    """The last prompts prefilled and their one-row caches, as many as
    `capacity` holds (least recently used dropped first). A row holds its
    prompt's keys and values at positions `[0, len(prompt))`.

    Args:
        capacity: what the kept rows may take together, in units of
            `measure` (0: none kept).
        measure: a row's size (default 1: `capacity` counts rows).
    """

    def __init__(self, capacity: int, measure=lambda row: 1):
        self.capacity = max(0, int(capacity))
        self.measure = measure
        self.held = 0  # the kept rows' sizes together
        self._rows: collections.OrderedDict = collections.OrderedDict()

    @classmethod
    def within(cls, mib: float) -> PrefixStore:
        """A store of the rows `mib` MiB hold."""
        return cls(int(mib * 2**20), measure=_bytes)

    def __len__(self) -> int:
        return len(self._rows)

    def find(self, prompt) -> tuple[int, object]:
        """`(n, row)`: the row whose prompt shares the longest beginning
        with `prompt`, and the length `n` of that beginning (at most
        `len(prompt) - 1`: one token is left to prefill, for the logits);
        `(0, None)` when none does."""
        ids = np.asarray(prompt, "int64")
        best, found = 0, None
        for key, (known, _) in self._rows.items():
            size = min(len(known), len(ids) - 1)
            same = known[:size] == ids[:size]
            shared = size if same.all() else int(np.argmin(same))
            if shared > best:
                best, found = shared, key
        if found is None:
            return 0, None
        self._rows.move_to_end(found)
        return best, self._rows[found][1]

    def add(self, prompt, row) -> None:
        """Keeps `row` (a cache of one row holding `prompt`'s positions)."""
        if not self.capacity:
            return
        key = tuple(int(t) for t in prompt)
        if key in self._rows:
            self.held -= self.measure(self._rows.pop(key)[1])
        self._rows[key] = (np.asarray(key, "int64"), row)
        self.held += self.measure(row)
        while self.held > self.capacity:
            self.held -= self.measure(self._rows.popitem(last=False)[1][1])


def _bytes(row) -> int:
    """Bytes of a row cache's tensors."""
    total = 0
    for c in keras.tree.flatten(row):
        dtype = keras.backend.standardize_dtype(c.dtype)
        size = 2 if dtype in ("bfloat16", "float16") else np.dtype(dtype).itemsize
        total += size * int(np.prod(c.shape))
    return total
