"""Variables that a checkpoint fills: their storage before loading
(`empty`), and one copy per weight into it (`assign_array`).

Writing fresh memory is the cost of loading on a CPU (the first write to
each page faults it in), so every weight should reach its variable in one
pass, and nothing should fill a variable that is about to be overwritten.
"""

from __future__ import annotations

import math
import mmap
import warnings

import keras
import ml_dtypes
import numpy as np


def numpy_dtype(dtype: str) -> np.dtype:
    """The NumPy dtype of a Keras dtype name (bfloat16 from `ml_dtypes`)."""
    return np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)


def _jax_on_cpu() -> bool:
    """JAX computing on its CPU backend, without a `keras.distribution`
    (whose variables Keras lays out itself)."""
    if keras.config.backend() != "jax" or keras.distribution.distribution():
        return False
    import jax

    return jax.default_backend() == "cpu"


def _host_array(shape, dtype) -> np.ndarray:
    """A writable zero array in its own anonymous memory map: page-aligned,
    and no page is touched until written. JAX on CPU adopts such an array
    without copying it."""
    dtype = numpy_dtype(dtype)
    count = math.prod(shape)
    buffer = mmap.mmap(-1, max(count * dtype.itemsize, 1))
    return np.frombuffer(buffer, dtype, count).reshape(shape)


def empty(shape, dtype=None):
    """The initial value of a variable that a checkpoint overwrites next.

    `keras.ops.empty` (PyTorch: uninitialised memory, untouched until
    written), except on JAX's CPU backend without a `keras.distribution`,
    whose `empty` writes zeros: there it is a `_host_array` that JAX adopts
    without a copy (no page is touched; it is unmapped when the loaded value
    replaces it).
    """
    dtype = dtype or keras.config.floatx()
    if _jax_on_cpu():
        import jax

        return jax.device_put(_host_array(tuple(shape), dtype))
    if keras.config.backend() == "tensorflow":  # `keras.ops.empty` writes zeros
        import tensorflow as tf

        return tf.raw_ops.Empty(shape=list(shape), dtype=tf.as_dtype(dtype))
    return keras.ops.empty(tuple(shape), dtype=dtype)


def _copy(out: np.ndarray, value: np.ndarray, tile: int = 128) -> None:
    """`out[...] = value`; a transposed 2-D `value` in square tiles (about
    twice as fast as NumPy's strided copy: each tile stays in cache)."""
    if value.ndim != 2 or value.flags.c_contiguous:
        np.copyto(out, value, casting="unsafe")
        return
    rows, cols = value.shape
    for i in range(0, rows, tile):
        for j in range(0, cols, tile):
            out[i : i + tile, j : j + tile] = value[i : i + tile, j : j + tile]


def assign_array(variable, value: np.ndarray) -> None:
    """Writes `value` into `variable`: a NumPy array with the variable's
    number of elements, any strides and dtype, whose C-order reshape is
    the variable (e.g. a transposed view of a memory-mapped checkpoint
    tensor, `[in, out]` for a `[in, heads, head_dim]` kernel). The
    transpose and the dtype conversion happen in the one copy.

    PyTorch: one copy, straight into the variable's storage. TensorFlow: a
    transposed matrix goes through TensorFlow's transpose. Anything else is
    copied into a fresh `_host_array` given to `variable.assign` (JAX on
    CPU adopts it as the variable's value). The variable never holds a view
    of the checkpoint file: it owns its memory.
    """
    shape = tuple(variable.shape)
    if keras.config.backend() == "torch":
        import torch

        bfloat16 = value.dtype == ml_dtypes.bfloat16  # NumPy-side: raw 16-bit words
        with warnings.catch_warnings():  # read-only views: torch only reads them
            warnings.simplefilter("ignore", UserWarning)
            source = torch.from_numpy(value.view(np.int16) if bfloat16 else value)
        source = source.view(torch.bfloat16) if bfloat16 else source
        with torch.no_grad():
            variable.value.view(value.shape).copy_(source)
        return
    transposed = value.ndim == 2 and value.T.flags.c_contiguous
    tensorflow = keras.config.backend() == "tensorflow"
    if tensorflow and transposed and min(value.shape) > 1:  # (size 1: a reshape)
        # TensorFlow's transpose kernel (multi-threaded, ~5x NumPy's tiles)
        # writes a new tensor, so the variable never holds the checkpoint's
        # file. (On XLA:CPU the same is slower and holds more memory than
        # the tiles below: a compilation per shape and a second buffer.)
        matrix = keras.ops.transpose(keras.ops.convert_to_tensor(value.T))
        variable.assign(
            keras.ops.reshape(keras.ops.cast(matrix, variable.dtype), shape)
        )
        return
    array = _host_array(shape, variable.dtype)
    _copy(array.reshape(value.shape), value)
    variable.assign(array)
