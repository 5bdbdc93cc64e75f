"""A `Checkpoint` seen under another converter's tensor names, so that one
converter's weight mapping (BERT's) loads a checkpoint of a type that stores
the same tensors under other names (RoBERTa, DistilBERT)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

POSITIONS = "embeddings.position_embeddings.weight"


class Renamed:
    """`checkpoint` with each name asked for passed through `rename` first.

    Args:
        checkpoint: the `Checkpoint` read.
        rename: name asked for -> name stored.
        prefix: `(prefixes, probe, model_type)` of the stored type, for
            `Checkpoint.prefix`.
        skip_positions: leading rows of the learned position table not
            returned (RoBERTa's `pad_token_id + 1`).
    """

    def __init__(
        self, checkpoint, rename: Callable[[str], str], prefix, skip_positions=0
    ):
        self.checkpoint, self.rename, self.stored = checkpoint, rename, prefix
        self.skip, self.directory = skip_positions, checkpoint.directory
        self.used = self  # `used.update(names)` marks the stored names

    def prefix(self, *_) -> str:
        return self.checkpoint.prefix(*self.stored)

    def __contains__(self, name: str) -> bool:
        return self.rename(name) in self.checkpoint

    def get(self, name: str) -> np.ndarray:
        value = self.checkpoint.get(self.rename(name))
        return value[self.skip :] if name.endswith(POSITIONS) else value

    def update(self, names) -> None:
        self.checkpoint.used.update(self.rename(n) for n in names)
