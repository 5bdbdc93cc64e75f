"""How `generate()` resolves its settings: explicit arguments, else the
model's `generation_config`, else the defaults; and the checks of the
arguments shared by the generate functions."""

from __future__ import annotations

import numbers

import numpy as np

from keras_transformers.config.validation import check_argument_int
from keras_transformers.generation.config import generation_config

DEFAULT_MAX_NEW_TOKENS = 32


def _stop_ids(model, stop_token_ids):
    """The ids that end a row. "auto": the generation config's end ids,
    else the model config's, else the tokenizer's."""
    if isinstance(stop_token_ids, str) and stop_token_ids == "auto":
        eos = generation_config(model).eos_token_id
        if eos is None and model.config.eos_token_id is not None:
            eos = (model.config.eos_token_id,)
        if eos is None and getattr(model, "tokenizer", None) is not None:
            token = getattr(model.tokenizer, "eos_token_id", None)
            eos = None if token is None else (token,)
        return () if eos is None else tuple(int(t) for t in eos)
    if stop_token_ids is None:
        return ()
    if isinstance(stop_token_ids, np.ndarray):
        ids = tuple(stop_token_ids.ravel().tolist())
    elif isinstance(stop_token_ids, (list, tuple, set, frozenset)):
        ids = tuple(stop_token_ids)
    else:
        ids = (stop_token_ids,)
    vocab = model.config.vocabulary_size
    for token in ids:
        if isinstance(token, bool) or not isinstance(token, numbers.Integral):
            ok = False
        else:
            ok = 0 <= token < vocab
        if not ok:
            raise ValueError(
                "`stop_token_ids` must be 'auto', None, an id or a list of ids "
                f"(integers in [0, vocabulary_size={vocab})). Received: "
                f"{stop_token_ids!r}"
            )
    return tuple(int(t) for t in ids)


def check_run_arguments(seed, stream=None) -> None:
    """Checks the `seed` and `stream` arguments of the generate functions."""
    check_argument_int("seed", seed, 0, optional=True)
    if stream is not None and not callable(stream):
        raise ValueError(
            "`stream` must be a callable taking a [batch] array of new tokens. "
            f"Received: {type(stream).__name__}"
        )


def _pick(value, default, fallback):
    """The first of (explicit value, generation-config default) that is set."""
    if value is not None:
        return value
    return fallback if default is None else default


def _max_new_tokens(value, defaults, lengths, config):
    if value is None and defaults.max_new_tokens is not None:
        value = defaults.max_new_tokens
    elif value is None and defaults.max_length is not None:
        limit = min(defaults.max_length, config.max_sequence_length)
        value = max(1, limit - int(lengths.max()))
    elif value is None:
        value = DEFAULT_MAX_NEW_TOKENS
    return check_argument_int("max_new_tokens", value, 1)
