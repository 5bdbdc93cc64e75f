"""The multi-process options of the causal-LM job of `keras-transformers
train` (`cli.causal_lm.train_model`): `--distribution`, or several
processes (`--coordinator`, `--num-processes`, `--process-id`), shard the
model over every device of every process (JAX).

With them the job differs from a single-device run in these places only:

* every process runs the command; `join` links them before anything
  computes;
* the model is built by `from_preset(..., distribution=...)` (default
  with `--coordinator`: `data`);
* each process feeds its own rows of every global batch
  (`multiprocess.ProcessBatches`); the validation batches are whole
  (a last, smaller one is dropped, so that it splits like the others);
* backups are sharded (`ShardedBackupAndRestore`: each process writes its
  own shards) and `--resume` may run on another number of processes;
* process 0 writes the preset (its weights gathered once, at the end,
  `save`), the backup's options and the printed log; it prints the sample.
"""

from __future__ import annotations

import argparse
import json

from keras_transformers.cli._common import CLIError
from keras_transformers.cli._training import CAUSAL_FAMILIES


def check_distribution_args(args: argparse.Namespace) -> None:
    """Checks the options of sharded and multi-process training before any
    slow work.

    Raises:
        CLIError: incomplete or inconsistent process options, a backend other
            than JAX, or a preset this job does not train.
    """
    import keras

    from keras_transformers.presets import list_presets

    several = (args.coordinator, args.num_processes, args.process_id)
    if any(v is not None for v in several) and any(v is None for v in several):
        raise CLIError(
            "several processes need all of --coordinator HOST:PORT, --num-processes N "
            "and --process-id I (every process the same --coordinator and "
            "--num-processes, each its own --process-id)."
        )
    if args.process_id is not None and not 0 <= args.process_id < args.num_processes:
        raise CLIError(
            f"--process-id must be in 0 .. {args.num_processes - 1} for "
            f"--num-processes {args.num_processes}, got {args.process_id}."
        )
    if keras.config.backend() != "jax":
        raise CLIError(
            "--distribution and --coordinator shard the model with keras.distribution, "
            f"which runs on JAX (KERAS_BACKEND is {keras.config.backend()!r}): set "
            "KERAS_BACKEND=jax."
        )
    family = list_presets().get(args.preset, {}).get("family")
    if family is not None and family not in CAUSAL_FAMILIES:
        raise CLIError(
            f"--distribution and --coordinator train gpt and mixtral presets; "
            f"{args.preset!r} is a {family!r} preset. Train it without them."
        )


def join(args: argparse.Namespace) -> None:
    """Checks the options (`check_distribution_args`), then joins the
    processes (`--coordinator`), before anything computes."""
    check_distribution_args(args)
    if args.coordinator is None:
        return
    from keras_transformers import multiprocess

    try:
        multiprocess.initialize(args.coordinator, args.num_processes, args.process_id)
    except TimeoutError as error:
        raise CLIError(str(error)) from None


def sharded_model(args: argparse.Namespace, overrides: dict):
    """`from_preset(args.preset, distribution=..., **overrides)`, a
    distribution it cannot use named in a `CLIError`."""
    from keras_transformers.presets import from_preset

    distribution = args.distribution or "data"
    try:
        return from_preset(args.preset, distribution=distribution, **overrides)
    except ValueError as error:
        raise CLIError(f"--distribution {json.dumps(distribution)}: {error}") from None


def describe(model) -> str:
    """`mesh {...} over N process(es), K weights split` for the log."""
    import keras

    from keras_transformers import multiprocess
    from keras_transformers.distribution import variable_layouts

    mesh = keras.distribution.distribution().device_mesh
    split = sum(any(axes) for axes in variable_layouts(model).values())
    return (
        f"mesh {dict(zip(mesh.axis_names, mesh.shape))} over "
        f"{multiprocess.process_count()} process(es), {split} weights split"
    )


def process_batches(args: argparse.Namespace, *datasets) -> list:
    """Each dataset of global batches as this process's rows of them
    (`multiprocess.ProcessBatches`).

    Raises:
        CLIError: `--batch-size` does not split over the processes.
    """
    from keras_transformers import multiprocess

    try:
        batches = [multiprocess.ProcessBatches(d) for d in datasets]
        multiprocess.process_rows(args.batch_size)
    except ValueError as error:
        raise CLIError(f"--batch-size {args.batch_size}: {error}") from None
    return batches


def save(model, args: argparse.Namespace, overrides: dict, tokenizer):
    """Gathers the weights (every process), then process 0 saves them as a
    preset from an unsharded copy of the model, which it returns (the other
    processes return None)."""
    import keras

    from keras_transformers import multiprocess
    from keras_transformers.presets import from_preset

    # Every process takes part in gathering each sharded variable.
    values = [multiprocess.gather(v.value) for v in model.variables]
    local = None
    if multiprocess.is_primary():
        distribution = keras.distribution.distribution()
        keras.distribution.set_distribution(None)
        try:
            local = from_preset(args.preset, **overrides)
        finally:
            keras.distribution.set_distribution(distribution)
        for variable, value in zip(local.variables, values, strict=True):
            variable.assign(value)
        local.tokenizer = tokenizer
        local.save_to_preset(args.output)
    multiprocess.sync("cli:saved")
    return local
