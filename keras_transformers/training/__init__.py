"""Training utilities Keras lacks: schedules, Adam/AdamW updating in place
on PyTorch, the paper's Adam, masked losses and metrics, BLEU, checkpoint
averaging, throughput / MFU measurement, preference tuning (DPO),
contrastive training of sentence embeddings with in-batch negatives
(`ContrastiveEmbedder`), and exact resumption of an interrupted `fit()`
(`BackupAndRestore`).

Everything here is backend-agnostic (JAX, TensorFlow, PyTorch), works inside
compiled `model.fit()`, and is registered for `.keras` serialization under
the package name "keras_transformers".
"""

from keras_transformers.training.averaging import CheckpointAveraging
from keras_transformers.training.bleu import (
    BleuScore,
    corpus_bleu,
    sentence_bleu,
    tokenize_13a,
)
from keras_transformers.training.callbacks import (
    ThroughputCallback,
    training_flops_per_token,
)
from keras_transformers.training.contrastive import (
    ContrastiveEmbedder,
    multiple_negatives_ranking_loss,
)
from keras_transformers.training.contrastive_data import contrastive_arrays
from keras_transformers.training.losses import MaskedSparseCategoricalCrossentropy
from keras_transformers.training.metrics import MaskedAccuracy, Perplexity
from keras_transformers.training.optimizers import (
    Adam,
    AdamW,
    PerUpdateSchedule,
    transformer_adam,
)
from keras_transformers.training.preference import (
    DPOModel,
    completion_logps,
    precompute_reference_logps,
)
from keras_transformers.training.preference_data import preference_arrays
from keras_transformers.training.resume import BackupAndRestore, ResumableBatches
from keras_transformers.training.schedules import (
    InverseSquareRootSchedule,
    WarmupCosineDecay,
)

__all__ = [
    "Adam",
    "AdamW",
    "BackupAndRestore",
    "BleuScore",
    "CheckpointAveraging",
    "ContrastiveEmbedder",
    "DPOModel",
    "InverseSquareRootSchedule",
    "MaskedAccuracy",
    "MaskedSparseCategoricalCrossentropy",
    "PerUpdateSchedule",
    "Perplexity",
    "ResumableBatches",
    "ThroughputCallback",
    "WarmupCosineDecay",
    "completion_logps",
    "contrastive_arrays",
    "corpus_bleu",
    "multiple_negatives_ranking_loss",
    "precompute_reference_logps",
    "preference_arrays",
    "sentence_bleu",
    "tokenize_13a",
    "training_flops_per_token",
    "transformer_adam",
]
