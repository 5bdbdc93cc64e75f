"""`keras-transformers train PRESET`: the options of every training job, and
the choice of the job by the preset's family.

* gpt and mixtral presets: `cli.causal_lm.train_model` (next-token
  prediction on text);
* bert presets: `cli.bert.pretrain_bert` (masked-LM pretraining);
* transformer presets, or `--source/--target/--task`:
  `cli.seq2seq.train_seq2seq` (translation);
* vit presets, or `--images`: `cli.vit.train_vit` (image classification).

With `--distribution` or `--coordinator` (several processes), gpt and
mixtral presets train by `cli.causal_lm.train_model` with the model
sharded over every device of every process (JAX; `cli.distributed`).

Building the parser imports none of these jobs (nor Keras): `run` imports
the one it needs.
"""

from __future__ import annotations

import argparse
import json

from keras_transformers.cli._common import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_EPOCHS,
    DEFAULT_LEARNING_RATE,
    DEFAULT_MAX_CHARS,
    DEFAULT_SEQUENCE_LENGTH,
    DEFAULT_STEPS_PER_EPOCH,
    DEFAULT_VALIDATION_FRACTION,
    VIT_DEFAULTS,
    mark_defaults,
    positive_float,
    positive_int,
    prepare_training_process,
    wants_distribution,
)
from keras_transformers.cli.resume import add_resume_arguments

# The generated translation tasks: `keras_transformers.data.parallel.TASKS`,
# repeated here because that module imports Keras (a test checks they agree).
TRANSLATION_TASKS = ("numbers",)


def add_parser(commands) -> None:
    """Adds the `train` sub-command to the `keras-transformers` parser."""
    train = commands.add_parser(
        "train",
        help="train a causal LM (gpt), masked LM (bert), translation "
        "(transformer) or image classifier (vit) preset",
        description=(
            "Trains a tokenizer on the text (byte-level BPE for causal LMs, "
            "WordPiece for bert), then the preset's architecture (random init) "
            "on next-token prediction, or masked-token prediction with dynamic "
            "masking for bert, and saves both with `save_to_preset`. vit "
            "presets train an image classifier on --images (default: "
            "Fashion-MNIST)."
        ),
    )
    train.add_argument("preset", help="built-in preset, e.g. gpt_mini or bert_tiny")
    train.add_argument(
        "--data",
        help="UTF-8 text file (default: Python's own documentation, pydoc_data)",
    )
    train.add_argument(
        "--output", help="directory for the trained preset (default: runs/PRESET)"
    )
    train.add_argument(
        "--epochs",
        type=positive_int,
        default=DEFAULT_EPOCHS,
        help="default: %(default)s",
    )
    train.add_argument(
        "--steps-per-epoch",
        type=positive_int,
        default=DEFAULT_STEPS_PER_EPOCH,
        help="batches per epoch; the data wraps around (default: %(default)s)",
    )
    train.add_argument(
        "--batch-size",
        type=positive_int,
        default=DEFAULT_BATCH_SIZE,
        help="default: %(default)s",
    )
    train.add_argument(
        "--sequence-length",
        type=positive_int,
        help=f"tokens per sequence (default: {DEFAULT_SEQUENCE_LENGTH}, or the "
        "preset's max_sequence_length if smaller; a longer one raises it)",
    )
    train.add_argument(
        "--learning-rate",
        type=positive_float,
        default=DEFAULT_LEARNING_RATE,
        help="peak of the warmup + cosine schedule (default: %(default)s)",
    )
    train.add_argument(
        "--vocabulary-size",
        type=positive_int,
        help="vocabulary size (default: the preset's vocabulary_size; bert: at "
        "most 8000)",
    )
    train.add_argument(
        "--max-chars",
        type=positive_int,
        default=DEFAULT_MAX_CHARS,
        help="use at most this many characters of the text (default: %(default)s)",
    )
    train.add_argument(
        "--validation-fraction",
        type=float,
        default=DEFAULT_VALIDATION_FRACTION,
        help="share of the token stream held out at its end (default: %(default)s)",
    )
    train.add_argument("--seed", type=int, default=0)
    train.add_argument(
        "--prompt", default="The", help="prompt of the sample printed at the end"
    )
    train.add_argument(
        "--sample-tokens",
        type=int,
        default=40,
        help="tokens of the final sample; 0 skips it (default: %(default)s)",
    )
    _add_translation_arguments(train)
    _add_image_arguments(train)
    add_resume_arguments(train)
    _add_distribution_arguments(train)


def distribution_kind(text: str):
    """An argparse type: `auto`, `data`, `model` or a JSON dict of mesh axis
    sizes such as `{"batch": 2, "model": 2}`."""
    if text in ("auto", "data", "model"):
        return text
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not (
        isinstance(value, dict)
        and value
        and all(isinstance(v, int) and v >= 1 for v in value.values())
    ):
        raise argparse.ArgumentTypeError(
            "expected auto, data, model or a JSON dict of mesh axis sizes such as "
            f'\'{{"batch": 2, "model": 2}}\', got {text!r}'
        )
    return value


