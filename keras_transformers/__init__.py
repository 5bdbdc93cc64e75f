"""keras_transformers: a Keras 3 multi-backend transformer model zoo."""

from keras_transformers import layers, models
from keras_transformers.config import MoEConfig, TransformerConfig, VisionConfig
from keras_transformers.memory import MemoryEstimate, estimate_memory
from keras_transformers.presets import from_preset, list_presets, load_config

__version__ = "0.1.0"

__all__ = [
    "MemoryEstimate",
    "MoEConfig",
    "TransformerConfig",
    "VisionConfig",
    "estimate_memory",
    "from_preset",
    "layers",
    "list_presets",
    "load_config",
    "models",
]
