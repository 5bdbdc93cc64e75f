"""The causal-LM job of `keras-transformers train`: text in, a trained
causal-LM preset (model, tokenizer) out, on one device or sharded over
several devices and processes (`cli.distributed`). `cli.train` parses the
arguments."""

from __future__ import annotations

import argparse
import sys
import time

from keras_transformers.cli import distributed, resume
from keras_transformers.cli._common import (
    DEFAULT_SEQUENCE_LENGTH,
    CLIError,
    quiet_stderr,
    wants_distribution,
)
from keras_transformers.cli._training import check_train_args, load_text, optimizer
from keras_transformers.cli.generate import generate_text


def _compile(model, args: argparse.Namespace, total_steps: int) -> None:
    from keras_transformers.training import (
        MaskedAccuracy,
        MaskedSparseCategoricalCrossentropy,
        Perplexity,
    )

    # Every window is full (no padding), so no label is ignored.
    model.compile(
        optimizer=optimizer(args, total_steps),
        loss=MaskedSparseCategoricalCrossentropy(from_logits=True),
        metrics=[Perplexity(from_logits=True), MaskedAccuracy(name="accuracy")],
    )


def train_model(args: argparse.Namespace):
    """Trains a tokenizer and a causal LM preset on text; saves a preset.

    With `--distribution` or `--coordinator` the model is sharded over
    every device of every process (JAX; `cli.distributed` names what
    changes): every process runs this, and process 0 prints and saves.

    Args:
        args: the parsed `train` arguments.

    Returns:
        The trained model, with its tokenizer attached and already saved to
        `args.output` (`model.history` holds the Keras `History`); when
        sharded, an unsharded copy of it in process 0 and None in the others.

    Raises:
        CLIError: an argument or the data cannot be used, or the processes
            cannot join.
    """
    sharded = wants_distribution(args)
    if sharded:
        distributed.join(args)
    check_train_args(args)
    import keras

    from keras_transformers import data, multiprocess
    from keras_transformers.models import CausalLM
    from keras_transformers.presets import from_preset, load_config
    from keras_transformers.training import ThroughputCallback

    with quiet_stderr():
        from keras_transformers.tokenizer import train_bpe

    primary = multiprocess.is_primary()
    say = print if primary else _silent
    start = time.perf_counter()
    config = load_config(args.preset)
    text, source = load_text(args)
    say(f"Data: {source}, {len(text):,} characters.")

    vocabulary_size = args.vocabulary_size or config.vocabulary_size
    try:
        with quiet_stderr():
            tokenizer = train_bpe([text], vocabulary_size=vocabulary_size)
            tokenizer = resume.backed_up_tokenizer(args, tokenizer)
            token_ids = tokenizer.encode(text)
    except ValueError as error:
        raise CLIError(f"cannot train the tokenizer: {error}") from None
    say(
        f"Tokenizer: byte-level BPE, {tokenizer.vocabulary_size:,} tokens; "
        f"{len(token_ids):,} tokens ({len(text) / max(len(token_ids), 1):.2f} "
        f"characters per token), {time.perf_counter() - start:.1f} s."
    )

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
    except ValueError as error:
        raise CLIError(f"training split: {error}") from None
    try:
        # Sharded: whole batches only, which split over the processes.
        validation_data = data.lm_dataset(
            validation_ids, length, args.batch_size, drop_remainder=sharded
        )
    except ValueError as error:
        raise CLIError(
            f"validation split (--validation-fraction {args.validation_fraction}): {error}"
        ) from None

    keras.utils.set_random_seed(args.seed)
    overrides = {
        "vocabulary_size": tokenizer.vocabulary_size,
        "max_sequence_length": max(length, config.max_sequence_length),
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    if sharded:
        model = distributed.sharded_model(args, overrides)
    else:
        model = from_preset(args.preset, **overrides)
    if not isinstance(model, CausalLM):
        raise CLIError(f"preset {args.preset!r} is not a causal language model.")
    total_steps = args.epochs * args.steps_per_epoch
    _compile(model, args, total_steps)
    mesh = f"; {distributed.describe(model)}" if sharded else ""
    say(
        f"Model: {args.preset} ({type(model).__name__}), {_params(model.config)} "
        f"parameters{mesh}; {args.epochs} epochs x {args.steps_per_epoch} steps of "
        f"{args.batch_size} x {length} tokens; validation: "
        f"{validation_data.num_tokens:,} tokens; backend: {keras.config.backend()}."
    )
    train_batches, validation_batches = train_data, validation_data
    if sharded:
        train_batches, validation_batches = distributed.process_batches(
            args, train_data, validation_data
        )
    throughput = ThroughputCallback(batch_size=args.batch_size, sequence_length=length)
    callbacks = resume.resume_callbacks(args)
    fit_start = time.perf_counter()
    history = model.fit(
        callbacks[0].resumable(train_batches),
        shuffle=False,  # the dataset shuffles itself, reproducibly
        validation_data=validation_batches,
        epochs=args.epochs,
        callbacks=[throughput, *callbacks],
        verbose=(1 if sys.stdout.isatty() else 2) if primary else 0,
    ).history
    fit_seconds = time.perf_counter() - fit_start

    if sharded:
        model = distributed.save(model, args, overrides, tokenizer)
    else:
        model.tokenizer = tokenizer
        model.save_to_preset(args.output)
    if not primary:
        return None
    _report(args, model, history, fit_seconds, time.perf_counter() - start)
    return model


def _silent(*args, **kwargs) -> None:
    """`print` in the processes other than process 0."""


def _report(args, model, history: dict, fit_seconds: float, seconds: float) -> None:
    """Prints the losses, the final metrics and a sample of the saved model."""
    for split, key in (("Training", "loss"), ("Validation", "val_loss")):
        losses = " -> ".join(f"{v:.3f}" for v in history[key])
        print(f"{split} loss per epoch: {losses}")
    speed = history.get("tokens_per_second", [0.0])[-1]
    print(
        f"Final: val_loss {history['val_loss'][-1]:.4f}, val_perplexity "
        f"{history['val_perplexity'][-1]:.2f}, val_accuracy "
        f"{history['val_accuracy'][-1]:.3f}; fit {fit_seconds:.0f} s "
        f"({speed:,.0f} tokens/s), total {seconds:.0f} s."
    )
    print(f"Saved the model and tokenizer to {args.output}")
    if args.sample_tokens > 0:
        try:
            sample = generate_text(
                model, args.prompt, args.sample_tokens, seed=args.seed
            )
            print(f"Sample (top_k=40, temperature 0.8): {sample!r}")
        except CLIError as error:  # the model is saved: report, do not fail
            print(f"No sample: {error}")


def _params(config) -> str:
    """Total parameters, and the active ones per token for MoE models."""
    total, active = config.num_params(), config.num_active_params()
    return (
        f"{total:,}" if total == active else f"{total:,} ({active:,} active per token)"
    )
