"""Sequence classification with a decoder: the hidden state of each row's
last real token, then a bias-free linear `score` head (Hugging Face's
`LlamaForSequenceClassification`, `Qwen2ForSequenceClassification`,
`GPT2ForSequenceClassification`, ...)."""

from __future__ import annotations

import numpy as np

from keras_transformers.backend import concrete_numpy
from keras_transformers.config.validation import check_argument_int
from keras_transformers.layers.core import Dense, seeded_dropout
from keras_transformers.layers.pooling import TokenPooling
from keras_transformers.layers.serializable import serializable
from keras_transformers.models.base import TaskModel, check_padding_mask, initializer
from keras_transformers.models.gpt import GPTBackbone
from keras_transformers.registry import register_model

INPUT_KEYS = ("token_ids", "padding_mask")


def check_real_tokens(padding_mask, name: str = "padding_mask") -> None:
    """Raises ValueError when a row of `padding_mask` `[B, T]` (values known
    now: NumPy, or an eager tensor) has no real token; None passes."""
    values = None if padding_mask is None else concrete_numpy(padding_mask)
    if values is None or values.ndim != 2 or not values.size:
        return
    empty = np.flatnonzero(~values.astype(bool).any(axis=1))
    if empty.size:
        raise ValueError(
            f"Row {int(empty[0])} of `{name}` has no real token (all False): a "
            "classifier reads the last real token of each row. Drop empty examples, "
            "or keep at least one token (e.g. BOS) unmasked in every row."
        )


def check_labels(labels, num_classes: int) -> None:
    """Raises ValueError when integer class labels (NumPy) fall outside
    `[0, num_classes)`."""
    labels = np.asarray(labels)
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        bad = labels.max() if labels.max() >= num_classes else labels.min()
        raise ValueError(
            f"Label {bad} is outside [0, num_classes={num_classes}). Map labels to "
            "0..num_classes-1 or build the model with more classes."
        )


@register_model("classifier")
@serializable
class GPTClassifier(TaskModel):
    """Sequence classification on a decoder: `GPTBackbone`, the hidden
    state of each row's last real token, optional dropout and a bias-free
    linear `score` head, as Hugging Face's `*ForSequenceClassification`
    decoders (Llama, Qwen2/3, Mistral, Gemma, GPT-2, GPT-NeoX, ...).

    Args:
        backbone: a `GPTBackbone` (or build one from `config` and keyword
            config fields).
        num_classes: number of labels (at least 1).
        classifier_dropout: dropout on the pooled state before `score`
            (default 0.0: Hugging Face's decoders have none).
        config, tokenizer, dtype, name: as for every task model.

    Call arguments:
        inputs: `{"token_ids": [B, T], "padding_mask": [B, T]}` or the
            `[B, T]` ids alone.

    Returns:
        Logits `[B, num_classes]`.

    Pooling reads the padding mask, so right and left padding both work:
    the last position whose mask is True. Without a padding mask every
    token counts as real and the last position `T - 1` is read, which is
    right for unpadded or left-padded rows only; pass the mask with a
    right-padded batch. (Hugging Face finds the last token that is not
    `pad_token_id` instead; the two agree whenever the mask marks the pad
    tokens.) A row without any real token raises a ValueError where its
    values can be read (eager calls, NumPy inputs to `fit` / `evaluate` /
    `predict`); inside a compiled step it pools zeros, so its logits are 0.
    With learned absolute positions (GPT-2), left padding shifts the
    positions of the real tokens and so changes the logits, as in
    Hugging Face; rotary models give the same logits either way.

    Train with `SparseCategoricalCrossentropy(from_logits=True)`.
    `compile()` freezes an untied backbone's LM head (`reverse_embeddings`),
    which classification never reads: no optimizer state and no weight
    decay for it. (Set its `trainable` back to True before training the
    same backbone as a `GPTCausalLM`.)

    Examples:
        >>> model = GPTClassifier.from_preset("gpt_llama_tiny", num_classes=3)
        >>> ids = np.array([[5, 6, 7, 0], [5, 6, 7, 8]], "int32")
        >>> mask = ids != 0
        >>> tuple(model({"token_ids": ids, "padding_mask": mask}).shape)
        (2, 3)
    """

    weight_axes = {"score/kernel": None}  # replicated

    backbone_cls = GPTBackbone
    task_arguments = ("num_classes", "classifier_dropout")

    def __init__(
        self, backbone=None, *, num_classes=2, classifier_dropout=0.0, **kwargs
    ):
        super().__init__(backbone, **kwargs)
        self.num_classes = check_argument_int("num_classes", num_classes, 1)
        self.classifier_dropout = classifier_dropout
        self.dropout = seeded_dropout(classifier_dropout, dtype=self.dtype_policy)
        self.last_token = TokenPooling(
            "lasttoken", dtype=self.dtype_policy, name="last_token"
        )
        self.score = Dense(
            self.num_classes,
            use_bias=False,
            kernel_initializer=initializer(self.config),
            dtype=self.dtype_policy,
            name="score",
        )
        self.score.build((None, self.config.hidden_dim))

    def call(self, inputs, training=None):
        if isinstance(inputs, dict):
            unknown = sorted(map(str, set(inputs) - set(INPUT_KEYS)))
            if unknown:
                raise ValueError(
                    f"{type(self).__name__} takes inputs {list(INPUT_KEYS)}. Received "
                    f"unknown key(s) {unknown}; pass labels as `y` to `fit()`."
                )
            token_ids, padding_mask = (
                inputs.get("token_ids"),
                inputs.get("padding_mask"),
            )
        else:
            token_ids, padding_mask = inputs, None
        hidden = self.backbone(inputs, training=training)  # [B, T, D], ids checked
        if padding_mask is None:
            pooled = hidden[:, -1, :]  # [B, D]
        else:
            check_real_tokens(padding_mask)
            padding_mask = check_padding_mask(padding_mask, token_ids)
            pooled = self.last_token(hidden, padding_mask)  # [B, D]
        return self.score(self.dropout(pooled, training=training))

    def compile(self, *args, **kwargs):
        """`keras.Model.compile`, after freezing the untied LM head of the
        backbone, which the classifier never reads."""
        embedding = self.backbone.token_embedding
        if not embedding.tie_weights:
            embedding.reverse_embeddings.trainable = False
        super().compile(*args, **kwargs)

    def fit(self, x=None, y=None, *args, **kwargs):
        """`keras.Model.fit`, after checking NumPy labels against
        `num_classes`."""
        if isinstance(y, (np.ndarray, list, tuple)):
            check_labels(y, self.num_classes)
        return super().fit(x, y, *args, **kwargs)

    def _check_data_ids(self, args, kwargs) -> None:
        """The ids check of every model, plus: each row of a NumPy
        `padding_mask` has a real token."""
        super()._check_data_ids(args, kwargs)
        x = args[0] if args else kwargs.get("x")
        if isinstance(x, dict) and isinstance(x.get("padding_mask"), np.ndarray):
            check_real_tokens(x["padding_mask"])
