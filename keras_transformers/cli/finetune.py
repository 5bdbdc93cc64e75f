"""`keras-transformers finetune HANDLE --task classify|causal-lm`: a bert
text classifier (`cli.classify`), or LoRA on a decoder (`cli.lora`)."""

from __future__ import annotations

import argparse

from keras_transformers.cli._common import (
    FINETUNE_DEFAULTS,
    LABELS_FILE,
    PROG,
    WORDPIECE_VOCABULARY_SIZE,
    positive_float,
    positive_int,
    prepare_training_process,
)
from keras_transformers.cli.resume import add_resume_arguments


def _defaults(key: str) -> str:
    """The help text of an option whose default depends on --task."""
    values = ", ".join(f"{v[key]:g} ({task})" for task, v in FINETUNE_DEFAULTS.items())
    return f"default: {values}"


def add_parser(commands) -> None:
    """Adds the `finetune` sub-command to the `keras-transformers` parser."""
    p = commands.add_parser(
        "finetune",
        help="fine-tune a checkpoint: a bert text classifier, or LoRA on a decoder",
        description=(
            "--task classify: fine-tunes a BertClassifier on the texts and labels of "
            "a CSV file (labels may be strings), reports validation accuracy and "
            "macro-F1, and saves the preset with the label names in "
            f"{LABELS_FILE}. --task causal-lm: LoRA fine-tuning of a decoder "
            "checkpoint on prompt/completion pairs (CSV), plain text, or chat "
            "examples (.jsonl: conversations trained on the assistant turns), reports "
            "the validation loss before and after, and saves the adapter."
        ),
    )
    p.add_argument(
        "preset",
        help="a Hugging Face directory, hf://org/name, a saved preset directory, "
        "or (classify) a bert preset name to train from scratch",
    )
    p.add_argument("--task", choices=tuple(FINETUNE_DEFAULTS), default="classify")
    p.add_argument(
        "--data",
        required=True,
        help="CSV file with a header row (causal-lm: or text, or .jsonl chat examples)",
    )
    p.add_argument("--text-column", default="text", help="default: %(default)s")
    p.add_argument("--label-column", default="label", help="default: %(default)s")
    p.add_argument("--output", help="default: runs/finetune")
    p.add_argument("--epochs", type=positive_int, help=_defaults("epochs"))
    p.add_argument("--batch-size", type=positive_int, help=_defaults("batch_size"))
    p.add_argument(
        "--sequence-length", type=positive_int, help=_defaults("sequence_length")
    )
    p.add_argument(
        "--learning-rate", type=positive_float, help=_defaults("learning_rate")
    )
    p.add_argument("--validation-fraction", type=float, default=0.1)
    p.add_argument(
        "--vocabulary-size",
        type=positive_int,
        default=WORDPIECE_VOCABULARY_SIZE,
        help="WordPiece size when the preset has no vocabulary (default: %(default)s)",
    )
    p.add_argument("--seed", type=int, default=0)
    _add_causal_lm_arguments(p)
    add_resume_arguments(p)


def _add_causal_lm_arguments(parser: argparse.ArgumentParser) -> None:
    """The `finetune` options of `--task causal-lm`."""
    group = parser.add_argument_group("--task causal-lm (LoRA on a decoder)")
    group.add_argument("--lora-rank", type=int, default=8, help="default: %(default)s")
    group.add_argument("--lora-alpha", type=float, help="default: the rank")
    group.add_argument(
        "--lora-target",
        default="query,value",
        help="projections (default: %(default)s)",
    )
    group.add_argument("--prompt-column", default="prompt", help="default: %(default)s")
    group.add_argument(
        "--completion-column", default="completion", help="default: %(default)s"
    )
    group.add_argument(
        "--chat-template",
        help="a Jinja file for .jsonl conversations (default: the checkpoint's)",
    )
    group.add_argument(
        "--pack",
        action="store_true",
        help="several .jsonl examples per row, each attending to itself only",
    )
    group.add_argument(
        "--merge",
        action="store_true",
        help=f"also save the merged model as a preset (loadable by `{PROG} generate`)",
    )


def run(args: argparse.Namespace) -> int:
    """Runs `finetune`: `cli.classify.finetune_classifier` (--task classify)
    or `cli.lora.finetune_causal_lm` (--task causal-lm), after
    `prepare_training_process` (TensorFlow's oneDNN kernels, freed host
    memory kept for reuse)."""
    prepare_training_process()
    if args.task == "causal-lm":
        from keras_transformers.cli.lora import finetune_causal_lm

        finetune_causal_lm(args)
    else:
        from keras_transformers.cli.classify import finetune_classifier

        finetune_classifier(args)
    return 0
