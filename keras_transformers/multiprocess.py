"""Several processes training one model (JAX): joining them, and feeding
each its own rows of every global batch.

Every process runs the same script. `initialize` joins it to the others
(`jax.distributed`, as `keras.distribution.initialize`), after which
`keras.distribution.list_devices()` lists the devices of all processes and a
`distribution=` given to `from_preset` spans them: weights, optimizer state
and batches are sharded over every process's devices, and each training
step is one computation over all of them.

Each process feeds only the rows of the global batch that its own devices
hold (Keras' JAX trainer assembles the global batch from them with
`jax.make_array_from_process_local_data`). `ProcessBatches(dataset)` picks
those rows out of every batch of a dataset of global batches, so the model
trains on the same batches, in the same order, as a single process given
`dataset` itself:

```py
from keras_transformers import data, multiprocess
from keras_transformers.models import GPTCausalLM

multiprocess.initialize("10.0.0.1:1234", num_processes=2, process_id=i)
model = GPTCausalLM.from_preset("gpt2_tiny", distribution="data")
model.compile(...)
train = data.lm_dataset(ids, 128, batch_size=32, shuffle=True, seed=0)
model.fit(multiprocess.ProcessBatches(train), shuffle=False)
```

Which rows a process holds follows from the distribution's data layout:
with `"data"` (the batch split over every device) process `i` of `n` feeds
rows `[i * B / n, (i + 1) * B / n)`; with a mesh whose `batch` axis lies
within each process (e.g. `"model"` with `model` or `expert` spanning the
processes) every process feeds the whole batch. Keras' own
`distribution.distribute_dataset` does the same for a `tf.data.Dataset`.

On the TensorFlow and PyTorch backends there is one process:
`initialize` raises, `process_count()` is 1 and `ProcessBatches` passes
batches through.
"""

from __future__ import annotations

import os
from typing import Any

import keras
import numpy as np

DEFAULT_TIMEOUT = 300  # seconds to wait for the coordinator and the others


def _backend():
    if keras.config.backend() != "jax":
        return None
    from keras_transformers.backend import multiprocess

    return multiprocess


def initialize(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    timeout: int = DEFAULT_TIMEOUT,
) -> None:
    """Joins this process to a run of `num_processes` processes.

    Call it first, before anything else computes with JAX, in every process
    with the same `coordinator` and `num_processes` and its own
    `process_id`. Process 0 serves `coordinator`. Arguments left None come
    from the environment: `KERAS_DISTRIBUTION_JOB_ADDRESSES`,
    `KERAS_DISTRIBUTION_NUM_PROCESSES` and `KERAS_DISTRIBUTION_PROCESS_ID`
    (as `keras.distribution.initialize`), else JAX's cluster detection
    (SLURM, Cloud TPU, Open MPI).

    Args:
        coordinator: `"host:port"` of process 0.
        num_processes: how many processes take part.
        process_id: this process's number, `0 .. num_processes - 1`.
        timeout: seconds to wait for the coordinator and the other
            processes.

    Raises:
        ValueError: a backend other than JAX, or invalid numbers.
        TimeoutError: the coordinator did not answer within `timeout`
            seconds (the message names its address).
        RuntimeError: JAX already computed in this process.
    """
    env = os.environ
    if coordinator is None and "KERAS_DISTRIBUTION_JOB_ADDRESSES" in env:
        coordinator = env["KERAS_DISTRIBUTION_JOB_ADDRESSES"].split(",")[0]
    if num_processes is None and "KERAS_DISTRIBUTION_NUM_PROCESSES" in env:
        num_processes = int(env["KERAS_DISTRIBUTION_NUM_PROCESSES"])
    if process_id is None and "KERAS_DISTRIBUTION_PROCESS_ID" in env:
        process_id = int(env["KERAS_DISTRIBUTION_PROCESS_ID"])
    if coordinator is not None:
        host, _, port = coordinator.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(
                "coordinator must be 'host:port' (process 0's address and a free "
                f"port, e.g. '10.0.0.1:1234'). Received: coordinator={coordinator!r}"
            )
    if num_processes is not None and num_processes < 1:
        raise ValueError(f"num_processes must be at least 1. Received: {num_processes}")
    if process_id is not None and num_processes is not None:
        if not 0 <= process_id < num_processes:
            raise ValueError(
                f"process_id must be in 0 .. {num_processes - 1} for "
                f"num_processes={num_processes}. Received: process_id={process_id}"
            )
    backend = _backend()
    if backend is None:
        raise ValueError(
            "Several processes training one model need the JAX backend "
            f"(KERAS_BACKEND is {keras.config.backend()!r}): set KERAS_BACKEND=jax. "
            "On TensorFlow use a tf.distribute strategy instead."
        )
    backend.initialize(coordinator, num_processes, process_id, timeout)


