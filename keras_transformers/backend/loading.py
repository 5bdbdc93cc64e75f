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

import contextlib
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


def _jax_on_cpu() -> bool:
    """JAX computing on its CPU backend, without a `keras.distribution`
    (whose variables Keras lays out)."""
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


def _copy(out: np.ndarray, value: np.ndarray, strip: int = 16) -> None:
    """`out[...] = value` (`out` C-contiguous), in row bands on every core
    for a large `value` (NumPy releases the GIL while copying, and the
    first writes to fresh pages fault in parallel). A transposed 2-D band
    is copied `strip` columns at a time, whose source is `strip` contiguous
    rows of the checkpoint's matrix: 2.5-3x NumPy's strided copy of the
    whole matrix on one core here (2.3-2.5 GB/s into touched memory)."""
    if value.ndim == 0:
        np.copyto(out, value, casting="unsafe")
        return
    rows = value.shape[0]
    transposed = value.ndim == 2 and not value.flags.c_contiguous

    def band(start: int, stop: int) -> None:
        if not transposed:
            np.copyto(out[start:stop], value[start:stop], casting="unsafe")
            return
        for j in range(0, value.shape[1], strip):
            out[start:stop, j : j + strip] = value[start:stop, j : j + strip]

    bands = min(os.cpu_count() or 1, max(1, value.size // (1 << 20)), rows)
    if bands == 1:
        band(0, rows)
        return
    step = -(-rows // bands)
    starts = range(0, rows, step)
    for future in [_pool().submit(band, i, min(i + step, rows)) for i in starts]:
        future.result()


def _tf_adopt(array: np.ndarray):
    """A TensorFlow tensor over `array`'s memory, without a copy (DLPack;
    `array` writable, C-contiguous and aligned to 64 bytes, as a
    `_host_array` is). `tf.constant` would copy it, twice for an unaligned
    array: NumPy's copy, then TensorFlow's aligned one."""
    import tensorflow as tf

    if array.dtype == ml_dtypes.bfloat16:  # DLPack in NumPy knows no bfloat16
        words = tf.experimental.dlpack.from_dlpack(array.view(np.uint16).__dlpack__())
        return tf.bitcast(words, tf.bfloat16)
    return tf.experimental.dlpack.from_dlpack(array.__dlpack__())


_SCRATCH: list = []  # within `staging()`: [the scratch buffer]


@contextlib.contextmanager
def staging():
    """A checkpoint load: within it TensorFlow stages every transposed
    matrix in one scratch buffer (see `_tf_scratch`), freed at exit."""
    outer = bool(_SCRATCH)
    if not outer:
        _SCRATCH.append(np.empty(0, np.uint8))
    try:
        yield
    finally:
        if not outer:
            _SCRATCH.clear()


def _tf_scratch(value: np.ndarray):
    """`value` (C-contiguous) copied into a page-aligned buffer, as a
    TensorFlow tensor over that buffer. Within `staging()` the buffer is
    reused by every call (its pages fault in once, not per matrix) and the
    tensor is valid until the next call: the caller's TensorFlow op reads
    it right away (eager CPU ops run synchronously)."""
    if not _SCRATCH:
        array = _host_array(value.shape, value.dtype.name)
    else:
        if _SCRATCH[0].size < value.nbytes:
            _SCRATCH[0] = _host_array((value.nbytes,), "uint8")
        array = _SCRATCH[0][: value.nbytes].view(value.dtype).reshape(value.shape)
    _copy(array, value)
    return _tf_adopt(array)


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
    TensorFlow's transpose (see `_tf_scratch`). Anything else is copied
    once into a fresh `_host_array` (a transposed matrix in strips on
    every core, see `_copy`), which JAX on CPU adopts as the variable's
    value and TensorFlow through DLPack (`_tf_adopt`). On JAX and
    TensorFlow the variable owns its memory: a copy of the file.
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
    tensorflow = keras.config.backend() == "tensorflow"
    if tensorflow and transposed and min(value.shape) > 1:  # (size 1: a reshape)
        # TensorFlow's transpose kernel (multi-threaded; ~10% faster than
        # `_copy`'s strips on the 1.1B checkpoint here) writes a new tensor,
        # which the variable adopts.
        matrix = keras.ops.transpose(_tf_scratch(value.T))
        variable.assign(
            keras.ops.reshape(keras.ops.cast(matrix, variable.dtype), shape)
        )
        return
    array = _host_array(shape, variable.dtype)
    _copy(array.reshape(value.shape), value)
    variable.assign(_tf_adopt(array) if tensorflow else array)


def own_memory(variables) -> None:
    """PyTorch: each CPU variable that is a view of a checkpoint's file
    mapping (`assign_array` shares it) gets a copy of its own, so the
    mapping is unmapped once no variable views it, e.g. after quantization
    replaced most of the weights it held (their pages read while quantizing
    would otherwise stay resident). Elsewhere variables own their memory:
    nothing to do."""
    if keras.config.backend() != "torch":
        return
    import torch

    for variable in variables:
        tensor = variable.value
        if tensor.device.type == "cpu" and not tensor.untyped_storage().resizable():
            with torch.no_grad():
                tensor.data = tensor.data.clone()
