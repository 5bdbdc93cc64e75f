"""Several processes training one model on JAX: real processes on this
machine (127.0.0.1, a free port), 2 CPU devices each, against one process
with 4 devices on the same global batches.

- 2-process data parallel, GPT model-parallel (batch 2 x model 2) and
  Mixtral expert-parallel losses equal the 1-process losses;
- a sharded checkpoint saved by 1 process (4 devices) restores in 2
  processes, and one saved by 2 processes restores in 1 process (2
  devices, another mesh), each with the next steps' losses of the run that
  saved it;
- a resumable `fit` stopped after step 3 of 4 on 2 processes resumes on 1
  process and ends with the uninterrupted run's weights;
- `keras-transformers train --coordinator ... --num-processes 2
  --process-id i` trains the weights of the 1-process command;
- a coordinator nobody serves is a `TimeoutError` naming its address.

The 1-process references run once (one launch, the `one_process` fixture).

Children always run with KERAS_BACKEND=jax (whatever this process's
backend), each under a timeout, and are killed when a test ends.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
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
    # No persistent compilation cache: its key does not tell a program
    # compiled for 2 processes from the same program for 1 process of as
    # many devices (a 1-process run once computed other losses after a
    # 2-process run had filled the cache).
    for name in [n for n in env if n.startswith("JAX_PERSISTENT_CACHE")]:
        del env[name]
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    env["XLA_FLAGS"] = (
        f"{XLA_TEST_FLAGS['jax']} --xla_force_host_platform_device_count={devices}"
    )
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HERE.parent), env.get("PYTHONPATH", "")]
    ).strip(os.pathsep)
    env.pop("OMP_NUM_THREADS", None)
    return env


def launch(commands, devices: int) -> list[str]:
    """Runs `commands` (one argv per process) at once; returns their
    outputs. Every process is killed when `TIMEOUT` seconds have passed or
    one fails."""
    logs = [tempfile.TemporaryFile("w+") for _ in commands]
    processes = [
        subprocess.Popen(argv, env=_env(devices), stdout=log, stderr=subprocess.STDOUT)
        for argv, log in zip(commands, logs)
    ]
    deadline = time.monotonic() + TIMEOUT
    try:
        while any(p.poll() is None for p in processes):
            failed = any(p.poll() not in (None, 0) for p in processes)
            if failed or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait()
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
        log.close()
    for process, out in zip(processes, outputs):
        assert process.returncode == 0, f"a process failed:\n{out[-4000:]}"
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


# The `train` command of the tests: GPT-2 sharded over a 2 x 2 mesh.
TRAIN = ["train", "gpt2_tiny", "--epochs", "2", "--steps-per-epoch", "2"]
TRAIN += ["--batch-size", "4", "--sequence-length", "16", "--max-chars", "10000"]
TRAIN += ["--sample-tokens", "0", "--distribution", '{"batch": 2, "model": 2}']


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The 1-process, 4-device references: the fits, a checkpoint, an
    uninterrupted resumable fit and the `train` command (one launch)."""
    path = tmp_path_factory.mktemp("one")
    spec = {"fits": FITS, "save": str(path / "ckpt"), "backup": str(path / "b")}
    spec.update(weights=str(path / "w.npz"))
    spec.update(cli=[*TRAIN, "--output", str(path / "train")])
    out = path / "out.json"
    (log,) = launch(
        [[sys.executable, str(WORKER), json.dumps(dict(spec, out=str(out)))]], 4
    )
    return path, json.loads(out.read_text()), log


@pytest.mark.once
def test_processes_train_and_checkpoint_as_one(one_process, tmp_path):
    """2 processes of 2 devices train the 1-process losses, restore its
    checkpoint, save theirs and stop a resumable fit after step 3 of 4;
    then 1 process of 2 devices (the Mixtral's 4 experts over an expert
    axis of 2) restores their checkpoint and resumes their fit."""
    path, one, _ = one_process
    multi, backup = str(tmp_path / "multi"), str(tmp_path / "backup")
    spec = {"fits": FITS, "save": multi, "restore": str(path / "ckpt")}
    spec.update(backup=backup, interrupt=3, restore_into=FITS[-1])
    two = run_worker(spec, 2, 2, tmp_path / "2.json")
    port = _free_port()  # nothing listens there
    spec = {"restore": multi, "restore_into": FITS[-1], "backup": backup}
    spec.update(weights=str(tmp_path / "w.npz"), unreachable=f"127.0.0.1:{port}")
    back = run_worker(spec, 1, 2, tmp_path / "3.json")

    for a, b in zip(one["losses"], two["losses"], strict=True):
        np.testing.assert_allclose(b, a, rtol=RTOL)
    # Data parallel (the GPT of the resumable fit): steps 1 to 3.
    np.testing.assert_allclose(two["resumed_fit"], one["resumed_fit"][:3], rtol=RTOL)
    np.testing.assert_allclose(two["then"], one["then"], rtol=RTOL)
    np.testing.assert_allclose(two["restored"], one["then"], rtol=RTOL)
    np.testing.assert_allclose(back["restored"], two["then"], rtol=RTOL)
    with np.load(path / "w.npz") as a, np.load(tmp_path / "w.npz") as b:
        assert sorted(a) == sorted(b)
        for key in a:
            np.testing.assert_allclose(b[key], a[key], rtol=RTOL, atol=1e-6)
    assert back["unreachable"].startswith(
        f"Process 1 could not join the run at coordinator 127.0.0.1:{port} within 1 s"
    )


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
def test_train_command_on_two_processes(one_process, tmp_path):
    path, _, one = one_process
    argv = [sys.executable, "-m", "keras_transformers.cli", *TRAIN]
    argv += ["--output", str(tmp_path / "two"), "--coordinator"]
    argv += [f"127.0.0.1:{_free_port()}", "--num-processes", "2", "--process-id"]
    two = launch([[*argv, str(i)] for i in range(2)], 2)

    def losses(output):
        return [line for line in output.splitlines() if "loss per epoch" in line]

    assert len(losses(one)) == 2 and losses(two[0]) == losses(one), two[0]
    assert losses(two[1]) == []  # process 1 prints no log
    assert "mesh {'batch': 2, 'model': 2} over 2 process" in two[0]
    assert not (tmp_path / "two" / "checkpoint").exists()  # deleted at the end
    a = _h5_arrays(path / "train" / "model.weights.h5")
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
