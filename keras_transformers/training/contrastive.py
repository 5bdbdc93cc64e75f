"""Contrastive training of sentence embeddings with in-batch negatives.

The loss is sentence-transformers' `MultipleNegativesRankingLoss` (InfoNCE
with in-batch negatives; van den Oord et al., 2018). For a batch of `B`
(anchor, positive) pairs with embeddings `a_i`, `p_j`, each anchor scores
every positive of the batch, and optional hard negatives `n_kj` as extra
columns:

    s_ij = scale * sim(a_i, d_j),   d = [p_1..p_B, n_11..n_1B, ..., n_K1..n_KB]
    loss_i = logsumexp_j(s_ij) - s_ii

(cross-entropy with the anchor's own positive as the target; `sim` is the
cosine by default, `scale` 20). The symmetric variant
(`MultipleNegativesSymmetricRankingLoss`) averages it with the loss of each
positive over the anchors, `logsumexp_j(s'_ij) - s'_ii` with
`s'_ij = scale * sim(p_i, a_j)`. The batch's mean is the loss.

This module is the model side: `multiple_negatives_ranking_loss` on
embeddings and `ContrastiveEmbedder`, which trains a `TextEmbedder` with
`compile()` / `fit()`. The batch layout, and `contrastive_arrays` that
builds it from strings, are in `keras_transformers.training.contrastive_data`.
"""

from __future__ import annotations

import keras
from keras import ops

from keras_transformers.backend import scale_loss_for_distribution
from keras_transformers.backend.compiled import (
    prepare_tensorflow_step,
    train_function,
)
from keras_transformers.layers.pooling import l2_normalize
from keras_transformers.training.contrastive_data import (
    check_contrastive_batch,
    contrastive_arrays,
)

SIMILARITIES = ("cosine", "dot")


def _check_settings(scale, similarity):
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or scale <= 0:
        raise ValueError(f"`scale` must be a number > 0. Received: scale={scale!r}")
    if similarity not in SIMILARITIES:
        raise ValueError(
            f"`similarity` must be one of {SIMILARITIES}. "
            f"Received: similarity={similarity!r}"
        )


def ranking_scores(anchors, positives, negatives=None, scale=20.0, similarity="cosine"):
    """The scaled similarities of each anchor to every document of the batch.

    Args:
        anchors: `[B, D]` embeddings.
        positives: `[B, D]` embeddings, row `i` the positive of anchor `i`.
        negatives: None, `[B, D]` (one hard negative per anchor) or
            `[B, K, D]` (`K` per anchor).
        scale: the factor on the similarities (1 / temperature).
        similarity: "cosine" (default) or "dot".

    Returns:
        `(scores, positive_scores)`: `scores` `[B, B * (1 + K)]` float32,
        columns the positives then each negative slot's `B` negatives
        (sentence-transformers' order); `positive_scores` `[B, B]`, the
        anchor-positive block (`scores[:, :B]`).
    """
    _check_settings(scale, similarity)
    anchors, positives = ops.cast(anchors, "float32"), ops.cast(positives, "float32")
    columns = []
    if negatives is not None:
        negatives = ops.cast(negatives, "float32")
        if len(negatives.shape) == 2:
            negatives = ops.expand_dims(negatives, 1)  # [B, 1, D]
        negatives = ops.transpose(negatives, (1, 0, 2))  # [K, B, D]
        columns = [ops.reshape(negatives, (-1, negatives.shape[-1]))]  # [K*B, D]
    if similarity == "cosine":
        anchors, positives = l2_normalize(anchors), l2_normalize(positives)
        columns = [l2_normalize(x) for x in columns]
    positive_scores = scale * ops.matmul(anchors, ops.transpose(positives))  # [B, B]
    scores = [positive_scores]
    scores += [scale * ops.matmul(anchors, ops.transpose(x)) for x in columns]
    scores = ops.concatenate(scores, axis=-1) if columns else positive_scores
    return scores, positive_scores


