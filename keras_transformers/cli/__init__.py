"""The `keras-transformers` command: list presets, train, fine-tune, generate.

Usage::

    keras-transformers presets [--family gpt]
    keras-transformers train gpt_mini --output runs/gpt_mini [--data corpus.txt]
    keras-transformers train bert_tiny --output runs/bert_tiny [--data corpus.txt]
    keras-transformers finetune runs/bert_tiny --task classify --data tweets.csv \
        --text-column text --label-column label --output runs/classifier
    keras-transformers generate runs/gpt_mini --prompt "The Python" [--stream]
    keras-transformers chat hf://HuggingFaceTB/SmolLM2-135M-Instruct [--system TEXT]
    keras-transformers train transformer_tiny --source en.txt --target fr.txt \
        --output runs/en_fr        (or --task numbers: no files needed)
    keras-transformers translate runs/en_fr --text "Hello." [--num-beams 4]
    keras-transformers train vit_mnist_28 --output runs/vit [--images DIR_OR_IDX]
    keras-transformers push runs/gpt_mini hf://org/name [--private]
    keras-transformers serve hf://HuggingFaceTB/SmolLM2-135M-Instruct [--port 8000]

`python -m keras_transformers.cli ...` is the same command. The backend is
chosen by `KERAS_BACKEND` (jax, tensorflow or torch) as usual for Keras.
Mistakes the user can fix (an unknown preset, a missing file, a directory
without a saved preset) print one line and exit with status 2.

One module per sub-command (`presets`, `train`, `finetune`, `generate`,
`chat`, `translate`, `push`, `serve`) builds its part of the parser and runs it; the jobs
behind them (`causal_lm`, `bert`, `seq2seq`, `vit`, `classify`, `lora`,
with `resume` for backups) are imported only when a command runs, so
building the parser and `--help` import neither Keras nor a backend.
"""

from __future__ import annotations

import argparse
import os
import sys

# Quiet TensorFlow's C++ start-up logs (the tokenizer imports it); set before
# anything imports TensorFlow. Users can still override it.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from keras_transformers.cli import (  # noqa: E402
    chat,
    finetune,
    generate,
    presets,
    push,
    serve,
    train,
    translate,
)
from keras_transformers.cli._common import PROG, CLIError  # noqa: E402

# The sub-commands, in the order of `--help`.
COMMANDS = {
    "presets": presets,
    "train": train,
    "finetune": finetune,
    "translate": translate,
    "chat": chat,
    "generate": generate,
    "push": push,
    "serve": serve,
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `keras-transformers` command."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Keras 3 transformer model zoo: presets, training and generation.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS.values():
        command.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the `keras-transformers` command.

    Args:
        argv: the arguments after the program name (default: `sys.argv[1:]`).

    Returns:
        The exit status: 0 on success, 2 for a mistake the user can fix (a
        one-line message on stderr). Invalid arguments make argparse print
        the usage and raise `SystemExit(2)`.
    """
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command].run(args)
    except CLIError as error:
        message = " ".join(str(error).split())  # always one line
        print(f"{PROG} {args.command}: error: {message}", file=sys.stderr)
        return 2


__all__ = ["CLIError", "build_parser", "main"]
