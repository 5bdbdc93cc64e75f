"""BERT-like encoders: post-norm blocks over token, position and segment
embeddings (or DeBERTa's disentangled relative attention), a pooler, and
masked-LM / classification heads."""

from __future__ import annotations

import numpy as np
from keras import ops

from keras_transformers import backend
from keras_transformers.layers.core import Dense
from keras_transformers.layers.disentangled import DisentangledAttention
from keras_transformers.layers.feed_forward import activation_fn
from keras_transformers.layers.heads import MaskedLMHead
from keras_transformers.layers.serializable import serializable
from keras_transformers.models.base import (
    TaskModel,
    initializer,
    run_blocks,
    unpack_token_inputs,
)
from keras_transformers.models.text import TextBackbone
from keras_transformers.registry import register_model


@register_model("backbone")
@serializable
class BertBackbone(TextBackbone):
    """Bidirectional encoder (BERT).

    Args:
        config: a `TransformerConfig` (or dict) with `stacks="encoder"`;
            keyword fields override it.

    Call arguments:
        inputs: `{"token_ids": [B, T], "segment_ids": [B, T] (optional),
            "padding_mask": [B, T]}` or the `[B, T]` ids alone.

    Returns:
        `{"sequence_output": [B, T, D], "pooled_output": [B, D]}`; the pooled
        output is the pooler (a dense layer with `pooler_activation`: tanh
        for BERT, GELU for DeBERTa's ContextPooler) on the first token
        (`[CLS]`), or that token's state when the config has no pooler.

    With `position_embedding="disentangled"` (DeBERTa) there is no absolute
    position table; `disentangled` (a `DisentangledAttention`) adds the
    relative-position terms to every block's attention logits.

    Examples:
        >>> bert = BertBackbone.from_preset("bert_tiny")
        >>> out = bert({"token_ids": np.ones((1, 8), "int32")})
        >>> tuple(out["pooled_output"].shape)
        (1, 128)
    """

    weight_axes = {
        **TextBackbone.weight_axes,
        "pooler/kernel": None,
        "pooler/bias": None,
    }

    family = "bert"
    stacks = "encoder"
    causal = False

    def _build_extras(self):
        config = self.config
        self.pooler = None
        if config.pooler:
            activation = config.pooler_activation
            self.pooler = Dense(
                config.hidden_dim,
                activation="tanh"
                if activation == "tanh"
                else activation_fn(activation),
                kernel_initializer=initializer(config),
                dtype=self.dtype_policy,
                name="pooler",
            )
            self.pooler.build((None, config.hidden_dim))
        self.disentangled = None
        if config.disentangled is not None:
            group = config.disentangled
            self.disentangled = DisentangledAttention(
                num_layers=config.num_layers,
                num_heads=config.num_heads,
                head_dim=config.resolved_head_dim,
                max_length=config.max_sequence_length,
                position_buckets=group.position_buckets,
                max_relative_positions=group.max_relative_positions,
                share_att_key=group.share_att_key,
                attention_terms=group.attention_terms,
                norm_relative_embeddings=group.norm_relative_embeddings,
                norm_epsilon=config.norm_epsilon,
                dropout=config.dropout,
                kernel_initializer=initializer(config),
                dtype=self.dtype_policy,
                name="disentangled",
            )
            self.disentangled.build((None, None, config.hidden_dim))

    def call(self, inputs, training=None):
        token_ids, padding_mask, segment_ids = unpack_token_inputs(
            inputs, self.config, extra=("segment_ids",)
        )
        x = self.embed(  # [B, T, D]
            token_ids, segment_ids, training=training, padding_mask=padding_mask
        )
        if self.disentangled is None:
            x = run_blocks(self.blocks, x, padding_mask, training=training)
        else:  # each block with its own position terms
            attentions = [block.self_attention for block in self.blocks]
            biases = self.disentangled.biases(attentions, training=training)
            padding_mask = backend.none_if_all_true(padding_mask)  # checked once
            for block, bias in zip(self.blocks, biases):
                x = run_blocks(
                    [block], x, padding_mask, training=training, attention_bias=bias
                )
        if self.final_norm is not None:
            x = self.final_norm(x)
        first = x[:, 0, :]  # [B, D]
        pooled = self.pooler(first) if self.pooler is not None else first
        return {"sequence_output": x, "pooled_output": pooled}


@register_model("masked_lm", default=True)
@serializable
class BertMaskedLM(TaskModel):
    """BERT with its masked-LM head (tied to the token embedding; with
    factorised embeddings, `embedding_dim`, the head's transform projects to
    that width first, as ALBERT's and ELECTRA's generator's do).

    Call arguments:
        inputs: the backbone's inputs plus `mask_positions` `[B, P]`, the
            positions to predict (as made by `MaskedLMMasker`).

    Returns:
        `[B, P, vocabulary_size]` logits at the masked positions only.
    """

    backbone_cls = BertBackbone

    def __init__(self, backbone=None, **kwargs):
        super().__init__(backbone, **kwargs)
        c = self.config
        self.masked_lm_head = MaskedLMHead(
            c.vocabulary_size,
            activation=c.activation,
            norm_type=c.norm_type,
            norm_epsilon=c.norm_epsilon,
            kernel_initializer=initializer(c),
            embedding_dim=c.embedding_dim,
            transform_bias=c.use_bias,
            dtype=self.dtype_policy,
            name="masked_lm_head",
        )
        self.masked_lm_head.build((None, None, c.hidden_dim))

    def call(self, inputs, training=None):
        if not isinstance(inputs, dict) or "mask_positions" not in inputs:
            raise ValueError(
                "BertMaskedLM inputs need 'mask_positions' [batch, num_masked]: the "
                "positions whose tokens to predict (see MaskedLMMasker)."
            )
        hidden = self.backbone(inputs, training=training)["sequence_output"]
        return self.masked_lm_head(
            hidden,
            inputs["mask_positions"],
            token_embedding=self.backbone.token_embedding,
        )


