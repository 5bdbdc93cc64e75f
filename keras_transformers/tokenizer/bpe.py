"""`BPETokenizer`: GPT-2 byte-level BPE on a keras-hub `BytePairTokenizer`."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from keras_transformers.tokenizer import esm, spm
from keras_transformers.tokenizer._common import (
    DEFAULT_END_TOKEN,
    HF_TOKENIZER_FILENAME,
    MERGES_FILENAME,
    SENTENCEPIECE_FILENAMES,
    VOCAB_FILENAME,
    PathLike,
    _canonicalize_ids,
    _canonicalize_texts,
    _check_merges,
    _check_sequence_length,
    _check_vocabulary,
    _dedupe,
    _is_symbolic,
    _no_tokenizer,
    _pad,
)
from keras_transformers.tokenizer.assets import _AssetsMixin
from keras_transformers.tokenizer.files import _has_assets
from keras_transformers.tokenizer.hf import HFTokenizer
from keras_transformers.tokenizer.layer import _layer_class


class BPETokenizer(_AssetsMixin):
    """GPT-family byte-level BPE tokenizer backed by keras-hub.

    Wraps a `keras_hub.tokenizers.BytePairTokenizer` (`tokenizer.layer`).
    `encode` / `decode` return Python and NumPy values; calling the
    tokenizer delegates to the keras-hub layer, so it can be mapped over a
    `tf.data.Dataset` for `fit()` on any backend.

    The end token (`"<|endoftext|>"` by default) is also the default
    beginning-of-sequence, end-of-sequence and padding token, as in GPT-2.
    `encode` adds no token; special tokens written in the text are kept
    whole (never split by BPE).

    Args:
        vocabulary: Mapping from byte-level token string to integer id.
        merges: Merge rules in rank order, as `"a b"` strings or `(a, b)`
            pairs (the lines of a GPT-2 `merges.txt`).
        end_token: The end-of-text token; must be in `vocabulary`.
        bos_token: Beginning-of-sequence token; defaults to `end_token`.
        eos_token: End-of-sequence token; defaults to `end_token`.
        pad_token: Padding token; defaults to `end_token`.
        special_tokens: Extra special tokens (all must be in `vocabulary`);
            like the named ones they are never split.
        sequence_length: If set, `encode` and `__call__` pad (with
            `pad_token_id`) or truncate every sequence to this length.
        add_prefix_space: Add a space before the text, so that the first word
            is tokenized like the others (GPT-2 itself uses `False`).

    Example:

    ```python
    tokenizer = train_bpe(texts, vocabulary_size=500)
    ids = tokenizer.encode("Hello world")          # np.int32 array
    tokenizer.decode(ids)                          # "Hello world"
    tokenizer.encode(["a b", "c"])                 # [[...], [...]]
    ds = tf.data.Dataset.from_tensor_slices(texts).map(tokenizer)
    ```
    """

    def __init__(
        self,
        vocabulary: Mapping[str, int],
        merges: Iterable[str] | Iterable[Sequence[str]],
        *,
        end_token: str = DEFAULT_END_TOKEN,
        bos_token: str | None = None,
        eos_token: str | None = None,
        pad_token: str | None = None,
        special_tokens: Sequence[str] = (),
        sequence_length: int | None = None,
        add_prefix_space: bool = False,
    ) -> None:
        vocab = _check_vocabulary(vocabulary)
        merges = _check_merges(merges, vocab)
        _check_sequence_length(sequence_length)
        bos_token = bos_token or end_token
        eos_token = eos_token or end_token
        pad_token = pad_token or end_token
        all_special = _dedupe(
            [end_token, bos_token, eos_token, pad_token, *special_tokens]
        )
        missing = [t for t in all_special if t not in vocab]
        if missing:
            raise ValueError(
                f"Special tokens {missing} are not in the vocabulary. Pass "
                "`end_token=` (and `bos_token=`, `eos_token=`, `pad_token=`, "
                "`special_tokens=`) naming tokens that the vocabulary contains."
            )

        self._vocabulary = vocab
        self._merges = merges
        self._end_token = end_token
        self._bos_token = bos_token
        self._eos_token = eos_token
        self._pad_token = pad_token
        self._special_tokens = tuple(all_special)
        self.sequence_length = sequence_length
        self.add_prefix_space = bool(add_prefix_space)
        # A Jinja chat template (`chat()`); saved in tokenizer_config.json.
        self.chat_template: str | None = None
        # Built eagerly: keras-hub creates TensorFlow lookup tables here, which
        # must exist before the tokenizer is traced into a `tf.data` graph.
        self._layer = _layer_class()(
            vocabulary=vocab,
            merges=merges,
            end_token=end_token,
            start_token=bos_token,
            pad_token=pad_token,
            unsplittable_tokens=list(all_special),
            add_prefix_space=self.add_prefix_space,
            dtype="int32",
        )

    # -- properties ---------------------------------------------------------

    @property
    def layer(self):
        """The keras-hub `BytePairTokenizer` layer doing the work."""
        return self._layer

    @property
    def vocabulary(self) -> dict[str, int]:
        """A copy of the token -> id mapping."""
        return dict(self._vocabulary)

    @property
    def merges(self) -> list[str]:
        """A copy of the merge rules, `"a b"` strings in rank order."""
        return list(self._merges)

    @property
    def vocabulary_size(self) -> int:
        """Size of the id space: the largest id plus one (the embedding size)."""
        return max(self._vocabulary.values()) + 1

    @property
    def end_token(self) -> str:
        """The end-of-text token, e.g. `"<|endoftext|>"`."""
        return self._end_token

    @property
    def bos_token(self) -> str:
        """Beginning-of-sequence token (the end token unless set)."""
        return self._bos_token

    @property
    def eos_token(self) -> str:
        """End-of-sequence token (the end token unless set)."""
        return self._eos_token

    @property
    def pad_token(self) -> str:
        """Padding token (the end token unless set)."""
        return self._pad_token

    @property
    def end_token_id(self) -> int:
        """Id of `end_token`."""
        return self._vocabulary[self._end_token]

    @property
    def bos_token_id(self) -> int:
        """Id of `bos_token`."""
        return self._vocabulary[self._bos_token]

    @property
    def eos_token_id(self) -> int:
        """Id of `eos_token`."""
        return self._vocabulary[self._eos_token]

    @property
    def pad_token_id(self) -> int:
        """Id of `pad_token`; `encode` and `__call__` pad with it."""
        return self._vocabulary[self._pad_token]

    @property
    def special_tokens(self) -> tuple[str, ...]:
        """All special (never split) tokens, the named ones first."""
        return self._special_tokens

    @property
    def special_token_ids(self) -> tuple[int, ...]:
        """Ids of `special_tokens`, in the same order."""
        return tuple(self._vocabulary[t] for t in self._special_tokens)

    def token_to_id(self, token: str) -> int:
        """Returns the id of a token string.

        Args:
            token: A byte-level token, e.g. `"Ġthe"` or `"<|endoftext|>"`.

        Returns:
            The integer id.

        Example:

        ```python
        tokenizer.token_to_id("<|endoftext|>")  # 50256 for GPT-2
        ```
        """
        return int(self._layer.token_to_id(token))

    def id_to_token(self, id: int) -> str:
        """Returns the token string of an id.

        Args:
            id: An integer id.

        Returns:
            The byte-level token string (spaces appear as `"Ġ"`).

        Example:

        ```python
        tokenizer.id_to_token(tokenizer.eos_token_id)  # "<|endoftext|>"
        ```
        """
        return self._layer.id_to_token(int(id))

    def __repr__(self) -> str:
        return (
            f"BPETokenizer(vocabulary_size={self.vocabulary_size}, "
            f"end_token={self._end_token!r}, sequence_length={self.sequence_length})"
        )

    # -- encode / decode ----------------------------------------------------

    def encode(
        self,
        inputs: str | Sequence[str],
        sequence_length: int | None = None,
    ) -> np.ndarray | list[list[int]]:
        """Tokenizes text into ids (eagerly, in Python).

        Args:
            inputs: One string, or a list / tuple / 1-D array of strings
                (NumPy arrays and eager `tf.string` tensors work too).
            sequence_length: Pad (with `pad_token_id`) or truncate to this
                length; defaults to the tokenizer's `sequence_length`.

        Returns:
            For one string, a 1-D `np.int32` array. For a batch, a list of
            lists of ints (ragged), or a 2-D `np.int32` array of shape
            `[batch, sequence_length]` when a sequence length applies.

        Example:

        ```python
        tokenizer.encode("Hello world")            # array([...], dtype=int32)
        tokenizer.encode(["a", "b c"])             # [[...], [...]]
        tokenizer.encode(["a", "b c"], sequence_length=8).shape  # (2, 8)
        ```
        """
        _check_sequence_length(sequence_length)
        sequence_length = sequence_length or self.sequence_length
        texts, single = _canonicalize_texts(inputs)
        rows = self._layer.tokenize(texts) if texts else []
        rows = [[int(i) for i in row] for row in rows]
        if sequence_length:
            out = _pad(rows, sequence_length, self.pad_token_id)
            return out[0] if single else out
        if single:
            return np.asarray(rows[0], dtype="int32")
        return rows

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str | list[str]:
        """Turns ids back into text.

        Args:
            ids: One sequence of ids (list, NumPy array or backend tensor), or
                a batch of them (2-D array, list of lists, `tf.RaggedTensor`).
            skip_special_tokens: Drop special tokens (e.g. padding) first.

        Returns:
            A string for one sequence, a list of strings for a batch.

        Example:

        ```python
        tokenizer.decode(tokenizer.encode("café 東京 🙂"))  # "café 東京 🙂"
        tokenizer.decode([[1, 2], [3]])                      # ["...", "..."]
        ```
        """
        rows, batched = _canonicalize_ids(ids)
        if skip_special_tokens:
            special = set(self.special_token_ids)
            rows = [[i for i in row if i not in special] for row in rows]
        texts = list(self._layer.detokenize(rows)) if rows else []
        texts = [
            t.decode("utf-8", "replace") if isinstance(t, bytes) else str(t)
            for t in texts
        ]
        return texts if batched else texts[0]

    def __call__(self, inputs: Any) -> Any:
        """Tokenizes; inside `tf.data` / `tf.function` via the keras-hub layer.

        Eagerly this is `encode`. On a symbolic `tf.string` tensor (what
        `tf.data.Dataset.map` passes) it calls the keras-hub layer, whose
        TensorFlow implementation then runs, on every Keras backend; see the
        package docstring for the inputs where its ids differ from GPT-2's.

        Args:
            inputs: A string or batch of strings: Python values, NumPy arrays
                or `tf.string` tensors.

        Returns:
            Eagerly, what `encode` returns. In a graph, a `tf.int32` tensor:
            ragged `[batch, None]` (dense `[None]` for a scalar input), or
            dense `[..., sequence_length]` padded with `pad_token_id` when
            `sequence_length` is set.

        Example:

        ```python
        ds = tf.data.Dataset.from_tensor_slices(texts).batch(32).map(tokenizer)
        ```
        """
        if not _is_symbolic(inputs):
            return self.encode(inputs)
        length = self.sequence_length
        if length is None:
            return self._layer(inputs)
        scalar = inputs.shape.rank == 0
        outputs = self._layer(inputs[None] if scalar else inputs)
        dense = outputs.to_tensor(default_value=self.pad_token_id, shape=[None, length])
        return dense[0] if scalar else dense


def load_tokenizer(directory: PathLike) -> BPETokenizer | HFTokenizer:
    """Loads the tokenizer of a directory.

    GPT-2 files (`vocab.json` + `merges.txt`, or a byte-level BPE
    `tokenizer.json`) load as a `BPETokenizer` (see
    `BPETokenizer.from_assets`); a directory with only a SentencePiece
    model (`tokenizer.model`, `spiece.model`, `sentencepiece.bpe.model`,
    `spm.model`) as an `HFTokenizer` (see `HFTokenizer.from_assets`); ESM's
    `vocab.txt` (`"tokenizer_class": "EsmTokenizer"`) as an `EsmTokenizer`.

    Args:
        directory: A directory, e.g. one written by `save_assets` or a
            Hugging Face model directory.

    Returns:
        The tokenizer.

    Raises:
        FileNotFoundError: The directory does not exist, holds none of
            those files (the message lists them), or only one of
            `vocab.json` / `merges.txt`.
        ValueError: A tokenizer file is not valid.

    Example:

    ```python
    tokenizer = load_tokenizer("checkpoints/gpt2")
    ```
    """
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"Directory '{directory}' does not exist.")
    if _has_assets(directory):
        return BPETokenizer.from_assets(directory)
    if esm.is_esm_directory(directory):
        return esm.EsmTokenizer.from_assets(directory)
    if spm.model_file(directory):
        return HFTokenizer.from_assets(directory)
    names = (
        f"{VOCAB_FILENAME} + {MERGES_FILENAME}",
        HF_TOKENIZER_FILENAME,
        *SENTENCEPIECE_FILENAMES,
    )
    raise _no_tokenizer(directory, names)
