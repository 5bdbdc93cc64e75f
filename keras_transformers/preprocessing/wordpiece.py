"""`WordPieceTokenizer`: BERT's WordPiece on a keras-hub `WordPieceTokenizer`."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from keras_transformers.preprocessing import _files
from keras_transformers.preprocessing._layer import (
    SPECIAL_TOKENS,
    layer_class,
    tensorflow,
)
from keras_transformers.tokenizer._common import (
    PathLike,
    _canonicalize_ids,
    _canonicalize_texts,
    _check_sequence_length,
    _is_symbolic,
    _pad,
)


def _as_list(vocabulary: Sequence[str] | Mapping[str, int]) -> list[str]:
    if isinstance(vocabulary, Mapping):
        ids = sorted(vocabulary.values())
        if ids != list(range(len(ids))):
            raise ValueError(
                "A `vocabulary` mapping must give the ids 0, 1, ..., n-1 once each."
            )
        vocabulary = sorted(vocabulary, key=vocabulary.get)
    if isinstance(vocabulary, (str, bytes)) or not all(
        isinstance(t, str) for t in vocabulary
    ):
        raise ValueError(
            "`vocabulary` must be a list of token strings (the lines of a BERT "
            "`vocab.txt`) or a {token: id} mapping. To read a file use "
            "`WordPieceTokenizer.from_vocab_file(path)`."
        )
    vocabulary = list(vocabulary)
    missing = [t for t in SPECIAL_TOKENS.values() if t not in vocabulary]
    if missing:
        raise ValueError(
            f"The vocabulary lacks the special tokens {missing}; BERT needs "
            f"{list(SPECIAL_TOKENS.values())}."
        )
    return vocabulary


class WordPieceTokenizer:
    """BERT's WordPiece tokenizer, backed by keras-hub.

    Wraps a `keras_hub.tokenizers.WordPieceTokenizer` (`tokenizer.layer`).
    `encode` gives exactly the ids of `transformers.BertTokenizer` (it runs
    the same Hugging Face `tokenizers` pipeline); calling the tokenizer on a
    symbolic `tf.string` tensor (in `tf.data.Dataset.map`) runs keras-hub's
    TensorFlow implementation (see the package docstring for its few
    differences). `encode` adds no `[CLS]` / `[SEP]`: `BertPreprocessor`
    packs sequences. Special tokens written in the text are kept whole.

    Args:
        vocabulary: Token strings in id order (the lines of a `vocab.txt`),
            or a `{token: id}` mapping with ids `0..n-1`. Must contain
            `[PAD]`, `[UNK]`, `[CLS]`, `[SEP]` and `[MASK]`.
        lowercase: Lowercase the text (BERT "uncased").
        strip_accents: Remove accents (NFD, then drop non-spacing marks).
            `None` follows `lowercase`, as in BERT and Hugging Face.
        split_on_cjk: Make each CJK ideograph a word of its own.
        sequence_length: If set, `encode` pads (with `[PAD]`) or truncates
            to this length.

    Example:

    ```python
    tokenizer = WordPieceTokenizer.from_vocab_file("bert/vocab.txt")
    tokenizer.encode("Hello, world!")        # array([7592, 1010, 2088, 999])
    tokenizer.decode(tokenizer.encode("Hello, world!"))   # "hello, world!"
    ```
    """

    def __init__(
        self,
        vocabulary: Sequence[str] | Mapping[str, int],
        *,
        lowercase: bool = True,
        strip_accents: bool | None = None,
        split_on_cjk: bool = True,
        sequence_length: int | None = None,
    ) -> None:
        _check_sequence_length(sequence_length)
        self._vocabulary = _as_list(vocabulary)
        self.lowercase = bool(lowercase)
        self.strip_accents = None if strip_accents is None else bool(strip_accents)
        self.split_on_cjk = bool(split_on_cjk)
        self.sequence_length = sequence_length
        # Built eagerly: keras-hub creates TensorFlow lookup tables here, which
        # must exist before the tokenizer is traced into a `tf.data` graph.
        self._layer = layer_class()(
            vocabulary=self._vocabulary,
            lowercase=self.lowercase,
            strip_accents=self.strip_accents,
            split_on_cjk=self.split_on_cjk,
            dtype="int32",
        )

    @property
    def layer(self):
        """The keras-hub `WordPieceTokenizer` layer doing the work."""
        return self._layer

    @property
    def vocabulary(self) -> list[str]:
        """A copy of the tokens, in id order."""
        return list(self._vocabulary)

    @property
    def vocabulary_size(self) -> int:
        """Number of ids (the embedding size a model needs)."""
        return len(self._vocabulary)

    @property
    def special_tokens(self) -> tuple[str, ...]:
        """`("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")`."""
        return tuple(SPECIAL_TOKENS.values())

    @property
    def special_token_ids(self) -> tuple[int, ...]:
        """Ids of `special_tokens`, in the same order."""
        return tuple(self.token_to_id(t) for t in self.special_tokens)

    pad_token_id = property(lambda self: self._layer.pad_token_id, doc="`[PAD]` id.")
    unk_token_id = property(lambda self: self._layer.unk_token_id, doc="`[UNK]` id.")
    cls_token_id = property(lambda self: self._layer.cls_token_id, doc="`[CLS]` id.")
    sep_token_id = property(lambda self: self._layer.sep_token_id, doc="`[SEP]` id.")
    mask_token_id = property(lambda self: self._layer.mask_token_id, doc="`[MASK]` id.")

    def token_to_id(self, token: str) -> int:
        """The id of a token string, e.g. `"[MASK]"` or `"##ing"`."""
        return int(self._layer.token_to_id(token))

    def id_to_token(self, id: int) -> str:
        """The token string of an id."""
        return self._layer.id_to_token(int(id))

    def __repr__(self) -> str:
        return (
            f"WordPieceTokenizer(vocabulary_size={self.vocabulary_size}, "
            f"lowercase={self.lowercase}, sequence_length={self.sequence_length})"
        )

    def encode(
        self, inputs: str | Sequence[str], sequence_length: int | None = None
    ) -> np.ndarray | list[list[int]]:
        """Tokenizes text into ids (eagerly, in Python and Rust).

        Args:
            inputs: One string, or a list / tuple / 1-D array of strings.
            sequence_length: Pad (with `[PAD]`) or truncate to this length;
                defaults to the tokenizer's `sequence_length`.

        Returns:
            For one string, a 1-D `np.int32` array; for a batch, a list of
            lists of ints, or a `[batch, sequence_length]` `np.int32` array
            when a sequence length applies.
        """
        _check_sequence_length(sequence_length)
        sequence_length = sequence_length or self.sequence_length
        texts, single = _canonicalize_texts(inputs)
        rows = self._layer._tokenize_python(texts) if texts else []
        if sequence_length:
            out = _pad(rows, sequence_length, self.pad_token_id)
            return out[0] if single else out
        return np.asarray(rows[0], dtype="int32") if single else rows

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str | list[str]:
        """Turns ids back into text, as `transformers.BertTokenizer.decode`.

        Word pieces are joined (`"play ##ing"` -> `"playing"`), words are
        separated by spaces, and spaces before punctuation removed; case and
        accents removed by the tokenizer do not come back.

        Args:
            ids: One sequence of ids or a batch of them.
            skip_special_tokens: Drop special tokens (e.g. `[PAD]`) first.

        Returns:
            A string for one sequence, a list of strings for a batch.
        """
        rows, batched = _canonicalize_ids(ids)
        texts = self._layer._hf.decode_batch(
            rows, skip_special_tokens=skip_special_tokens
        )
        return texts if batched else texts[0]

    def __call__(self, inputs: Any) -> Any:
        """Tokenizes; inside `tf.data` / `tf.function` via the keras-hub layer.

        Eagerly this is `encode`. On a symbolic `tf.string` tensor it returns
        a `tf.int32` tensor: ragged `[batch, None]` (dense `[None]` for a
        scalar), or dense and padded when `sequence_length` is set.
        """
        if not _is_symbolic(inputs):
            return self.encode(inputs)
        tf = tensorflow()
        # Autograph would convert keras-hub's layer: slow, and no use.
        return tf.autograph.experimental.do_not_convert(self._call_tf)(inputs)

    def _call_tf(self, inputs):
        scalar = inputs.shape.rank == 0
        outputs = self._layer(inputs[None] if scalar else inputs)
        if self.sequence_length is None:
            return outputs[0] if scalar else outputs
        dense = outputs.to_tensor(
            default_value=self.pad_token_id, shape=[None, self.sequence_length]
        )
        return dense[0] if scalar else dense

    def get_config(self) -> dict[str, Any]:
        """The contents of `tokenizer_config.json` (also read by `transformers`)."""
        return _files.tokenizer_config(self)

    def save_assets(self, directory: PathLike) -> None:
        """Writes `vocab.txt` (one token a line, in id order) and
        `tokenizer_config.json`; `transformers.BertTokenizer.from_pretrained`
        reads the directory too.

        Args:
            directory: Where to write; created if needed.
        """
        _files.write_assets(os.fspath(directory), self._vocabulary, self.get_config())

    @classmethod
    def from_assets(cls, directory: PathLike) -> WordPieceTokenizer:
        """Loads what `save_assets` wrote, or a Hugging Face BERT directory
        (`vocab.txt`, else a WordPiece `tokenizer.json`, with the options of
        `tokenizer_config.json`).

        Raises:
            FileNotFoundError: The directory or its vocabulary is missing.
            ValueError: A file is not valid.
        """
        vocabulary, options = _files.read_assets(os.fspath(directory))
        return cls(vocabulary, **options)

    @classmethod
    def from_vocab_file(cls, path: PathLike, **kwargs: Any) -> WordPieceTokenizer:
        """Loads a BERT `vocab.txt` (one token a line; the line number is the id).

        Args:
            path: The file.
            **kwargs: Other arguments (`lowercase=False` for cased models).
        """
        return cls(_files.read_vocab_txt(os.fspath(path)), **kwargs)
