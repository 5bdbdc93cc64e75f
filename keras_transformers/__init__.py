"""keras_transformers: a Keras 3 multi-backend transformer model zoo.

The public names below are imported on first use (PEP 562), so that
importing a light part of the package, such as the `keras-transformers`
command's parser, does not import Keras and a backend.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# Each public name and the module it comes from.
_SOURCES = {
    "DisentangledConfig": "keras_transformers.config",
    "MemoryEstimate": "keras_transformers.memory",
    "MoEConfig": "keras_transformers.config",
    "TransformerConfig": "keras_transformers.config",
    "VisionConfig": "keras_transformers.config",
    "estimate_memory": "keras_transformers.memory",
    "from_preset": "keras_transformers.presets",
    "layers": "keras_transformers.layers",
    "list_presets": "keras_transformers.presets",
    "load_config": "keras_transformers.presets",
    "models": "keras_transformers.models",
    "retain_freed_memory": "keras_transformers.backend.host_memory",
}

__all__ = sorted(_SOURCES)


def __getattr__(name: str) -> Any:
    """Imports public name `name` on first access."""
    if name not in _SOURCES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(_SOURCES[name])
    is_subpackage = _SOURCES[name] == f"{__name__}.{name}"  # layers, models
    value = module if is_subpackage else getattr(module, name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
