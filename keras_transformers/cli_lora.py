"""Deprecated: LoRA fine-tuning of the command line lives in
`keras_transformers.cli.lora` (`load_finetuned`, `LORA_FILE`, ...)."""

from __future__ import annotations

import warnings
from typing import Any

_NEW = "keras_transformers.cli.lora"


def __getattr__(name: str) -> Any:
    """Forwards `name` to `keras_transformers.cli.lora`, with a
    `DeprecationWarning` naming the new import path."""
    from keras_transformers.cli import lora

    if name.startswith("__") or not hasattr(lora, name):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"`{__name__}.{name}` is deprecated: use `from {_NEW} import {name}`.",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(lora, name)
