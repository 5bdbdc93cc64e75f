"""The causal-LM job of `keras-transformers train` with `--distribution`
or several processes (`--coordinator`, `--num-processes`, `--process-id`):
the model sharded over every device of every process (JAX).

The same job as `cli.causal_lm.train_model` (the same tokenizer, batches,
model, optimizer and schedule, so the same training losses), with these
differences:

* every process runs the command; `multiprocess.initialize` joins them
  before anything computes;
* the model is built by `from_preset(..., distribution=...)` (default
  with `--coordinator`: `data`);
* each process feeds its own rows of every global batch
  (`multiprocess.ProcessBatches`); the validation batches are whole
  (a last, smaller one is dropped, so that it splits like the others);
* backups are sharded (`ShardedBackupAndRestore`: each process writes its
  own shards) and `--resume` may run on another number of processes;
* process 0 writes the preset (its weights gathered once, at the end), the
  backup's metadata and the printed log; it prints the sample.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from keras_transformers.cli import resume
from keras_transformers.cli._common import (
    DEFAULT_SEQUENCE_LENGTH,
    CLIError,
    quiet_stderr,
)
from keras_transformers.cli._training import (
    CAUSAL_FAMILIES,
    check_train_args,
    load_text,
)
from keras_transformers.cli.causal_lm import _compile, _params
from keras_transformers.cli.generate import generate_text


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


def _join(args: argparse.Namespace) -> None:
    """Joins the processes (`--coordinator`), before anything computes."""
    if args.coordinator is None:
        return
    from keras_transformers import multiprocess

    try:
        multiprocess.initialize(args.coordinator, args.num_processes, args.process_id)
    except TimeoutError as error:
        raise CLIError(str(error)) from None


def _backup(args: argparse.Namespace):
    """The run's `ShardedBackupAndRestore` (options checked on `--resume`,
    written by process 0)."""
    from keras_transformers import multiprocess
    from keras_transformers.training.sharded_checkpoint import ShardedBackupAndRestore

    directory = resume.checkpoint_dir(args)
    if getattr(args, "resume", False):
        resume._check_options(args, directory)
    if multiprocess.is_primary():
        directory.mkdir(parents=True, exist_ok=True)
        options = resume._options(args)
        (directory / resume.ARGS_FILE).write_text(json.dumps(options, indent=1) + "\n")
    multiprocess.sync("cli:backup")
    every = getattr(args, "checkpoint_every", None) or "epoch"
    return ShardedBackupAndRestore(str(directory), save_freq=every)


def _tokenizer(args: argparse.Namespace, tokenizer):
    """`resume.backed_up_tokenizer`, written by process 0 only."""
    from keras_transformers import multiprocess

    directory = resume.checkpoint_dir(args) / resume.TOKENIZER_DIR
    if getattr(args, "resume", False) and directory.is_dir():
        return type(tokenizer).from_assets(directory)
    if multiprocess.is_primary():
        directory.mkdir(parents=True, exist_ok=True)
        tokenizer.save_assets(directory)
    return tokenizer


def _save(model, args, overrides, tokenizer):
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


def train_distributed(args: argparse.Namespace):
    """Trains a tokenizer and a sharded causal LM; process 0 saves a preset.

    Args:
        args: the parsed `train` arguments.

    Returns:
        In process 0 the trained model (unsharded, with its tokenizer, saved
        to `args.output`); in the others None.

    Raises:
        CLIError: an argument or the data cannot be used, or the processes
            cannot join.
    """
    check_distribution_args(args)
    _join(args)
    check_train_args(args)
    import keras

    from keras_transformers import data, multiprocess
    from keras_transformers.distribution import variable_layouts
    from keras_transformers.presets import from_preset, load_config
    from keras_transformers.training import ThroughputCallback

    with quiet_stderr():
        from keras_transformers.tokenizer import train_bpe

    primary = multiprocess.is_primary()
    say = print if primary else (lambda *a, **k: None)
    start = time.perf_counter()
    config = load_config(args.preset)
    text, source = load_text(args)
    say(f"Data: {source}, {len(text):,} characters.")
    try:
        with quiet_stderr():
            tokenizer = train_bpe(
                [text], vocabulary_size=args.vocabulary_size or config.vocabulary_size
            )
            tokenizer = _tokenizer(args, tokenizer)
            token_ids = tokenizer.encode(text)
    except ValueError as error:
        raise CLIError(f"cannot train the tokenizer: {error}") from None
    length = args.sequence_length or min(
        DEFAULT_SEQUENCE_LENGTH, config.max_sequence_length
    )
    train_ids, validation_ids = data.split_tokens(token_ids, args.validation_fraction)
    try:
        train_data = data.lm_dataset(
            train_ids,
            length,
            args.batch_size,
            shuffle=True,
            seed=args.seed,
            num_batches=args.steps_per_epoch,
        )
        validation_data = data.lm_dataset(
            validation_ids, length, args.batch_size, drop_remainder=True
        )
    except ValueError as error:
        raise CLIError(f"data: {error}") from None

    keras.utils.set_random_seed(args.seed)
    overrides = {
        "vocabulary_size": tokenizer.vocabulary_size,
        "max_sequence_length": max(length, config.max_sequence_length),
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    distribution = args.distribution or "data"
    try:
        model = from_preset(args.preset, distribution=distribution, **overrides)
    except ValueError as error:
        raise CLIError(f"--distribution {json.dumps(distribution)}: {error}") from None
    total_steps = args.epochs * args.steps_per_epoch
    _compile(model, args, total_steps)
    mesh = keras.distribution.distribution().device_mesh
    split = sum(any(axes) for axes in variable_layouts(model).values())
    say(
        f"Model: {args.preset} ({type(model).__name__}), {_params(model.config)} "
        f"parameters; mesh {dict(zip(mesh.axis_names, mesh.shape))} over "
        f"{multiprocess.process_count()} process(es), {split} weights split; "
        f"{args.epochs} epochs x {args.steps_per_epoch} steps of {args.batch_size} x "
        f"{length} tokens."
    )
    try:
        train_batches = multiprocess.ProcessBatches(train_data)
        validation_batches = multiprocess.ProcessBatches(validation_data)
        multiprocess.process_rows(args.batch_size)
    except ValueError as error:
        raise CLIError(f"--batch-size {args.batch_size}: {error}") from None
    backup = _backup(args)
    throughput = ThroughputCallback(batch_size=args.batch_size, sequence_length=length)
    fit_start = time.perf_counter()
    history = model.fit(
        backup.resumable(train_batches),
        shuffle=False,  # the dataset shuffles itself, reproducibly
        validation_data=validation_batches,
        epochs=args.epochs,
        callbacks=[throughput, backup],
        verbose=(1 if sys.stdout.isatty() else 2) if primary else 0,
    ).history
    fit_seconds = time.perf_counter() - fit_start
    local = _save(model, args, overrides, tokenizer)
    if not primary:
        return None
    losses = " -> ".join(f"{v:.4f}" for v in history["loss"])
    print(f"Training loss per epoch: {losses}")
    losses = " -> ".join(f"{v:.4f}" for v in history["val_loss"])
    print(f"Validation loss per epoch: {losses}")
    print(
        f"Final: val_loss {history['val_loss'][-1]:.4f}; fit {fit_seconds:.0f} s, "
        f"total {time.perf_counter() - start:.0f} s."
    )
    print(f"Saved the model and tokenizer to {args.output}")
    if args.sample_tokens > 0:
        try:
            sample = generate_text(
                local, args.prompt, args.sample_tokens, seed=args.seed
            )
            print(f"Sample (top_k=40, temperature 0.8): {sample!r}")
        except CLIError as error:
            print(f"No sample: {error}")
    return local
