"""The batches of preference tuning (`DPOModel`): building them from token
id lists, and checking their layout.

The batch layout (`preference_arrays` writes it; `[N, T]` arrays, one row
per example, both completions padded to the same length `T`):

- `chosen_token_ids`, `rejected_token_ids`: int32, the prompt followed by
  the completion, right-padded.
- `chosen_padding_mask`, `rejected_padding_mask`: bool, True on real tokens.
- `chosen_loss_mask`, `rejected_loss_mask`: bool, True on the completion's
  tokens: the tokens whose log-probability counts.
- optional `reference_chosen_logps`, `reference_rejected_logps`: `[N]`
  float32, the reference model's log-probabilities
  (`precompute_reference_logps`), used when `DPOModel` has no reference
  model.

Examples:
    >>> data = preference_arrays([[5, 6]], [[7, 8, 9]], [[3]], max_length=6)
    >>> data["chosen_token_ids"].tolist(), data["chosen_loss_mask"].tolist()
    ([[5, 6, 7, 8, 9, 0]], [[False, False, True, True, True, False]])
    >>> data["rejected_padding_mask"].tolist()
    [[True, True, True, False, False, False]]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

SIDES = ("chosen", "rejected")
INPUT_KEYS = tuple(
    f"{side}_{part}"
    for side in SIDES
    for part in ("token_ids", "padding_mask", "loss_mask")
)
REFERENCE_KEYS = ("reference_chosen_logps", "reference_rejected_logps")


def _positive(name, value):
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int) or value < 1
    ):
        raise ValueError(
            f"`{name}` must be a positive integer or None. Received: {name}={value!r}"
        )


def preference_arrays(
    prompts: Sequence[Sequence[int]],
    chosen: Sequence[Sequence[int]],
    rejected: Sequence[Sequence[int]],
    max_length: int | None = None,
    max_prompt_length: int | None = None,
    pad_token_id: int = 0,
) -> dict:
    """Token id lists -> the padded arrays of `DPOModel.fit` (see the
    module docstring for the keys).

    Args:
        prompts, chosen, rejected: one list of token ids per example each
            (prompts and completions non-empty).
        max_length: length `T` of every row (None: the longest sequence).
            A longer prompt + completion loses the completion's end.
        max_prompt_length: a longer prompt keeps its last tokens (None:
            prompts are not cut).
        pad_token_id: the id written on padding.

    Returns:
        A dict of numpy arrays: `*_token_ids` `[N, T]` int32,
        `*_padding_mask` and `*_loss_mask` `[N, T]` bool.

    Raises ValueError where a prompt or completion is empty, the lists
    differ in length, or a prompt leaves no room for a completion within
    `max_length` (pass a smaller `max_prompt_length`).
    """
    _positive("max_length", max_length)
    _positive("max_prompt_length", max_prompt_length)
    if not len(prompts) == len(chosen) == len(rejected):
        raise ValueError(
            "`prompts`, `chosen` and `rejected` need one entry per example. "
            f"Received: {len(prompts)}, {len(chosen)} and {len(rejected)} entries."
        )
    rows = {side: [] for side in SIDES}  # (ids, prompt length) per example
    for i, prompt in enumerate(prompts):
        prompt = list(prompt)
        if max_prompt_length is not None:
            prompt = prompt[-max_prompt_length:]
        if not prompt:
            raise ValueError(
                f"Example {i} has an empty prompt: the first completion token "
                "needs a token before it (e.g. a BOS token)."
            )
        for side, completions in zip(SIDES, (chosen, rejected)):
            completion = list(completions[i])
            if not completion:
                raise ValueError(f"Example {i} has an empty {side} completion.")
            if max_length is not None and len(prompt) >= max_length:
                raise ValueError(
                    f"Example {i}: its prompt ({len(prompt)} tokens) leaves no "
                    f"room for the {side} completion within max_length="
                    f"{max_length}. Pass max_prompt_length < max_length (the "
                    "prompt then keeps its last tokens) or a larger max_length."
                )
            ids = (prompt + completion)[:max_length]
            rows[side].append((ids, len(prompt)))
    length = max_length or max(len(ids) for r in rows.values() for ids, _ in r)
    arrays = {}
    for side in SIDES:
        n = len(rows[side])
        token_ids = np.full((n, length), pad_token_id, dtype="int32")  # [N, T]
        padding = np.zeros((n, length), dtype=bool)  # [N, T]
        loss = np.zeros((n, length), dtype=bool)  # [N, T]
        for row, (ids, prompt_length) in enumerate(rows[side]):
            token_ids[row, : len(ids)] = ids
            padding[row, : len(ids)] = True
            loss[row, prompt_length : len(ids)] = True
        arrays[f"{side}_token_ids"] = token_ids
        arrays[f"{side}_padding_mask"] = padding
        arrays[f"{side}_loss_mask"] = loss
    return arrays


def _same(a, b):
    return len(a) == len(b) and all(
        x is None or y is None or x == y for x, y in zip(a, b)
    )


def check_preference_batch(batch, needs_reference: bool, has_reference: bool):
    """Raises ValueError for a batch that is not a dict with the DPO keys
    of consistent shapes (see the module docstring).

    Args:
        batch: the dict to check; its arrays' shapes may hold None (traced
            batch dimension).
        needs_reference: whether the two `reference_*_logps` (`[B]`) must
            be there.
        has_reference: whether the model computes the reference
            log-probabilities itself (the batch must then not hold them).
    """
    if not isinstance(batch, dict):
        raise ValueError(
            "A DPO batch is a dict of arrays (see `preference_arrays`). "
            f"Received: {type(batch).__name__}"
        )
    wanted = INPUT_KEYS + (REFERENCE_KEYS if needs_reference else ())
    missing = [key for key in wanted if key not in batch]
    if missing:
        hint = (
            " Without a reference model, precompute them with "
            "`precompute_reference_logps`, or pass `reference=`."
            if any(key in REFERENCE_KEYS for key in missing)
            else ""
        )
        raise ValueError(
            f"The DPO batch lacks {missing}.{hint} It has {sorted(batch)}."
        )
    if has_reference and any(key in batch for key in REFERENCE_KEYS):
        raise ValueError(
            "The batch holds precomputed reference log-probabilities and this "
            "DPOModel has a reference model: drop those keys, or build the "
            "DPOModel with reference=None to use them."
        )
    shape = tuple(batch["chosen_token_ids"].shape)  # [B, T]
    for key in wanted:
        want = shape[:1] if key in REFERENCE_KEYS else shape
        got = tuple(batch[key].shape)
        if len(shape) != 2 or not _same(got, want):
            raise ValueError(
                f"`{key}` has shape {got}; every *_token_ids / *_padding_mask /"
                f" *_loss_mask array must have the shape [batch, length] of "
                f"`chosen_token_ids` {shape} (pad both completions to the same "
                "length) and each reference_*_logps [batch]."
            )


__all__ = ["preference_arrays"]
