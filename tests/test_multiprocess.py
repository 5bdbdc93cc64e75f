"""Several processes training one model on JAX: real processes on this
machine (127.0.0.1, a free port), 2 CPU devices each, against one process
with 4 devices on the same global batches.

- 2-process data parallel, GPT model-parallel (batch 2 x model 2) and
  Mixtral expert-parallel losses equal the 1-process losses;
- a sharded checkpoint saved by 1 process (4 devices) restores in 2
  processes, and one saved by 2 processes restores in 1 process (2
  devices, another mesh), each with the next steps' losses of the run that
  saved it;
- `keras-transformers train --coordinator ... --num-processes 2
  --process-id i` trains the weights of the 1-process command, and an
  interrupted 2-process run resumes on 1 process.

Children always run with KERAS_BACKEND=jax (whatever this process's
backend), each under a timeout, and are killed when a test ends.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import XLA_TEST_FLAGS
from contracts import toy_run_env

HERE = Path(__file__).parent
WORKER = HERE / "multiprocess_worker.py"
TIMEOUT = 240  # seconds for one launch (all its processes)
# float32 sums in another order (a psum over processes, other shardings).
RTOL = 2e-5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(devices: int) -> dict:
    env = toy_run_env(KERAS_BACKEND="jax", DEVICES_PER_PROCESS=str(devices))
    env["XLA_FLAGS"] = XLA_TEST_FLAGS["jax"]
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HERE.parent), env.get("PYTHONPATH", "")]
    ).strip(os.pathsep)
    env.pop("OMP_NUM_THREADS", None)
    return env


def launch(commands, devices: int, cwd=None) -> list[str]:
    """Runs `commands` (one argv per process) at once; returns their
    outputs. Every process is killed after `TIMEOUT` seconds or when one
    fails."""
    processes = [
        subprocess.Popen(
            argv,
            env=_env(devices),
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for argv in commands
    ]
    outputs = []
    try:
        for process in processes:
            out, _ = process.communicate(timeout=TIMEOUT)
            outputs.append(out)
            if process.returncode != 0:
                raise AssertionError(f"a process failed:\n{out[-4000:]}")
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    return outputs


def run_worker(spec: dict, processes: int, devices: int, out: Path) -> dict:
    spec = dict(spec, out=str(out))
    if processes == 1:
        commands = [[sys.executable, str(WORKER), json.dumps(spec)]]
    else:
        coordinator = f"127.0.0.1:{_free_port()}"
        commands = [
            [
                sys.executable,
                str(WORKER),
                json.dumps(
                    dict(
                        spec,
                        coordinator=coordinator,
                        num_processes=processes,
                        process_id=i,
                    )
                ),
            ]
            for i in range(processes)
        ]
    launch(commands, devices)
    return json.loads(out.read_text())


FITS = [
    ["gpt2_tiny", "data"],
    ["gpt_llama_tiny", {"batch": 2, "model": 2}],
    ["mixtral_tiny", "model"],  # 4 experts over an expert axis of 4
]


@pytest.mark.once
def test_processes_train_and_checkpoint_as_one(tmp_path):
    single, multi = tmp_path / "single", tmp_path / "multi"
    # 1 process, 4 devices; then 2 processes of 2 devices, which also
    # restore the 1-process checkpoint; then 1 process of 2 devices (the
    # Mixtral's 4 experts over an expert axis of 2) restores theirs.
    one = run_worker({"fits": FITS, "save": str(single)}, 1, 4, tmp_path / "1.json")
    spec = {"fits": FITS, "save": str(multi), "restore": str(single)}
    two = run_worker(dict(spec, restore_into=FITS[-1]), 2, 2, tmp_path / "2.json")
    spec = {"restore": str(multi), "restore_into": FITS[-1]}
    back = run_worker(spec, 1, 2, tmp_path / "3.json")
    for a, b in zip(one["losses"], two["losses"], strict=True):
        np.testing.assert_allclose(b, a, rtol=RTOL)
    np.testing.assert_allclose(two["then"], one["then"], rtol=RTOL)
    np.testing.assert_allclose(two["restored"], one["then"], rtol=RTOL)
    np.testing.assert_allclose(back["restored"], two["then"], rtol=RTOL)