class _Classifier(TaskModel):
    """Dropout and a dense layer on top of a backbone output."""

    backbone_cls = BertBackbone
    task_arguments = ("num_classes", "classifier_dropout")
    ignored_label = None  # a label value that marks positions without a label

    def fit(self, x=None, y=None, *args, **kwargs):
        """`keras.Model.fit`, after checking array labels against `num_classes`."""
        if isinstance(y, (np.ndarray, list, tuple)):
            labels = np.asarray(y)
            if self.ignored_label is not None:
                labels = labels[labels != self.ignored_label]
            if labels.size and (labels.min() < 0 or labels.max() >= self.num_classes):
                bad = labels.max() if labels.max() >= self.num_classes else labels.min()
                raise ValueError(
                    f"Label {bad} is outside [0, num_classes={self.num_classes}). Map "
                    "labels to 0..num_classes-1 or build the model with more classes."
                )
        return super().fit(x, y, *args, **kwargs)

    def __init__(
        self, backbone=None, *, num_classes=2, classifier_dropout=0.1, **kwargs
    ):
        super().__init__(backbone, **kwargs)
        self._add_classifier(num_classes, classifier_dropout, initializer(self.config))

    def _head(self, features, training):
        return self.classifier(self.dropout(features, training=training))


@register_model("classifier")
@serializable
class BertClassifier(_Classifier):
    """Sequence classification on the pooled (`[CLS]`) output.

    Args:
        backbone: a `BertBackbone` (or build one from `config`).
        num_classes: number of labels.
        classifier_dropout: dropout before the classifier.
        pooling: "pooled" (the tanh pooler's output, as BERT) or "token"
            (the final `[CLS]` state, no pooler).

    Returns:
        `[B, num_classes]` logits.
    """

    task_arguments = ("num_classes", "classifier_dropout", "pooling")

    def __init__(self, backbone=None, *, pooling="pooled", **kwargs):
        super().__init__(backbone, **kwargs)
        if pooling not in ("pooled", "token"):
            raise ValueError(
                f"`pooling` must be 'pooled' or 'token'. Received: {pooling!r}"
            )
        self.pooling = pooling

    def call(self, inputs, training=None):
        out = self.backbone(inputs, training=training)
        if self.pooling == "pooled":
            return self._head(out["pooled_output"], training)
        return self._head(out["sequence_output"][:, 0, :], training)


@register_model("token_classifier")
@serializable
class BertTokenClassifier(_Classifier):
    """Per-token classification (tagging). Train with a loss that ignores
    padding, e.g. `MaskedSparseCategoricalCrossentropy(ignore_class=-100)` or
    `sample_weight=padding_mask`.

    Returns:
        `[B, T, num_classes]` logits.
    """

    ignored_label = -100

    def call(self, inputs, training=None):
        return self._head(
            self.backbone(inputs, training=training)["sequence_output"], training
        )


@register_model("discriminator")
@serializable
class ElectraDiscriminator(TaskModel):
    """ELECTRA's replaced-token detection (Hugging Face's
    `ElectraForPreTraining`): a dense layer with the config's activation and
    a one-unit projection score every token of any `BertBackbone`.

    Call arguments:
        inputs: the backbone's inputs.

    Returns:
        `[B, T]` logits, positive where the token is predicted to be
        replaced. Train with `keras.losses.BinaryCrossentropy(from_logits=True)`
        and `sample_weight=padding_mask`.

    Examples:
        >>> model = ElectraDiscriminator.from_preset("bert_tiny", num_layers=1)
        >>> tuple(model({"token_ids": np.ones((1, 8), "int32")}).shape)
        (1, 8)
    """

    weight_axes = dict.fromkeys(
        f"discriminator_{part}/{weight}"
        for part in ("dense", "prediction")
        for weight in ("kernel", "bias")
    )  # replicated

    backbone_cls = BertBackbone

    def __init__(self, backbone=None, **kwargs):
        super().__init__(backbone, **kwargs)
        c = self.config
        self.discriminator_dense = Dense(
            c.hidden_dim,
            activation=activation_fn(c.activation),
            kernel_initializer=initializer(c),
            dtype=self.dtype_policy,
            name="discriminator_dense",
        )
        self.discriminator_dense.build((None, None, c.hidden_dim))
        self.discriminator_prediction = Dense(
            1,
            kernel_initializer=initializer(c),
            dtype=self.dtype_policy,
            name="discriminator_prediction",
        )
        self.discriminator_prediction.build((None, None, c.hidden_dim))

    def call(self, inputs, training=None):
        hidden = self.backbone(inputs, training=training)["sequence_output"]
        scores = self.discriminator_prediction(self.discriminator_dense(hidden))
        return ops.squeeze(scores, -1)  # [B, T, 1] -> [B, T]
