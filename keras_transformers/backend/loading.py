"""Variables that a checkpoint fills: their storage before loading
(`empty`), and each weight into it in at most one copy (`assign_array`).

Writing fresh memory is the cost of loading on a CPU (the first write to
each page faults it in), so every weight should reach its variable in one
pass, and nothing should fill a variable that is about to be overwritten.
On PyTorch a weight whose dtype matches is not copied at all: the variable
becomes a view of the checkpoint file mapped copy-on-write (`shares_file`),
as transformers' `from_pretrained` does; pages are read at first use, and
a write (training) copies only the pages it touches.
"""

from __future__ import annotations

import functools
import math
import mmap
import os
import warnings
from concurrent.futures import ThreadPoolExecutor

import keras
import ml_dtypes
import numpy as np


def numpy_dtype(dtype: str) -> np.dtype:
    """The NumPy dtype of a Keras dtype name (bfloat16 from `ml_dtypes`)."""
    return np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)


def _jax_unsharded() -> bool:
    """JAX without a `keras.distribution` (whose variables Keras lays out)."""
    return keras.config.backend() == "jax" and not keras.distribution.distribution()


_XLA_TRANSPOSE_SIZE = 1 << 21  # elements: 8 MiB of float32


@functools.cache
def _jax_transpose(dtype: str, shape: tuple):
    """A compiled `[out, in]` -> `[in, out]` transpose, cast to `dtype`
    and reshaped to `shape`, in one XLA program per shape and dtype."""
    import jax

    return jax.jit(lambda matrix: matrix.T.astype(dtype).reshape(shape))


def _jax_on_cpu() -> bool:
    """JAX computing on its CPU backend, without a `keras.distribution`."""
    if not _jax_unsharded():
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


def shares_file() -> bool:
    """Whether `assign_array` may make a variable a view of the checkpoint's
    memory (PyTorch): the caller then maps the file copy-on-write
    (`mmap.ACCESS_COPY`), so the views are writable and no write reaches
    the file."""
    return keras.config.backend() == "torch"


def _share(variable, value: np.ndarray) -> bool:
    """Makes PyTorch `variable` a view of `value`'s memory, when the variable
    lives on the CPU and `value` is writable, has the variable's dtype, and
    reshapes to the variable's shape without a copy (a transposed `[out, in]`
    weight does). Returns whether it did."""
    import torch

    if variable.value.device.type != "cpu":  # a GPU variable copies the array in
        return False
    if not value.flags.writeable or value.dtype != numpy_dtype(variable.dtype):
        return False
    try:
        tensor = torch.from_numpy(value).view(tuple(variable.shape))
    except (RuntimeError, TypeError, ValueError):  # e.g. strides that do not reshape
        return False
    variable.value.data = tensor
    return True


@functools.cache
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="load")


def _copy(out: np.ndarray, value: np.ndarray, tile: int = 128) -> None:
    """`out[...] = value`; a transposed 2-D `value` in square tiles (about
    twice as fast as NumPy's strided copy: each tile stays in cache), its
    row bands on every core for a large one (NumPy releases the GIL while
    copying, and the first writes to fresh pages fault in parallel)."""
    if value.ndim != 2 or value.flags.c_contiguous:
        np.copyto(out, value, casting="unsafe")
        return
    rows, cols = value.shape

    def band(start: int, stop: int) -> None:
        for i in range(start, stop, tile):
            for j in range(0, cols, tile):
                out[i : i + tile, j : j + tile] = value[i : i + tile, j : j + tile]

    bands = min(os.cpu_count() or 1, max(1, value.size // (1 << 20)), -(-rows // tile))
    if bands == 1:
        band(0, rows)
        return
    step = -(-rows // (bands * tile)) * tile
    starts = range(0, rows, step)
    for future in [_pool().submit(band, i, min(i + step, rows)) for i in starts]:
        future.result()


def assign_array(variable, value: np.ndarray) -> None:
    """Writes `value` into `variable`: a NumPy array with the variable's
    number of elements, any strides and dtype, whose C-order reshape is
    the variable (e.g. a transposed view of a memory-mapped checkpoint
    tensor, `[in, out]` for a `[in, heads, head_dim]` kernel). The
    transpose and the dtype conversion happen in the one copy.

    PyTorch: a writable `value` of the variable's dtype (a view of a
    copy-on-write file mapping, see `shares_file`) becomes the variable's
    storage without a copy; otherwise one copy, straight into the
    variable's storage. TensorFlow: a transposed matrix goes through
    TensorFlow's transpose; on JAX (without a distribution) a transposed
    matrix of `_XLA_TRANSPOSE_SIZE` elements or more through a compiled XLA
    transpose. Anything else is copied into a fresh
    `_host_array` given to `variable.assign` (JAX on CPU adopts it as the
    variable's value). On JAX and TensorFlow the variable owns its memory.
    """
    shape = tuple(variable.shape)
    if keras.config.backend() == "torch":
        import torch

        if _share(variable, value):
            return

        bfloat16 = value.dtype == ml_dtypes.bfloat16  # NumPy-side: raw 16-bit words
        with warnings.catch_warnings():  # read-only views: torch only reads them
            warnings.simplefilter("ignore", UserWarning)
            source = torch.from_numpy(value.view(np.int16) if bfloat16 else value)
        source = source.view(torch.bfloat16) if bfloat16 else source
        with torch.no_grad():
            variable.value.view(value.shape).copy_(source)
        return
    transposed = value.ndim == 2 and value.T.flags.c_contiguous
    if _jax_unsharded() and transposed and value.size >= _XLA_TRANSPOSE_SIZE:
        # XLA's transpose: about twice NumPy's tiles on CPU, for a
        # compilation per shape (~0.1 s), so for large matrices only; on a
        # GPU the file's layout is sent as is and transposed there. On CPU
        # JAX reads an aligned `value.T` in place: one copy in all.
        import jax

        matrix = jax.device_put(value.T)
        variable.assign(_jax_transpose(variable.dtype, shape)(matrix))
        return
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
