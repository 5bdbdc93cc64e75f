"""Dynamic masked-LM masking (BERT's 15% / 80-10-10 recipe) in NumPy, and a
`keras.utils.PyDataset` that masks every batch afresh for `fit()`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np


def _check_rate(name: str, value: Any, low_open: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not (0 < value <= 1 if low_open else 0 <= value <= 1):
        interval = "(0, 1]" if low_open else "[0, 1]"
        raise ValueError(f"`{name}` must be in {interval}. Received: {value!r}.")
    return float(value)


class MaskedLMMasker:
    """Chooses tokens to predict and corrupts them, as in BERT pre-training.

    In each sequence, `round(mask_rate * n)` of its `n` maskable tokens (at
    least one, at most `max_predictions`) are chosen uniformly at random;
    special tokens (`[CLS]`, `[SEP]`, `[PAD]`, ...) and padding are never
    chosen. Of the chosen tokens, a fraction `random_rate` is replaced by
    a random non-special token, `unchanged_rate` is left as it is, and the
    rest (80% by default) becomes `mask_token_id`.

    Args:
        vocabulary_size: Number of token ids.
        mask_token_id: Id of `[MASK]`.
        special_token_ids: Ids never chosen, nor drawn as random tokens.
        mask_rate: Fraction of the maskable tokens to predict.
        max_predictions: Prediction slots per sequence, `P`; defaults to
            `ceil(mask_rate * sequence_length)`, which never drops any.
        random_rate: Fraction of chosen tokens replaced by a random token.
        unchanged_rate: Fraction of chosen tokens left unchanged.
        seed: Seed of the masker's own random generator (used when a call
            passes no `rng`).

    Example:

    ```python
    masker = MaskedLMMasker.from_tokenizer(tokenizer, seed=0)
    m = masker(x["token_ids"], x["padding_mask"])
    model.fit({**x, "token_ids": m["token_ids"],
               "mask_positions": m["mask_positions"]},
              m["labels"], sample_weight=m["sample_weight"])
    ```
    """

    def __init__(
        self,
        vocabulary_size: int,
        mask_token_id: int,
        special_token_ids: Sequence[int] = (),
        *,
        mask_rate: float = 0.15,
        max_predictions: int | None = None,
        random_rate: float = 0.1,
        unchanged_rate: float = 0.1,
        seed: int | None = None,
    ) -> None:
        if not isinstance(vocabulary_size, int) or vocabulary_size < 2:
            raise ValueError(
                f"`vocabulary_size` must be an int >= 2. Received: {vocabulary_size!r}."
            )
        if not 0 <= int(mask_token_id) < vocabulary_size:
            raise ValueError(
                f"`mask_token_id` must be in [0, {vocabulary_size}). Received: "
                f"{mask_token_id!r}."
            )
        if max_predictions is not None and (
            not isinstance(max_predictions, int) or max_predictions < 1
        ):
            raise ValueError(
                f"`max_predictions` must be a positive int or None. Received: "
                f"{max_predictions!r}."
            )
        self.mask_rate = _check_rate("mask_rate", mask_rate, low_open=True)
        self.random_rate = _check_rate("random_rate", random_rate)
        self.unchanged_rate = _check_rate("unchanged_rate", unchanged_rate)
        if self.random_rate + self.unchanged_rate > 1:
            raise ValueError("`random_rate + unchanged_rate` must be at most 1.")
        self.vocabulary_size = vocabulary_size
        self.mask_token_id = int(mask_token_id)
        self.special_token_ids = tuple(sorted({int(i) for i in special_token_ids}))
        self.max_predictions = max_predictions
        self._random_ids = np.setdiff1d(
            np.arange(vocabulary_size), self.special_token_ids
        ).astype("int32")
        if not len(self._random_ids):
            raise ValueError("Every id is special: there is no token to draw.")
        self._rng = np.random.default_rng(seed)

    @classmethod
    def from_tokenizer(cls, tokenizer, **kwargs: Any) -> MaskedLMMasker:
        """A masker for a `WordPieceTokenizer` (or `BertPreprocessor`).

        Args:
            tokenizer: The tokenizer; its special tokens are never masked.
            **kwargs: Other arguments (`mask_rate`, `seed`, ...).
        """
        tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
        return cls(
            tokenizer.vocabulary_size,
            tokenizer.mask_token_id,
            tokenizer.special_token_ids,
            **kwargs,
        )

    def num_predictions(self, sequence_length: int) -> int:
        """`P`, the prediction slots per sequence of this length."""
        return self.max_predictions or max(
            1, math.ceil(self.mask_rate * sequence_length)
        )

    def __call__(
        self,
        token_ids: Any,
        padding_mask: Any = None,
        rng: np.random.Generator | None = None,
    ) -> dict[str, np.ndarray]:
        """Masks a batch.

        Args:
            token_ids: `[batch, length]` (or `[length]`) integer ids.
            padding_mask: Same shape, true / 1 on real tokens; padding is
                never chosen. Defaults to all real.
            rng: A NumPy `Generator`; defaults to the masker's own.

        Returns:
            A dict of NumPy arrays: `token_ids` (`[B, T]` int32, corrupted),
            `mask_positions` (`[B, P]` int32), `labels` (`[B, P]` int32, the
            original tokens there) and `sample_weight` (`[B, P]` float32, 0
            on unused slots, whose position and label are 0).
        """
        rng = self._rng if rng is None else rng
        ids = np.asarray(token_ids)
        single = ids.ndim == 1
        ids = ids[None] if single else ids
        if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(
                f"`token_ids` must be integers of shape [batch, length]. "
                f"Received {ids.dtype} of shape {ids.shape}."
            )
        batch, length = ids.shape
        maskable = ~np.isin(ids, self.special_token_ids)
        if padding_mask is not None:
            maskable &= np.asarray(padding_mask).reshape(ids.shape).astype(bool)
        slots = self.num_predictions(length)
        count = maskable.sum(axis=1)
        wanted = np.where(
            count > 0,
            np.minimum(slots, np.maximum(1, np.round(self.mask_rate * count))),
            0,
        ).astype("int64")

        # A uniform random subset of size `wanted` of each row's maskable tokens.
        keys = np.where(maskable, rng.random((batch, length)), 2.0)
        chosen = np.argsort(keys, axis=1)[:, :slots]
        chosen = np.pad(chosen, ((0, 0), (0, slots - chosen.shape[1])))
        valid = np.arange(slots)[None, :] < wanted[:, None]
        positions = np.sort(np.where(valid, chosen, length), axis=1)
        positions = np.where(valid, positions, 0).astype("int32")
        labels = np.where(valid, np.take_along_axis(ids, positions, axis=1), 0)

        draw = rng.random((batch, slots))
        to_mask = draw < 1.0 - self.random_rate - self.unchanged_rate
        to_random = ~to_mask & (draw < 1.0 - self.unchanged_rate)
        random_ids = self._random_ids[
            rng.integers(len(self._random_ids), size=draw.shape)
        ]
        values = np.where(
            to_mask, self.mask_token_id, np.where(to_random, random_ids, labels)
        )
        masked = ids.astype("int32", copy=True)
        rows, cols = np.nonzero(valid)
        masked[rows, positions[rows, cols]] = values[rows, cols]
        out = {
            "token_ids": masked,
            "mask_positions": positions,
            "labels": labels.astype("int32"),
            "sample_weight": valid.astype("float32"),
        }
        return {k: v[0] for k, v in out.items()} if single else out


class MaskedLMDataset(keras.utils.PyDataset):
    """Batches for `BertMaskedLM.fit`, masked afresh every epoch.

    Each batch is `(x, labels, sample_weight)` with `x = {"token_ids",
    "segment_ids", "padding_mask", "mask_positions"}`. Batch `i` of epoch
    `e` is masked with `np.random.default_rng([seed, e, i])`: fresh masks
    every epoch (Keras calls `on_epoch_end`), reproducible for a seed, and
    the same with worker threads or processes. Works on every backend.

    Args:
        inputs: `{"token_ids", "segment_ids", "padding_mask"}` NumPy arrays
            (what `BertPreprocessor` returns); the last two are optional.
        masker: The `MaskedLMMasker`.
        batch_size: Sequences per batch (the last batch may be smaller).
        shuffle: Shuffle the sequences every epoch.
        seed: Seed of the masks and the order; None picks one at random.
        **kwargs: `keras.utils.PyDataset` arguments (`workers`,
            `use_multiprocessing`, `max_queue_size`).

    Example:

    ```python
    x = preprocessor(texts)
    data = MaskedLMDataset(x, MaskedLMMasker.from_tokenizer(tokenizer), 32)
    model.fit(data, epochs=3)
    ```
    """

    def __init__(
        self,
        inputs: dict[str, Any],
        masker: MaskedLMMasker,
        batch_size: int = 32,
        *,
        shuffle: bool = True,
        seed: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if not isinstance(inputs, dict) or "token_ids" not in inputs:
            raise ValueError("`inputs` must be a dict with at least 'token_ids'.")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(
                f"`batch_size` must be a positive int. Received: {batch_size!r}."
            )
        ids = np.asarray(inputs["token_ids"]).astype("int32")
        if ids.ndim != 2 or not len(ids):
            raise ValueError(
                f"`token_ids` must be [batch, length]. Received {ids.shape}."
            )
        self.arrays = {"token_ids": ids}
        for key in ("segment_ids", "padding_mask"):
            value = inputs.get(key)
            value = (
                np.zeros_like(ids) if value is None and key == "segment_ids" else value
            )
            value = np.ones_like(ids) if value is None else value
            self.arrays[key] = np.asarray(value).astype("int32").reshape(ids.shape)
        self.masker = masker
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = (
            int(np.random.SeedSequence().entropy % 2**63) if seed is None else seed
        )
        self.epoch = 0
        self._order = self._make_order()

    def _make_order(self) -> np.ndarray:
        n = len(self.arrays["token_ids"])
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, self.epoch]).permutation(n)

    def __len__(self) -> int:
        return math.ceil(len(self.arrays["token_ids"]) / self.batch_size)

    def __getitem__(self, index: int):
        if not 0 <= index < len(self):
            raise IndexError(f"Batch {index} out of range [0, {len(self)}).")
        rows = self._order[index * self.batch_size : (index + 1) * self.batch_size]
        x = {k: v[rows] for k, v in self.arrays.items()}
        rng = np.random.default_rng([self.seed, self.epoch, index])
        m = self.masker(x["token_ids"], x["padding_mask"], rng=rng)
        x["token_ids"] = m["token_ids"]
        x["mask_positions"] = m["mask_positions"]
        return x, m["labels"], m["sample_weight"]

    def on_epoch_end(self) -> None:
        """Moves to the next epoch: new masks and (if `shuffle`) a new order."""
        self.epoch += 1
        self._order = self._make_order()