def process_index() -> int:
    """This process's number (0 on one process)."""
    backend = _backend()
    return backend.process_index() if backend else 0


def process_count() -> int:
    """How many processes train the model (1 unless `initialize` joined
    several)."""
    backend = _backend()
    return backend.process_count() if backend else 1


def is_primary() -> bool:
    """True in process 0, the one that writes files only one process may
    write (logs, presets, metadata)."""
    return process_index() == 0


def sync(name: str) -> None:
    """Waits until every process has called `sync(name)` (a no-op on one
    process)."""
    backend = _backend()
    if backend is not None:
        backend.sync(name)


def gather(value) -> np.ndarray:
    """The whole of a (possibly sharded) array as numpy, in every process.
    On several processes every process must call it for the same arrays in
    the same order (it is a collective)."""
    backend = _backend()
    if backend is None:
        return keras.ops.convert_to_numpy(value)
    return backend.gather(value)


def process_rows(batch_size: int, distribution=None) -> tuple[int, int]:
    """`(start, stop)`: the rows of a global batch of `batch_size` rows
    that this process feeds to `fit`, `evaluate` or `predict`.

    Args:
        batch_size: rows of the global batch.
        distribution: the `keras.distribution` (default: the global one);
            without one, all rows.

    Raises:
        ValueError: the batch does not split over the mesh's batch axis.
    """
    distribution = distribution or keras.distribution.distribution()
    backend = _backend()
    if distribution is None or backend is None or backend.process_count() == 1:
        return 0, batch_size
    layout = distribution.get_data_layout((batch_size,))
    return backend.process_rows(layout, batch_size)


def process_batch(batch: Any, distribution=None) -> Any:
    """This process's rows (`process_rows`) of every array in `batch` (a
    nested tuple, list or dict of arrays whose first axis is the batch)."""
    arrays = keras.tree.flatten(batch)
    if not arrays:
        return batch
    start, stop = process_rows(len(arrays[0]), distribution)
    return keras.tree.map_structure(lambda a: np.asarray(a)[start:stop], batch)


class ProcessBatches(keras.utils.PyDataset):
    """A dataset of global batches, as this process's rows of each.

    Wraps any `keras.utils.PyDataset` (or sequence of batches) whose items
    are the global batches; item `i` is `process_batch(dataset[i])`, and
    `on_epoch_end` (reshuffling) is passed on. On one process (or another
    backend) the batches pass through unchanged. Make it after
    `from_preset(..., distribution=...)` (the data layout comes from the
    global distribution when a batch is read).

    Args:
        dataset: the global batches, the same in every process.
        distribution: the `keras.distribution` to split by (default: the
            global one at the time a batch is read).
    """

    def __init__(self, dataset: Any, distribution=None) -> None:
        super().__init__()
        self.dataset = dataset
        self.distribution = distribution
        # Keras refuses a dataset other than tf.data on several processes
        # unless told the data is split already: it is, here.
        active = distribution or keras.distribution.distribution()
        if active is not None:
            active.auto_shard_dataset = False

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        return process_batch(self.dataset[index], self.distribution)

    def on_epoch_end(self) -> None:
        if hasattr(self.dataset, "on_epoch_end"):
            self.dataset.on_epoch_end()

    def __getattr__(self, name: str):
        # `num_tokens`, `batch_size`, ... of the wrapped dataset.
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)
