"""What the training jobs of the `keras-transformers` command share: the
checks of the `train` arguments, the training text, the optimizer and a
`fit` that reports a validation metric per epoch."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from keras_transformers.cli import resume
from keras_transformers.cli._common import PROG, CLIError

CAUSAL_FAMILIES = ("gpt", "mixtral")
TRAIN_FAMILIES = (*CAUSAL_FAMILIES, "bert", "transformer", "vit")


def check_train_args(
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
    resume.check_resume(args)
    return info


def load_text(args: argparse.Namespace) -> tuple[str, str]:
    """The training text (at most `--max-chars` characters) and its source."""
    from keras_transformers import data

    if args.data is None:
        source, text = "Python documentation (pydoc_data)", data.default_text()
        return text[: args.max_chars], source
    try:
        return data.read_text(args.data, max_chars=args.max_chars), args.data
    except (OSError, UnicodeError) as error:
        raise CLIError(f"cannot read {args.data}: {error}") from None


def optimizer(args: argparse.Namespace, total_steps: int):
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


def fit(model, x, validation, args, metric, y=None, batch_size=None, **kwargs):
    """`model.fit` (`kwargs`: further `fit` arguments); prints the
    validation `metric` per epoch. Returns `(history dict, seconds)`."""
    start = time.perf_counter()
    history = model.fit(
        x,
        y,
        batch_size=batch_size,
        validation_data=validation,
        epochs=args.epochs,
        verbose=1 if sys.stdout.isatty() else 2,
        **kwargs,
    ).history
    values = " -> ".join(f"{v:.3f}" for v in history[f"val_{metric}"])
    print(f"Validation {metric.replace('_', ' ')} per epoch: {values}")
    return history, time.perf_counter() - start
