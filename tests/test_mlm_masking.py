"""Masked-LM masking (`MaskedLMMasker`, `MaskedLMDataset`): BERT's 80/10/10
statistics, invariants, fresh masks each epoch, and `fit` of a
`BertMaskedLM` from raw text through the preprocessor."""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest
from wordpiece_samples import DOCS, tokenizers

from keras_transformers.preprocessing import (
    BertPreprocessor,
    MaskedLMDataset,
    MaskedLMMasker,
    load_preprocessor,
)

pytest.importorskip("transformers")


def _random_batch(rng, batch=2000, length=128, vocab=1000):
    ids = rng.integers(5, vocab, size=(batch, length)).astype("int32")
    lengths = rng.integers(3, length + 1, size=batch)
    mask = np.arange(length)[None] < lengths[:, None]
    ids[:, 0] = 2
    ids[np.arange(batch), lengths - 1] = 3
    ids[~mask] = 0
    ids[rng.random(ids.shape) < 0.02] = 1  # a few [UNK]: special, never masked
    return ids, mask


def test_masker_statistics():
    ids, mask = _random_batch(np.random.default_rng(1))
    masker = MaskedLMMasker(1000, 4, (0, 1, 2, 3, 4), seed=0)
    out = masker(ids, mask)
    weight = out["sample_weight"].astype(bool)
    maskable = mask & (ids > 4)
    assert abs(weight.sum() / maskable.sum() - 0.15) < 0.005
    rows = np.repeat(np.arange(len(ids))[:, None], weight.shape[1], axis=1)[weight]
    now = out["token_ids"][rows, out["mask_positions"][weight]]
    before = out["labels"][weight]
    fractions = [np.mean(now == 4), np.mean((now != 4) & (now != before))]
    fractions.append(np.mean(now == before))
    np.testing.assert_allclose(fractions, [0.8, 0.1, 0.1], atol=0.01)


def test_masker_invariants():
    rng = np.random.default_rng(2)
    ids, mask = _random_batch(rng, batch=300, length=40, vocab=50)
    masker = MaskedLMMasker(50, 4, (0, 1, 2, 3, 4), seed=3)
    out = masker(ids, mask)
    positions, weight = out["mask_positions"], out["sample_weight"].astype(bool)
    assert positions.shape == (300, math.ceil(0.15 * 40))
    assert {v.dtype.name for v in out.values()} == {"int32", "float32"}
    for i in range(len(ids)):
        chosen = positions[i][weight[i]]
        assert (np.diff(chosen) > 0).all()  # sorted, no repeats
        assert mask[i, chosen].all() and (ids[i, chosen] > 4).all()
        np.testing.assert_array_equal(out["labels"][i][weight[i]], ids[i, chosen])
        assert (
            not positions[i][~weight[i]].any()
            and not out["labels"][i][~weight[i]].any()
        )
        changed = np.flatnonzero(out["token_ids"][i] != ids[i])
        assert set(changed) <= set(chosen)
        assert (out["token_ids"][i, changed] != 0).all()
        assert weight[i].sum() == max(1, round(0.15 * (mask[i] & (ids[i] > 4)).sum()))
    # Random replacements are never special tokens; a seed reproduces.
    replaced = out["token_ids"][(out["token_ids"] != ids) & (out["token_ids"] != 4)]
    assert len(replaced) and (replaced > 4).all()
    again = MaskedLMMasker(50, 4, (0, 1, 2, 3, 4), seed=3)(ids, mask)
    np.testing.assert_array_equal(again["token_ids"], out["token_ids"])
    with pytest.raises(ValueError, match="mask_rate"):
        MaskedLMMasker(50, 4, mask_rate=0)
    with pytest.raises(ValueError, match="at most 1"):
        MaskedLMMasker(50, 4, random_rate=0.6, unchanged_rate=0.6)


def test_masked_lm_dataset_masks_afresh_each_epoch():
    tokenizer = tokenizers(True)[0]
    x = BertPreprocessor(tokenizer, 32)(DOCS[:10], DOCS[10:20])
    masker = MaskedLMMasker.from_tokenizer(tokenizer)
    data = MaskedLMDataset(x, masker, batch_size=4, seed=0)
    assert len(data) == 3
    batch, labels, weights = data[0]
    assert set(batch) == {"token_ids", "segment_ids", "padding_mask", "mask_positions"}
    assert batch["token_ids"].shape == (4, 32)
    assert labels.shape == weights.shape == (4, math.ceil(0.15 * 32))
    np.testing.assert_array_equal(data[0][0]["token_ids"], batch["token_ids"])
    data.on_epoch_end()
    assert not np.array_equal(data[0][0]["mask_positions"], batch["mask_positions"])
    assert data[2][0]["token_ids"].shape == (2, 32)


def test_fit_bert_masked_lm_from_raw_text(tmp_path):
    from keras_transformers.models import BertMaskedLM

    tokenizer = tokenizers(True)[0]
    pre = BertPreprocessor(tokenizer, sequence_length=32)
    x = pre([d[:300] for d in DOCS[:16]])
    data = MaskedLMDataset(
        x, MaskedLMMasker.from_tokenizer(tokenizer, seed=0), 8, seed=0
    )
    model = BertMaskedLM.from_preset(
        "bert_tiny", vocabulary_size=tokenizer.vocabulary_size, max_sequence_length=32
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    history = model.fit(data, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    # Saved with the preset, under `tokenizer/`.
    model.tokenizer = pre
    model.save_to_preset(tmp_path)
    restored = load_preprocessor(tmp_path / "tokenizer")
    np.testing.assert_array_equal(
        restored(DOCS[:2])["token_ids"], pre(DOCS[:2])["token_ids"]
    )
