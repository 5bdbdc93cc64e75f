"""`keras-transformers serve HANDLE`: an OpenAI-compatible HTTP server for a
model (see `keras_transformers.serving`): chat and text completions for a
causal LM, decoded with continuous batching, or embeddings for a text
embedding model (a sentence-transformers or BERT-family checkpoint)."""

from __future__ import annotations

import argparse
from pathlib import Path

from keras_transformers.cli._common import PROG, CLIError, positive_int

HANDLE_HELP = (
    "a saved preset directory, a Hugging Face model directory, hf://org/name "
    "or a built-in preset (with a tokenizer)"
)


def add_parser(commands) -> None:
    """Adds the `serve` sub-command to the `keras-transformers` parser."""
    serve = commands.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API",
        description=(
            "Serves GET /v1/models and, for a causal LM, POST /v1/chat/completions "
            "and /v1/completions (streaming with server-sent events; requests "
            "share one continuously batched decoding loop), or, for a text "
            "embedding model, POST /v1/embeddings. Needs the serve extra: "
            "pip install 'keras-transformers[serve]'."
        ),
    )
    serve.add_argument("handle", metavar="HANDLE", help=HANDLE_HELP)
    serve.add_argument("--host", default="127.0.0.1", help="default: 127.0.0.1")
    serve.add_argument("--port", type=int, default=8000, help="default: 8000")
    serve.add_argument(
        "--slots", type=positive_int, default=8, help="requests decoded together (8)"
    )
    serve.add_argument(
        "--max-length",
        type=positive_int,
        help="prompt plus reply tokens per request (default: the model's, at most 4096)",
    )
    serve.add_argument(
        "--no-warm-up",
        dest="warm_up",
        action="store_false",
        help="compile each program when first needed, not before serving "
        "(by default the decoding steps of every batch size and the prefills "
        "of short prompts are compiled at start, on JAX and TensorFlow)",
    )
    serve.add_argument(
        "--prefix-memory",
        type=float,
        default=256,
        metavar="MIB",
        help="memory for the cache rows of recent prompts, so that a prompt "
        "beginning with one prefills only the rest (default 256; 0: none)",
    )
    serve.add_argument(
        "--model-name", help="the name clients pass as `model` (default: HANDLE)"
    )
    serve.add_argument(
        "--chat-template",
        metavar="FILE",
        help="a Jinja chat template file (default: the tokenizer's)",
    )


def load_for_serving(handle: str):
    """The model of `handle`: a causal LM, or a `TextEmbedder` for a
    BERT-family checkpoint.

    Raises:
        CLIError: it cannot load, cannot generate or embed, or has no
            tokenizer.
    """
    from keras_transformers.cli._common import quiet_stderr
    from keras_transformers.presets import from_preset

    try:
        with quiet_stderr():
            model = from_preset(handle)
            family = getattr(getattr(model, "backbone", model), "family", None)
            if not hasattr(model, "generate") and family == "bert":
                from keras_transformers.models import TextEmbedder

                model = TextEmbedder.from_preset(handle)
    except (ValueError, OSError, ImportError, RuntimeError, KeyError) as error:
        raise CLIError(f"cannot load {handle}: {error}") from None
    if not hasattr(model, "generate") and not hasattr(model, "encode"):
        raise CLIError(
            f"{handle} holds a {type(model).__name__}, which neither generates "
            "text nor embeds it."
        )
    if getattr(model, "tokenizer", None) is None:
        raise CLIError(
            f"{handle} has no tokenizer (a built-in preset has none): serve a "
            f"checkpoint or a directory written by `{PROG} train`."
        )
    return model


def run(args: argparse.Namespace) -> int:
    """Loads the model and serves it until interrupted."""
    try:
        import uvicorn

        from keras_transformers.serving.app import create_app
    except ImportError as error:
        raise CLIError(
            f"serving needs {error.name}: pip install 'keras-transformers[serve]'"
        ) from None
    template = None
    if args.chat_template:
        path = Path(args.chat_template)
        if not path.is_file():
            raise CLIError(f"--chat-template {path} is not a file.")
        template = path.read_text(encoding="utf-8")
    model = load_for_serving(args.handle)
    try:
        app = create_app(
            model,
            args.model_name or args.handle,
            slots=args.slots,
            max_length=args.max_length,
            chat_template=template,
            warm_up=args.warm_up,
            prefix_memory=args.prefix_memory,
        )
    except ValueError as error:
        raise CLIError(str(error)) from None
    print(
        f"Serving {args.model_name or args.handle} on http://{args.host}:{args.port}/v1"
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
