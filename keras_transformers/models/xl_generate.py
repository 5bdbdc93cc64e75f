"""Generation with Transformer-XL memory: a long prompt is read segment by
segment into the memory, then the standard cached decoding loop continues
from its last part while every step also attends to the memory."""

from __future__ import annotations

import numpy as np

from keras_transformers.generation import generate
from keras_transformers.generation.prompts import _prompt_rows, pad_rows
from keras_transformers.models.transformer_xl import memory_length


def generate_with_memory(model, prompts, **kwargs):
    """`CausalLM.generate` for a model with `position_embedding=
    "transformer_xl"`: with an evaluation memory of M slots, the first
    `p = M * floor((shortest - 1) / M)` prompt tokens of every row (shortest:
    the shortest prompt) are read in segments of M tokens into a fresh
    memory for the batch (`reset_memory(batch_size)`); `generate` then runs
    on the rest of each prompt, its cache and every step attending to the
    memory. Prompts may then be longer than `max_sequence_length`. The
    arguments and results are those of `keras_transformers.generation.generate`.
    """
    m = memory_length(model.config, training=False)
    if m and kwargs.get("stop_strings") is not None:
        raise ValueError(
            "`stop_strings` are not supported with Transformer-XL memory: "
            "pass `stop_token_ids`."
        )
    if not m:  # no memory: the whole prompt at once
        return generate(model, prompts, **kwargs)
    rows, was_text, single = _prompt_rows(model, prompts)
    shortest = min(len(r) for r in rows)
    consumed = (shortest - 1) // m * m
    model.reset_memory(batch_size=len(rows))
    prefix = np.asarray([r[:consumed] for r in rows], "int32").reshape(len(rows), -1)
    for start in range(0, consumed, m):
        model.backbone({"token_ids": prefix[:, start : start + m]})
    tails = [list(r[consumed:]) for r in rows]
    out = generate(model, tails, **kwargs)
    pad = model.config.pad_token_id
    full = [np.concatenate([p, row]) for p, row in zip(prefix, out)]
    if not was_text:
        return pad_rows(full, pad)
    texts = [
        model.tokenizer.decode(_strip(row, pad).tolist()[skip:])
        for row, skip in zip(full, was_text)
    ]
    return texts[0] if single else texts


def _strip(row, pad):
    """`row` without its trailing padding."""
    keep = len(row)
    while keep and row[keep - 1] == pad:
        keep -= 1
    return row[:keep]
