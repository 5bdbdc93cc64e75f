"""Importing keras-hub / TensorFlow without TensorFlow's start-up lines.

keras-hub's tokenizer layers import TensorFlow, whatever the Keras backend.
On JAX and PyTorch that prints TensorFlow's C++ start-up lines (no CUDA
drivers, `cuInit` errors, oneDNN notices) that say nothing about the user's
run. :func:`import_quietly` imports a module with those lines silenced,
unless the user has set `TF_CPP_MIN_LOG_LEVEL` (then TensorFlow logs as they
asked). With the TensorFlow backend, TensorFlow is already loaded and the
import is a plain one.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import warnings
from collections.abc import Iterator
from types import ModuleType

LOG_LEVEL_VARIABLE = "TF_CPP_MIN_LOG_LEVEL"
# What `import jax` sets the variable to when it is unset (JAX's own choice).
_JAX_LOG_LEVEL = "1"


def _in_startup_environment(name: str) -> bool:
    """Whether the process started with `name` in its environment (read from
    `/proc/self/environ`, so False where there is no such file)."""
    try:
        with open("/proc/self/environ", "rb") as f:
            entries = f.read().split(b"\0")
    except OSError:
        return False
    return any(entry.startswith(name.encode() + b"=") for entry in entries)


def _log_level_set_by_user() -> bool:
    """Whether `TF_CPP_MIN_LOG_LEVEL` is the user's choice.

    `import jax` sets it to 1 when unset; that value counts as the user's
    only when the process started with the variable set.
    """
    value = os.environ.get(LOG_LEVEL_VARIABLE)
    if value is None:
        return False
    if value != _JAX_LOG_LEVEL or "jax" not in sys.modules:
        return True
    return _in_startup_environment(LOG_LEVEL_VARIABLE)


@contextlib.contextmanager
def _stderr_to_devnull() -> Iterator[None]:
    """Sends file descriptor 2 to /dev/null inside the block.

    Catches what C++ code writes before its logging is set up (absl prints
    some lines whatever `TF_CPP_MIN_LOG_LEVEL` says). Python warnings raised
    inside are recorded and shown after the block; exceptions propagate after
    the descriptor is restored.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), 2)
        with warnings.catch_warnings(record=True) as caught:
            try:
                yield
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
    finally:
        os.close(saved)
    for warning in caught:
        warnings.showwarning(
            warning.message, warning.category, warning.filename, warning.lineno
        )


def import_quietly(name: str) -> ModuleType:
    """Imports module `name` (e.g. `"keras_hub"`) without TensorFlow's
    start-up lines, when that import is the one that loads TensorFlow.

    Sets `TF_CPP_MIN_LOG_LEVEL=3` (errors hidden too: on machines without a
    GPU, TensorFlow reports the failed CUDA probe as an error) and silences
    file descriptor 2 during the import only; nothing changes when the user
    set `TF_CPP_MIN_LOG_LEVEL` (JAX's default of 1 is not the user's).

    Args:
        name: the module to import.

    Returns:
        The module.
    """
    loaded = name in sys.modules or "tensorflow" in sys.modules
    if loaded or _log_level_set_by_user():
        return importlib.import_module(name)
    os.environ[LOG_LEVEL_VARIABLE] = "3"
    with _stderr_to_devnull():
        return importlib.import_module(name)
