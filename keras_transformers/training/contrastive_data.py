"""The batches of contrastive embedding training (`ContrastiveEmbedder`):
building them from strings with a `TextEmbedder`'s tokenizer, and checking
their layout.

The batch layout (`contrastive_arrays` writes it; one row per example;
each side padded to its own length):

- `anchor_token_ids` `[N, Ta]` int32, `anchor_padding_mask` `[N, Ta]` bool
  (True on real tokens): the queries.
- `positive_token_ids` `[N, Tp]`, `positive_padding_mask` `[N, Tp]`: the
  document that belongs to each anchor (row `i` to anchor `i`).
- optional `negative_token_ids`, `negative_padding_mask`: hard negatives,
  `[N, Tn]` (one per anchor) or `[N, K, Tn]` (`K` per anchor).

Examples:
    >>> from keras_transformers.models import TextEmbedder
    >>> from keras_transformers.preprocessing import (
    ...     BertPreprocessor,
    ...     WordPieceTokenizer,
    ... )
    >>> vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "cat", "sat"]
    >>> embedder = TextEmbedder.from_preset("bert_tiny", num_layers=1)
    >>> embedder.tokenizer = BertPreprocessor(WordPieceTokenizer(vocab))
    >>> data = contrastive_arrays(embedder, ["a cat"], ["a cat sat"])
    >>> data["anchor_token_ids"].tolist(), data["positive_token_ids"].tolist()
    ([[2, 5, 6, 3]], [[2, 5, 6, 7, 3]])
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

SIDES = ("anchor", "positive", "negative")
PARTS = ("token_ids", "padding_mask")


def contrastive_arrays(
    embedder,
    anchors: Sequence[str],
    positives: Sequence[str],
    negatives: Sequence[str] | Sequence[Sequence[str]] | None = None,
    max_length: int | None = None,
) -> dict:
    """Strings -> the padded arrays of `ContrastiveEmbedder.fit` (see the
    module docstring for the keys).

    Each text is tokenized as `embedder.encode` tokenizes it: lowercased
    when the embedder says so (`lowercase`), with the model's special tokens
    (`[CLS] ... [SEP]`), cut to `max_length` tokens. Each side is padded
    (right, with the tokenizer's pad id) to its longest row, so every batch
    of `fit()` has one shape.

    Args:
        embedder: a `TextEmbedder` with a tokenizer.
        anchors: one text per example (the queries).
        positives: one text per example, the document that belongs to
            the anchor of the same index.
        negatives: None; one text per example (`[N, Tn]` arrays); or one
            list of `K` texts per example, the same `K` for all
            (`[N, K, Tn]`).
        max_length: tokens per text at most, special tokens included
            (None: the embedder's `max_length`, else its config's
            `max_sequence_length`; never more than the latter).

    Returns:
        A dict of numpy arrays: `*_token_ids` int32 and `*_padding_mask`
        bool, `[N, T]` (`[N, K, T]` for several negatives per example).

    Raises:
        ValueError: the lists differ in length or are empty, the negatives
            of the examples differ in number, `max_length` < 2, or the
            embedder has no tokenizer.
    """
    # Imported here: the models package imports this package's modules.
    from keras_transformers.models.text_embedder import token_rows

    anchors, positives = _texts("anchors", anchors), _texts("positives", positives)
    if len(anchors) != len(positives):
        raise ValueError(
            "`anchors` and `positives` need one text per example. Received: "
            f"{len(anchors)} anchors and {len(positives)} positives."
        )
    if not anchors:
        raise ValueError("`anchors` and `positives` are empty: nothing to train on.")
    if max_length is not None and (
        isinstance(max_length, bool)
        or not isinstance(max_length, int)
        or max_length < 2
    ):
        raise ValueError(
            "`max_length` must be an integer >= 2 (room for the special tokens) "
            f"or None. Received: max_length={max_length!r}"
        )
    limit = embedder.config.max_sequence_length
    limit = min(limit, max_length or getattr(embedder, "max_length", None) or limit)
    sides = {"anchor": anchors, "positive": positives}
    per_example = None
    if negatives is not None:
        negatives, per_example = _negatives(negatives, len(anchors))
        sides["negative"] = negatives
    tokenizer = embedder.tokenizer
    pad = getattr(tokenizer, "pad_token_id", None) or 0
    arrays = {}
    for side, texts in sides.items():
        if getattr(embedder, "lowercase", False):
            texts = [text.lower() for text in texts]
        ids, mask = _padded(token_rows(tokenizer, texts, limit), pad)  # [n, T]
        if side == "negative" and per_example is not None:
            ids = ids.reshape(len(anchors), per_example, -1)  # [N, K, T]
            mask = mask.reshape(ids.shape)
        arrays[f"{side}_token_ids"], arrays[f"{side}_padding_mask"] = ids, mask
    return arrays


def _texts(name, texts) -> list[str]:
    if isinstance(texts, str):
        raise ValueError(
            f"`{name}` must be a sequence of strings, one per example. "
            f"Received: the string {texts[:40]!r}"
        )
    texts = list(texts)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise ValueError(
                f"`{name}[{i}]` must be a string. Received: {type(text).__name__}"
            )
    return texts


def _negatives(negatives, count: int) -> tuple[list[str], int | None]:
    """The negatives as one flat list (example-major) and their number per
    example (None: one text per example, `[N, T]`)."""
    if isinstance(negatives, str) or len(negatives) != count:
        got = "a string" if isinstance(negatives, str) else f"{len(negatives)} entries"
        raise ValueError(
            f"`negatives` needs one entry per example ({count}). Received: {got}."
        )
    if all(isinstance(item, str) for item in negatives):
        return list(negatives), None
    rows = [_texts(f"negatives[{i}]", row) for i, row in enumerate(negatives)]
    sizes = sorted({len(row) for row in rows})
    if len(sizes) != 1 or sizes[0] == 0:
        raise ValueError(
            "Every example needs the same number (at least one) of negatives, "
            f"to form a [N, K, T] array. Received: {sizes} negatives per example."
        )
    return [text for row in rows for text in row], sizes[0]


def _padded(rows: list[list[int]], pad: int) -> tuple[np.ndarray, np.ndarray]:
    """`[n, T]` int32 ids right-padded with `pad` and the bool mask of the
    real tokens, `T` the longest row."""
    length = max(len(row) for row in rows)
    ids = np.full((len(rows), length), pad, "int32")
    mask = np.zeros((len(rows), length), bool)
    for i, row in enumerate(rows):
        ids[i, : len(row)], mask[i, : len(row)] = row, True
    return ids, mask


def _same(a, b) -> bool:
    return len(a) == len(b) and all(
        x is None or y is None or x == y for x, y in zip(a, b)
    )


def check_contrastive_batch(batch):
    """Raises ValueError for a batch that is not a dict with the keys of
    the module docstring, of consistent shapes (shapes may hold None: a
    traced batch dimension).

    Returns:
        Whether the batch holds negatives.
    """
    if not isinstance(batch, dict):
        raise ValueError(
            "A contrastive batch is a dict of arrays (see `contrastive_arrays`). "
            f"Received: {type(batch).__name__}"
        )
    known = [f"{side}_{part}" for side in SIDES for part in PARTS]
    wanted = known[:4] + (known[4:] if any(k in batch for k in known[4:]) else [])
    missing = [key for key in wanted if key not in batch]
    unknown = sorted(key for key in batch if key not in known)
    if missing or unknown:
        problem = f"lacks {missing}" if missing else f"has unknown keys {unknown}"
        raise ValueError(
            f"The contrastive batch {problem}: it takes `anchor_token_ids`, "
            "`anchor_padding_mask`, `positive_token_ids`, `positive_padding_mask` "
            "and, for hard negatives, `negative_token_ids` and "
            f"`negative_padding_mask`. It has {sorted(batch)}."
        )
    batch_size = tuple(batch["anchor_token_ids"].shape)[:1]
    for side in SIDES[: len(wanted) // 2]:
        ids, mask = (tuple(batch[f"{side}_{part}"].shape) for part in PARTS)
        ranks = (2, 3) if side == "negative" else (2,)
        if len(ids) not in ranks or not _same(ids, mask):
            raise ValueError(
                f"`{side}_token_ids` {ids} and `{side}_padding_mask` {mask} must "
                "have one shape, [batch, length]"
                + (" (or [batch, negatives, length])." if side == "negative" else ".")
            )
        if not _same(ids[:1], batch_size):
            raise ValueError(
                f"`{side}_token_ids` holds {ids[0]} rows and `anchor_token_ids` "
                f"{batch_size[0]}: every side needs one row per anchor."
            )
    return len(wanted) == 6


__all__ = ["contrastive_arrays"]