def _add_distribution_arguments(train: argparse.ArgumentParser) -> None:
    """The options of sharded and multi-process training (`cli.distributed`)."""
    group = train.add_argument_group(
        "several devices and processes (JAX; gpt and mixtral presets)",
        "--distribution shards the model over every device (of every "
        "process). For several processes, run the same command once per "
        "process, each with its own --process-id: every process reads the "
        "same data and feeds its own rows of each batch; process 0 writes "
        "the output and logs, and backups are sharded (each process writes "
        "its own part). --checkpoint-dir and --output must be on a file "
        "system that every process sees.",
    )
    group.add_argument(
        "--distribution",
        type=distribution_kind,
        help="data, model, auto or a JSON dict of mesh axis sizes (batch, model, "
        "expert); default with --coordinator: data",
    )
    group.add_argument(
        "--coordinator",
        metavar="HOST:PORT",
        help="address of process 0, which serves it (several processes)",
    )
    group.add_argument(
        "--num-processes", type=positive_int, help="how many processes take part"
    )
    group.add_argument("--process-id", type=int, help="this process's number, 0 .. N-1")


def _add_translation_arguments(train: argparse.ArgumentParser) -> None:
    """The options of transformer presets (`cli.seq2seq`)."""
    group = train.add_argument_group(
        "translation (transformer presets)",
        "--sequence-length caps the source and target lengths in tokens "
        "(default 64; longer lines are cut); --validation-fraction holds out "
        "the last lines.",
    )
    group.add_argument("--source", help="source-language text, one sentence a line")
    group.add_argument("--target", help="target-language text, line-aligned")
    group.add_argument(
        "--task",
        choices=TRANSLATION_TASKS,
        help="train on a generated task instead of files (numbers: English "
        "number words -> digits)",
    )
    group.add_argument(
        "--warmup-steps",
        type=int,
        help="warmup of the inverse-square-root schedule, which peaks at "
        "--learning-rate (default: a tenth of the steps, at most 4000)",
    )


def _add_image_arguments(train: argparse.ArgumentParser) -> None:
    """The options of vit presets (`cli.vit`); marks the defaults that vit
    presets replace unless given (`VIT_DEFAULTS`, `--steps-per-epoch`)."""
    mark_defaults(train, (*VIT_DEFAULTS, "steps_per_epoch"))
    group = train.add_argument_group(
        "images (vit presets)",
        "One epoch is one pass over the images unless --steps-per-epoch is "
        "given; defaults: --epochs {epochs}, --batch-size {batch_size}, "
        "--learning-rate {learning_rate}. --validation-fraction holds out "
        "images when there are no --test-images.".format(**VIT_DEFAULTS),
    )
    group.add_argument(
        "--images",
        help="a folder with one sub-folder of images per class, or an IDX "
        "images file (default: Fashion-MNIST)",
    )
    group.add_argument(
        "--labels", help="IDX labels file (default: found beside --images by name)"
    )
    group.add_argument("--test-images", help="test images (a folder or IDX file)")
    group.add_argument("--test-labels", help="IDX labels of --test-images")
    group.add_argument(
        "--image-size",
        type=int,
        help="train at this square size (default: the preset's image_size)",
    )
    group.add_argument(
        "--max-images",
        type=int,
        help="use at most this many training images (the first ones)",
    )
    group.add_argument(
        "--augment",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="random horizontal flips while training (default; use "
        "--no-augment for digits or text)",
    )
    group.add_argument(
        "--label-smoothing", type=float, default=0.1, help="default: %(default)s"
    )


def run(args: argparse.Namespace) -> int:
    """Runs `train`: `train_model`, `pretrain_bert` for a bert preset,
    `train_seq2seq` for a transformer preset (or --source/--target/--task),
    or `train_vit` for a vit preset (or --images), after
    `prepare_training_process` (TensorFlow's oneDNN kernels, freed host
    memory kept for reuse)."""
    prepare_training_process()
    from keras_transformers.cli.seq2seq import wants_seq2seq
    from keras_transformers.cli.vit import wants_vit
    from keras_transformers.presets import list_presets

    family = list_presets().get(args.preset, {}).get("family")
    if wants_distribution(args):
        from keras_transformers.cli.causal_lm import train_model

        train_model(args)
    elif wants_vit(args, family):
        from keras_transformers.cli.vit import train_vit

        train_vit(args)
    elif wants_seq2seq(args, family):
        from keras_transformers.cli.seq2seq import train_seq2seq

        train_seq2seq(args)
    elif family == "bert":
        from keras_transformers.cli.bert import pretrain_bert

        pretrain_bert(args)
    else:
        from keras_transformers.cli.causal_lm import train_model

        train_model(args)
    return 0
