"""Training utilities Keras lacks: schedules, masked losses and metrics,
and throughput / MFU measurement.

Everything here is backend-agnostic (JAX, TensorFlow, PyTorch), works inside
compiled `model.fit()`, and is registered for `.keras` serialization under
the package name "keras_transformers".
"""

from keras_transformers.training.callbacks import (
    ThroughputCallback,
    training_flops_per_token,
)
from keras_transformers.training.losses import MaskedSparseCategoricalCrossentropy
from keras_transformers.training.metrics import MaskedAccuracy, Perplexity
from keras_transformers.training.schedules import (
    InverseSquareRootSchedule,
    WarmupCosineDecay,
)

__all__ = [
    "InverseSquareRootSchedule",
    "MaskedAccuracy",
    "MaskedSparseCategoricalCrossentropy",
    "Perplexity",
    "ThroughputCallback",
    "WarmupCosineDecay",
    "training_flops_per_token",
]
