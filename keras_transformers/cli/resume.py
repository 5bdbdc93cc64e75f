"""Backups and `--resume` for the `train` jobs of the `keras-transformers`
command (causal LM, bert, transformer and vit presets) and its `finetune`
jobs (classifier, LoRA).

Every `train` and `finetune` job backs up its training state into `--checkpoint-dir`
(default: `OUTPUT/checkpoint`) every `--checkpoint-every` steps (default:
once per epoch) with `keras_transformers.training.BackupAndRestore`, and
deletes the backup when training completes. After an interruption (an
error, Ctrl-C, a killed process), the same command with `--resume`
continues from the last backup: weights, optimizer state (AdamW moments
and step count, hence the learning-rate schedule's position), dropout
seeds, MoE router statistics and the position in the data (the same
batches in the same order), with the tokenizer the interrupted run trained
(training a tokenizer again need not give the same vocabulary). It ends
with the weights of an uninterrupted run. The options that shape training
must be the same as in the interrupted run; `--resume` checks them.

The `train` and `finetune` parsers add their options from here (`add_resume_arguments`), so
this module imports nothing heavy at import time.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from keras_transformers.cli._common import CLIError, positive_int, wants_distribution

CHECKPOINT_DIR = "checkpoint"  # inside --output
ARGS_FILE = "train_args.json"  # the options of the run being backed up
TOKENIZER_DIR = "tokenizer"  # the tokenizer the backed-up run trained
METADATA_FILE = "training_metadata.json"  # written by BackupAndRestore
# Options that change what is trained: a resumed run must repeat them.
TRAINING_OPTIONS = (
    "preset",
    "data",
    "epochs",
    "steps_per_epoch",
    "batch_size",
    "sequence_length",
    "learning_rate",
    "vocabulary_size",
    "max_chars",
    "validation_fraction",
    "seed",
    "source",
    "target",
    "task",
    "warmup_steps",
    "images",
    "labels",
    "image_size",
    "max_images",
    "augment",
    "label_smoothing",
    "text_column",
    "label_column",
    "prompt_column",
    "completion_column",
    "lora_rank",
    "lora_alpha",
    "lora_target",
)


def add_resume_arguments(train: argparse.ArgumentParser) -> None:
    """Adds `--checkpoint-dir`, `--checkpoint-every` and `--resume` to the
    parser of a training subcommand (`train`, `finetune`)."""
    group = train.add_argument_group(
        "backups and --resume",
        "Training is backed up while it runs and the backup deleted when it "
        "completes. After an interruption, the same command with --resume "
        "continues from the last backup: weights, optimizer state (moments, "
        "step count and so the learning-rate schedule's position), dropout "
        "seeds, MoE router statistics and the position in the data, ending "
        "with the weights of an uninterrupted run.",
    )
    group.add_argument(
        "--checkpoint-dir",
        help=f"backup directory (default: OUTPUT/{CHECKPOINT_DIR})",
    )
    group.add_argument(
        "--checkpoint-every",
        type=positive_int,
        help="back up every this many steps (default: at the end of each epoch)",
    )
    group.add_argument(
        "--resume",
        action="store_true",
        help="continue the interrupted run backed up in --checkpoint-dir",
    )


def checkpoint_dir(args: argparse.Namespace) -> Path:
    """The backup directory of a run (after `--output` is known)."""
    if getattr(args, "checkpoint_dir", None):
        return Path(args.checkpoint_dir)
    return Path(args.output) / CHECKPOINT_DIR


def _options(args: argparse.Namespace) -> dict:
    return {k: getattr(args, k) for k in TRAINING_OPTIONS if hasattr(args, k)}


def check_resume(args: argparse.Namespace) -> None:
    """Checks `--resume` against the backup directory before any slow work.

    Raises:
        CLIError: `--resume` without a backup, or a backup without
            `--resume` (it would be overwritten).
    """
    directory = checkpoint_dir(args)
    backed_up = (directory / METADATA_FILE).is_file()
    if getattr(args, "resume", False) and not backed_up:
        raise CLIError(
            f"--resume: no backup in {directory} (it is deleted when training "
            "completes). Run without --resume to start training, or pass the "
            "--checkpoint-dir of the interrupted run."
        )
    if not getattr(args, "resume", False):
        if backed_up:
            raise CLIError(
                f"{directory} holds the backup of an interrupted run: add "
                "--resume to continue it, or delete the directory to start over."
            )


def _check_options(args: argparse.Namespace, directory: Path) -> None:
    """Raises CLIError when a training option differs from the backed-up
    run's."""
    saved_file = directory / ARGS_FILE
    saved = json.loads(saved_file.read_text()) if saved_file.is_file() else {}
    for key, value in _options(args).items():
        if key in saved and saved[key] != value:
            flag = key if key == "preset" else "--" + key.replace("_", "-")
            raise CLIError(
                f"--resume: {flag} is {value!r} but the interrupted run used "
                f"{saved[key]!r}; give the same options to resume it."
            )


def backed_up_tokenizer(args: argparse.Namespace, tokenizer):
    """The tokenizer of the run: with `--resume`, the one the interrupted
    run trained (saved in its backup directory); else `tokenizer`, which is
    saved there (by process 0 of several) for a later `--resume`. Call it
    before encoding the data."""
    from keras_transformers import multiprocess

    directory = checkpoint_dir(args) / TOKENIZER_DIR
    if getattr(args, "resume", False) and directory.is_dir():
        return type(tokenizer).from_assets(directory)
    if multiprocess.is_primary():
        directory.mkdir(parents=True, exist_ok=True)
        tokenizer.save_assets(directory)
    return tokenizer


def resume_callbacks(args: argparse.Namespace) -> list:
    """`[backup]`: the `BackupAndRestore` of a run, or with `--distribution`
    or `--coordinator` the `ShardedBackupAndRestore` of a model sharded
    over several devices or processes (each process writes its own shards;
    process 0 the options). Train with `fit(backup.resumable(data),
    shuffle=False, callbacks=[..., *these])`."""
    from keras_transformers import multiprocess
    from keras_transformers.training import BackupAndRestore

    directory = checkpoint_dir(args)
    if getattr(args, "resume", False):
        _check_options(args, directory)
    if multiprocess.is_primary():
        directory.mkdir(parents=True, exist_ok=True)
        options = json.dumps(_options(args), indent=1)
        (directory / ARGS_FILE).write_text(options + "\n")
    multiprocess.sync("cli:backup")
    every = getattr(args, "checkpoint_every", None) or "epoch"
    if wants_distribution(args):
        from keras_transformers.training.sharded_checkpoint import (
            ShardedBackupAndRestore,
        )

        return [ShardedBackupAndRestore(str(directory), save_freq=every)]
    return [BackupAndRestore(str(directory), save_freq=every)]
