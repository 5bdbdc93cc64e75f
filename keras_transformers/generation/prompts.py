"""Prompts in every accepted form -> lists of token ids, and back."""

from __future__ import annotations

import inspect

import numpy as np
from keras import ops


def encode_text(tokenizer, text: str) -> tuple[list[int], int]:
    """`text` as transformers' `tokenizer(text)` begins it: with the special
    tokens the tokenizer's post-processor puts before the text (Gemma's and
    Llama 3's `<bos>`; none for GPT-2 or SmolLM2), where the tokenizer can
    say (`encode(..., add_special_tokens=True)`); none it would append.

    Returns:
        `(ids, prefix)`: the ids and how many special ids lead them.
    """
    plain = [int(i) for i in tokenizer.encode(text)]
    if "add_special_tokens" not in inspect.signature(tokenizer.encode).parameters:
        return plain, 0
    full = [int(i) for i in tokenizer.encode(text, add_special_tokens=True)]
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            return full[:start] + plain, start
    return plain, 0


def _prompt_rows(model, prompts, ids_key="token_ids", mask_key="padding_mask"):
    """Normalises prompts to a list of id lists; returns (rows, was_text,
    single), `was_text` False for ids, and for text the number of special
    ids leading each row (a non-empty tuple).

    A dict gives its ids under `ids_key` and its (right-padding) mask under
    `mask_key`; strings are encoded with `model.tokenizer` (`encode_text`)."""
    single = isinstance(prompts, str)
    if single:
        prompts = [prompts]
    if isinstance(prompts, dict):
        return _dict_rows(prompts, ids_key, mask_key), False, False
    if isinstance(prompts, (list, tuple)) and any(isinstance(p, str) for p in prompts):
        if not all(isinstance(p, str) for p in prompts):
            raise ValueError(
                "Prompts mix strings and token ids: pass a list of strings or a "
                "list of id lists."
            )
        if getattr(model, "tokenizer", None) is None:
            raise ValueError(
                "Text prompts need a tokenizer: pass token ids, or attach one with "
                "`model.tokenizer = ...` (presets saved with a tokenizer restore it)."
            )
        encoded = [encode_text(model.tokenizer, p) for p in prompts]
        return [ids for ids, _ in encoded], tuple(n for _, n in encoded), single
    if isinstance(prompts, (list, tuple)):
        if prompts and not any(_is_row(p) for p in prompts):
            prompts, single = [prompts], True  # one prompt as a flat id list
        rows = [_row(r, i) for i, r in enumerate(prompts)]
        return rows, False, single
    if not hasattr(prompts, "shape"):
        raise ValueError(
            "`prompts` must be a string, a list of strings, a list of id lists, "
            f"a [batch, length] id array or a dict. Received: {type(prompts).__name__}"
        )
    array = _array(prompts)
    if array.ndim == 1:
        array, single = array[None], True
    if array.ndim != 2:
        raise ValueError(
            "An id array of prompts must have shape [batch, length] or [length]. "
            f"Received shape {array.shape}."
        )
    return [_row(r, i) for i, r in enumerate(array)], False, single


def _is_row(value) -> bool:
    """Whether `value` is a sequence (a row of ids), not a single id."""
    return isinstance(value, (list, tuple)) or len(getattr(value, "shape", ())) > 0


def _array(value) -> np.ndarray:
    """`value` (a tensor, array or nested list) as a NumPy array; ragged
    nesting gives a 0-d object array, which every check rejects."""
    try:
        return np.asarray(
            ops.convert_to_numpy(value) if hasattr(value, "shape") else value
        )
    except ValueError:
        return np.asarray(None)


def _row(row, index):
    """One prompt as a list of ints; raises ValueError unless it is a flat
    sequence of integers."""
    values = _array(row)
    if values.ndim != 1 or (values.size and values.dtype.kind not in "iu"):
        raise ValueError(
            f"Prompt {index} must be a flat list of integer token ids. Received: "
            f"{row!r:.80}"
        )
    return [int(t) for t in values]


def _dict_rows(prompts, ids_key, mask_key):
    """The rows of `{ids_key: [B, T], mask_key: [B, T]}` (right padding)."""
    if ids_key not in prompts:
        raise ValueError(
            f"A dict of prompts needs {ids_key!r} (and optionally {mask_key!r}). "
            f"Received keys: {sorted(prompts)}"
        )
    ids = _array(prompts[ids_key])
    if ids.ndim != 2:
        raise ValueError(
            f"{ids_key!r} must have shape [batch, length]. Received shape {ids.shape}."
        )
    mask = prompts.get(mask_key)
    mask = np.ones_like(ids, bool) if mask is None else _array(mask)
    if np.shape(mask) != ids.shape:
        raise ValueError(
            f"{mask_key!r} shape {np.shape(mask)} does not match {ids_key!r} shape "
            f"{ids.shape}."
        )
    mask = np.asarray(mask).astype(bool)
    return [_row(r[m], i) for i, (r, m) in enumerate(zip(ids, mask))]


def _check_ids(rows, config, noun="prompt", arg="prompts"):
    """Every row is non-empty with ids in [0, vocabulary_size)."""
    if not rows:
        raise ValueError(f"`{arg}` is empty: pass at least one {noun}.")
    for i, row in enumerate(rows):
        if len(row) == 0:
            example = "a BOS id" if noun == "prompt" else "the end token"
            raise ValueError(
                f"{noun.capitalize()} {i} is empty: generation needs at least one "
                f"token (e.g. {example})."
            )
        bad = [t for t in row if not 0 <= int(t) < config.vocabulary_size]
        if bad:
            raise ValueError(
                f"{noun.capitalize()} {i} contains id {int(bad[0])}, outside "
                f"[0, vocabulary_size={config.vocabulary_size}). Check that the "
                "tokenizer matches the model."
            )


def _check_rows(rows, config, total):
    if total > config.max_sequence_length:
        raise ValueError(
            f"Prompt length {max(map(len, rows))} plus max_new_tokens needs {total} positions, "
            f"more than max_sequence_length={config.max_sequence_length}. "
            "Shorten the prompt or lower `max_new_tokens`."
        )


def pad_rows(rows, pad_id):
    """Id rows of different lengths -> a right-padded `[B, T_max]` int32 array."""
    out = np.full((len(rows), max(len(r) for r in rows)), pad_id, "int32")
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out
