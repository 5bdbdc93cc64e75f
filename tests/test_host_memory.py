"""`retain_freed_memory`: freed host memory stays in the process.

Each check runs in a fresh interpreter: the setting changes the C
library's allocator for the whole process."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="glibc's allocator (Linux)"
)

# A worker thread (as XLA's and PyTorch's are) mallocs, fills and frees
# 256 MiB twice; the page faults of the second round tell whether the first
# block was kept (transparent huge pages off, so each 4 KiB page faults).
PROBE = textwrap.dedent(
    """
    import ctypes, json, resource, threading
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = (ctypes.c_void_p,)
    libc.prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE: count 4 KiB pages
    {setup}
    faults = []

    def work():
        for _ in range(2):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            block = libc.malloc(2**28)
            ctypes.memset(block, 1, 2**28)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
            libc.free(block)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    print(json.dumps({{"set": SET, "faults": faults}}))
    """
)


def probe(setup, **env):
    code = PROBE.format(setup=setup)
    env = {**os.environ, "KERAS_TRANSFORMERS_RETAIN_MEMORY": "1", **env}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.once  # the C library's allocator: the same under every backend
def test_freed_memory_is_reused_without_page_faults():
    pages = 2**28 // os.sysconf("SC_PAGE_SIZE")
    plain = probe("SET = None")
    assert plain["faults"][1] > pages // 2  # glibc returns the block: fresh pages
    kept = probe(
        "from keras_transformers.backend.host_memory import retain_freed_memory\n"
        "SET = retain_freed_memory()"
    )
    if not kept["set"]:
        pytest.skip("the C library is not glibc")
    assert kept["faults"][0] > pages // 2  # the first touch still faults
    assert kept["faults"][1] < pages // 20  # the second reuses the kept block


@pytest.mark.once  # the C library's allocator: the same under every backend
def test_the_environment_can_leave_the_allocator_alone():
    off = probe(
        "from keras_transformers.backend.host_memory import retain_freed_memory\n"
        "SET = retain_freed_memory()",
        KERAS_TRANSFORMERS_RETAIN_MEMORY="0",
    )
    assert off["set"] is False
    assert off["faults"][1] > 2**28 // os.sysconf("SC_PAGE_SIZE") // 2


def test_training_commands_call_it_first(monkeypatch):
    import argparse

    from keras_transformers.backend import host_memory
    from keras_transformers.cli import finetune, train

    class Called(Exception):
        pass

    def first():
        raise Called

    monkeypatch.setattr(host_memory, "retain_freed_memory", first)
    for run in (train.run, finetune.run):  # nothing is read or built before it
        with pytest.raises(Called):
            run(argparse.Namespace())
