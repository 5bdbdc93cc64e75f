"""`keras-transformers chat HANDLE`: an interactive conversation with a chat
model, the reply streamed to stdout token by token.

Each line read from stdin is a user message; `/reset` starts the
conversation again (keeping `--system`), `/exit` or the end of input stops.
HANDLE is a saved preset directory, a Hugging Face model directory or
`hf://org/name`, as for `keras-transformers generate`.
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
)
from keras_transformers.cli.generate import HANDLE_HELP, load_for_generation


def add_sampler_arguments(parser) -> None:
    """--sampler, --temperature, --top-k, --top-p, --seed,
    --repetition-penalty (unset: the checkpoint's generation config)."""
    parser.add_argument(
        "--sampler",
        choices=("greedy", "random", "top_k", "top_p"),
        help="default: the checkpoint's generation config (greedy without one)",
    )
    parser.add_argument("--temperature", type=positive_float)
    parser.add_argument("--top-k", type=positive_int, help="k of top_k sampling")
    parser.add_argument("--top-p", type=float, help="mass of nucleus (top_p) sampling")
    parser.add_argument("--seed", type=int, help="sampling seed")
    parser.add_argument(
        "--repetition-penalty",
        type=positive_float,
        help="> 1 discourages repeating tokens (default: none)",
    )


def add_parser(commands) -> None:
    """Adds the `chat` sub-command to the `keras-transformers` parser."""
    chat = commands.add_parser(
        "chat",
        help="chat with a model that has a chat template",
        description=(
            "Reads user messages from stdin, one per line, and streams each "
            "reply. /reset starts over, /exit (or end of input) quits."
        ),
    )
    chat.add_argument("handle", metavar="HANDLE", help=HANDLE_HELP)
    chat.add_argument("--system", help="a system message that opens the conversation")
    chat.add_argument(
        "--chat-template",
        metavar="FILE",
        help="a Jinja chat template file (default: the tokenizer's)",
    )
    chat.add_argument(
        "--max-new-tokens",
        type=positive_int,
        default=256,
        help="reply tokens at most (default: %(default)s)",
    )
    add_sampler_arguments(chat)


def sampler_options(args) -> dict:
    """The sampling options given, as `model.chat` arguments."""
    if args.top_p is not None and not 0.0 < args.top_p <= 1.0:
        raise CLIError(f"--top-p must be in (0, 1], got {args.top_p}.")
    names = ("sampler", "temperature", "top_k", "top_p", "seed", "repetition_penalty")
    return {n: getattr(args, n) for n in names if getattr(args, n) is not None}


def run(args: argparse.Namespace, stdin=None, stdout=None) -> int:
    """Runs the interactive loop; returns 0 at `/exit` or end of input."""
    from keras_transformers.generation.chat import _template

    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    options = sampler_options(args)
    template = None
    if args.chat_template:
        try:
            template = Path(args.chat_template).read_text(encoding="utf-8")
        except OSError as error:
            raise CLIError(f"cannot read --chat-template: {error}") from None
    model = load_for_generation(args.handle)
    try:
        _template(model, template)
    except ValueError as error:
        raise CLIError(f"{error} Or pass --chat-template FILE.") from None
    opening = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(opening)
    interactive = stdin.isatty()

    def show(text):
        stdout.write(text)
        stdout.flush()

    while True:
        if interactive:
            show("> ")
        line = stdin.readline()
        if not line or line.strip() == "/exit":
            return 0
        text = line.rstrip("\r\n")
        if text.strip() == "/reset":
            messages = list(opening)
            show("(new conversation)\n")
            continue
        if not text.strip():
            continue
        messages.append({"role": "user", "content": text})
        try:
            reply = model.chat(
                messages,
                max_new_tokens=args.max_new_tokens,
                stream=show,
                chat_template=template,
                **options,
            )
        except ValueError as error:  # e.g. the conversation outgrew the model
            messages.pop()
            print(
                f"{PROG} chat: error: {' '.join(str(error).split())}", file=sys.stderr
            )
            continue
        show("\n")
        messages.append({"role": "assistant", "content": reply})
