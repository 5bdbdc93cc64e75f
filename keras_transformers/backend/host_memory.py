"""Keeping freed host memory in the process, for training on a CPU.

A training step allocates and frees the same large buffers every step:
XLA:CPU (JAX, TensorFlow with XLA) allocates all of a program's
temporaries anew on each run (3.6 GiB per step for an 8-layer Mixtral-style
model with SmolLM2's widths at 2 x 512 tokens), eager PyTorch its
activations and gradients. glibc's `malloc` serves such blocks with `mmap`
and returns them to the operating system on `free`, so every step touches
fresh pages: a page fault and the zeroing of each 4 KiB page, about a
million faults per step at that size. On a virtual machine whose balloon
device reports free pages to the host, each first touch is also a host
fault (measured on a 2-core Firecracker VM: 0.4-0.5 GB/s, against 4-5 GB/s
for memory the process keeps), and 25-35% of a JAX step's CPU time went
to the kernel.

`retain_freed_memory()` sets three glibc `mallopt` parameters so freed
blocks stay in the process for the next step: every thread allocates from
the main heap (`M_ARENA_MAX = 1`: a thread's own arena would still `mmap`
blocks over 64 MiB), large blocks come from that heap rather than their own
mappings (`M_MMAP_MAX = 0`), and the heap is never trimmed
(`M_TRIM_THRESHOLD` at its maximum). The process's resident memory then
stays at its peak, which a training loop reaches every step anyway.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

ENV = "KERAS_TRANSFORMERS_RETAIN_MEMORY"  # "0": leave the allocator alone

# glibc's <malloc.h> parameter numbers.
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
M_ARENA_MAX = -8


def retain_freed_memory() -> bool:
    """Keeps memory freed by any thread of this process for its reuse.

    Call it at the start of a training script, before the first
    computation: threads that have already allocated (e.g. XLA's worker
    threads after a first JAX call) keep their own heaps, which still
    return large blocks to the system. It changes the C library's
    allocator for the whole process (every library in it), lasts until the
    process ends and is harmless to call twice. The `keras-transformers`
    `train` and `finetune` commands call it first. With the environment
    variable `KERAS_TRANSFORMERS_RETAIN_MEMORY=0` it does nothing (for a
    process that must give memory back between phases; the test suite
    sets it).

    Measured on a 2-core virtual machine (JAX, the Mixtral-layout benchmark
    row, 2 x 512 tokens): per training step, 1.0 million page faults and
    3.5-4.9 s of kernel time before; none and 0.05 s after; 6.9-8.1 s per
    step -> 4.5-5.6 s. On a machine where fresh pages are cheap the gain is
    smaller. Resident memory no longer shrinks after the peak.

    Returns:
        True when the allocator was set; False where the C library is not
        glibc (macOS, Windows, musl) or the environment variable says "0",
        which leave everything unchanged.
    """
    if os.environ.get(ENV, "1").strip().lower() in ("0", "false", "no"):
        return False
    libc = _glibc()
    if libc is None:
        return False
    ok = libc.mallopt(M_ARENA_MAX, 1) == 1
    ok &= libc.mallopt(M_MMAP_MAX, 0) == 1
    # -1 as glibc's size_t: the largest threshold, i.e. never trim.
    ok &= libc.mallopt(M_TRIM_THRESHOLD, -1) == 1
    return bool(ok)


def _glibc():
    """The process's C library when it is glibc (it has `gnu_get_libc_version`)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return None
    libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    libc.mallopt.restype = ctypes.c_int
    return libc
