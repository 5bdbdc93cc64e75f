"""T5's span-corruption objective (`keras_transformers.data.span_corruption`)."""

import numpy as np
import pytest

from keras_transformers.data import span_corruption, span_corruption_pairs
from keras_transformers.data.span_corruption import noise_mask

SENTINELS = list(range(2999, 2399, -1))  # <extra_id_0> is the highest id
END = 1


def _rebuild(inputs, targets):
    """The original tokens: each sentinel of the inputs replaced by the
    tokens after the same sentinel in the targets."""
    spans, current = {}, None
    for t in targets[:-1]:
        if t in SENTINELS:
            current = spans.setdefault(int(t), [])
        else:
            current.append(int(t))
    out = []
    for t in inputs[:-1]:
        out.extend(spans[int(t)] if t in SENTINELS else [int(t)])
    return out


@pytest.mark.parametrize("length", [2, 3, 10, 57, 512])
@pytest.mark.parametrize("density,mean", [(0.15, 3.0), (0.5, 1.0), (0.3, 8.0)])
def test_inputs_and_targets_rebuild_the_tokens(length, density, mean):
    rng = np.random.default_rng(length)
    tokens = rng.integers(3, 800, length)
    inputs, targets = span_corruption(tokens, SENTINELS, END, density, mean, rng=rng)
    assert _rebuild(inputs, targets) == tokens.tolist()
    assert inputs[-1] == END and targets[-1] == END
    spans = [t for t in inputs if t in SENTINELS]
    # Sentinels in order, and the targets end with the next unused one.
    assert spans == SENTINELS[: len(spans)]
    assert [t for t in targets if t in SENTINELS] == SENTINELS[: len(spans) + 1]
    assert inputs.dtype == targets.dtype == np.int32


def test_noise_mask_density_and_spans():
    rng = np.random.default_rng(0)
    mask = noise_mask(1000, 0.15, 3.0, rng)
    assert mask.sum() == 150 and not mask[0]  # starts with a kept run
    starts = mask & ~np.concatenate([[False], mask[:-1]])
    assert starts.sum() == 50  # round(150 / 3) spans
    # Across many draws the spans average the mean length.
    lengths = [noise_mask(200, 0.15, 3.0, rng) for _ in range(50)]
    assert all(m.sum() == 30 for m in lengths)


def test_pairs_are_seeded_and_skip_short_sequences():
    seqs = [list(range(3, 40)), [5], list(range(3, 20))]
    a = span_corruption_pairs(seqs, SENTINELS, END, seed=7)
    b = span_corruption_pairs(seqs, SENTINELS, END, seed=7)
    assert len(a) == 2
    assert all(np.array_equal(x, y) for p, q in zip(a, b) for x, y in zip(p, q))


def test_too_few_sentinels_and_too_short_are_clear_errors():
    with pytest.raises(ValueError, match="sentinel ids"):
        span_corruption(range(3, 103), [2999, 2998], END, 0.5, 1.0)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        span_corruption([5], SENTINELS, END)
