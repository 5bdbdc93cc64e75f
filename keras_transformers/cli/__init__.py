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

`python -m keras_transformers.cli ...` is the same command. The backend is
chosen by `KERAS_BACKEND` (jax, tensorflow or torch) as usual for Keras.
Mistakes the user can fix (an unknown preset, a missing file, a directory
without a saved preset) print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import os
import sys

# Quiet TensorFlow's C++ start-up logs (the tokenizer imports it); set before
# anything imports TensorFlow. Users can still override it.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from keras_transformers.cli_train import (  # noqa: E402
    DEFAULT_BATCH_SIZE,
    DEFAULT_EPOCHS,
    DEFAULT_LEARNING_RATE,
    DEFAULT_MAX_CHARS,
    DEFAULT_SEQUENCE_LENGTH,
    DEFAULT_STEPS_PER_EPOCH,
    DEFAULT_VALIDATION_FRACTION,
    PROG,
    CLIError,
    _generate,
    train_model,
)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `keras-transformers` command."""
    from keras_transformers.presets import FAMILIES

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Keras 3 transformer model zoo: presets, training and generation.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    presets = commands.add_parser("presets", help="list the built-in presets")
    presets.add_argument("--family", choices=FAMILIES, help="show only this family")

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
        type=_positive_int,
        default=DEFAULT_EPOCHS,
        help="default: %(default)s",
    )
    train.add_argument(
        "--steps-per-epoch",
        type=_positive_int,
        default=DEFAULT_STEPS_PER_EPOCH,
        help="batches per epoch; the data wraps around (default: %(default)s)",
    )
    train.add_argument(
        "--batch-size",
        type=_positive_int,
        default=DEFAULT_BATCH_SIZE,
        help="default: %(default)s",
    )
    train.add_argument(
        "--sequence-length",
        type=_positive_int,
        help=f"tokens per sequence (default: {DEFAULT_SEQUENCE_LENGTH}, or the "
        "preset's max_sequence_length if smaller; a longer one raises it)",
    )
    train.add_argument(
        "--learning-rate",
        type=_positive_float,
        default=DEFAULT_LEARNING_RATE,
        help="peak of the warmup + cosine schedule (default: %(default)s)",
    )
    train.add_argument(
        "--vocabulary-size",
        type=_positive_int,
        help="vocabulary size (default: the preset's vocabulary_size; bert: at "
        "most 8000)",
    )
    train.add_argument(
        "--max-chars",
        type=_positive_int,
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

    from keras_transformers.cli_bert import add_finetune_parser
    from keras_transformers.cli_resume import add_resume_arguments
    from keras_transformers.cli_seq2seq import add_train_arguments, add_translate_parser
    from keras_transformers.cli_vit import add_train_arguments as add_image_arguments

    add_train_arguments(train)
    add_image_arguments(train)
    add_resume_arguments(train, _positive_int)
    add_finetune_parser(commands, _positive_int, _positive_float)
    add_translate_parser(commands, _positive_int, _positive_float)

    from keras_transformers.cli_chat import HANDLE_HELP, add_chat_parser

    add_chat_parser(commands, _positive_int, _positive_float)
    generate = commands.add_parser(
        "generate",
        help="generate text with a saved preset or a Hugging Face checkpoint",
        description="Loads a model (with its tokenizer) and continues a prompt.",
    )
    generate.add_argument("handle", metavar="HANDLE", help=HANDLE_HELP)
    generate.add_argument("--prompt", required=True)
    generate.add_argument("--max-new-tokens", type=_positive_int, default=64)
    generate.add_argument(
        "--sampler",
        choices=("greedy", "random", "top_k", "top_p"),
        help="default: top_p if --top-p is given, else top_k",
    )
    generate.add_argument("--temperature", type=_positive_float, default=0.8)
    generate.add_argument(
        "--top-k", type=_positive_int, help="k of top_k sampling (default: 40)"
    )
    generate.add_argument(
        "--top-p", type=float, help="mass of nucleus (top_p) sampling"
    )
    generate.add_argument("--seed", type=int, help="sampling seed (default: random)")
    generate.add_argument(
        "--stream", action="store_true", help="print tokens as they are generated"
    )
    return parser


# ---------------------------------------------------------------------------
# presets
# ---------------------------------------------------------------------------


def _format_table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths)]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return "\n".join(lines)


def _count(n: int) -> str:
    """A parameter count with one decimal: 124439808 -> '124.4M' (also for
    counts of 100 units and more, so close presets stay distinguishable)."""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def cmd_presets(args: argparse.Namespace) -> int:
    """Prints the built-in presets: name, family, parameters, description."""
    from keras_transformers.presets import list_presets, load_config

    rows = [["name", "family", "params", "description"]]
    for name, info in list_presets(args.family).items():
        config = load_config(name)
        params = _count(config.num_params())
        if config.moe is not None:
            params += f" ({_count(config.num_active_params())} active)"
        rows.append([name, info["family"], params, info.get("description", "")])
    if len(rows) == 1:
        print(f"No built-in presets of family {args.family!r}.")
        return 0
    print(_format_table(rows))
    return 0


# ---------------------------------------------------------------------------
# train
# ---------------------------------------------------------------------------


def cmd_train(args: argparse.Namespace) -> int:
    """Runs `train`: `train_model`, `pretrain_bert` for a bert preset,
    `train_seq2seq` for a transformer preset (or --source/--target/--task),
    or `train_vit` for a vit preset (or --images)."""
    from keras_transformers.cli_seq2seq import train_seq2seq, wants_seq2seq
    from keras_transformers.cli_vit import train_vit, wants_vit
    from keras_transformers.presets import list_presets

    info = list_presets().get(args.preset, {})
    if wants_vit(args, info.get("family")):
        train_vit(args)
    elif wants_seq2seq(args, info.get("family")):
        train_seq2seq(args)
    elif info.get("family") == "bert":
        from keras_transformers.cli_bert import pretrain_bert

        pretrain_bert(args)
    else:
        train_model(args)
    return 0


def cmd_finetune(args: argparse.Namespace) -> int:
    """Runs `finetune`: `cli_classify.finetune_classifier` (--task classify)
    or `cli_lora.finetune_causal_lm` (--task causal-lm)."""
    if args.task == "causal-lm":
        from keras_transformers.cli_lora import finetune_causal_lm

        finetune_causal_lm(args)
    else:
        from keras_transformers.cli_classify import finetune_classifier

        finetune_classifier(args)
    return 0


def _load_for_generation(handle: str):
    from keras_transformers.cli_chat import load_for_generation

    return load_for_generation(handle)


class _StreamPrinter:
    """Prints the text of newly generated tokens as they arrive.

    Byte-level BPE tokens can split a UTF-8 character, so the whole
    completion is decoded each time and only the new, complete text printed.
    """

    def __init__(self, tokenizer, out=None) -> None:
        self.tokenizer = tokenizer
        self.out = out or sys.stdout
        self.ids: list[int] = []
        self.printed = 0

    def __call__(self, tokens) -> None:
        token = int(tokens[0])
        if token < 0:
            return
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):  # an incomplete character: wait for more bytes
            return
        self.out.write(text[self.printed :])
        self.out.flush()
        self.printed = len(text)

    def finish(self) -> None:
        text = self.tokenizer.decode(self.ids) if self.ids else ""
        self.out.write(text[self.printed :] + "\n")
        self.out.flush()


def cmd_generate(args: argparse.Namespace) -> int:
    """Continues `--prompt` with a saved preset and prints the text."""
    if args.top_p is not None and not 0.0 < args.top_p <= 1.0:
        raise CLIError(f"--top-p must be in (0, 1], got {args.top_p}.")
    model = _load_for_generation(args.handle)
    options = dict(
        sampler=args.sampler,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
    )
    if not args.stream:
        print(
            _generate(
                model, args.prompt, args.max_new_tokens, seed=args.seed, **options
            )
        )
        return 0
    printer = _StreamPrinter(model.tokenizer)
    sys.stdout.write(args.prompt)
    sys.stdout.flush()
    _generate(
        model,
        args.prompt,
        args.max_new_tokens,
        seed=args.seed,
        stream=printer,
        **options,
    )
    printer.finish()
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    """Runs `chat` (see `cli_chat.cmd_chat`)."""
    from keras_transformers.cli_chat import cmd_chat as chat

    return chat(args)


def cmd_translate(args: argparse.Namespace) -> int:
    """Runs `translate` (see `cli_seq2seq.cmd_translate`)."""
    from keras_transformers.cli_seq2seq import cmd_translate as translate

    return translate(args)


COMMANDS = {
    "presets": cmd_presets,
    "train": cmd_train,
    "finetune": cmd_finetune,
    "generate": cmd_generate,
    "chat": cmd_chat,
    "translate": cmd_translate,
}


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
        return COMMANDS[args.command](args)
    except CLIError as error:
        message = " ".join(str(error).split())  # always one line
        print(f"{PROG} {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
