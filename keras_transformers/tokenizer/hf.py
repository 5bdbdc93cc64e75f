"""`HFTokenizer`: any Hugging Face `tokenizer.json`, run by the `tokenizers` library."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from keras_transformers.tokenizer import hf_files, spm
from keras_transformers.tokenizer._common import (
    HF_TOKENIZER_FILENAME,
    PathLike,
    _canonicalize_ids,
    _canonicalize_texts,
    _check_sequence_length,
    _dedupe,
    _is_symbolic,
)
from keras_transformers.tokenizer.hf_assets import (
    _HFAssetsMixin,
    saved_by_hf_tokenizer,
)


def _named_token(name: str, doc: str, id: bool = False) -> property:
    """A read-only property: the named special token (or its id), or None."""

    def get(self):
        token = self._named[name]
        if not id or token is None:
            return token
        return self._backend.token_to_id(token)

    return property(get, doc=f"{doc}, or None.")


class HFTokenizer(_HFAssetsMixin):
    """A Hugging Face "fast" tokenizer (`tokenizer.json`) of any model type.

    The `tokenizers` library does the work, so ids and text are those of
    `transformers.AutoTokenizer` on the same directory: BPE (byte-level as
    GPT-2 / Llama 3 / SmolLM, or with byte fallback as Llama 2 / Mistral),
    WordPiece (BERT), Unigram (SentencePiece-derived, T5) and WordLevel,
    with their normalizers, pre-tokenizers and decoders. Special tokens, the
    padding side and the chat template come from `tokenizer_config.json`
    (see `from_assets`). It runs eagerly, in Python; to train on text inside
    `fit()`, tokenize with `encode` first and build the dataset from the ids.

    Args:
        tokenizer: A `tokenizers.Tokenizer` (used as is, its padding and
            truncation turned off), or the path of a `tokenizer.json`.
        bos_token, eos_token, unk_token, pad_token, cls_token, sep_token,
            mask_token: The named special tokens (strings, or `AddedToken`
            dicts as in `tokenizer_config.json`), or None. A token the
            vocabulary lacks is added as a special token, as `transformers`
            does.
        additional_special_tokens: Other special tokens (added likewise).
        added_tokens: `AddedToken` dicts (`{"content", "special", ...}`, the
            values of `added_tokens_decoder` in `tokenizer_config.json`)
            to add where the tokenizer lacks them.
        padding_side: `"right"` or `"left"`: where `__call__` (and `encode`
            with a sequence length) pads.
        truncation_side: `"right"` or `"left"`: which end truncation cuts.
        model_max_length: The longest input the model takes, or None
            (informative; nothing is truncated to it).
        clean_up_tokenization_spaces: `decode` removes the space before
            punctuation (`" ."` -> `"."`), as `transformers` does with this
            option; never for BPE models, as `transformers` 5.
        split_special_tokens: Tokenize special tokens written in the text as
            ordinary text instead of mapping them to their ids.
        chat_template: A Jinja chat template, a `{name: template}` dict, or
            a list of `{"name", "template"}` dicts; None for none.
        sequence_length: If set, `encode` and `__call__` pad or truncate to
            this length.

    Raises:
        ValueError: An invalid argument or `tokenizer.json`.

    Example:

    ```python
    tokenizer = HFTokenizer.from_assets("path/to/SmolLM2-135M-Instruct")
    ids = tokenizer.encode("Hello world")     # [19556, 905]
    tokenizer.decode(ids)                     # "Hello world"
    tokenizer(["a b", "c"])                   # int32 [2, 2], padded
    ```
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        bos_token: Any = None,
        eos_token: Any = None,
        unk_token: Any = None,
        pad_token: Any = None,
        cls_token: Any = None,
        sep_token: Any = None,
        mask_token: Any = None,
        additional_special_tokens: Sequence[Any] = (),
        added_tokens: Sequence[dict] = (),
        padding_side: str = "right",
        truncation_side: str = "right",
        model_max_length: int | None = None,
        clean_up_tokenization_spaces: bool = False,
        split_special_tokens: bool = False,
        chat_template: Any = None,
        sequence_length: int | None = None,
    ) -> None:
        if isinstance(tokenizer, (str, os.PathLike)):
            tokenizer, _ = hf_files.read_backend(os.fspath(tokenizer))
        if not hasattr(tokenizer, "encode_batch"):
            raise ValueError(
                "`tokenizer` must be a `tokenizers.Tokenizer` or the path of a "
                f"tokenizer.json. Received: {type(tokenizer).__name__}."
            )
        for name, side in (("padding", padding_side), ("truncation", truncation_side)):
            if side not in ("left", "right"):
                raise ValueError(
                    f"`{name}_side` must be 'left' or 'right'. Received: {side!r}."
                )
        _check_sequence_length(sequence_length)
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self._backend = tokenizer
        named = dict(
            bos_token=bos_token,
            eos_token=eos_token,
            unk_token=unk_token,
            pad_token=pad_token,
            cls_token=cls_token,
            sep_token=sep_token,
            mask_token=mask_token,
        )
        self._named = {k: hf_files.token_content(v) for k, v in named.items()}
        self._extra = _dedupe(map(hf_files.token_content, additional_special_tokens))
        hf_files.add_missing_tokens(
            tokenizer, [*added_tokens, *named.values(), *additional_special_tokens]
        )
        tokenizer.encode_special_tokens = bool(split_special_tokens)
        self.split_special_tokens = bool(split_special_tokens)
        self.padding_side = padding_side
        self.truncation_side = truncation_side
        self.model_max_length = model_max_length
        self.clean_up_tokenization_spaces = bool(clean_up_tokenization_spaces)
        self.sequence_length = sequence_length
        self._templates = hf_files.chat_templates_of(chat_template)
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        self._vocabulary_size = max(vocab.values(), default=-1) + 1
        self._model_type = type(tokenizer.model).__name__

    # -- vocabulary and special tokens --------------------------------------

    @property
    def backend(self):
        """The `tokenizers.Tokenizer` doing the work."""
        return self._backend

    @property
    def model_type(self) -> str:
        """The `tokenizers` model: `"BPE"`, `"WordPiece"`, `"Unigram"` or `"WordLevel"`."""
        return self._model_type

    @property
    def vocabulary_size(self) -> int:
        """Size of the id space, added tokens included (the largest id plus one)."""
        return self._vocabulary_size

    @property
    def vocabulary(self) -> dict[str, int]:
        """A copy of the token -> id mapping, added tokens included."""
        return self._backend.get_vocab(with_added_tokens=True)

    def token_to_id(self, token: str) -> int:
        """Returns the id of a token string.

        Args:
            token: A token as the vocabulary spells it (e.g. `"Ġthe"`,
                `"▁the"`, `"##ing"`, `"<|im_end|>"`).

        Returns:
            The integer id.

        Raises:
            KeyError: The token is not in the vocabulary.
        """
        index = self._backend.token_to_id(token)
        if index is None:
            raise KeyError(f"Token {token!r} is not in the vocabulary.")
        return int(index)

    def id_to_token(self, id: int) -> str:
        """Returns the token string of an id.

        Args:
            id: An integer id.

        Returns:
            The token as the vocabulary spells it.

        Raises:
            KeyError: The id is not in the vocabulary.
        """
        token = self._backend.id_to_token(int(id))
        if token is None:
            raise KeyError(f"Id {id} is not in the vocabulary.")
        return token

    bos_token = _named_token("bos_token", "Beginning-of-sequence token")
    eos_token = _named_token("eos_token", "End-of-sequence token")
    unk_token = _named_token("unk_token", "Unknown-word token")
    pad_token = _named_token("pad_token", "Padding token")
    cls_token = _named_token("cls_token", "Classifier token (BERT's `[CLS]`)")
    sep_token = _named_token("sep_token", "Separator token (BERT's `[SEP]`)")
    mask_token = _named_token("mask_token", "Mask token (BERT's `[MASK]`)")
    bos_token_id = _named_token("bos_token", "Id of `bos_token`", id=True)
    eos_token_id = _named_token("eos_token", "Id of `eos_token`", id=True)
    unk_token_id = _named_token("unk_token", "Id of `unk_token`", id=True)
    pad_token_id = _named_token(
        "pad_token", "Id of `pad_token` (padding uses it)", id=True
    )
    cls_token_id = _named_token("cls_token", "Id of `cls_token`", id=True)
    sep_token_id = _named_token("sep_token", "Id of `sep_token`", id=True)
    mask_token_id = _named_token("mask_token", "Id of `mask_token`", id=True)

    @property
    def special_tokens(self) -> tuple[str, ...]:
        """All special tokens: the named ones, the additional ones, then the
        added tokens `tokenizer.json` marks special (what
        `decode(..., skip_special_tokens=True)` drops)."""
        added = sorted(self._backend.get_added_tokens_decoder().items())
        marked = [t.content for _, t in added if t.special]
        return tuple(_dedupe([*self._named.values(), *self._extra, *marked]))

    @property
    def special_token_ids(self) -> tuple[int, ...]:
        """Ids of `special_tokens`, in the same order."""
        ids = (self._backend.token_to_id(t) for t in self.special_tokens)
        return tuple(i for i in ids if i is not None)

    @property
    def chat_template(self) -> str | None:
        """The default chat template (Jinja source), or None; settable."""
        return self._templates.get(hf_files.DEFAULT_TEMPLATE)

    @chat_template.setter
    def chat_template(self, value: str | None) -> None:
        self._templates.pop(hf_files.DEFAULT_TEMPLATE, None)
        if value is not None:
            self._templates[hf_files.DEFAULT_TEMPLATE] = str(value)

    @property
    def chat_templates(self) -> dict[str, str]:
        """All chat templates by name; the default one is named `"default"`."""
        return dict(self._templates)

    def __repr__(self) -> str:
        return (
            f"HFTokenizer(model_type={self._model_type!r}, "
            f"vocabulary_size={self.vocabulary_size}, "
            f"eos_token={self.eos_token!r}, padding_side={self.padding_side!r})"
        )

    # -- encode / decode ----------------------------------------------------

    def encode(
        self,
        inputs: str | Sequence[str],
        sequence_length: int | None = None,
        add_special_tokens: bool = False,
    ) -> list[int] | list[list[int]] | np.ndarray:
        """Tokenizes text into ids.

        Special tokens written in the text (e.g. `"<|im_start|>"`) map to
        their ids; no others are added unless `add_special_tokens=True`.

        Args:
            inputs: One string, or a list / tuple / 1-D array of strings.
            sequence_length: Pad (with `pad_token_id`, on `padding_side`) or
                truncate (on `truncation_side`) to this length; defaults to
                the tokenizer's `sequence_length`.
            add_special_tokens: Add the model's own (e.g. BOS, or
                `[CLS] ... [SEP]`), as `tokenizer.json`'s post-processor says.

        Returns:
            For one string, a list of ints; for a batch, a list of lists.
            With a sequence length, an `np.int32` array `[sequence_length]`
            or `[batch, sequence_length]`.

        Example:

        ```python
        tokenizer.encode("Hello world")     # [19556, 905]
        tokenizer.encode(["a", "b c"])      # [[...], [...]]
        ```
        """
        _check_sequence_length(sequence_length)
        texts, single = _canonicalize_texts(inputs)
        if single:
            rows = [
                self._backend.encode(
                    texts[0], add_special_tokens=add_special_tokens
                ).ids
            ]
        else:
            encodings = self._backend.encode_batch(
                texts, add_special_tokens=add_special_tokens
            )
            rows = [e.ids for e in encodings]
        length = sequence_length or self.sequence_length
        if length:
            padded = self._pad(rows, length)
            return padded[0] if single else padded
        return rows[0] if single else rows

    def _pad(self, rows: Sequence[Sequence[int]], length: int) -> np.ndarray:
        pad = self.pad_token_id
        out = np.full((len(rows), length), 0 if pad is None else pad, dtype="int32")
        for i, row in enumerate(rows):
            row = list(row)
            row = row[-length:] if self.truncation_side == "left" else row[:length]
            if self.padding_side == "left":
                out[i, length - len(row) :] = row
            else:
                out[i, : len(row)] = row
        return out

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str | list[str]:
        """Turns ids back into text, as `transformers`' `decode`.

        Args:
            ids: One sequence of ids (list, NumPy array or backend tensor), or
                a batch of them (2-D array, list of lists).
            skip_special_tokens: Drop the special tokens (`special_tokens`).

        Returns:
            A string for one sequence, a list of strings for a batch.

        Example:

        ```python
        tokenizer.decode(tokenizer.encode("café 東京 🙂"))  # "café 東京 🙂"
        ```
        """
        rows, batched = _canonicalize_ids(ids)
        texts = self._backend.decode_batch(
            rows, skip_special_tokens=skip_special_tokens
        )
        if self.clean_up_tokenization_spaces and self._model_type != "BPE":
            texts = [hf_files.clean_up_tokenization(t) for t in texts]
        return texts if batched else texts[0]

    def __call__(
        self,
        inputs: str | Sequence[str],
        sequence_length: int | None = None,
        return_dict: bool = False,
    ) -> np.ndarray | dict[str, np.ndarray]:
        """Tokenizes a batch into padded ids (no special tokens added).

        Args:
            inputs: One string or a batch of strings (Python or NumPy; not
                a `tf.data` graph tensor: this tokenizer runs eagerly).
            sequence_length: Pad or truncate to this length; defaults to the
                tokenizer's `sequence_length`, else the longest sequence.
            return_dict: Return `{"token_ids", "padding_mask"}`, the inputs
                of the text models, instead of the ids alone.

        Returns:
            `np.int32` ids `[batch, length]` (`[length]` for one string),
            padded with `pad_token_id` (0 if there is none) on `padding_side`; with `return_dict`,
            also a boolean `padding_mask` of the same shape.

        Raises:
            TypeError: `inputs` is a symbolic `tf.data` / `tf.function` tensor.

        Example:

        ```python
        tokenizer(["a b", "c"]).shape                 # (2, 2)
        model(tokenizer(["a b", "c"], return_dict=True))
        ```
        """
        if _is_symbolic(inputs):
            raise TypeError(
                "HFTokenizer runs eagerly (the Rust `tokenizers` library) and "
                "cannot run inside `tf.data.Dataset.map` or a `tf.function`. "
                "Tokenize the texts with `tokenizer.encode(texts)` first and "
                "build the dataset from the ids."
            )
        texts, single = _canonicalize_texts(inputs)
        rows = self.encode(texts) if texts else []
        _check_sequence_length(sequence_length)
        length = sequence_length or self.sequence_length
        length = length or max((len(r) for r in rows), default=0)
        ids, mask = self._pad(rows, length), self._mask(rows, length)
        if single:
            ids, mask = ids[0], mask[0]
        return {"token_ids": ids, "padding_mask": mask} if return_dict else ids

    def _mask(self, rows: Sequence[Sequence[int]], length: int) -> np.ndarray:
        out = np.zeros((len(rows), length), dtype=bool)
        for i, row in enumerate(rows):
            n = min(len(row), length)
            if self.padding_side == "left":
                out[i, length - n :] = True
            else:
                out[i, :n] = True
        return out


