"""The `train` job of the `keras-transformers` command: text in, a trained
causal-LM preset (model, tokenizer) out. `cli.py` parses the arguments."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any

PROG = "keras-transformers"
CAUSAL_FAMILIES = ("gpt", "mixtral")
TRAIN_FAMILIES = (*CAUSAL_FAMILIES, "bert", "transformer", "vit")

# Defaults of `train`, sized so that `train gpt_mini` takes a few minutes on
# two CPU cores with the JAX backend.
DEFAULT_EPOCHS = 6
DEFAULT_STEPS_PER_EPOCH = 60
DEFAULT_BATCH_SIZE = 16
DEFAULT_SEQUENCE_LENGTH = 128
DEFAULT_LEARNING_RATE = 2e-3
DEFAULT_MAX_CHARS = 1_000_000
DEFAULT_VALIDATION_FRACTION = 0.05


class CLIError(Exception):
    """A mistake the user can fix: printed as one line, exit status 2."""


@contextlib.contextmanager
def _quiet_stderr():
    """Silences file descriptor 2 for the duration of a block.

    TensorFlow (which the keras-hub tokenizer imports on every backend)
    writes C++ start-up and device-probe logs straight to file descriptor 2,
    which neither Python nor `TF_CPP_MIN_LOG_LEVEL` can silence. Python
    exceptions still propagate (and print once stderr is back).
    """
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # e.g. a captured stderr
        yield
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), fd)
            try:
                yield
            finally:
                sys.stderr.flush()
                os.dup2(saved, fd)
    finally:
        os.close(saved)


# ---------------------------------------------------------------------------
# Argument parsing.
# ---------------------------------------------------------------------------


def _check_train_args(
    args: argparse.Namespace, families: tuple[str, ...] = CAUSAL_FAMILIES
) -> dict[str, Any]:
    """Validates `train` arguments before any slow work; returns the preset info.

    Args:
        args: the parsed `train` arguments.
        families: the preset families this training job accepts.
    """
    from keras_transformers.presets import list_presets

    presets = list_presets()
    if args.preset not in presets:
        raise CLIError(
            f"unknown preset {args.preset!r}. Trainable presets: "
            + ", ".join(n for n, i in presets.items() if i["family"] in TRAIN_FAMILIES)
            + f". Run `{PROG} presets` for details."
        )
    info = presets[args.preset]
    if info["family"] not in families:
        raise CLIError(
            f"preset {args.preset!r} is a {info['family']!r} model; `train` trains "
            f"causal language models ({', '.join(CAUSAL_FAMILIES)} presets) and "
            "masked language models (bert presets)."
        )
    if args.data is not None and not Path(args.data).is_file():
        raise CLIError(f"data file not found: {args.data}")
    if args.output is None:
        args.output = str(Path("runs") / args.preset)
    output = Path(args.output)
    if output.exists() and not output.is_dir():
        raise CLIError(f"--output {args.output} exists and is not a directory.")
    try:  # fail now rather than after training
        output.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise CLIError(f"cannot create --output {args.output}: {error}") from None
    if not 0.0 < args.validation_fraction < 0.5:
        raise CLIError(
            f"--validation-fraction must be in (0, 0.5), got {args.validation_fraction}."
        )
    from keras_transformers.cli_resume import check_resume

    check_resume(args)
    return info


def _load_text(args: argparse.Namespace) -> tuple[str, str]:
    """The training text (at most `--max-chars` characters) and its source."""
    from keras_transformers import data

    if args.data is None:
        source, text = "Python documentation (pydoc_data)", data.default_text()
        return text[: args.max_chars], source
    try:
        return data.read_text(args.data, max_chars=args.max_chars), args.data
    except (OSError, UnicodeError) as error:
        raise CLIError(f"cannot read {args.data}: {error}") from None


def _optimizer(args: argparse.Namespace, total_steps: int):
    """AdamW (in place on PyTorch) on a warmup + cosine schedule peaking at
    `--learning-rate`."""
    from keras_transformers.training import AdamW, WarmupCosineDecay

    schedule = WarmupCosineDecay(
        peak_learning_rate=args.learning_rate,
        warmup_steps=min(100, max(total_steps // 10, 1)),
        decay_steps=total_steps,
        min_learning_rate=args.learning_rate / 10,
    )
    return AdamW(
        learning_rate=schedule, weight_decay=0.01, beta_2=0.95, global_clipnorm=1.0
    )


def _compile(model, args: argparse.Namespace, total_steps: int) -> None:
    from keras_transformers.training import (
        MaskedAccuracy,
        MaskedSparseCategoricalCrossentropy,
        Perplexity,
    )

    optimizer = _optimizer(args, total_steps)
    # Every window is full (no padding), so no label is ignored.
    model.compile(
        optimizer=optimizer,
        loss=MaskedSparseCategoricalCrossentropy(from_logits=True),
        metrics=[Perplexity(from_logits=True), MaskedAccuracy(name="accuracy")],
    )


def train_model(args: argparse.Namespace):
    """Trains a tokenizer and a causal LM preset on text; saves a preset.

    Args:
        args: the parsed `train` arguments.

    Returns:
        The trained model, with its tokenizer attached and already saved to
        `args.output` (`model.history` holds the Keras `History`).

    Raises:
        CLIError: an argument or the data cannot be used.
    """
    _check_train_args(args)
    import keras

    from keras_transformers import cli_resume, data
    from keras_transformers.models import CausalLM
    from keras_transformers.presets import from_preset, load_config
    from keras_transformers.training import ThroughputCallback

    with _quiet_stderr():
        from keras_transformers.tokenizer import train_bpe

    start = time.perf_counter()
    config = load_config(args.preset)
    text, source = _load_text(args)
    print(f"Data: {source}, {len(text):,} characters.")

    vocabulary_size = args.vocabulary_size or config.vocabulary_size
    try:
        with _quiet_stderr():
            tokenizer = train_bpe([text], vocabulary_size=vocabulary_size)
            tokenizer = cli_resume.backed_up_tokenizer(args, tokenizer)
            token_ids = tokenizer.encode(text)
    except ValueError as error:
        raise CLIError(f"cannot train the tokenizer: {error}") from None
    print(
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
        validation_data = data.lm_dataset(validation_ids, length, args.batch_size)
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
    model = from_preset(args.preset, **overrides)
    if not isinstance(model, CausalLM):
        raise CLIError(f"preset {args.preset!r} is not a causal language model.")
    total_steps = args.epochs * args.steps_per_epoch
    _compile(model, args, total_steps)
    print(
        f"Model: {args.preset} ({type(model).__name__}), {_params(model.config)} "
        f"parameters; {args.epochs} epochs x {args.steps_per_epoch} steps of "
        f"{args.batch_size} x {length} tokens; validation: "
        f"{validation_data.num_tokens:,} tokens; backend: {keras.config.backend()}."
    )
    throughput = ThroughputCallback(batch_size=args.batch_size, sequence_length=length)
    callbacks = cli_resume.resume_callbacks(args)
    fit_start = time.perf_counter()
    history = model.fit(
        callbacks[0].resumable(train_data),
        shuffle=False,  # the dataset shuffles itself, reproducibly
        validation_data=validation_data,
        epochs=args.epochs,
        callbacks=[throughput, *callbacks],
        verbose=1 if sys.stdout.isatty() else 2,
    ).history
    fit_seconds = time.perf_counter() - fit_start

    model.tokenizer = tokenizer
    model.save_to_preset(args.output)
    losses = " -> ".join(f"{v:.3f}" for v in history["val_loss"])
    speed = history.get("tokens_per_second", [0.0])[-1]
    print(f"Validation loss per epoch: {losses}")
    print(
        f"Final: val_loss {history['val_loss'][-1]:.4f}, val_perplexity "
        f"{history['val_perplexity'][-1]:.2f}, val_accuracy "
        f"{history['val_accuracy'][-1]:.3f}; fit {fit_seconds:.0f} s "
        f"({speed:,.0f} tokens/s), total {time.perf_counter() - start:.0f} s."
    )
    print(f"Saved the model and tokenizer to {args.output}")
    if args.sample_tokens > 0:
        try:
            sample = _generate(model, args.prompt, args.sample_tokens, seed=args.seed)
            print(f"Sample (top_k=40, temperature 0.8): {sample!r}")
        except CLIError as error:  # the model is saved: report, do not fail
            print(f"No sample: {error}")
    return model


# ---------------------------------------------------------------------------
# generate
# ---------------------------------------------------------------------------


def _generate(model, prompt: str, max_new_tokens: int, seed=None, **kwargs) -> str:
    """`model.generate` with the CLI's default sampler, errors as CLIError."""
    if not prompt:
        raise CLIError("--prompt is empty: give at least one character.")
    if kwargs.get("sampler") is None:
        kwargs["sampler"] = "top_p" if kwargs.get("top_p") is not None else "top_k"
    if kwargs["sampler"] == "top_k" and kwargs.get("top_k") is None:
        kwargs["top_k"] = 40
    kwargs.setdefault("temperature", 0.8)
    try:
        return model.generate(
            prompt, max_new_tokens=max_new_tokens, seed=seed, **kwargs
        )
    except ValueError as error:
        raise CLIError(str(error)) from None


def _params(config) -> str:
    """Total parameters, and the active ones per token for MoE models."""
    total, active = config.num_params(), config.num_active_params()
    return (
        f"{total:,}" if total == active else f"{total:,} ({active:,} active per token)"
    )
