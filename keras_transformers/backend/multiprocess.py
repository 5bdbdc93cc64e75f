"""JAX's side of several processes training one model: joining the
processes (`jax.distributed`), the rows of a global batch that this
process feeds, a barrier, and sharded state on disk (Orbax).

`keras_transformers.multiprocess` and
`keras_transformers.training.sharded_checkpoint` are the public faces;
this module is the only one that imports `jax` and `orbax` for them.
"""

from __future__ import annotations

import os
import socket
import time

import jax
import numpy as np


def initialize(
    coordinator: str, num_processes: int, process_id: int, timeout: int
) -> None:
    """`jax.distributed.initialize` (gloo collectives on CPU), then one
    random seed for every process (as `keras.distribution.initialize`).

    Raises:
        RuntimeError: JAX already computed something in this process, or
            was initialized for several processes already.
        TimeoutError: the coordinator (or the other processes) did not
            answer within `timeout` seconds.
    """
    if jax.distributed.is_initialized():
        raise RuntimeError(
            "This process already joined a multi-process JAX run "
            f"({jax.process_count()} processes); initialize once per process."
        )
    # JAX's client ends the process (no exception) when it cannot reach
    # the coordinator: find out first, and say so.
    if coordinator and process_id not in (None, 0):
        timeout = _wait_for(coordinator, process_id, timeout)
    try:
        # CPU devices of several processes need a collectives library
        # (without one, a computation over them fails).
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            coordinator_address=coordinator,
            num_processes=num_processes,
            process_id=process_id,
            initialization_timeout=timeout,
        )
    except RuntimeError as error:
        text = str(error)
        if "must be called before" in text or "already" in text:
            raise RuntimeError(
                "Initialize the processes before anything else uses JAX (creating a "
                "model, an array or a random seed): call "
                "keras_transformers.multiprocess.initialize(...) first. "
                f"JAX said: {text}"
            ) from None
        raise _timeout(coordinator, process_id, timeout, text) from None
    except Exception as error:  # the client's own errors (deadline, connection)
        raise _timeout(coordinator, process_id, timeout, str(error)) from None
    from keras.src.backend.jax.distribution_lib import initialize_rng

    initialize_rng()


def _wait_for(coordinator: str, process_id: int, timeout: int) -> int:
    """Waits until `coordinator` ("host:port") accepts a connection;
    returns the seconds left of `timeout`.

    Raises:
        TimeoutError: it did not within `timeout` seconds.
    """
    host, _, port = coordinator.rpartition(":")
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=1):
                return max(int(deadline - time.monotonic()), 1)
        except (OSError, ValueError) as error:
            if time.monotonic() >= deadline:
                raise _timeout(coordinator, process_id, timeout, str(error)) from None
        time.sleep(0.2)


def _timeout(coordinator, process_id, timeout, text) -> TimeoutError:
    first = text.strip().splitlines()[0] if text.strip() else "no answer"
    return TimeoutError(
        f"Process {process_id} could not join the run at coordinator {coordinator} "
        f"within {timeout} s ({first[:300]}). Start process 0 (it serves that "
        "address) and the others with the same coordinator and number of "
        "processes, check that the host and port are reachable from here, or "
        "raise the timeout."
    )


def process_index() -> int:
    return jax.process_index()


def process_count() -> int:
    return jax.process_count()


def process_rows(layout, batch_size: int) -> tuple[int, int]:
    """`(start, stop)`: the rows of a global batch of `batch_size` rows
    that this process's devices hold under the data `layout` (a Keras
    `TensorLayout` of a `[batch]` array).

    Raises:
        ValueError: the batch does not split evenly over the layout's
            batch shards, or this process's rows are not one range.
    """
    sharding = layout.backend_layout
    try:
        sharding.shard_shape((batch_size,))
    except ValueError:
        axes = sharding.spec[0]
        axes = (axes,) if isinstance(axes, str) else axes
        shards = int(np.prod([sharding.mesh.shape[axis] for axis in axes]))
        raise ValueError(
            f"A batch of {batch_size} rows does not split evenly into the "
            f"{shards} shards of the mesh's batch axis; make the batch size a "
            f"multiple of {shards}."
        ) from None
    slices = sorted(
        {
            index[0].indices(batch_size)[:2]
            for index in sharding.addressable_devices_indices_map(
                (batch_size,)
            ).values()
        }
    )
    if any(a[1] < b[0] for a, b in zip(slices, slices[1:])):
        raise ValueError(
            f"This process's devices hold rows {slices} of the batch: not one "
            "range. Order the mesh's devices by process, as "
            "keras.distribution.list_devices() does."
        )
    return slices[0][0], max(stop for _, stop in slices)


def sync(name: str) -> None:
    """Waits until every process reaches the barrier `name`."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def gather(value) -> np.ndarray:
    """The whole of a (possibly sharded) array as numpy, on every process
    (a collective: every process must call it, in the same order)."""
    if getattr(value, "is_fully_addressable", True) or value.is_fully_replicated:
        return np.asarray(value)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(value, tiled=True))


def save_arrays(directory: str, arrays: dict) -> None:
    """Writes `{name: jax.Array}` to the new Orbax directory `directory`,
    each process its own shards (no array is gathered). Every process calls
    it with the same names; it returns when the save is complete on all."""
    import orbax.checkpoint as ocp

    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(os.path.abspath(directory), arrays)
        checkpointer.wait_until_finished()


def load_arrays(directory: str, targets: dict) -> dict:
    """Reads `{name: array}` from `directory` (`save_arrays`), each array
    straight into the sharding of `targets[name]` (an array of the shape
    and dtype to read: the variable's current value), whatever the device
    count and layout at save time."""
    import orbax.checkpoint as ocp

    abstract = {
        name: jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=value.sharding)
        for name, value in targets.items()
    }
    with ocp.StandardCheckpointer() as checkpointer:
        return checkpointer.restore(os.path.abspath(directory), abstract)
