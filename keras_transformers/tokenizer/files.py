"""Tokenizer files: GPT-2 `vocab.json` + `merges.txt`, Hugging Face
`tokenizer.json`, and `tokenizer_config.json` (ours or Hugging Face's)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from keras_transformers.tokenizer._common import (
    CONFIG_FILENAME,
    DEFAULT_END_TOKEN,
    HF_TOKENIZER_FILENAME,
    MERGES_FILENAME,
    VOCAB_FILENAME,
    _dedupe,
    _normalize_merges,
)
from keras_transformers.tokenizer.hf_files import DEFAULT_TEMPLATE, read_chat_templates

_CONFIG_FORMAT_VERSION = 1
_MERGES_HEADER = "#version: 0.2"
_CLASS_NAME = "BPETokenizer"


def _read_json(path: str) -> Any:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Tokenizer file '{path}' does not exist.")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(
            f"'{path}' is not valid UTF-8 JSON ({e}). The file is corrupt or "
            "truncated: download or save it again."
        ) from e


def _read_vocab_json(path: str) -> dict[str, int]:
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"Vocabulary file '{path}' does not exist. A GPT-2 style tokenizer "
            f"needs {VOCAB_FILENAME} (token -> id) and {MERGES_FILENAME}."
        )
    vocab = _read_json(path)
    if (
        not isinstance(vocab, dict)
        or not vocab
        or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0
            for v in vocab.values()
        )
    ):
        raise ValueError(
            f"'{path}' must be a non-empty JSON object mapping token strings to "
            "non-negative integer ids (GPT-2 vocab.json format)."
        )
    return vocab


def _read_merges_txt(path: str) -> list[str]:
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"Merges file '{path}' does not exist. A GPT-2 style tokenizer needs "
            f"{MERGES_FILENAME} (one 'a b' merge rule per line) and {VOCAB_FILENAME}."
        )
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"'{path}' is not UTF-8 text ({e}); it is corrupt or not a merges file."
        ) from e
    lines = [line.rstrip("\r") for line in lines]
    return _normalize_merges(lines, source=f"'{path}'")


def _read_hf_tokenizer_json(
    path: str,
) -> tuple[dict[str, int], list[str], dict[str, int], bool]:
    """Returns `(vocab, merges, added special tokens, add_prefix_space)`."""
    data = _read_json(path)
    model = data.get("model") if isinstance(data, dict) else None
    if not isinstance(model, dict) or model.get("type") != "BPE":
        found = model.get("type") if isinstance(model, dict) else None
        raise ValueError(
            f"'{path}' is not a BPE tokenizer (model.type is {found!r}, expected "
            "'BPE'). Only byte-level BPE (GPT-2 family) tokenizers are supported."
        )
    if (
        model.get("continuing_subword_prefix")
        or model.get("end_of_word_suffix")
        or model.get("byte_fallback")
    ):
        raise ValueError(
            f"'{path}' uses continuing_subword_prefix, end_of_word_suffix or "
            "byte_fallback; it is not a GPT-2 style byte-level BPE tokenizer."
        )
    if data.get("normalizer") is not None:
        raise ValueError(
            f"'{path}' has a normalizer ({data['normalizer'].get('type')}), which "
            "this GPT-2 style tokenizer does not apply; ids would differ."
        )
    pre = data.get("pre_tokenizer") or {}
    if pre.get("type") == "Sequence" and len(pre.get("pretokenizers", [])) == 1:
        pre = pre["pretokenizers"][0]
    if pre.get("type") != "ByteLevel" or not pre.get("use_regex", True):
        raise ValueError(
            f"'{path}' has pre-tokenizer {pre.get('type')!r}; only the GPT-2 "
            "byte-level one (ByteLevel with use_regex=true) is supported, other "
            "split rules (e.g. Llama 3's) would give different ids."
        )
    vocab = model.get("vocab")
    if not isinstance(vocab, dict) or not vocab:
        raise ValueError(f"'{path}' has no model.vocab mapping.")
    merges = _normalize_merges(model.get("merges") or [], source=f"'{path}'")
    added = {}
    for entry in data.get("added_tokens") or []:
        if isinstance(entry, dict) and "content" in entry and "id" in entry:
            added[entry["content"]] = int(entry["id"])
    return vocab, merges, added, bool(pre.get("add_prefix_space", False))


def _with_added(vocab: dict[str, int], added: Mapping[str, int]) -> dict[str, int]:
    """`vocab` plus the added tokens it lacks."""
    return {**vocab, **{t: i for t, i in added.items() if t not in vocab}}


def _token_content(value: Any) -> str | None:
    if isinstance(value, dict):  # {"content": ..., "__type": "AddedToken"}
        value = value.get("content")
    return value if isinstance(value, str) else None


def _default_end_token(
    vocab: Mapping[str, int], candidates: Iterable[str], where: str
) -> str:
    if DEFAULT_END_TOKEN in vocab:
        return DEFAULT_END_TOKEN
    for token in candidates:
        if token in vocab:
            return token
    raise ValueError(
        f"Cannot tell the end token of '{where}': '{DEFAULT_END_TOKEN}' is not "
        "in the vocabulary and no special token is declared. Pass `end_token=`."
    )


def _special_tokens_from_config(
    config: dict, vocab: dict[str, int], added: dict[str, int], config_path: str
) -> dict[str, Any]:
    """`BPETokenizer` special-token kwargs from our or Hugging Face's config."""
    if config.get("class_name") not in (None, _CLASS_NAME):
        raise ValueError(
            f"'{config_path}' describes a {config['class_name']!r}, not a "
            f"{_CLASS_NAME}."
        )
    known = {**vocab, **added}
    names = ("bos_token", "eos_token", "pad_token")
    named = {n: _token_content(config.get(n)) for n in names}
    extra = [*added]
    for key in ("special_tokens", "extra_special_tokens", "additional_special_tokens"):
        values = config.get(key) or []
        if isinstance(values, dict):
            values = list(values.values())
        extra += [t for t in map(_token_content, values) if t]
    for entry in (config.get("added_tokens_decoder") or {}).values():
        token = _token_content(entry)
        if token and isinstance(entry, dict) and entry.get("special", True):
            extra.append(token)
    end = _token_content(config.get("end_token")) or named["eos_token"]
    if end is None:
        end = _default_end_token(known, extra, config_path)
    kwargs: dict[str, Any] = {"end_token": end}
    kwargs.update({n: t for n, t in named.items() if t})
    kwargs["special_tokens"] = _dedupe(t for t in extra if t in known)
    return kwargs


