"""T5's span-corruption objective: drop random spans of a token sequence
from the input, each replaced by one sentinel token, and ask the decoder
for the dropped spans, each after its sentinel (Raffel et al. 2020, 3.1.4).

    tokens:  The  quick brown fox jumps over the lazy dog
    inputs:  The  <X>   fox  jumps <Y>  the lazy dog </s>
    targets: <X>  quick brown <Y>  over <Z> </s>

Sentinels are ids the vocabulary sets aside (T5: `<extra_id_0>` is the
highest id, then downwards); the i-th dropped span gets `sentinel_ids[i]`,
and the targets end with one more sentinel, then the end token, as T5's
preprocessing writes them. NumPy only: use it in a `tf.data` map through
`tf.numpy_function`, or build the examples ahead, as `span_corruption_pairs`
does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


def noise_mask(length: int, noise_density: float, mean_span_length: float, rng):
    """`[length]` bool mask of the tokens to drop, in `round(length *
    noise_density)` tokens split into `round(noise / mean_span_length)`
    spans (at least one, and never the whole sequence), the span lengths
    and the kept runs between them random, the sequence starting with a
    kept run (T5's `random_spans_noise_mask`)."""
    if length < 2:
        raise ValueError(f"Span corruption needs at least 2 tokens. Received {length}.")
    noise = int(round(length * noise_density))
    noise = min(max(noise, 1), length - 1)
    spans = max(int(round(noise / mean_span_length)), 1)
    spans = min(spans, noise, length - noise)

    def segment(items, parts):
        """`parts` random positive lengths summing to `items`."""
        cuts = np.sort(rng.choice(np.arange(1, items), parts - 1, replace=False))
        return np.diff(np.concatenate([[0], cuts, [items]]))

    noise_lengths = segment(noise, spans)
    kept_lengths = segment(length - noise, spans)
    runs = np.stack([kept_lengths, noise_lengths], axis=1).reshape(-1)
    return np.repeat(np.tile([False, True], spans), runs)


def span_corruption(
    tokens: Sequence[int],
    sentinel_ids: Sequence[int],
    end_token_id: int,
    noise_density: float = 0.15,
    mean_span_length: float = 3.0,
    rng=None,
) -> tuple[np.ndarray, np.ndarray]:
    """One `(inputs, targets)` pair of T5's pretraining task.

    Args:
        tokens: `[T]` token ids, without an end token.
        sentinel_ids: ids for the dropped spans, in order (T5:
            `<extra_id_0>`, `<extra_id_1>`, ...); one more than the spans
            dropped is needed (the targets end with the next sentinel).
        end_token_id: appended to both sides (`</s>`).
        noise_density: fraction of the tokens dropped (T5: 0.15).
        mean_span_length: mean dropped-span length (T5: 3).
        rng: a `numpy.random.Generator` (default: a fresh one).

    Returns:
        `inputs [T - noise + spans + 1]` and `targets [noise + spans + 2]`,
        int32: the kept tokens with a sentinel for each dropped span, and
        each span after its sentinel.

    Raises:
        ValueError: fewer sentinels than the spans need, or fewer than 2 tokens.

    Examples:
        >>> inputs, targets = span_corruption(
        ...     range(5, 15), [99, 98, 97], 1, noise_density=0.2, mean_span_length=2,
        ...     rng=np.random.default_rng(0))
        >>> len(inputs), len(targets), targets[[0, -2, -1]].tolist()  # one span of 2
        (10, 5, [99, 98, 1])
    """
    tokens = np.asarray(list(tokens), dtype="int32")
    rng = rng if rng is not None else np.random.default_rng()
    mask = noise_mask(len(tokens), noise_density, mean_span_length, rng)
    starts = mask & ~np.concatenate([[False], mask[:-1]])  # first token of a span
    spans = int(starts.sum())
    if len(sentinel_ids) < spans + 1:
        raise ValueError(
            f"{spans} dropped spans need {spans + 1} sentinel ids; received "
            f"{len(sentinel_ids)}. Reserve more sentinel tokens or lower "
            "noise_density."
        )
    sentinels = np.asarray(sentinel_ids[: spans + 1], dtype="int32")
    span_of = np.cumsum(starts) - 1  # the last span started at or before each token
    # Inputs: the kept tokens; each dropped span becomes its sentinel.
    inputs = np.where(starts, sentinels[np.maximum(span_of, 0)], tokens)
    inputs = np.concatenate([inputs[~mask | starts], [end_token_id]])
    # Targets: each span after its sentinel, then the next sentinel and the end.
    pieces = []
    for i in range(spans):
        pieces += [sentinels[i : i + 1], tokens[mask & (span_of == i)]]
    pieces.append(np.asarray([sentinels[spans], end_token_id]))
    return inputs.astype("int32"), np.concatenate(pieces).astype("int32")


def span_corruption_pairs(
    sequences: Iterable[Sequence[int]],
    sentinel_ids: Sequence[int],
    end_token_id: int,
    noise_density: float = 0.15,
    mean_span_length: float = 3.0,
    seed: int = 0,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """`span_corruption` over many token sequences (those shorter than 2
    tokens are skipped), one seeded generator for all: the same pairs on
    every run."""
    rng = np.random.default_rng(seed)
    return [
        span_corruption(
            s, sentinel_ids, end_token_id, noise_density, mean_span_length, rng
        )
        for s in sequences
        if len(s) >= 2
    ]
