"""`keras-transformers generate HANDLE --prompt TEXT`: continues a prompt with
a saved preset or a Hugging Face checkpoint, printed at once or streamed.

`load_for_generation` and `generate_text` serve `chat`, `translate` and the
sample at the end of `train` too.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from keras_transformers.cli._common import (
    PROG,
    CLIError,
    positive_float,
    positive_int,
    quiet_stderr,
)

HANDLE_HELP = (
    "a saved preset directory, a Hugging Face model directory or hf://org/name"
)


def add_parser(commands) -> None:
    """Adds the `generate` sub-command to the `keras-transformers` parser."""
    generate = commands.add_parser(
        "generate",
        help="generate text with a saved preset or a Hugging Face checkpoint",
        description="Loads a model (with its tokenizer) and continues a prompt.",
    )
    generate.add_argument("handle", metavar="HANDLE", help=HANDLE_HELP)
    generate.add_argument("--prompt", required=True)
    generate.add_argument("--max-new-tokens", type=positive_int, default=64)
    generate.add_argument(
        "--sampler",
        choices=("greedy", "random", "top_k", "top_p"),
        help="default: top_p if --top-p is given, else top_k",
    )
    generate.add_argument("--temperature", type=positive_float, default=0.8)
    generate.add_argument(
        "--top-k", type=positive_int, help="k of top_k sampling (default: 40)"
    )
    generate.add_argument(
        "--top-p", type=float, help="mass of nucleus (top_p) sampling"
    )
    generate.add_argument("--seed", type=int, help="sampling seed (default: random)")
    generate.add_argument(
        "--stream", action="store_true", help="print tokens as they are generated"
    )


def load_for_generation(handle: str):
    """The model of `handle`, which must generate text and have a tokenizer.

    Raises:
        CLIError: a missing directory, a directory without a model, a load
            error, a model that cannot generate, or no tokenizer.
    """
    from keras_transformers.presets import CONFIG_FILE, from_preset

    if not handle.startswith("hf://"):
        path = Path(handle)
        if not path.is_dir():
            raise CLIError(
                f"{handle} is not a directory. Pass {HANDLE_HELP}, e.g. a "
                f"directory written by `{PROG} train`."
            )
        if not (path / CONFIG_FILE).is_file():
            raise CLIError(
                f"{handle} holds no saved preset ({CONFIG_FILE} is missing). "
                f"Pass a directory written by `{PROG} train` or `save_to_preset`, "
                "or a Hugging Face model directory."
            )
    try:
        with quiet_stderr():
            model = from_preset(handle)
    except (ValueError, OSError, ImportError, RuntimeError) as error:
        raise CLIError(f"cannot load {handle}: {error}") from None
    if not hasattr(model, "generate"):
        raise CLIError(
            f"{handle} holds a {type(model).__name__}, which cannot generate text."
        )
    if getattr(model, "tokenizer", None) is None:
        raise CLIError(f"{handle} has no tokenizer; text generation needs one.")
    return model


def generate_text(model, prompt: str, max_new_tokens: int, seed=None, **kwargs) -> str:
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


def run(args: argparse.Namespace) -> int:
    """Continues `--prompt` with a saved preset and prints the text."""
    if args.top_p is not None and not 0.0 < args.top_p <= 1.0:
        raise CLIError(f"--top-p must be in (0, 1], got {args.top_p}.")
    model = load_for_generation(args.handle)
    options = dict(
        sampler=args.sampler,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
    )
    if not args.stream:
        print(generate_text(model, args.prompt, args.max_new_tokens, **options))
        return 0
    printer = _StreamPrinter(model.tokenizer)
    sys.stdout.write(args.prompt)
    sys.stdout.flush()
    generate_text(model, args.prompt, args.max_new_tokens, stream=printer, **options)
    printer.finish()
    return 0
