"""`keras-transformers translate DIR --text TEXT`: translates with an
encoder-decoder preset saved by `train TRANSFORMER_PRESET` (see
`cli.seq2seq`), greedy or with beam search."""

from __future__ import annotations

import argparse

from keras_transformers.cli._common import PROG, CLIError, positive_int
from keras_transformers.cli.generate import load_for_generation


def add_parser(commands) -> None:
    """Adds the `translate` sub-command to the `keras-transformers` parser."""
    parser = commands.add_parser(
        "translate",
        help="translate text with a saved encoder-decoder preset",
        description="Loads a directory written by `train TRANSFORMER_PRESET` "
        "(model and tokenizer) and prints one translation per --text.",
    )
    parser.add_argument("directory", metavar="DIR", help="a saved preset directory")
    parser.add_argument(
        "--text", action="append", required=True, help="source text (repeatable)"
    )
    parser.add_argument("--num-beams", type=positive_int, default=1)
    parser.add_argument(
        "--length-penalty",
        type=float,
        default=0.6,
        help="alpha of beam search's length normalisation (default: %(default)s)",
    )
    parser.add_argument("--max-new-tokens", type=positive_int, default=64)


def run(args: argparse.Namespace) -> int:
    """Translates each `--text` with a saved `Seq2SeqLM` and prints it."""
    from keras_transformers.cli.seq2seq import translate
    from keras_transformers.models import Seq2SeqLM

    texts = [text.strip() for text in args.text]
    if not all(texts):
        raise CLIError("--text is empty: give at least one character.")
    lm = load_for_generation(args.directory)
    if not isinstance(lm, Seq2SeqLM):
        raise CLIError(
            f"{args.directory} holds a {type(lm).__name__}; `translate` needs an "
            f"encoder-decoder model (`{PROG} train transformer_tiny ...`). For "
            f"decoder-only models use `{PROG} generate`."
        )
    options = {"num_beams": args.num_beams}
    if args.num_beams > 1:
        options["length_penalty"] = args.length_penalty
    try:
        translations = translate(
            lm, texts, max_new_tokens=args.max_new_tokens, **options
        )
    except ValueError as error:
        raise CLIError(str(error)) from None
    for translation in translations:
        print(translation)
    return 0
