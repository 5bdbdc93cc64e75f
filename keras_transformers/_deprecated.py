"""Module-level `__getattr__` for modules whose contents moved elsewhere."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any


def moved_to(old: str, new: str) -> Callable[[str], Any]:
    """A module `__getattr__` that forwards names to module `new`.

    Each name looked up through module `old` is taken from `new`, with a
    `DeprecationWarning` that names the new import path.

    Args:
        old: the deprecated module's name (its `__name__`).
        new: the module the names moved to.

    Returns:
        The function to assign to the old module's `__getattr__`.

    Example:

    ```python
    __getattr__ = moved_to(__name__, "keras_transformers.data.parallel")
    ```
    """

    def __getattr__(name: str) -> Any:
        if not name.startswith("__"):
            module = importlib.import_module(new)
            if hasattr(module, name):
                warnings.warn(
                    f"`{old}` is deprecated: import `{name}` from `{new}` "
                    "(or from `keras_transformers.data`).",
                    DeprecationWarning,
                    stacklevel=2,
                )
                return getattr(module, name)
        raise AttributeError(f"module {old!r} has no attribute {name!r}")

    return __getattr__
