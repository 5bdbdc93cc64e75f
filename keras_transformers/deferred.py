"""Building a model whose weights are loaded right after it is built,
without running its random initializers.

A model's random initializers cost more than reading its checkpoint (a
truncated normal over every weight: seconds for 135M parameters on a
CPU), and their values are overwritten at once. Inside
`deferred_initialization()`, every `Layer.add_weight` gives its variable
uninitialised storage (`keras_transformers.backend.loading.empty`: no
random draws, and on PyTorch, TensorFlow and JAX's CPU backend not even a
write) and remembers the initializer. The converters mark each variable
they write (`loaded`); when the block ends, the variables that no
checkpoint tensor filled (a new task head, a grown position table's extra
rows, statistics) run their own initializer, so the model is the same as
one built normally and then loaded.
"""

from __future__ import annotations

import contextlib
import threading

import keras

from keras_transformers.backend.loading import empty

_LOCAL = threading.local()  # `pending` of this thread's innermost block
_PATCH = {"count": 0, "original": None}
_LOCK = threading.Lock()


class _Empty(keras.initializers.Initializer):
    """Uninitialised storage of the requested shape and dtype."""

    def __call__(self, shape, dtype=None):
        return empty(shape, dtype=dtype)


_EMPTY = _Empty()


def _pending():
    return getattr(_LOCAL, "pending", None)


def _add_weight(layer, *args, **kwargs):
    """`Layer.add_weight`, deferring the initializer inside a block."""
    original = _PATCH["original"]
    pending = _pending()
    positional = len(args) > 1
    initializer = args[1] if positional else kwargs.get("initializer")
    if pending is None or initializer is None:
        return original(layer, *args, **kwargs)
    if positional:
        args = (args[0], _EMPTY, *args[2:])
    else:
        kwargs["initializer"] = _EMPTY
    variable = original(layer, *args, **kwargs)
    pending[id(variable)] = (variable, keras.initializers.get(initializer))
    return variable


@contextlib.contextmanager
def deferred_initialization():
    """Builds models with uninitialised variables until the block ends,
    then initializes those no `loaded` call marked.

    Yields:
        the dict of pending variables (id -> (variable, initializer)).
    """
    with _LOCK:
        if _PATCH["count"] == 0:
            _PATCH["original"] = keras.layers.Layer.add_weight
            keras.layers.Layer.add_weight = _add_weight
        _PATCH["count"] += 1
    outer, pending = _pending(), {}
    _LOCAL.pending = pending
    try:
        yield pending
        while pending:
            initialize(next(iter(pending.values()))[0])
    finally:
        _LOCAL.pending = outer
        with _LOCK:
            _PATCH["count"] -= 1
            if _PATCH["count"] == 0:
                keras.layers.Layer.add_weight = _PATCH["original"]


def _owner(variable):
    """The pending dict that holds `variable` (this thread's blocks)."""
    pending = _pending()
    if pending is not None and id(variable) in pending:
        return pending
    return None


def loaded(variable) -> None:
    """Marks `variable` as written from a checkpoint (no initializer needed)."""
    pending = _owner(variable)
    if pending is not None:
        del pending[id(variable)]


def initialize(variable) -> None:
    """Runs the deferred initializer of `variable` now (nothing when it has
    none pending), e.g. before reading it to keep some of its rows."""
    pending = _owner(variable)
    if pending is not None:
        _, initializer = pending.pop(id(variable))
        value = initializer(tuple(variable.shape), dtype=variable.dtype)
        variable.assign(value)
