"""`from_assets`, `get_config` and `save_assets` of `HFTokenizer`."""

from __future__ import annotations

import json
import os
from typing import Any, TypeVar

from keras_transformers.tokenizer import hf_files, spm
from keras_transformers.tokenizer._common import (
    CONFIG_FILENAME,
    HF_TOKENIZER_FILENAME,
    SENTENCEPIECE_FILENAMES,
    PathLike,
    _no_tokenizer,
)

# The class `from_assets` is called on (`HFTokenizer` or a subclass).
_Tokenizer = TypeVar("_Tokenizer", bound="_HFAssetsMixin")


class _HFAssetsMixin:
    """Reading and writing the files of an `HFTokenizer` directory."""

    @classmethod
    def from_assets(cls: type[_Tokenizer], directory: PathLike) -> _Tokenizer:
        """Loads a Hugging Face tokenizer directory, or one `save_assets` wrote.

        Reads `tokenizer.json`, or, where there is none, a SentencePiece
        model (`tokenizer.model`, `spiece.model`, `sentencepiece.bpe.model`
        or `spm.model`), built as `transformers` builds the tokenizer class
        the directory names (Llama, T5, XLM-RoBERTa, CamemBERT, DeBERTa-v2,
        ALBERT, or the model file's own settings; see
        `keras_transformers.tokenizer.spm`); special tokens (strings or
        `AddedToken` dicts), `padding_side`, `truncation_side`, `model_max_length` (values
        of 1e9 and above, Hugging Face's "no limit", become None),
        `clean_up_tokenization_spaces`, `split_special_tokens` and
        `chat_template` from `tokenizer_config.json`; the named tokens of a
        legacy `special_tokens_map.json`; and chat templates from
        `chat_template.jinja` and `additional_chat_templates/*.jinja`, which
        take priority over the config's, as in `transformers`.

        Args:
            directory: The directory.

        Returns:
            The tokenizer.

        Raises:
            FileNotFoundError: The directory is missing, or has no tokenizer
                file (the message lists the names looked for).
            ValueError: A file is corrupt or not valid, or a SentencePiece
                model of a tokenizer class this library cannot build (the
                message names it and the fix).

        Example:

        ```python
        tokenizer = HFTokenizer.from_assets("path/to/hf_model")
        ```
        """
        directory = os.fspath(directory)
        if not os.path.isdir(directory):
            raise FileNotFoundError(
                f"Tokenizer directory '{directory}' does not exist."
            )
        path = os.path.join(directory, HF_TOKENIZER_FILENAME)
        if not os.path.isfile(path) and spm.model_file(directory):
            backend, options = spm.read_directory(directory)
            return cls(backend, **options)
        if not os.path.isfile(path):
            names = (HF_TOKENIZER_FILENAME, *SENTENCEPIECE_FILENAMES)
            raise _no_tokenizer(directory, names)
        backend, sides = hf_files.read_backend(path)
        return cls(backend, **hf_files.read_options(directory, sides))

    def get_config(self) -> dict[str, Any]:
        """The contents of the `tokenizer_config.json` `save_assets` writes.

        Our keys (`class_name`, `sequence_length`) and those `transformers`
        reads (`tokenizer_class`, the named special tokens,
        `additional_special_tokens`, `padding_side`, ...).

        Returns:
            A JSON-serializable dict.

        Example:

        ```python
        tokenizer.get_config()["eos_token"]  # "<|im_end|>"
        ```
        """
        config: dict[str, Any] = {
            "class_name": hf_files.CLASS_NAME,
            "module": "keras_transformers.tokenizer",
            "format_version": hf_files.FORMAT_VERSION,
            "tokenizer_class": "PreTrainedTokenizerFast",
            **{k: v for k, v in self._named.items() if v is not None},
            "padding_side": self.padding_side,
            "truncation_side": self.truncation_side,
            "clean_up_tokenization_spaces": self.clean_up_tokenization_spaces,
            "sequence_length": self.sequence_length,
        }
        if self._extra:
            config["additional_special_tokens"] = list(self._extra)
        if self.model_max_length is not None:
            config["model_max_length"] = self.model_max_length
        if self.split_special_tokens:
            config["split_special_tokens"] = True
        return config

    def save_assets(self, directory: PathLike) -> None:
        """Writes `tokenizer.json`, `tokenizer_config.json` and the chat templates.

        The layout is that of `transformers` 5 (`chat_template.jinja`, others
        in `additional_chat_templates/`), so `transformers.AutoTokenizer`
        loads the directory with the same ids, and so does `from_assets`.
        The directory is created if needed; chat template files of an
        earlier save are replaced.

        Args:
            directory: Where to write.

        Example:

        ```python
        tokenizer.save_assets("my_tokenizer")
        same = HFTokenizer.from_assets("my_tokenizer")
        ```
        """
        directory = os.fspath(directory)
        os.makedirs(directory, exist_ok=True)
        self._backend.save(os.path.join(directory, HF_TOKENIZER_FILENAME))
        with open(os.path.join(directory, CONFIG_FILENAME), "w", encoding="utf-8") as f:
            json.dump(self.get_config(), f, ensure_ascii=False, indent=2)
        hf_files.write_chat_templates(directory, self._templates)


def saved_by_hf_tokenizer(directory: PathLike) -> bool:
    """Whether `HFTokenizer.save_assets` wrote `directory` (its
    `tokenizer_config.json` names the class), so that it loads as one even
    where its `tokenizer.json` is a WordPiece one."""
    directory = os.fspath(directory)
    return hf_files.saved_class(directory) == hf_files.CLASS_NAME and (
        os.path.isfile(os.path.join(directory, HF_TOKENIZER_FILENAME))
    )
