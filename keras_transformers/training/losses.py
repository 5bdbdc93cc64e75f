"""Token-level cross-entropy that ignores padding and survives mixed precision.

Keras' built-in `SparseCategoricalCrossentropy(ignore_class=...)` zeroes the
ignored positions but its default reduction still divides by *all* positions,
so padding dilutes the loss. `MaskedSparseCategoricalCrossentropy` divides by
the (weighted) number of real tokens instead, supports label smoothing on
sparse targets, and always computes in float32.
"""

from __future__ import annotations

import numbers
from typing import Any

import keras
from keras import ops

from keras_transformers.backend import scale_loss_for_distribution
from keras_transformers.backend.cross_entropy import sparse_cross_entropy


def check_ignore_class(ignore_class: Any) -> int | None:
    """Validates `ignore_class` (an int or None) and returns it."""
    if ignore_class is None:
        return None
    if isinstance(ignore_class, bool) or not isinstance(ignore_class, numbers.Integral):
        raise ValueError(
            "`ignore_class` must be an integer label or None. "
            f"Received: ignore_class={ignore_class!r}"
        )
    return int(ignore_class)


def safe_divide(numerator: Any, denominator: Any) -> Any:
    """`numerator / denominator`, or 0 where the denominator is 0.

    Unlike a plain `where(d == 0, 0, n / d)`, the division never sees a zero,
    so gradients stay finite on every backend.
    """
    numerator = ops.convert_to_tensor(numerator)
    denominator = ops.convert_to_tensor(denominator)
    nonzero = ops.not_equal(denominator, 0.0)
    safe = ops.where(nonzero, denominator, ops.ones_like(denominator))
    return ops.where(nonzero, numerator / safe, ops.zeros_like(numerator))


def sparse_labels(y_true: Any, y_pred: Any) -> Any:
    """Returns `y_true` as int32 with the rank of `y_pred` minus one.

    Args:
        y_true: integer (or integral float) labels, shape `[B, T]`, `[B]`, or
            the same with a trailing axis of size 1.
        y_pred: scores, shape `[B, T, V]` or `[B, V]`.

    Returns:
        int32 labels, shape `y_pred.shape[:-1]`.
    """
    y_true = ops.convert_to_tensor(y_true)
    if len(y_true.shape) == len(y_pred.shape) and y_true.shape[-1] == 1:
        y_true = ops.squeeze(y_true, axis=-1)
    return ops.cast(y_true, "int32")


def token_weights(
    labels: Any, ignore_class: int | None, sample_weight: Any = None
) -> Any:
    """Per-position float32 weights: 0 where ignored, else the sample weight.

    Args:
        labels: int labels, shape `[B, T]` (or `[B]`).
        ignore_class: label whose positions get weight 0, or None.
        sample_weight: optional weights broadcastable from the left: `[B]`,
            `[B, T]` or `[B, T, 1]`.

    Returns:
        float32 weights, shape `labels.shape`.
    """
    if ignore_class is None:
        weights = ops.ones(ops.shape(labels), dtype="float32")
    else:
        weights = ops.cast(ops.not_equal(labels, ignore_class), "float32")
    if sample_weight is None:
        return weights
    sample_weight = ops.cast(ops.convert_to_tensor(sample_weight), "float32")
    rank = len(labels.shape)
    if len(sample_weight.shape) == rank + 1 and sample_weight.shape[-1] == 1:
        sample_weight = ops.squeeze(sample_weight, axis=-1)
    while len(sample_weight.shape) < rank:
        sample_weight = ops.expand_dims(sample_weight, axis=-1)
    return weights * sample_weight


def token_cross_entropy(
    labels: Any,
    y_pred: Any,
    from_logits: bool = True,
    label_smoothing: float = 0.0,
    ignore_class: int | None = None,
) -> Any:
    """Unreduced float32 cross-entropy of sparse labels.

    `loss = (1 - eps) * NLL + eps * mean_v(-log p_v)`, the sparse form of
    smoothing the one-hot target to `(1 - eps) * onehot + eps / V`.

    Args:
        labels: int labels, shape `[B, T]` (or `[B]`). Positions equal to
            `ignore_class` may hold any value (even out of range).
        y_pred: logits (or probabilities if `from_logits=False`), shape
            `[B, T, V]` (or `[B, V]`), any float dtype.
        from_logits: whether `y_pred` are unnormalised logits.
        label_smoothing: `eps` in `[0, 1]`.
        ignore_class: label whose positions are set to 0, or None.

    Returns:
        float32 per-position loss, shape `labels.shape`; 0 at ignored positions.
    """
    y_pred = ops.cast(y_pred, "float32")
    valid = None
    if ignore_class is not None:
        valid = ops.not_equal(labels, ignore_class)
        labels = ops.where(valid, labels, ops.zeros_like(labels))
    index = ops.expand_dims(labels, axis=-1)
    if from_logits:
        # PyTorch: one [B, T, V] buffer for forward and backward (see
        # backend/cross_entropy.py). Elsewhere one fused log-softmax over the
        # vocabulary; a logsumexp spelled out costs ~3 more passes.
        loss = sparse_cross_entropy(y_pred, labels, label_smoothing)
        log_probs = ops.log_softmax(y_pred, axis=-1) if loss is None else None
    else:
        probs = y_pred / ops.sum(y_pred, axis=-1, keepdims=True)
        log_probs = ops.log(ops.clip(probs, keras.config.epsilon(), 1.0))
    if log_probs is not None:
        loss = -ops.squeeze(ops.take_along_axis(log_probs, index, axis=-1), axis=-1)
        if label_smoothing:
            uniform = -ops.mean(log_probs, axis=-1)
            loss = (1.0 - label_smoothing) * loss + label_smoothing * uniform
    if valid is not None:
        loss = ops.where(valid, loss, ops.zeros_like(loss))
    return loss