def load_hf_tokenizer(directory: PathLike) -> HFTokenizer | None:
    """The `HFTokenizer` of a directory, or None when it has no Hugging Face
    tokenizer: neither a `tokenizer.json` nor a SentencePiece model
    (`tokenizer.model`, `spiece.model`, `sentencepiece.bpe.model`,
    `spm.model`; see `HFTokenizer.from_assets`).

    A `tokenizer.json` beside the `tokenizer_config.json` of another of our
    tokenizer classes is left to that class.

    Args:
        directory: A Hugging Face model directory, or one `save_assets` wrote.

    Returns:
        The tokenizer, or None.

    Raises:
        FileNotFoundError: The directory does not exist.
        ValueError: A tokenizer file is corrupt or not valid, or a
            SentencePiece model of a tokenizer class this library cannot
            build (the message says how to write its `tokenizer.json`).

    Examples:
        >>> tokenizer = load_hf_tokenizer("path/to/hf_model")  # doctest: +SKIP
    """
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"Directory '{directory}' does not exist.")
    if hf_files.has_hf_tokenizer(directory) or (
        not os.path.isfile(os.path.join(directory, HF_TOKENIZER_FILENAME))
        and spm.model_file(directory)
    ):
        return HFTokenizer.from_assets(directory)
    return None


__all__ = ["HFTokenizer", "load_hf_tokenizer", "saved_by_hf_tokenizer"]
