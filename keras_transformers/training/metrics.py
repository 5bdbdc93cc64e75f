"""Token-level metrics that skip padding and accumulate exactly across batches.

Both metrics keep a weighted sum and a weighted token count, so the value
over an epoch is the exact token-level figure, not a mean of per-batch
values. In `model.compile`, Keras passes `sample_weight` only to
`weighted_metrics`; list them there when padding is marked by a sample-weight
mask rather than by `ignore_class`.
"""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from keras_transformers.training.losses import (
    check_ignore_class,
    safe_divide,
    sparse_labels,
    token_cross_entropy,
    token_weights,
)


class _TokenMean(keras.metrics.Metric):
    """Shared state: a weighted sum and a weighted count of tokens."""

    def __init__(self, ignore_class: int | None, name: str, dtype: Any) -> None:
        super().__init__(name=name, dtype=dtype)
        self.ignore_class = check_ignore_class(ignore_class)
        self.total = self.add_variable(
            shape=(), initializer="zeros", dtype="float32", name="total"
        )
        self.count = self.add_variable(
            shape=(), initializer="zeros", dtype="float32", name="count"
        )

    def _values(self, labels: Any, y_pred: Any) -> Any:
        raise NotImplementedError

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        """Accumulates one batch.

        Args:
            y_true: int labels, shape `[B, T]` or `[B]`.
            y_pred: logits or probabilities, shape `[B, T, V]` or `[B, V]`.
            sample_weight: optional weights, shape `[B]` or `[B, T]`.
        """
        y_pred = ops.convert_to_tensor(y_pred)
        labels = sparse_labels(y_true, y_pred)
        weights = token_weights(labels, self.ignore_class, sample_weight)
        values = self._values(labels, y_pred)
        self.total.assign_add(ops.sum(values * weights))
        self.count.assign_add(ops.sum(weights))

    def reset_state(self) -> None:
        self.total.assign(0.0)
        self.count.assign(0.0)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config["ignore_class"] = self.ignore_class
        return config


@keras.saving.register_keras_serializable(package="keras_transformers")
class MaskedAccuracy(_TokenMean):
    """Top-1 accuracy of sparse labels over non-ignored positions.

    `accuracy = sum(w * m * [argmax(y_pred) == y_true]) / sum(w * m)`, with
    `m` = 0 where `y_true == ignore_class` and `w` the sample weight.

    Args:
        ignore_class: label whose positions are skipped (e.g. the pad id), or
            None.
        name: name of the metric.
        dtype: dtype of the result (the state is always float32).

    Returns:
        `result()` is a scalar, shape `()`, in `[0, 1]` (0 before any token).

    Example:

    ```python
    model.compile(
        optimizer="adamw",
        loss=MaskedSparseCategoricalCrossentropy(ignore_class=0),
        metrics=[MaskedAccuracy(ignore_class=0)],
    )
    ```
    """

    def __init__(
        self,
        ignore_class: int | None = None,
        name: str = "masked_accuracy",
        dtype: Any = None,
    ) -> None:
        super().__init__(ignore_class=ignore_class, name=name, dtype=dtype)

    def _values(self, labels: Any, y_pred: Any) -> Any:
        predicted = ops.cast(ops.argmax(y_pred, axis=-1), "int32")
        return ops.cast(ops.equal(predicted, labels), "float32")

    def result(self) -> Any:
        return ops.cast(safe_divide(self.total, self.count), self.dtype)


@keras.saving.register_keras_serializable(package="keras_transformers")
class Perplexity(_TokenMean):
    """Token perplexity: `exp(sum(w * m * NLL) / sum(w * m))`.

    The negative log-likelihood is summed and counted across every batch
    seen since the last reset, so the epoch value is the exact corpus
    perplexity, not a mean of per-batch perplexities. Computed in float32.

    Args:
        from_logits: whether `y_pred` are logits (default) or probabilities.
        ignore_class: label whose positions are skipped (e.g. the pad id), or
            None.
        name: name of the metric.
        dtype: dtype of the result (the state is always float32).

    Returns:
        `result()` is a scalar, shape `()`, >= 1 (1 before any token).

    Example:

    ```python
    metric = Perplexity(ignore_class=0)
    metric.update_state(labels, logits)  # [B, T], [B, T, V]
    float(metric.result())
    ```
    """

    def __init__(
        self,
        from_logits: bool = True,
        ignore_class: int | None = None,
        name: str = "perplexity",
        dtype: Any = None,
    ) -> None:
        super().__init__(ignore_class=ignore_class, name=name, dtype=dtype)
        self.from_logits = bool(from_logits)

    def _values(self, labels: Any, y_pred: Any) -> Any:
        return token_cross_entropy(
            labels,
            y_pred,
            from_logits=self.from_logits,
            ignore_class=self.ignore_class,
        )

    def result(self) -> Any:
        return ops.cast(ops.exp(safe_divide(self.total, self.count)), self.dtype)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config["from_logits"] = self.from_logits
        return config
