"""Logits processors applied inside the compiled decode loop.

Each step, before the sampler picks a token, the float32 logits `[B, V]` go
through (in Hugging Face's order):

1. the repetition penalty (`RepetitionPenaltyLogitsProcessor`): every token
   already present in the row (its prompt and what it generated so far)
   has its logit divided by the penalty where positive, multiplied by it
   where negative. Presence is a `[B, V]` bool mask carried in the loop
   state, set from the prompts before decoding and updated with each new
   token by a one-hot comparison: static shapes, `keras.ops` only.
2. the minimum length (`MinNewTokensLengthLogitsProcessor`): the stop ids
   get -inf while a row has produced fewer than `min_new_tokens` tokens;
3. the forced last token (`ForcedEOSTokenLogitsProcessor`, encoder-decoder
   models): at the last position a row may fill, every other token gets
   -inf.

Unlike Hugging Face, padding never counts as present: a batch of prompts of
different lengths is penalised per row for its own tokens only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from keras import ops

from keras_transformers.config.validation import (
    check_argument_int,
    check_argument_number,
)


@dataclass(frozen=True)
class LogitsSettings:
    """The static processor settings of one compiled loop.

    Attributes:
        repetition_penalty: 1.0 disables it; > 1 discourages repeats.
        min_new_tokens: the stop ids are masked until a row has generated
            this many tokens (0 disables it).
        forced_eos_token_id: the token produced at a row's last allowed
            position (None disables it).
    """

    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    forced_eos_token_id: int | None = None

    def __post_init__(self):
        # Plain Python numbers: the settings key the compiled loops.
        penalty = check_argument_number(
            "repetition_penalty", self.repetition_penalty, 0, low_open=True
        )
        minimum = check_argument_int("min_new_tokens", self.min_new_tokens, 0)
        forced = check_argument_int(
            "forced_eos_token_id", self.forced_eos_token_id, 0, optional=True
        )
        object.__setattr__(self, "repetition_penalty", penalty)
        object.__setattr__(self, "min_new_tokens", minimum)
        object.__setattr__(self, "forced_eos_token_id", forced)

    @property
    def processes(self) -> bool:
        """Whether a penalty or a minimum length changes the logits (the
        processors beam search does not apply)."""
        return self.repetition_penalty != 1.0 or self.min_new_tokens > 0

    @property
    def tracks_presence(self) -> bool:
        return self.repetition_penalty != 1.0


def initial_presence(token_ids, prompt_mask, vocabulary_size, settings):
    """The `[B, V]` presence mask of the prompts (NumPy), or a `[B, 1]`
    placeholder when no penalty needs it."""
    batch = token_ids.shape[0]
    if not settings.tracks_presence:
        return np.zeros((batch, 1), bool)
    seen = np.zeros((batch, vocabulary_size), bool)
    for row in range(batch):
        seen[row, token_ids[row][prompt_mask[row]]] = True
    return seen


def process_logits(logits, index, seen, min_limits, stop_mask, settings):
    """Applies the processors to one step's logits.

    Args:
        logits: `[B, V]` float32.
        index: the position being produced.
        seen: `[B, V]` bool presence mask (ignored without a penalty).
        min_limits: `[B]` int32; the stop ids are masked while
            `index < min_limits` (the prompt length plus `min_new_tokens`).
        stop_mask: `[V]` bool, True at the stop ids.
        settings: a `LogitsSettings`.

    Returns:
        The processed `[B, V]` logits.
    """
    penalty = settings.repetition_penalty
    if settings.tracks_presence:
        penalised = ops.where(logits > 0, logits / penalty, logits * penalty)
        logits = ops.where(seen, penalised, logits)
    if settings.min_new_tokens > 0:
        early = ops.expand_dims(index < min_limits, -1)  # [B, 1]
        masked = ops.logical_and(early, ops.expand_dims(stop_mask, 0))
        logits = ops.where(masked, float("-inf"), logits)
    return logits


def force_token(logits, where, token_id):
    """`logits [B, V]` with every id but `token_id` at -inf in the rows
    where `where [B]` (or everywhere, a scalar) is True: that token is then
    chosen whatever the sampler."""
    vocabulary = ops.arange(logits.shape[-1], dtype="int32")
    others = ops.not_equal(vocabulary, token_id)[None, :]  # [1, V]
    where = ops.reshape(where, (-1, 1))  # [B, 1] or [1, 1]
    return ops.where(ops.logical_and(where, others), float("-inf"), logits)


def update_presence(seen, token, new, settings):
    """Marks `token [B]` present where `new [B]` (a token was generated)."""
    if not settings.tracks_presence:
        return seen
    vocabulary = ops.arange(seen.shape[-1], dtype="int32")
    hit = ops.equal(ops.expand_dims(vocabulary, 0), ops.expand_dims(token, -1))
    return ops.logical_or(seen, ops.logical_and(hit, ops.expand_dims(new, -1)))


def stop_mask(stop_ids, vocabulary_size):
    """`[V]` bool NumPy array, True at `stop_ids` (all False when there are
    none): an input of the compiled loops, so that every set of stop ids
    runs the same program."""
    mask = np.zeros((vocabulary_size,), bool)
    mask[[i for i in stop_ids or () if 0 <= i < vocabulary_size]] = True
    return mask
