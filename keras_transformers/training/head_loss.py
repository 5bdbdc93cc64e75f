"""`fit()` of a causal LM with the chunked cross-entropy of its head.

While Keras' train function runs, `CausalLM.call` returns the hidden states
`[B, T, D]` instead of the logits, and `CausalLM.compute_loss` computes the
compiled loss from them with `chunked_cross_entropy` (the head and the loss
chunk by chunk: the float32 `[B, T, V]` logits never exist). Everywhere
else (`predict`, `evaluate`, a direct call, generation) the model returns
logits as usual.

It applies when the compiled loss is a `MaskedSparseCategoricalCrossentropy`
on logits (reduced to a mean or a sum), no compiled metric needs the
logits, and the head is the plain one (not quantized, no LoRA on it). A
model's `chunked_loss` attribute decides: None (default) where it pays
(batch x length x vocabulary >= `PAYS_FROM` on JAX, 4x that elsewhere), True:
whenever it applies, False: never.
"""

from __future__ import annotations

from keras import ops

from keras_transformers.backend import scale_loss_for_distribution
from keras_transformers.backend.choices import chunked_loss_pays_more
from keras_transformers.training.chunked_loss import chunked_cross_entropy
from keras_transformers.training.losses import (
    MaskedSparseCategoricalCrossentropy,
    safe_divide,
    sparse_labels,
    token_weights,
)

# Logits from which chunking pays on JAX: 2^26 float32 values are 256 MB;
# elsewhere from four times as many (`choices.chunked_loss_pays_more`).
PAYS_FROM = 2**26
_REDUCTIONS = ("sum_over_batch_size", "mean", "mean_with_sample_weight", "sum")


def wrap_train_function(model, function):
    """Keras' train function of `model`, run with the model in its
    "training step" state (see `returns_hidden`); set as
    `model.train_function`."""
    if function is None or getattr(function, "runs_train_step", False):
        return function

    def run(*args, **kwargs):
        model._in_train_step = True
        try:
            return function(*args, **kwargs)
        finally:
            model._in_train_step = False

    run.runs_train_step = True
    model.train_function = run
    return run


def why_not(model) -> str | None:
    """Why the chunked loss cannot apply to `model`'s compiled training
    (None: it can)."""
    loss = getattr(model, "loss", None)
    if not isinstance(loss, MaskedSparseCategoricalCrossentropy):
        return "the compiled loss is not a MaskedSparseCategoricalCrossentropy"
    if not loss.from_logits or loss.reduction not in _REDUCTIONS:
        return "the loss must take logits and reduce to a mean or a sum"
    if getattr(model, "_compile_metrics", None) is not None:
        return "compiled metrics read the logits"
    embedding = model.backbone.token_embedding
    if embedding.quantization_mode is not None or getattr(
        embedding, "lora_enabled", False
    ):
        return "the LM head is quantized or has LoRA weights"
    if embedding.reverse_dtype is not None or embedding.logit_soft_cap is not None:
        return "the LM head is not a plain projection"
    return None


def returns_hidden(model, hidden) -> bool:
    """Whether `model.call` returns `hidden` `[B, T, D]` for the chunked
    loss (inside the train function only); remembers the answer for
    `compute_loss`."""
    model._hidden_returned = False
    if not getattr(model, "_in_train_step", False) or model.chunked_loss is False:
        return False
    reason = why_not(model)
    if reason is not None:
        if model.chunked_loss:
            raise ValueError(
                f"`chunked_loss=True` cannot apply: {reason}. Set "
                "`chunked_loss=None` (where it applies and pays) or False."
            )
        return False
    size = model.backbone.config.vocabulary_size
    for dim in hidden.shape[:-1]:
        size *= dim or 1  # unknown (a TensorFlow trace's batch): 1
    pays = size >= PAYS_FROM * (1 if chunked_loss_pays_more() else 4)
    model._hidden_returned = bool(model.chunked_loss) or pays
    return model._hidden_returned


def compute_loss(model, y, hidden, sample_weight):
    """The compiled loss (and the model's added losses) from the hidden
    states `[B, T, D]`, as Keras' `compute_loss` gives it from the logits."""
    model._hidden_returned = False
    loss = model.loss
    backbone, config = model.backbone, model.backbone.config
    embedding = backbone.token_embedding
    dtype = embedding.compute_dtype
    labels = sparse_labels(y, hidden)
    weights = token_weights(labels, loss.ignore_class, sample_weight)
    if loss.ignore_class is not None:  # any in-range label: its weight is 0
        labels = ops.where(ops.not_equal(labels, loss.ignore_class), labels, 0)
    hidden = ops.cast(hidden, dtype)
    if config.scale_logits:
        hidden = hidden * config.hidden_dim**-0.5
    kernel, transposed = embedding.head_kernel()
    bias = backbone.logits_bias
    total = chunked_cross_entropy(
        hidden,
        kernel,
        labels,
        weights,
        bias=None if bias is None else ops.cast(bias, "float32"),
        transposed=transposed,
        softcap=config.logit_softcap,
        label_smoothing=loss.label_smoothing,
    )
    if loss.reduction != "sum":
        total = scale_loss_for_distribution(safe_divide(total, ops.sum(weights)))
    for extra in model.losses:
        total = total + model._aggregate_additional_loss(extra)
    return total


__all__ = ["PAYS_FROM", "compute_loss", "returns_hidden", "why_not"]
