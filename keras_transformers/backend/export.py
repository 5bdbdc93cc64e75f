"""Backend settings for `keras_transformers.export`: two compatibility shims
around Keras' exporters on JAX, each active only for the duration of one
export and a no-op wherever it does not apply.

- `tensorflow_readable_stablehlo`: JAX writes a SavedModel's program as
  serialized StableHLO for TensorFlow's `XlaCallModule`. JAX serializes for
  consumers at most four weeks older than itself; a TensorFlow release
  older than that (TensorFlow 2.21 reads StableHLO 1.13.7, JAX 0.10 writes
  1.15) cannot read ops that are newer (`vhlo.composite_v2`, which JAX uses
  for `erf` and `top_k`): "unregistered operation". Inside the context JAX
  serializes for the installed TensorFlow's version (the smaller of the
  two), which that TensorFlow reads.
- `onnx_friendly_arange`: `jax2onnx` replaces `jax.numpy.arange` while it
  traces, and its replacement reads `arange(n, None)` (how Keras' JAX
  backend calls it for `ops.arange(n)`) as start `n`, stop None, and fails.
  Inside the context Keras' JAX `arange` passes `(0, n)` instead: the
  same values and dtype.
"""

from __future__ import annotations

import contextlib

import keras


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in str(text).split("."))


def _tensorflow_stablehlo_version():
    """The StableHLO version the installed TensorFlow reads, or None."""
    try:
        from tensorflow.compiler.mlir.stablehlo import stablehlo
    except ImportError:
        return None
    getter = getattr(stablehlo, "get_current_version", None)
    return None if getter is None else getter()


@contextlib.contextmanager
def tensorflow_readable_stablehlo():
    """On JAX, serialize exported programs for the installed TensorFlow's
    StableHLO version when that is older than JAX's default target."""
    if keras.config.backend() != "jax":
        yield
        return
    try:
        from jax._src.export import _export
    except ImportError:  # another JAX layout: its default applies
        yield
        return
    hlo = getattr(_export, "hlo", None)
    original = getattr(hlo, "get_version_from_compatibility_requirement", None)
    readable = _tensorflow_stablehlo_version()
    if original is None or readable is None:
        yield
        return

    def target_version(requirement):
        version = original(requirement)
        return min(version, readable, key=_version)

    hlo.get_version_from_compatibility_requirement = target_version
    try:
        yield
    finally:
        hlo.get_version_from_compatibility_requirement = original


@contextlib.contextmanager
def onnx_friendly_arange():
    """On JAX, `ops.arange(n)` calls `arange(0, n)` (see the module
    docstring); elsewhere nothing changes."""
    if keras.config.backend() != "jax":
        yield
        return
    from keras.src.backend.jax import numpy as jax_numpy

    original = jax_numpy.arange

    def arange(start, stop=None, step=None, dtype=None):
        if stop is None:
            start, stop = 0, start
        return original(start, stop, step=step, dtype=dtype)

    jax_numpy.arange = arange
    try:
        yield
    finally:
        jax_numpy.arange = original