def _has_assets(directory: str) -> bool:
    names = (VOCAB_FILENAME, MERGES_FILENAME, HF_TOKENIZER_FILENAME)
    return any(os.path.isfile(os.path.join(directory, n)) for n in names)


def _read_assets(directory: str) -> tuple[dict[str, int], list[str], dict[str, Any]]:
    """`(vocab, merges, other BPETokenizer kwargs)` of a tokenizer directory
    (and its `chat_template`, None without one)."""
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            f"Tokenizer directory '{directory}' does not exist. Create one "
            "with `BPETokenizer.save_assets(directory)`."
        )
    vocab_path = os.path.join(directory, VOCAB_FILENAME)
    merges_path = os.path.join(directory, MERGES_FILENAME)
    hf_path = os.path.join(directory, HF_TOKENIZER_FILENAME)
    config_path = os.path.join(directory, CONFIG_FILENAME)
    has_vocab, has_merges = os.path.isfile(vocab_path), os.path.isfile(merges_path)
    config = _read_json(config_path) if os.path.isfile(config_path) else {}
    if not isinstance(config, dict):
        raise ValueError(
            f"'{config_path}' must hold a JSON object. Delete or rewrite it "
            "(`BPETokenizer.save_assets` writes a valid one)."
        )
    added: dict[str, int] = {}
    add_prefix_space = bool(config.get("add_prefix_space", False))
    if has_vocab and has_merges:
        vocab = _read_vocab_json(vocab_path)
        merges = _read_merges_txt(merges_path)
    elif has_vocab or has_merges:
        present, absent = (
            (vocab_path, merges_path) if has_vocab else (merges_path, vocab_path)
        )
        raise FileNotFoundError(
            f"'{absent}' is missing: found '{present}' but a GPT-2 style "
            f"tokenizer needs both {VOCAB_FILENAME} and {MERGES_FILENAME}. "
            "Copy the missing file from the same source."
        )
    elif os.path.isfile(hf_path):
        vocab, merges, added, hf_prefix = _read_hf_tokenizer_json(hf_path)
        add_prefix_space = bool(config.get("add_prefix_space", hf_prefix))
    else:
        raise FileNotFoundError(
            f"No tokenizer files in '{directory}': expected {VOCAB_FILENAME} "
            f"and {MERGES_FILENAME}, or {HF_TOKENIZER_FILENAME}. Save one "
            "with `BPETokenizer.save_assets(directory)`."
        )
    kwargs = _special_tokens_from_config(config, vocab, added, config_path)
    kwargs["sequence_length"] = config.get("sequence_length")
    kwargs["add_prefix_space"] = add_prefix_space
    templates = read_chat_templates(directory, config)
    kwargs["chat_template"] = templates.get(DEFAULT_TEMPLATE)
    return _with_added(vocab, added), merges, kwargs


def _write_assets(
    directory: str, vocab: Mapping[str, int], merges: Iterable[str], config: dict
) -> None:
    """Writes `vocab.json` (sorted by id), `merges.txt` and the config."""
    os.makedirs(directory, exist_ok=True)
    vocab = dict(sorted(vocab.items(), key=lambda item: item[1]))
    with open(os.path.join(directory, VOCAB_FILENAME), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(directory, MERGES_FILENAME), "w", encoding="utf-8") as f:
        f.write(_MERGES_HEADER + "\n")
        for merge in merges:
            f.write(merge + "\n")
    with open(os.path.join(directory, CONFIG_FILENAME), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
