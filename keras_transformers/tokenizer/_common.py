"""Constants and argument checks shared by the tokenizer modules."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

DEFAULT_END_TOKEN = "<|endoftext|>"
VOCAB_FILENAME = "vocab.json"
MERGES_FILENAME = "merges.txt"
CONFIG_FILENAME = "tokenizer_config.json"
HF_TOKENIZER_FILENAME = "tokenizer.json"
# SentencePiece models of Hugging Face repositories without a `tokenizer.json`
# (Llama 2 and Mistral; T5 and ALBERT; XLM-RoBERTa and CamemBERT; DeBERTa-v3).
SENTENCEPIECE_FILENAMES = (
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "spm.model",
)

PathLike = str | os.PathLike


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's `bytes_to_unicode`: a printable character for each byte."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    mapping = {b: chr(b) for b in printable}
    n = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + n)
            n += 1
    return mapping


_BYTE_TO_UNICODE = _bytes_to_unicode()


def _bytes_to_token(data: bytes) -> str:
    return "".join(_BYTE_TO_UNICODE[b] for b in data)


def _no_tokenizer(directory: str, names: Iterable[str]) -> FileNotFoundError:
    """The error for a directory without any of the tokenizer files `names`."""
    return FileNotFoundError(
        f"No tokenizer in '{directory}': it holds none of {', '.join(names)}. "
        "Copy the tokenizer files from the model's repository into it (a "
        "SentencePiece model alone will do), or save one there with "
        "`tokenizer.save_assets(directory)`."
    )


def _dedupe(items: Iterable[str | None]) -> list[str]:
    out: list[str] = []
    for item in items:
        if item is not None and item not in out:
            out.append(item)
    return out


def _with_special_tokens(
    kwargs: dict[str, Any], tokens: Iterable[str], end_token: str
) -> dict[str, Any]:
    """`kwargs` with `tokens` (but `end_token`) added to its `special_tokens`."""
    extra = [t for t in tokens if t != end_token]
    kwargs["special_tokens"] = _dedupe([*kwargs.get("special_tokens", ()), *extra])
    return kwargs


def _normalize_merges(merges: Iterable[Any], source: str = "merges") -> list[str]:
    """`"a b"` strings from merge lines or pairs; skips `#version` and blanks."""
    out = []
    for i, merge in enumerate(merges):
        if isinstance(merge, (list, tuple)):
            parts = list(merge)
        elif isinstance(merge, str):
            if merge.startswith("#version") or not merge.strip():
                continue
            parts = merge.split(" ")
        else:
            parts = []
        if len(parts) != 2 or not all(
            isinstance(p, str) and p and " " not in p for p in parts
        ):
            raise ValueError(
                f"Invalid merge rule #{i} in {source}: {merge!r}. Each merge rule "
                "must be two tokens separated by one space, e.g. 'Ġ t'."
            )
        out.append(f"{parts[0]} {parts[1]}")
    return out


def _check_vocabulary(vocabulary: Any) -> dict[str, int]:
    if not isinstance(vocabulary, Mapping) or not vocabulary:
        raise ValueError(
            "`vocabulary` must be a non-empty dict mapping token strings to "
            f"integer ids. Received: {type(vocabulary).__name__}."
        )
    vocab: dict[str, int] = {}
    for token, index in vocabulary.items():
        if (
            not isinstance(token, str)
            or isinstance(index, bool)
            or not isinstance(index, (int, np.integer))
            or index < 0
        ):
            raise ValueError(
                "`vocabulary` must map token strings to non-negative integer "
                f"ids. Received the entry {token!r}: {index!r}."
            )
        vocab[token] = int(index)
    return vocab


def _check_merges(merges: Iterable[Any], vocab: Mapping[str, int]) -> list[str]:
    merges = _normalize_merges(merges)
    for merge in merges:
        a, b = merge.split(" ")
        for token in (a, b, a + b):
            if token not in vocab:
                raise ValueError(
                    f"Merge rule {merge!r} uses token {token!r}, which is not "
                    "in the vocabulary. The vocabulary and merges do not "
                    "belong together."
                )
    return merges


def _check_sequence_length(sequence_length: Any) -> None:
    if sequence_length is not None and (
        isinstance(sequence_length, bool)
        or not isinstance(sequence_length, int)
        or sequence_length < 1
    ):
        raise ValueError(
            f"`sequence_length` must be a positive int or None. Received: "
            f"{sequence_length!r}."
        )


def _is_symbolic(x: Any) -> bool:
    """True for a graph (`tf.function` / `tf.data`) tensor."""
    return hasattr(x, "graph") and not hasattr(x, "numpy")


def _canonicalize_texts(inputs: Any) -> tuple[list[str], bool]:
    """`(list of str, single)` from a string or a batch of strings."""
    if isinstance(inputs, (str, bytes)):
        items, single = [inputs], True
    elif isinstance(inputs, (list, tuple)):
        items, single = list(inputs), False
    else:
        array = np.asarray(inputs)  # NumPy or eager tf.string tensors.
        if array.ndim > 1:
            raise ValueError(
                f"`encode` takes a string or a 1-D batch of strings. Received shape "
                f"{array.shape}."
            )
        items, single = array.reshape(-1).tolist(), array.ndim == 0
    texts = []
    for item in items:
        if isinstance(item, bytes):
            item = item.decode("utf-8")
        if not isinstance(item, str):
            raise TypeError(
                "`encode` takes a string or a sequence of strings. Received an "
                f"element of type {type(item).__name__}."
            )
        texts.append(item)
    return texts, single


def _canonicalize_ids(ids: Any) -> tuple[list[list[int]], bool]:
    """`(list of id lists, batched)` from one sequence or a batch of ids.
    -1, what `generate(stream=...)` reports for a finished row, is dropped;
    a negative id or one past int32 raises a ValueError (ids the vocabulary
    lacks decode as the tokenizer's own decoder decodes them)."""
    if hasattr(ids, "to_list"):  # tf.RaggedTensor
        ids = ids.to_list()
    if isinstance(ids, (list, tuple)) and any(np.ndim(row) > 0 for row in ids):
        rows, batched = [_host(row).reshape(-1) for row in ids], True
    else:
        array = _host(ids)  # NumPy, JAX, torch and TF tensors, on any device
        if array.size and not np.issubdtype(array.dtype, np.integer):
            raise TypeError(
                f"`decode` takes integer ids. Received dtype {array.dtype}."
            )
        if array.ndim > 2:
            raise ValueError(
                f"`decode` takes 1-D or 2-D ids. Received shape {array.shape}."
            )
        batched = array.ndim == 2
        rows = list(array) if batched else [array.reshape(-1)]
    rows = [[int(i) for i in row if i != -1] for row in rows]
    bad = [i for row in rows for i in row if not 0 <= i < 2**31]
    if bad:
        raise ValueError(
            f"`decode` takes token ids >= 0. Received id {bad[0]} (-1, a finished "
            "row's marker in `generate(stream=...)` steps, is skipped)."
        )
    return rows, batched


def _host(ids: Any) -> np.ndarray:
    """`ids` as a NumPy array; a backend tensor is copied to host memory
    first (a GPU tensor has no `__array__`)."""
    if isinstance(ids, (list, tuple, int, np.ndarray, np.integer)):
        return np.asarray(ids)
    import keras  # loaded already when a backend tensor exists

    if keras.ops.is_tensor(ids):
        return keras.ops.convert_to_numpy(ids)
    return np.asarray(ids)


def _pad(rows: Sequence[Sequence[int]], length: int, pad_id: int) -> np.ndarray:
    """`[len(rows), length]` int32 array, rows truncated or padded with `pad_id`."""
    out = np.full((len(rows), length), pad_id, dtype="int32")
    for i, row in enumerate(rows):
        row = list(row)[:length]
        out[i, : len(row)] = row
    return out
