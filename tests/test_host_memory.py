"""`retain_freed_memory`: freed host memory stays in the process.

Each check runs in a process of its own, a fork of one process that has
imported the library, Keras and its backend: the setting changes the C
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

# For each probe, a fork of this process (set, or not, by
# `retain_freed_memory` with the probe's KERAS_TRANSFORMERS_RETAIN_MEMORY)
# starts a worker thread (as XLA's and PyTorch's are) that mallocs, fills
# and frees 256 MiB twice; the page faults of the second round tell whether
# the first block was kept (transparent huge pages off, so each 4 KiB page
# faults). Each fork prints one JSON line.
PROBES = textwrap.dedent(
    """
    import ctypes, json, os, resource, threading
    from keras_transformers.backend.host_memory import retain_freed_memory
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = (ctypes.c_void_p,)
    libc.prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE: count 4 KiB pages

    def work(faults):
        for _ in range(2):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            block = libc.malloc(2**28)
            ctypes.memset(block, 1, 2**28)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
            libc.free(block)

    for name, variable in (("plain", None), ("kept", "1"), ("off", "0")):
        pid = os.fork()
        if pid == 0:
            setting = None
            if variable is not None:
                os.environ["KERAS_TRANSFORMERS_RETAIN_MEMORY"] = variable
                setting = retain_freed_memory()
            faults = []
            thread = threading.Thread(target=work, args=(faults,))
            thread.start()
            thread.join()
            print(json.dumps({"probe": name, "set": setting, "faults": faults}))
            os._exit(0)
        assert os.waitpid(pid, 0)[1] == 0, name
    """
)


@pytest.fixture(scope="module")
def probes():
    """{probe: {"set", "faults"}} for `plain` (never set), `kept` and `off`."""
    proc = subprocess.run(
        [sys.executable, "-c", PROBES],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line[:1] == "{"]
    return {line.pop("probe"): line for line in lines}


@pytest.mark.once  # the C library's allocator: the same under every backend
def test_freed_memory_is_reused_without_page_faults(probes):
    pages = 2**28 // os.sysconf("SC_PAGE_SIZE")
    plain = probes["plain"]
    assert plain["faults"][1] > pages // 2  # glibc returns the block: fresh pages
    kept = probes["kept"]
    if not kept["set"]:
        pytest.skip("the C library is not glibc")
    assert kept["faults"][0] > pages // 2  # the first touch still faults
    assert kept["faults"][1] < pages // 20  # the second reuses the kept block


@pytest.mark.once  # the C library's allocator: the same under every backend
def test_the_environment_can_leave_the_allocator_alone(probes):
    off = probes["off"]
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


@pytest.mark.parametrize(
    "given, imported, expected",
    [(None, False, "1"), ("0", False, "0"), (None, True, None)],
    ids=["turned-on", "users-choice-kept", "tensorflow-already-imported"],
)
def test_training_commands_turn_on_tensorflow_onednn_before_its_import(
    monkeypatch, given, imported, expected
):
    import types

    from keras_transformers.backend import host_memory
    from keras_transformers.cli._common import prepare_training_process

    monkeypatch.setattr(host_memory, "retain_freed_memory", lambda: True)
    if given is None:
        monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    else:
        monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", given)
    if imported:  # read at TensorFlow's import: too late to set it then
        module = sys.modules.get("tensorflow") or types.ModuleType("tensorflow")
        monkeypatch.setitem(sys.modules, "tensorflow", module)
    else:
        monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
    prepare_training_process()
    assert os.environ.get("TF_ENABLE_ONEDNN_OPTS") == expected
