"""`BertPreprocessor`: raw strings (or pairs) -> BERT's packed integer inputs."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from keras_transformers.preprocessing import _files
from keras_transformers.preprocessing._layer import tensorflow
from keras_transformers.preprocessing.wordpiece import WordPieceTokenizer
from keras_transformers.tokenizer._common import (
    PathLike,
    _canonicalize_texts,
    _is_symbolic,
)

TRUNCATE = ("round_robin", "longest_first", "waterfall")


def truncated_lengths(n1, n2, budget: int, truncate: str, xp=np):
    """Lengths to keep of two segments sharing a budget of tokens.

    The formulas use only `minimum`, `maximum` and `where`, so the eager
    (NumPy) and the `tf.data` (TensorFlow) paths give the same lengths.

    * `"round_robin"` (keras-hub): one token at a time to each segment in
      turn, the first first; two long segments get `ceil(budget / 2)` and
      `floor(budget / 2)`.
    * `"longest_first"` (Hugging Face's default): cut the longer segment
      first; of two long segments the longer gets the odd token (the second
      on a tie).
    * `"waterfall"` (keras-hub): the first segment first, the second gets
      what is left.

    Args:
        n1: Lengths of the first segments, an integer array.
        n2: Lengths of the second segments, same shape.
        budget: Tokens the two may use together.
        truncate: `"round_robin"`, `"longest_first"` or `"waterfall"`.
        xp: `numpy` or `tensorflow`.

    Returns:
        `(kept1, kept2)`, arrays like `n1`.
    """
    half = budget // 2
    if truncate == "round_robin":
        first = xp.minimum(n1, xp.maximum(budget - half, budget - n2))
    elif truncate == "longest_first":
        first = xp.where(
            n1 <= n2,
            xp.minimum(n1, half),
            xp.minimum(n1, budget - xp.minimum(n2, half)),
        )
    else:
        first = xp.minimum(n1, budget)
    return first, xp.minimum(n2, budget - first)


class BertPreprocessor:
    """Packs text for BERT: `[CLS] a [SEP]` or `[CLS] a [SEP] b [SEP]`.

    Tokenizes with a `WordPieceTokenizer`, truncates to `sequence_length`
    (the special tokens always kept), pads with `[PAD]`, and returns the
    inputs of `BertBackbone` and its task models. Segment ids are 0 for
    `[CLS] a [SEP]` and 1 for `b [SEP]`, as in BERT and Hugging Face.

    Called on Python strings, lists or NumPy arrays it returns NumPy
    `int32` arrays (any backend: give them to `fit`); called on symbolic
    `tf.string` tensors (`tf.data.Dataset.map`) it returns TensorFlow
    tensors (keras-hub's tokenizer, then a few dense TensorFlow ops).

    Args:
        tokenizer: The `WordPieceTokenizer`.
        sequence_length: Length of every packed sequence.
        truncate: How a pair shares `sequence_length - 3` tokens:
            `"round_robin"` (default, keras-hub), `"longest_first"`
            (Hugging Face's default: `transformers.BertTokenizer(a, b,
            truncation=True)` gives the same ids) or `"waterfall"`.

    Example:

    ```python
    preprocessor = BertPreprocessor(tokenizer, sequence_length=128)
    x = preprocessor(["first text", "second"])             # one segment
    x = preprocessor(["question?"], ["the passage ..."])   # pairs
    x["token_ids"].shape, x["segment_ids"].shape, x["padding_mask"].shape
    ds = tf.data.Dataset.from_tensor_slices(texts).batch(8).map(preprocessor)
    ```
    """

    def __init__(
        self,
        tokenizer: WordPieceTokenizer,
        sequence_length: int = 512,
        truncate: str = "round_robin",
    ) -> None:
        if not isinstance(tokenizer, WordPieceTokenizer):
            raise TypeError(
                f"`tokenizer` must be a WordPieceTokenizer. Received: "
                f"{type(tokenizer).__name__}."
            )
        if (
            isinstance(sequence_length, bool)
            or not isinstance(sequence_length, int)
            or sequence_length < 3
        ):
            raise ValueError(
                f"`sequence_length` must be an int >= 3 (room for [CLS] and two "
                f"[SEP]). Received: {sequence_length!r}."
            )
        if truncate not in TRUNCATE:
            raise ValueError(
                f"`truncate` must be one of {TRUNCATE}. Received: {truncate!r}."
            )
        self.tokenizer = tokenizer
        self.sequence_length = sequence_length
        self.truncate = truncate

    def __repr__(self) -> str:
        return (
            f"BertPreprocessor({self.tokenizer!r}, sequence_length="
            f"{self.sequence_length}, truncate={self.truncate!r})"
        )

    def __call__(self, first: Any, second: Any = None) -> dict[str, Any]:
        """Tokenizes and packs one segment, or pairs of segments.

        Args:
            first: A string or a batch of strings (list, NumPy array or
                `tf.string` tensor).
            second: Optional second segments, as many as `first`.

        Returns:
            `{"token_ids", "segment_ids", "padding_mask"}`, each
            `[batch, sequence_length]` (`[sequence_length]` for one string)
            `int32`; `padding_mask` is 1 on real tokens.
        """
        if _is_symbolic(first) or (second is not None and _is_symbolic(second)):
            tf = tensorflow()
            # Autograph would convert keras-hub's layers: slow, and no use.
            return tf.autograph.experimental.do_not_convert(self._call_tf)(
                first, second
            )
        a, single = _canonicalize_texts(first)
        rows_a = self.tokenizer.encode(a) if a else []
        n1 = np.array([len(r) for r in rows_a], dtype="int64")
        if second is None:
            rows_b, n2 = [[] for _ in rows_a], np.zeros_like(n1)
            k1, k2 = np.minimum(n1, self.sequence_length - 2), n2
        else:
            b, _ = _canonicalize_texts(second)
            if len(b) != len(a):
                raise ValueError(
                    f"`first` and `second` must hold as many texts. Received "
                    f"{len(a)} and {len(b)}."
                )
            rows_b = self.tokenizer.encode(b) if b else []
            n2 = np.array([len(r) for r in rows_b], dtype="int64")
            budget = self.sequence_length - 3
            k1, k2 = truncated_lengths(n1, n2, budget, self.truncate)
        out = self._pack(rows_a, rows_b, k1, k2, pair=second is not None)
        return {k: v[0] for k, v in out.items()} if single else out

    def _pack(self, rows_a, rows_b, k1, k2, pair: bool) -> dict[str, np.ndarray]:
        tok = self.tokenizer
        shape = (len(rows_a), self.sequence_length)
        token_ids = np.full(shape, tok.pad_token_id, dtype="int32")
        segment_ids = np.zeros(shape, dtype="int32")
        padding_mask = np.zeros(shape, dtype="int32")
        for i, (a, b) in enumerate(zip(rows_a, rows_b)):
            row = [tok.cls_token_id, *a[: k1[i]], tok.sep_token_id]
            if pair:
                segment_ids[i, len(row) : len(row) + k2[i] + 1] = 1
                row += [*b[: k2[i]], tok.sep_token_id]
            token_ids[i, : len(row)] = row
            padding_mask[i, : len(row)] = 1
        return {
            "token_ids": token_ids,
            "segment_ids": segment_ids,
            "padding_mask": padding_mask,
        }

    def _call_tf(self, first, second):
        """The `tf.data` path: the keras-hub tokenizer, then dense packing.

        (keras-hub's `MultiSegmentPacker` packs the same, but its graph is
        ~10 times larger than this packing: seconds more to start a pipeline.)
        """
        tf = tensorflow()
        tok, length = self.tokenizer, self.sequence_length
        scalar = first.shape.rank == 0
        texts = [first] if second is None else [first, second]
        texts = [t[None] if scalar else t for t in texts]
        # One tokenizer call for both segments: half the graph.
        tokens = tok.layer(tf.concat(texts, axis=0))
        n = tf.cast(tokens.row_lengths(), "int32")
        dense = tokens.to_tensor(tok.pad_token_id, shape=[None, length])
        batch = tf.shape(texts[0])[0]
        if second is None:
            k1, k2 = tf.minimum(n, length - 2), tf.zeros_like(n)
        else:
            n1, n2 = n[:batch], n[batch:]
            k1, k2 = truncated_lengths(n1, n2, length - 3, self.truncate, xp=tf)
        k1, k2 = k1[:, None], k2[:, None]
        pos = tf.range(length)[None, :]  # [1, T]: the output positions

        def take(rows, offset):  # position j gets token j - offset of `rows`
            index = tf.clip_by_value(pos - offset, 0, length - 1)
            return tf.gather(rows, tf.broadcast_to(index, tf.shape(rows)), batch_dims=1)

        ends = [k1 + 1] if second is None else [k1 + 1, k1 + k2 + 2]
        ids = tf.fill(tf.shape(dense[:batch]), tok.pad_token_id)
        if second is not None:
            ids = tf.where(pos <= ends[1], take(dense[batch:], k1 + 2), ids)
        ids = tf.where(pos <= k1, take(dense[:batch], 1), ids)
        for end in ends:
            ids = tf.where(pos == end, tok.sep_token_id, ids)
        ids = tf.where(pos == 0, tok.cls_token_id, ids)
        out = {
            "token_ids": ids,
            "segment_ids": tf.cast((pos > k1 + 1) & (pos <= ends[-1]), "int32"),
            "padding_mask": tf.cast(pos <= ends[-1], "int32"),
        }
        return {k: v[0] if scalar else v for k, v in out.items()}

    def get_config(self) -> dict[str, Any]:
        """The contents of `tokenizer_config.json`."""
        return _files.tokenizer_config(
            self.tokenizer,
            class_name=type(self).__name__,
            sequence_length=self.sequence_length,
            truncate=self.truncate,
        )

    def save_assets(self, directory: PathLike) -> None:
        """Writes `vocab.txt` and `tokenizer_config.json` (with the sequence
        length and truncation) into `directory`, created if needed."""
        _files.write_assets(
            os.fspath(directory), self.tokenizer.vocabulary, self.get_config()
        )

    @classmethod
    def from_assets(cls, directory: PathLike) -> BertPreprocessor:
        """Loads what `save_assets` wrote, or a Hugging Face BERT directory.

        The sequence length is ours, else Hugging Face's `model_max_length`,
        else 512.
        """
        directory = os.fspath(directory)
        tokenizer = WordPieceTokenizer.from_assets(directory)
        config = _files.read_config(directory)
        return cls(
            tokenizer,
            sequence_length=_files.sequence_length_of(config) or 512,
            truncate=config.get("truncate", "round_robin"),
        )


def load_preprocessor(directory: PathLike) -> BertPreprocessor | None:
    """The `BertPreprocessor` saved in `directory`, or None if it has none.

    A directory has one when it holds `vocab.txt` or a WordPiece
    `tokenizer.json` (see `BertPreprocessor.from_assets`).

    Raises:
        FileNotFoundError: The directory does not exist.
        ValueError: A file is not valid.

    Example:

    ```python
    preprocessor = load_preprocessor("checkpoints/bert/tokenizer")
    ```
    """
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"Directory '{directory}' does not exist.")
    if not _files.has_assets(directory):
        return None
    return BertPreprocessor.from_assets(directory)
