"""Prompts in every accepted form -> lists of token ids, and back."""

from __future__ import annotations

import numpy as np
from keras import ops


def _prompt_rows(model, prompts, ids_key="token_ids", mask_key="padding_mask"):
    """Normalises prompts to a list of id lists; returns (rows, was_text, single).

    A dict gives its ids under `ids_key` and its (right-padding) mask under
    `mask_key`; strings are encoded with `model.tokenizer`."""
    single = isinstance(prompts, str)
    if single:
        prompts = [prompts]
    if isinstance(prompts, dict):
        ids = np.asarray(ops.convert_to_numpy(prompts[ids_key]))
        mask = prompts.get(mask_key)
        mask = (
            np.ones_like(ids, bool)
            if mask is None
            else np.asarray(ops.convert_to_numpy(mask)).astype(bool)
        )
        return [list(r[m]) for r, m in zip(ids, mask)], False, False
    if isinstance(prompts, (list, tuple)) and prompts and isinstance(prompts[0], str):
        if getattr(model, "tokenizer", None) is None:
            raise ValueError(
                "Text prompts need a tokenizer: pass token ids, or attach one with "
                "`model.tokenizer = ...` (presets saved with a tokenizer restore it)."
            )
        return [list(model.tokenizer.encode(p)) for p in prompts], True, single
    array = (
        prompts if isinstance(prompts, (list, tuple)) else ops.convert_to_numpy(prompts)
    )
    if isinstance(array, np.ndarray) and array.ndim == 1:
        array = array[None]
        single = True
    rows = [list(np.asarray(r).reshape(-1)) for r in array]
    return rows, False, single


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
    _check_ids(rows, config)
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
