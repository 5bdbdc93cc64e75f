"""Reading and writing WordPiece tokenizer files: BERT's `vocab.txt`, our
`tokenizer_config.json` (a superset of Hugging Face's) and Hugging Face's
WordPiece `tokenizer.json`."""

from __future__ import annotations

import json
import os
from typing import Any

from keras_transformers.preprocessing._layer import SPECIAL_TOKENS

VOCAB_TXT = "vocab.txt"
CONFIG_JSON = "tokenizer_config.json"
HF_TOKENIZER_JSON = "tokenizer.json"
FORMAT_VERSION = 1
# Hugging Face writes a huge `model_max_length` when a model has no limit.
_MAX_SENSIBLE_LENGTH = 1_000_000


def read_vocab_txt(path: str) -> list[str]:
    """The tokens of a `vocab.txt`, as `transformers.BertTokenizer` reads them."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Vocabulary file '{path}' does not exist.")
    with open(path, encoding="utf-8") as file:
        tokens = [line.rstrip("\n") for line in file]
    if not tokens:
        raise ValueError(f"Vocabulary file '{path}' is empty.")
    return tokens


def _read_json(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as file:
            data = json.load(file)
    except json.JSONDecodeError as error:
        raise ValueError(f"'{path}' is not valid JSON ({error}).") from None
    if not isinstance(data, dict):
        raise ValueError(f"'{path}' must hold a JSON object.")
    return data


def _read_hf_tokenizer_json(path: str) -> tuple[list[str], dict[str, Any]]:
    """Vocabulary and options of a Hugging Face WordPiece `tokenizer.json`."""
    data = _read_json(path)
    model = data.get("model") or {}
    if model.get("type") != "WordPiece" or not isinstance(model.get("vocab"), dict):
        raise ValueError(
            f"'{path}' is not a WordPiece tokenizer (model type "
            f"{model.get('type')!r}); BERT preprocessing needs WordPiece."
        )
    vocab = model["vocab"]
    normalizers = [data.get("normalizer") or {}]
    normalizers += normalizers[0].get("normalizers") or []
    options: dict[str, Any] = {}
    for normalizer in normalizers:
        if normalizer.get("type") == "BertNormalizer":
            options = {
                "do_lower_case": normalizer.get("lowercase", True),
                "strip_accents": normalizer.get("strip_accents"),
                "tokenize_chinese_chars": normalizer.get("handle_chinese_chars", True),
            }
    return sorted(vocab, key=vocab.get), options


def has_assets(directory: str) -> bool:
    """Whether `directory` has a WordPiece vocabulary."""
    if os.path.isfile(os.path.join(directory, VOCAB_TXT)):
        return True
    path = os.path.join(directory, HF_TOKENIZER_JSON)
    if not os.path.isfile(path):
        return False
    try:
        model = _read_json(path).get("model") or {}
    except ValueError:
        return False
    return model.get("type") == "WordPiece"


def read_assets(directory: str) -> tuple[list[str], dict[str, Any]]:
    """`(vocabulary, WordPieceTokenizer kwargs)` of a tokenizer directory."""
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"Tokenizer directory '{directory}' does not exist.")
    config = read_config(directory)
    vocab_path = os.path.join(directory, VOCAB_TXT)
    json_path = os.path.join(directory, HF_TOKENIZER_JSON)
    if os.path.isfile(vocab_path):
        vocabulary = read_vocab_txt(vocab_path)
    elif os.path.isfile(json_path):
        vocabulary, json_options = _read_hf_tokenizer_json(json_path)
        config = {**json_options, **config}
    else:
        raise FileNotFoundError(
            f"'{directory}' has neither '{VOCAB_TXT}' nor a WordPiece "
            f"'{HF_TOKENIZER_JSON}'. Write one with `save_assets(directory)`."
        )
    options = {
        "lowercase": bool(config.get("do_lower_case", True)),
        "strip_accents": config.get("strip_accents"),
        "split_on_cjk": bool(config.get("tokenize_chinese_chars", True)),
    }
    if config.get("class_name") == "WordPieceTokenizer":
        options["sequence_length"] = config.get("sequence_length")
    return vocabulary, options


def read_config(directory: str) -> dict[str, Any]:
    """`tokenizer_config.json` of `directory`, or `{}`."""
    path = os.path.join(directory, CONFIG_JSON)
    return _read_json(path) if os.path.isfile(path) else {}


def sequence_length_of(config: dict[str, Any]) -> int | None:
    """Our `sequence_length`, else a sensible Hugging Face `model_max_length`."""
    length = config.get("sequence_length")
    if length is None:
        length = config.get("model_max_length")
        if not isinstance(length, int) or length > _MAX_SENSIBLE_LENGTH:
            length = None
    return length


def tokenizer_config(tokenizer, **extra: Any) -> dict[str, Any]:
    """`tokenizer_config.json` contents: our keys and Hugging Face's."""
    config: dict[str, Any] = {
        "class_name": type(tokenizer).__name__,
        "module": "keras_transformers.preprocessing",
        "format_version": FORMAT_VERSION,
        "sequence_length": tokenizer.sequence_length,
        # Read by us and by Hugging Face `transformers`.
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": tokenizer.lowercase,
        "strip_accents": tokenizer.strip_accents,
        "tokenize_chinese_chars": tokenizer.split_on_cjk,
        **SPECIAL_TOKENS,
    }
    config.update(extra)
    if config["sequence_length"]:
        config["model_max_length"] = config["sequence_length"]
    return config


def write_assets(directory: str, vocabulary: list[str], config: dict) -> None:
    """Writes `vocab.txt` and `tokenizer_config.json` into `directory`."""
    bad = [t for t in vocabulary if "\n" in t or "\r" in t]
    if bad:
        raise ValueError(f"Tokens with line breaks cannot be saved: {bad[:5]}.")
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, VOCAB_TXT), "w", encoding="utf-8") as file:
        file.write("".join(f"{t}\n" for t in vocabulary))
    with open(os.path.join(directory, CONFIG_JSON), "w", encoding="utf-8") as file:
        json.dump(config, file, indent=2, ensure_ascii=False)
        file.write("\n")