@keras.saving.register_keras_serializable(package="keras_transformers")
class MaskedSparseCategoricalCrossentropy(keras.losses.Loss):
    """Sparse cross-entropy averaged over real tokens only.

    Positions whose label equals `ignore_class` contribute nothing, and the
    mean divides by the weighted count of the remaining positions:

    `loss = sum(w * m * ce) / sum(w * m)`

    where `ce` is the per-position cross-entropy, `m` is 0 at ignored
    positions and 1 elsewhere, and `w` is `sample_weight` (1 when absent).
    So a padded batch gives exactly the mean over its real tokens, whether the
    padding is marked by `ignore_class`, by a 0/1 `sample_weight` mask, or
    both. Note this differs from Keras' built-in losses, whose
    `"sum_over_batch_size"` divides by the number of positions regardless of
    weights. Keras tensor masks (`_keras_mask`) are not read: mark padding
    with `ignore_class` or `sample_weight`.

    The computation is float32 whatever the logits dtype (float16/bfloat16
    logits from a mixed-precision policy are upcast before the softmax).

    Args:
        from_logits: whether `y_pred` are logits (default) or probabilities
            (renormalised to sum to 1 and clipped to
            `[keras.config.epsilon(), 1]` before the log, as Keras does).
        label_smoothing: `eps` in `[0, 1]`; the loss becomes
            `(1 - eps) * NLL + eps * mean_over_vocab(-log_softmax)`.
        ignore_class: label to ignore (e.g. the pad id 0, or -100), or None.
        reduction: `"sum_over_batch_size"` / `"mean"` /
            `"mean_with_sample_weight"` (all: the weighted mean above),
            `"sum"` (`sum(w * m * ce)`), or `None` / `"none"` (per-position
            `w * m * ce`).
        name: name of the loss.

    Returns:
        Calling the loss with `y_true` int `[B, T]` (or `[B]`) and `y_pred`
        `[B, T, V]` (or `[B, V]`), plus an optional `sample_weight` `[B]` or
        `[B, T]`, returns a float32 scalar, shape `()` (or `[B, T]` with
        reduction None). A batch with no real token gives 0.

    Example:

    ```python
    loss = MaskedSparseCategoricalCrossentropy(ignore_class=0,
                                               label_smoothing=0.1)
    model.compile(optimizer="adamw", loss=loss)
    ```
    """

    def __init__(
        self,
        from_logits: bool = True,
        label_smoothing: float = 0.0,
        ignore_class: int | None = None,
        reduction: str | None = "sum_over_batch_size",
        name: str = "masked_sparse_categorical_crossentropy",
    ) -> None:
        super().__init__(name=name, reduction=reduction, dtype="float32")
        ok = isinstance(label_smoothing, numbers.Real) and 0 <= label_smoothing <= 1
        if isinstance(label_smoothing, bool) or not ok:
            raise ValueError(
                "`label_smoothing` must be a number in [0, 1]. "
                f"Received: label_smoothing={label_smoothing!r}"
            )
        self.from_logits = bool(from_logits)
        self.label_smoothing = float(label_smoothing)
        self.ignore_class = check_ignore_class(ignore_class)

    def call(self, y_true: Any, y_pred: Any) -> Any:
        """Unweighted per-position loss, float32, shape `y_pred.shape[:-1]`."""
        labels = sparse_labels(y_true, y_pred)
        return token_cross_entropy(
            labels,
            y_pred,
            from_logits=self.from_logits,
            label_smoothing=self.label_smoothing,
            ignore_class=self.ignore_class,
        )

    def __call__(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> Any:
        with keras.name_scope(self.name):
            y_pred = ops.convert_to_tensor(y_pred)
            labels = sparse_labels(y_true, y_pred)
            losses = token_cross_entropy(
                labels,
                y_pred,
                from_logits=self.from_logits,
                label_smoothing=self.label_smoothing,
                ignore_class=self.ignore_class,
            )
            weights = token_weights(labels, self.ignore_class, sample_weight)
            weighted = losses * weights
            if self.reduction is None or self.reduction == "none":
                return weighted
            total = ops.sum(weighted)
            if self.reduction == "sum":
                return total
            return scale_loss_for_distribution(safe_divide(total, ops.sum(weights)))

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            {
                "from_logits": self.from_logits,
                "label_smoothing": self.label_smoothing,
                "ignore_class": self.ignore_class,
            }
        )
        return config