def multiple_negatives_ranking_loss(
    anchors,
    positives,
    negatives=None,
    scale=20.0,
    symmetric=False,
    similarity="cosine",
):
    """Per-anchor in-batch negatives loss (see the module docstring).

    Args:
        anchors, positives, negatives, scale, similarity: as
            `ranking_scores`.
        symmetric: also rank the anchors for each positive (over the
            anchors only, as `MultipleNegativesSymmetricRankingLoss`) and
            average the two losses.

    Returns:
        `[B]` float32 losses; their mean is sentence-transformers' loss.

    Examples:
        >>> import numpy as np
        >>> a = np.eye(3, dtype="float32")
        >>> loss = multiple_negatives_ranking_loss(a, a, scale=1.0)
        >>> np.round(keras.ops.convert_to_numpy(loss), 4)  # log(e + 2) - 1
        array([0.5514, 0.5514, 0.5514], dtype=float32)
    """
    scores, positive_scores = ranking_scores(
        anchors, positives, negatives, scale, similarity
    )
    own = ops.diagonal(positive_scores)  # [B]: s_ii
    losses = ops.logsumexp(scores, axis=-1) - own
    if symmetric:  # each positive over the anchors: the columns of the block
        backward = ops.logsumexp(positive_scores, axis=0) - own
        losses = (losses + backward) / 2
    return losses


