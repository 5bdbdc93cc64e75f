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

import keras
import numpy as np
import pytest
from conftest import XLA_TEST_FLAGS
from contracts import toy_run_env

from keras_transformers import cli, multiprocess
from keras_transformers.cli._common import CLIError
from keras_transformers.cli.distributed import check_distribution_args

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
    env = toy_run_env(KERAS_BACKEND="jax")
    env["XLA_FLAGS"] = (
        f"{XLA_TEST_FLAGS['jax']} --xla_force_host_platform_device_count={devices}"
    )
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
    ["gpt_llama_tiny", {"batch": 2, "model": 2}],
    ["mixtral_tiny", "model"],  # 4 experts over an expert axis of 4
]


@pytest.mark.once
def test_processes_train_and_checkpoint_as_one(tmp_path):
    single, multi = tmp_path / "single", tmp_path / "multi"
    # 1 process, 4 devices; then 2 processes of 2 devices, which also
    # restore the 1-process checkpoint; then 1 process of 2 devices (the
    # Mixtral's 4 experts over an expert axis of 2) restores theirs.
    # The interrupted fit: uninterrupted in the first, stopped after step 3
    # of 4 in the second, resumed in the third.
    backup = {"backup": str(tmp_path / "backup")}
    spec = {"fits": FITS, "save": str(single), "backup": str(tmp_path / "b1")}
    spec.update(weights=str(tmp_path / "w1.npz"))
    one = run_worker(spec, 1, 4, tmp_path / "1.json")
    spec = {"fits": FITS, "save": str(multi), "restore": str(single)}
    spec.update(backup, interrupt=3, restore_into=FITS[-1])
    two = run_worker(spec, 2, 2, tmp_path / "2.json")
    spec = {"restore": str(multi), "restore_into": FITS[-1]}
    spec.update(backup, weights=str(tmp_path / "w3.npz"))
    back = run_worker(spec, 1, 2, tmp_path / "3.json")
    with np.load(tmp_path / "w1.npz") as a, np.load(tmp_path / "w3.npz") as b:
        assert sorted(a) == sorted(b)
        for key in a:
            np.testing.assert_allclose(b[key], a[key], rtol=RTOL, atol=1e-6)
    # Data parallel (the GPT of the interrupted fit): steps 1 to 3.
    np.testing.assert_allclose(two["resumed_fit"], one["resumed_fit"][:3], rtol=RTOL)
    for a, b in zip(one["losses"], two["losses"], strict=True):
        np.testing.assert_allclose(b, a, rtol=RTOL)
    np.testing.assert_allclose(two["then"], one["then"], rtol=RTOL)
    np.testing.assert_allclose(two["restored"], one["then"], rtol=RTOL)
    np.testing.assert_allclose(back["restored"], two["then"], rtol=RTOL)


def _h5_arrays(path: Path) -> dict:
    import h5py

    out = {}
    with h5py.File(path) as f:
        f.visititems(
            lambda name, item: (
                out.__setitem__(name, item[()])
                if isinstance(item, h5py.Dataset)
                else None
            )
        )
    return out


@pytest.mark.once
def test_train_command_on_two_processes(tmp_path):
    argv = [sys.executable, "-m", "keras_transformers.cli", "train", "gpt2_tiny"]
    argv += ["--epochs", "2", "--steps-per-epoch", "2", "--batch-size", "4"]
    argv += ["--sequence-length", "16", "--max-chars", "10000"]
    argv += ["--sample-tokens", "0"]
    argv += ["--distribution", '{"batch": 2, "model": 2}']
    (one,) = launch([[*argv, "--output", str(tmp_path / "one")]], 4)
    coordinator = ["--coordinator", f"127.0.0.1:{_free_port()}", "--num-processes", "2"]
    commands = [
        [*argv, "--output", str(tmp_path / "two"), *coordinator, "--process-id", str(i)]
        for i in range(2)
    ]
    two = launch(commands, 2)

    def losses(output):
        return [line for line in output.splitlines() if "loss per epoch" in line]

    assert len(losses(one)) == 2 and losses(two[0]) == losses(one), two[0]
    assert losses(two[1]) == []  # process 1 prints no log
    assert "mesh {'batch': 2, 'model': 2} over 2 process" in two[0]
    assert not (tmp_path / "two" / "checkpoint").exists()  # deleted at the end
    a = _h5_arrays(tmp_path / "one" / "model.weights.h5")
    b = _h5_arrays(tmp_path / "two" / "model.weights.h5")
    assert sorted(a) == sorted(b)
    for key in a:
        np.testing.assert_allclose(b[key], a[key], rtol=RTOL, atol=1e-6)


def test_mistakes_are_named():
    """In-process, every backend: nothing here starts JAX's client."""
    if keras.config.backend() != "jax":
        with pytest.raises(ValueError, match="KERAS_BACKEND=jax"):
            multiprocess.initialize("127.0.0.1:1234", 2, 0)
    with pytest.raises(ValueError, match="host:port"):
        multiprocess.initialize("1234", 2, 0)
    with pytest.raises(ValueError, match="process_id must be in 0 .. 1"):
        multiprocess.initialize("127.0.0.1:1234", 2, 2)
    assert multiprocess.process_count() == 1 and multiprocess.is_primary()
    assert multiprocess.process_rows(8) == (0, 8)

    def check(*flags):
        args = cli.build_parser().parse_args(["train", "gpt2_tiny", *flags])
        check_distribution_args(args)

    with pytest.raises(CLIError, match="--num-processes N and --process-id I"):
        check("--coordinator", "127.0.0.1:1234", "--num-processes", "2")
    with pytest.raises(CLIError, match="--process-id must be in 0 .. 1"):
        check("--coordinator", "h:1", "--num-processes", "2", "--process-id", "5")
    if keras.config.backend() != "jax":
        with pytest.raises(CLIError, match="KERAS_BACKEND=jax"):
            check("--distribution", "data")
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["train", "gpt2_tiny", "--distribution", "x"])


@pytest.mark.once
def test_unreachable_coordinator_is_a_timeout_naming_it():
    port = _free_port()  # nothing listens there
    code = (
        "from keras_transformers import multiprocess\n"
        "try:\n"
        f"    multiprocess.initialize('127.0.0.1:{port}', 2, 1, timeout=2)\n"
        "except TimeoutError as error:\n"
        "    print('TimeoutError:', error)\n"
    )
    (out,) = launch([[sys.executable, "-c", code]], 1)
    assert (
        f"TimeoutError: Process 1 could not join the run at coordinator 127.0.0.1:{port} within 2 s"
        in out
    )
