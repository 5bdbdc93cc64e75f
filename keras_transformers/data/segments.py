"""Consecutive segments for training with a recurrent memory (Transformer-XL).

The corpus (one or more documents of token ids, in order) is cut into
`batch_size` contiguous streams, one per batch row, as the paper's
`batchify`; batch `k` holds segment `k` of every stream, so row `i` of each
batch continues row `i` of the previous one. A document always starts a
new segment, whose `memory_reset` flag is True (the model's memory of that
row is cleared first); the last segment of a document is padded.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from keras_transformers.config.validation import check_argument_int


def _documents(documents: Any) -> list[np.ndarray]:
    """A 1-D id sequence (one document) or a list of them, as int32 arrays."""
    if isinstance(documents, np.ndarray) and documents.ndim == 1:
        documents = [documents]
    elif isinstance(documents, (list, tuple)) and documents:
        if all(np.ndim(d) == 0 for d in documents):
            documents = [documents]
    out = [np.asarray(d) for d in documents]
    for i, doc in enumerate(out):
        if doc.ndim != 1 or (doc.size and not np.issubdtype(doc.dtype, np.integer)):
            raise ValueError(
                f"Document {i} must be a 1-D sequence of integer token ids. "
                f"Received shape {doc.shape}, dtype {doc.dtype}."
            )
    return [d.astype("int32") for d in out]


class SegmentBatches(keras.utils.PyDataset):
    """Batches of consecutive segments (see the module docstring); made by
    `segment_batches`. Keras never shuffles a `PyDataset`, so the order
    holds under `fit()`.

    Each item is `({"token_ids": [B, T] int32, "padding_mask": [B, T] bool,
    "memory_reset": [B] bool}, labels [B, T] int32, sample_weight [B, T]
    float32)`: labels are the inputs shifted left by one within their
    document; padded positions have weight 0.

    Attributes:
        inputs, labels, weights: `[K, B, T]` arrays of the K batches.
        resets: `[K, B]` bool.
    """

    def __init__(self, inputs, labels, weights, resets):
        super().__init__()
        self.inputs, self.labels = inputs, labels
        self.weights, self.resets = weights, resets

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index):
        if not 0 <= index < len(self):
            raise IndexError(f"Batch {index} out of range (0..{len(self) - 1}).")
        mask = self.weights[index] > 0
        x = {
            "token_ids": self.inputs[index],
            "padding_mask": mask,
            "memory_reset": self.resets[index],
        }
        return x, self.labels[index], self.weights[index]

    @property
    def num_tokens(self) -> int:
        """Predicted (real) positions."""
        return int((self.weights > 0).sum())


def segment_batches(
    documents: Any, batch_size: int, segment_length: int, pad_id: int = 0
) -> SegmentBatches:
    """Lays a corpus out for `fit()` with a Transformer-XL memory.

    Args:
        documents: token ids of one document (1-D) or a list of documents;
            memory never crosses from one document into the next.
        batch_size: rows B (the model's memory must be allocated for it:
            `model.reset_memory(batch_size)`).
        segment_length: tokens T per segment.
        pad_id: id of padded positions (their weight is 0).

    Returns:
        A `SegmentBatches` of K batches, K the longest row's segment count.
        The (input, label) pairs, `len(doc) - 1` per document, are split
        into B contiguous runs of equal length (the remainder, fewer than B
        pairs, is dropped); a stream cut inside a document resumes in the
        next row with a reset memory.

    Examples:
        >>> batches = segment_batches(list(range(20)), batch_size=2, segment_length=4)
        >>> x, y, w = batches[1]
        >>> x["token_ids"].tolist(), y[0].tolist(), x["memory_reset"].tolist()
        ([[4, 5, 6, 7], [13, 14, 15, 16]], [5, 6, 7, 8], [False, False])
    """
    batch_size = check_argument_int("batch_size", batch_size, 1)
    segment_length = check_argument_int("segment_length", segment_length, 1)
    docs = [d for d in _documents(documents) if d.size > 1]
    pairs = sum(d.size - 1 for d in docs)
    per_row = pairs // batch_size
    if per_row == 0:
        raise ValueError(
            f"The corpus has {pairs} (input, label) pairs, fewer than "
            f"batch_size={batch_size} rows: use a smaller batch or more text."
        )
    # Every pair: its input, label and document index, in corpus order.
    x = np.concatenate([d[:-1] for d in docs])
    y = np.concatenate([d[1:] for d in docs])
    doc = np.concatenate([np.full(d.size - 1, i) for i, d in enumerate(docs)])
    rows = []
    for r in range(batch_size):
        cut = slice(r * per_row, (r + 1) * per_row)
        rows.append(_row_segments(x[cut], y[cut], doc[cut], segment_length))
    count = max(len(row) for row in rows)
    shape = (count, batch_size, segment_length)
    inputs = np.full(shape, pad_id, "int32")
    labels = np.full(shape, pad_id, "int32")
    weights = np.zeros(shape, "float32")
    resets = np.ones(shape[:2], bool)
    for r, row in enumerate(rows):
        for k, (xs, ys, reset) in enumerate(row):
            inputs[k, r, : xs.size], labels[k, r, : ys.size] = xs, ys
            weights[k, r, : xs.size] = 1.0
            resets[k, r] = reset
    return SegmentBatches(inputs, labels, weights, resets)


def _row_segments(x, y, doc, length):
    """One row's `(inputs, labels, reset)` segments: each run of one
    document is cut into pieces of `length` (the last one shorter)."""
    starts = np.flatnonzero(np.diff(doc)) + 1
    out = []
    for run_x, run_y in zip(np.split(x, starts), np.split(y, starts)):
        for k, start in enumerate(range(0, run_x.size, length)):
            piece = slice(start, start + length)
            out.append((run_x[piece], run_y[piece], k == 0))
    return out