class ContrastiveEmbedder(keras.Model):
    """Trains a `TextEmbedder` on (anchor, positive[, negative]) texts with
    in-batch negatives (sentence-transformers' `MultipleNegativesRankingLoss`),
    through `compile()` / `fit()`.

    `fit()` trains the trainable weights of `embedder` (all of them, or the
    LoRA adapters after `embedder.enable_lora(...)`). `call` embeds each
    side of the batch with `embedder` (pooling and normalisation as the
    embedder computes them) and returns the embeddings `[B, 2 + K, D]`;
    `compute_loss` turns them into the mean loss and `compute_metrics`
    into `in_batch_accuracy` (the share of anchors whose highest-scored
    document is their positive). Keras 3 calls these two hooks in the train
    and test steps of every backend, compiled or not, so `fit()` needs no
    custom step. `compile()` takes an optimizer and no loss.

    Args:
        embedder: the `TextEmbedder` to train (trained in place).
        scale: the factor on the similarities (1 / temperature; 20 as
            sentence-transformers).
        symmetric: also rank the anchors for each positive, as
            `MultipleNegativesSymmetricRankingLoss`.
        similarity: "cosine" (default) or "dot" (then a scale of about 1).

    Call arguments:
        inputs: a dict with `anchor_token_ids`, `anchor_padding_mask`,
            `positive_token_ids`, `positive_padding_mask` (`[B, T]` each,
            each side its own `T`) and optionally `negative_token_ids`,
            `negative_padding_mask` (`[B, T]` or `[B, K, T]`); see
            `contrastive_arrays`.
        training: passed to the embedder (dropout in training).

    Returns:
        `[B, 2 + K, D]` float32: column 0 the anchors' embeddings, 1 the
        positives', then the `K` negatives' (`K = 0` without negatives).

    Save the trained embedder (`embedder.save_to_preset`), not this
    wrapper: it loads back as a `TextEmbedder` with its tokenizer and
    pooling settings.

    Examples:
        >>> import numpy as np
        >>> from keras_transformers.models import TextEmbedder
        >>> embedder = TextEmbedder.from_preset("bert_tiny", num_layers=1)
        >>> ids = np.random.default_rng(0).integers(5, 500, (8, 6)).astype("int32")
        >>> data = {"anchor_token_ids": ids, "anchor_padding_mask": ids > 0,
        ...         "positive_token_ids": ids[:, ::-1].copy(),
        ...         "positive_padding_mask": ids > 0}
        >>> model = ContrastiveEmbedder(embedder, scale=20.0)
        >>> model.compile(optimizer=keras.optimizers.Adam(1e-3))
        >>> history = model.fit(data, batch_size=8, epochs=2, verbose=0)
        >>> sorted(history.history)
        ['in_batch_accuracy', 'loss']

    Reference:
        van den Oord et al., "Representation Learning with Contrastive
        Predictive Coding", 2018; Henderson et al., "Efficient Natural
        Language Response Suggestion for Smart Reply", 2017.
    """

    def __init__(
        self, embedder, scale=20.0, symmetric=False, similarity="cosine", **kwargs
    ):
        super().__init__(**kwargs)
        _check_settings(scale, similarity)
        if not isinstance(embedder, keras.Model) or not hasattr(
            embedder, "token_pooling"
        ):
            raise ValueError(
                "`embedder` must be a TextEmbedder (token ids -> pooled "
                f"embeddings). Received: {type(embedder).__name__}"
            )
        self.embedder = embedder
        self.scale, self.similarity = float(scale), similarity
        self.symmetric = bool(symmetric)
        self.accuracy = keras.metrics.Mean(name="in_batch_accuracy")
        self.built = True

    def compile(self, optimizer="adam", loss=None, **kwargs):
        """`keras.Model.compile` without `loss` (the ranking loss is built
        in), after freezing the backbone's pooler, which the embeddings
        never read (no optimizer state, no missing-gradient warning)."""
        if loss is not None:
            raise ValueError(
                "ContrastiveEmbedder computes the ranking loss itself; compile it "
                f"without `loss`. Received: loss={loss!r}"
            )
        pooler = getattr(getattr(self.embedder, "backbone", None), "pooler", None)
        if pooler is not None:
            pooler.trainable = False
        super().compile(optimizer=optimizer, **kwargs)

    def make_train_function(self, force=False):
        """Keras' train function; compiled PyTorch and TensorFlow steps as
        for the package's models (`keras_transformers.backend.compiled`)."""
        prepare_tensorflow_step(self)
        function = train_function(self, force)
        return super().make_train_function(force) if function is None else function

    def _embed(self, inputs, side, training):
        ids = inputs[f"{side}_token_ids"]
        mask = inputs[f"{side}_padding_mask"]
        return self.embedder(
            {"token_ids": ids, "padding_mask": mask}, training=training
        )

    def call(self, inputs, training=None):
        has_negatives = check_contrastive_batch(inputs)
        columns = [
            ops.expand_dims(self._embed(inputs, side, training), 1)  # [B, 1, D]
            for side in ("anchor", "positive")
        ]
        if has_negatives:
            ids = inputs["negative_token_ids"]
            if len(ids.shape) == 2:
                columns.append(
                    ops.expand_dims(self._embed(inputs, "negative", training), 1)
                )
            else:  # [B, K, T]: embedded as [B * K, T]
                k, length = ids.shape[1], ids.shape[2]
                flat = {
                    f"negative_{part}": ops.reshape(
                        inputs[f"negative_{part}"], (-1, length)
                    )
                    for part in ("token_ids", "padding_mask")
                }
                embedded = self._embed(flat, "negative", training)  # [B * K, D]
                columns.append(ops.reshape(embedded, (-1, k, embedded.shape[-1])))
        return ops.concatenate(columns, axis=1)  # [B, 2 + K, D]

    def _scores(self, y_pred):
        """`ranking_scores` of the embeddings `call` returns."""
        negatives = y_pred[:, 2:] if y_pred.shape[1] > 2 else None
        return ranking_scores(
            y_pred[:, 0], y_pred[:, 1], negatives, self.scale, self.similarity
        )

    def compute_loss(
        self, x=None, y=None, y_pred=None, sample_weight=None, training=True
    ):
        """Mean ranking loss over the batch, plus the embedder's `add_loss`
        terms."""
        if y is not None or sample_weight is not None:
            raise ValueError(
                "ContrastiveEmbedder trains on the batch dict alone (the targets "
                "are the pairs themselves); pass no `y` and no `sample_weight` to "
                "fit() / evaluate()."
            )
        negatives = y_pred[:, 2:] if y_pred.shape[1] > 2 else None
        losses = multiple_negatives_ranking_loss(
            y_pred[:, 0],
            y_pred[:, 1],
            negatives,
            self.scale,
            self.symmetric,
            self.similarity,
        )
        loss = scale_loss_for_distribution(ops.mean(losses))
        for extra in self.losses:  # `add_loss` terms
            loss = loss + ops.cast(self._aggregate_additional_loss(extra), "float32")
        return loss

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        """Updates `in_batch_accuracy`, then Keras' metrics (the loss
        tracker)."""
        scores, positive_scores = self._scores(y_pred)
        own = ops.diagonal(positive_scores)  # [B]
        hit = ops.greater_equal(own, ops.max(scores, axis=-1))
        self.accuracy.update_state(ops.cast(hit, "float32"))
        return super().compute_metrics(x, y, y_pred, sample_weight)


__all__ = [
    "ContrastiveEmbedder",
    "contrastive_arrays",
    "multiple_negatives_ranking_loss",
    "ranking_scores",
]
