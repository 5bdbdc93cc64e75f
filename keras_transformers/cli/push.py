"""`keras-transformers push DIR hf://org/name`: uploads a saved preset, a
Hugging Face export or a PEFT adapter directory to the Hugging Face hub
(see `keras_transformers.hub_upload`)."""

from __future__ import annotations

import argparse

from keras_transformers.cli._common import CLIError


def add_parser(commands) -> None:
    """Adds the `push` sub-command to the `keras-transformers` parser."""
    push = commands.add_parser(
        "push",
        help="upload a saved preset, Hugging Face export or adapter to the hub",
        description=(
            "Uploads a directory written by save_to_preset, export_hf or "
            "save_adapter to a Hugging Face hub repository, in one commit. The "
            "token comes from --token, else HF_TOKEN, else `hf auth login`."
        ),
    )
    push.add_argument("directory", metavar="DIR", help="the directory to upload")
    push.add_argument(
        "repo", metavar="REPO", help="hf://org/name, optionally @branch (or org/name)"
    )
    push.add_argument(
        "--private",
        action="store_true",
        default=None,
        help="make the repository private if this push creates it",
    )
    push.add_argument("--message", help="the commit message")
    push.add_argument("--revision", help="the branch to commit to (created if missing)")
    push.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a repository's files even if they are another model's",
    )
    push.add_argument(
        "--token", help="a hub token with write access (default: HF_TOKEN)"
    )


def run(args: argparse.Namespace) -> int:
    """Pushes the directory; prints the commit's URL."""
    from keras_transformers.hub import HubError
    from keras_transformers.hub_upload import push

    try:
        info = push(
            args.directory,
            args.repo,
            token=args.token,
            private=args.private,
            commit_message=args.message,
            revision=args.revision,
            overwrite=args.overwrite,
        )
    except HubError as error:
        raise CLIError(str(error)) from None
    print(getattr(info, "commit_url", None) or info)
    return 0
