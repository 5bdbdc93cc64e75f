"""Saving and loading of `BPETokenizer`: the methods of `_AssetsMixin`."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from keras_transformers.tokenizer._common import (
    DEFAULT_END_TOKEN,
    PathLike,
    _with_special_tokens,
)
from keras_transformers.tokenizer.files import (
    _CONFIG_FORMAT_VERSION,
    _default_end_token,
    _read_assets,
    _read_hf_tokenizer_json,
    _read_merges_txt,
    _read_vocab_json,
    _with_added,
    _write_assets,
)
from keras_transformers.tokenizer.tiktoken import _read_tiktoken

# The class a `from_*` loader is called on (`BPETokenizer` or a subclass).
_Tokenizer = TypeVar("_Tokenizer", bound="_AssetsMixin")


class _AssetsMixin:
    """`get_config`, `save_assets` and the `from_*` loaders of `BPETokenizer`."""

    def get_config(self) -> dict[str, Any]:
        """The contents of `tokenizer_config.json`.

        Besides our own keys it has those Hugging Face reads
        (`tokenizer_class`, `bos_token`, `eos_token`, `unk_token`,
        `pad_token`, `add_prefix_space`), so `transformers.AutoTokenizer` can
        load a directory written by `save_assets`.

        Returns:
            A JSON-serializable dict.

        Example:

        ```python
        tokenizer.get_config()["special_tokens"]  # ["<|endoftext|>"]
        ```
        """
        config: dict[str, Any] = {
            "class_name": type(self).__name__,
            "module": "keras_transformers.tokenizer",
            "format_version": _CONFIG_FORMAT_VERSION,
            "end_token": self._end_token,
            "bos_token": self._bos_token,
            "eos_token": self._eos_token,
            "pad_token": self._pad_token,
            "special_tokens": list(self._special_tokens),
            "sequence_length": self.sequence_length,
            "add_prefix_space": self.add_prefix_space,
            # For Hugging Face `transformers`.
            "tokenizer_class": "GPT2Tokenizer",
            "unk_token": self._end_token,
        }
        named = {self._end_token, self._bos_token, self._eos_token, self._pad_token}
        extra = [t for t in self._special_tokens if t not in named]
        if extra:
            config["additional_special_tokens"] = extra
        if self.sequence_length:
            config["model_max_length"] = self.sequence_length
        if self.chat_template:
            config["chat_template"] = self.chat_template
        return config

    def save_assets(self, directory: PathLike) -> None:
        """Writes `vocab.json`, `merges.txt` and `tokenizer_config.json`.

        The first two are in the GPT-2 / Hugging Face format. The directory is
        created if needed; existing files of those names are replaced.

        Args:
            directory: Where to write.

        Example:

        ```python
        tokenizer.save_assets("my_tokenizer")
        same = BPETokenizer.from_assets("my_tokenizer")
        ```
        """
        _write_assets(
            os.fspath(directory), self._vocabulary, self._merges, self.get_config()
        )

    @classmethod
    def from_assets(cls: type[_Tokenizer], directory: PathLike) -> _Tokenizer:
        """Loads a tokenizer directory.

        Reads what `save_assets` writes, and Hugging Face model directories:
        `vocab.json` + `merges.txt` if present, else a byte-level BPE
        `tokenizer.json`; special tokens come from `tokenizer_config.json`
        when present (ours or Hugging Face's), the chat template from
        `chat_template.jinja` or the config's `chat_template`.

        Args:
            directory: The directory.

        Returns:
            The tokenizer.

        Raises:
            FileNotFoundError: The directory or a needed file is missing.
            ValueError: A file is not valid.

        Example:

        ```python
        tokenizer = BPETokenizer.from_assets("path/to/gpt2")
        ```
        """
        vocab, merges, kwargs = _read_assets(os.fspath(directory))
        template = kwargs.pop("chat_template", None)
        tokenizer = cls(vocab, merges, **kwargs)
        tokenizer.chat_template = template
        return tokenizer

    @classmethod
    def from_gpt2_files(
        cls: type[_Tokenizer],
        vocab_json_path: PathLike,
        merges_txt_path: PathLike,
        *,
        end_token: str = DEFAULT_END_TOKEN,
        **kwargs: Any,
    ) -> _Tokenizer:
        """Loads GPT-2 style `vocab.json` (a.k.a. `encoder.json`) and `merges.txt`.

        Args:
            vocab_json_path: JSON file mapping token strings to ids.
            merges_txt_path: Merge rules, one `"a b"` per line (a leading
                `#version` line is skipped).
            end_token: The end-of-text token.
            **kwargs: Other `BPETokenizer` arguments (`pad_token`,
                `sequence_length`, ...).

        Returns:
            The tokenizer.

        Raises:
            FileNotFoundError: A file is missing.
            ValueError: A file is not valid.

        Example:

        ```python
        tokenizer = BPETokenizer.from_gpt2_files("gpt2/vocab.json", "gpt2/merges.txt")
        tokenizer.encode("Hello world")  # array([15496, 995], dtype=int32)
        ```
        """
        vocab = _read_vocab_json(os.fspath(vocab_json_path))
        merges = _read_merges_txt(os.fspath(merges_txt_path))
        return cls(vocab, merges, end_token=end_token, **kwargs)

    @classmethod
    def from_hf_tokenizer_json(
        cls: type[_Tokenizer],
        path: PathLike,
        *,
        end_token: str | None = None,
        **kwargs: Any,
    ) -> _Tokenizer:
        """Loads a Hugging Face `tokenizer.json` of a byte-level BPE model.

        Args:
            path: The `tokenizer.json` file.
            end_token: The end-of-text token; defaults to `"<|endoftext|>"`
                if present, else the first special added token.
            **kwargs: Other `BPETokenizer` arguments.

        Returns:
            The tokenizer.

        Raises:
            FileNotFoundError: The file is missing.
            ValueError: The file is not a GPT-2 style byte-level BPE tokenizer.

        Example:

        ```python
        tokenizer = BPETokenizer.from_hf_tokenizer_json("gpt2/tokenizer.json")
        ```
        """
        path = os.fspath(path)
        vocab, merges, added, add_prefix_space = _read_hf_tokenizer_json(path)
        vocab = _with_added(vocab, added)
        if end_token is None:
            end_token = _default_end_token(vocab, added, path)
        kwargs.setdefault("add_prefix_space", add_prefix_space)
        kwargs = _with_special_tokens(kwargs, added, end_token)
        return cls(vocab, merges, end_token=end_token, **kwargs)

    @classmethod
    def from_tiktoken(
        cls: type[_Tokenizer],
        path: PathLike,
        *,
        special_tokens: Mapping[str, int] | Sequence[str] | None = None,
        end_token: str = DEFAULT_END_TOKEN,
        **kwargs: Any,
    ) -> _Tokenizer:
        """Loads an OpenAI `.tiktoken` rank file (e.g. `gpt2.tiktoken`).

        Each line is a base64 token and its rank; the rank is the id. Merge
        rules are recovered from the ranks: a token's two parts are what BPE
        gives on its bytes using only the merges of lower rank. Only files
        meant for the GPT-2 split regex (`gpt2`, `r50k_base`, `p50k_base`)
        tokenize like the original; `cl100k_base` and later use another regex.

        Args:
            path: The `.tiktoken` file.
            special_tokens: Special tokens to add: a `{token: id}` mapping, or
                token strings that get the ids after the last rank. Defaults
                to `{end_token: <number of ranks>}` (`50256` for GPT-2).
            end_token: The end-of-text token.
            **kwargs: Other `BPETokenizer` arguments.

        Returns:
            The tokenizer.

        Raises:
            FileNotFoundError: The file is missing.
            ValueError: The file is not a valid rank file.

        Example:

        ```python
        tokenizer = BPETokenizer.from_tiktoken("whisper/assets/gpt2.tiktoken")
        tokenizer.encode("Hello world")  # array([15496, 995], dtype=int32)
        ```
        """
        if special_tokens is None:
            special_tokens = [end_token]
        vocab, merges, added = _read_tiktoken(os.fspath(path), special_tokens)
        kwargs = _with_special_tokens(kwargs, added, end_token)
        return cls(vocab, merges, end_token=end_token, **kwargs)
