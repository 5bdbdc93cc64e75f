"""Uploading to the Hugging Face hub: `push(directory, "org/name")`.

A pushed directory is one of three kinds, told apart by its files:

- a preset, written by `model.save_to_preset(dir)` (`config.json` with
  `family` and `config`, `model.weights.h5`, `metadata.json`; its files
  must match the record in `metadata.json`);
- a Hugging Face model, written by `keras_transformers.convert.export_hf`
  (`config.json` with `model_type`, safetensors weights);
- a PEFT LoRA adapter, written by `keras_transformers.adapters.save_adapter`
  (`adapter_config.json`, `adapter_model.safetensors`).

The repository is created if needed (`private` applies then), and one
commit makes its files those of the directory: files the directory lacks
are deleted, except `README.md` and `.gitattributes`. A repository that
already holds files is only updated when they are the same kind of model:
a preset of the same class, a Hugging Face model of the same
`model_type` and architectures, an adapter of the same base model and task. Anything else
(another model, files that are none of the three) needs `overwrite=True`.

Everything goes through `huggingface_hub`, with the token of the `token`
argument, else `HF_TOKEN`, else the one `hf auth login` stored.
"""

from __future__ import annotations

import contextlib
import glob
import json
import tempfile
from pathlib import Path

from keras_transformers.hub import (
    CONFIG,
    INDEX,
    PREFIX,
    SAFETENSORS,
    SAVED_WEIGHTS,
    HubAccessError,
    HubError,
    _is_http_error,
    _unreachable_errors,
    parse_handle,
)

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
METADATA = "metadata.json"
KEPT = ("README.md", ".gitattributes")  # never deleted by a push
FORMATS = ("preset", "hf", "adapter")
SAVERS = (
    "model.save_to_preset(dir), keras_transformers.convert.export_hf(model, dir) "
    "or model.save_adapter(dir)"
)


class HubUploadError(HubError, ValueError):
    """What a push refuses: a directory that is not a preset, Hugging Face
    model or adapter, or a repository that holds something else."""


def push(
    directory,
    repo,
    *,
    token: str | None = None,
    private: bool | None = None,
    commit_message: str | None = None,
    revision: str | None = None,
    overwrite: bool = False,
):
    """Uploads a preset, Hugging Face model or adapter directory to the hub.

    Args:
        directory: a directory written by `save_to_preset`, `export_hf` or
            `save_adapter`.
        repo: `org/name` or `hf://org/name` (optionally `@branch`).
        token: a hub access token with write access (None: `HF_TOKEN`,
            else the token of `hf auth login`).
        private: make a repository this push creates private (an existing
            repository keeps its visibility; None: the hub's default).
        commit_message: the commit's message (None: one naming the kind).
        revision: the branch to commit to, created from the default
            branch if missing (None: the default branch).
        overwrite: replace a repository's files even when they are not the
            same kind of model as the directory.

    Returns:
        The `huggingface_hub.CommitInfo` of the commit (`commit_url`, `oid`).

    Raises:
        HubUploadError: the directory is none of the three kinds, or the
            repository holds another model or other files (and not
            `overwrite`).
        HubAccessError: offline, no token, a token without write access,
            or the hub could not be reached.
    """
    import huggingface_hub

    local = describe(directory)
    repo_id, revision = _target(repo, revision)
    if huggingface_hub.is_offline_mode():
        raise _offline(repo_id)
    token = token or huggingface_hub.get_token()
    if not token:
        raise HubAccessError(
            f"Cannot push to {repo_id}: no hub token. Set HF_TOKEN to an access "
            "token with write access (https://huggingface.co/settings/tokens), run "
            "`hf auth login`, or pass a token (`token=`, `--token`)."
        )
    api = huggingface_hub.HfApi(token=token)
    with _translated(repo_id):
        remote, new_branch = _remote_files(api, repo_id, revision)
        if not overwrite:
            source = None if new_branch else revision  # where `remote` was read
            _check_same_kind(api, repo_id, source, remote, local)
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        if new_branch:
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        stale = sorted(set(remote) - set(_files(directory)) - set(KEPT))
        return api.upload_folder(
            repo_id=repo_id,
            folder_path=str(directory),
            commit_message=commit_message
            or f"Upload {local[0]} with keras_transformers",
            revision=revision,
            delete_patterns=[glob.escape(name) for name in stale] or None,
        )


def push_model(model, repo, format: str = "preset", model_type=None, **kwargs):
    """Saves `model` to a temporary directory as `format` ("preset":
    `save_to_preset`; "hf": `export_hf`, in `model_type`'s layout if given;
    "adapter": `save_adapter`) and `push`es it; `kwargs` go to `push`."""
    if format not in FORMATS:
        raise ValueError(
            f"`format` must be one of {FORMATS}: 'preset' (save_to_preset), 'hf' "
            f"(a Hugging Face export) or 'adapter' (a PEFT adapter). Received: {format!r}"
        )
    if model_type is not None and format == "preset":
        raise ValueError("`model_type` picks a Hugging Face layout: pass format='hf'.")
    with tempfile.TemporaryDirectory(prefix="keras_transformers_push_") as tmp:
        directory = Path(tmp) / "model"
        if format == "preset":
            model.save_to_preset(directory)
        elif format == "hf":
            from keras_transformers.convert import export_hf

            export_hf(model, directory, model_type=model_type)
        else:
            model.save_adapter(directory, model_type=model_type)
        return push(directory, repo, **kwargs)


# ------------------------------------------------------------ what is what
def describe(directory) -> tuple[str, dict]:
    """`(kind, identity)` of a directory to push: kind is "preset",
    "Hugging Face model" or "adapter"; identity the values a repository's
    model must share with it (class and family, `model_type`, base model
    and task). Raises HubUploadError for anything else."""
    path = Path(directory)
    if not path.is_dir():
        raise HubUploadError(
            f"{directory} is not a directory. Save the model first: {SAVERS}."
        )
    names = set(_files(path))
    if ADAPTER_CONFIG in names:
        if ADAPTER_WEIGHTS not in names:
            raise HubUploadError(
                f"{directory} has {ADAPTER_CONFIG} but no {ADAPTER_WEIGHTS}: an "
                "incomplete adapter. Save it again with model.save_adapter(dir)."
            )
        return _kind_of_files(_read(path / ADAPTER_CONFIG), ADAPTER_CONFIG)
    if CONFIG not in names:
        raise HubUploadError(
            f"{directory} has no {CONFIG} or {ADAPTER_CONFIG}: it is not a preset, "
            f"a Hugging Face model or an adapter. Save the model first: {SAVERS}."
        )
    kind, identity = _kind_of_files(_read(path / CONFIG), CONFIG)
    if kind == "preset":
        _check_preset(path, names)
    elif kind == "Hugging Face model":
        _check_weights(directory, names)
    else:
        raise HubUploadError(
            f"{path / CONFIG} has neither `model_type` (a Hugging Face model) nor "
            f"`family` and `config` (a preset). Save the model first: {SAVERS}."
        )
    return kind, identity


def _kind_of_files(config: dict, name: str) -> tuple[str, dict]:
    if name == ADAPTER_CONFIG:
        keys = ("peft_type", "task_type", "base_model_name_or_path")
        return "adapter", {key: config.get(key) for key in keys}
    if "family" in config and "config" in config:
        return "preset", {
            "class_name": config.get("class_name"),
            "family": config["family"],
        }
    if "model_type" in config:
        keys = ("model_type", "architectures")
        return "Hugging Face model", {key: config.get(key) for key in keys}
    return "", {}


def _check_preset(path: Path, names: set) -> None:
    from keras_transformers import preset_record

    missing = [n for n in (SAVED_WEIGHTS, METADATA) if n not in names]
    if missing:
        raise HubUploadError(
            f"{path} is an incomplete preset: it lacks {missing}. Save it again "
            "with model.save_to_preset(dir)."
        )
    try:
        preset_record.check_files(path, METADATA)
    except (OSError, ValueError) as error:
        raise HubUploadError(f"Not pushing {path}: {error}") from None


def _check_weights(directory, names: set) -> None:
    if SAFETENSORS in names or INDEX in names:
        return
    raise HubUploadError(
        f"{directory} is a Hugging Face model without {SAFETENSORS} or {INDEX}. "
        "Export it with keras_transformers.convert.export_hf(model, dir), which "
        "writes safetensors weights."
    )


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise HubUploadError(f"{path} is not readable JSON ({error}).") from None
    if not isinstance(data, dict):
        raise HubUploadError(f"{path} must hold a JSON object.")
    return data


def _files(directory) -> list[str]:
    root = Path(directory)
    return sorted(
        p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()
    )


# ------------------------------------------------------------ the repository
def _target(repo, revision) -> tuple[str, str | None]:
    """`(repo_id, revision)` of `org/name` or `hf://org/name[@branch]`."""
    if not isinstance(repo, str) or not repo:
        raise HubUploadError(f"The repository must be 'org/name'. Received: {repo!r}")
    handle = repo if repo.startswith(PREFIX) else PREFIX + repo
    repo_id, at = parse_handle(handle)
    if at is not None and revision is not None and at != revision:
        raise HubUploadError(
            f"{repo} names branch {at!r} but revision={revision!r}: give one of them."
        )
    return repo_id, revision or at


def _remote_files(api, repo_id, revision) -> tuple[list[str], bool]:
    """The repository's files at `revision` (its default branch's for a
    branch to create; none for a repository to create), and whether the
    branch must be created."""
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    try:
        return api.list_repo_files(repo_id, revision=revision), False
    except RepositoryNotFoundError:
        return [], revision is not None
    except RevisionNotFoundError:
        if revision is None:
            return [], False  # a repository without commits
        return api.list_repo_files(repo_id), True


def _check_same_kind(api, repo_id, revision, remote, local) -> None:
    names = set(remote) - set(KEPT)
    if not names:
        return
    kind, identity = local
    for name in (ADAPTER_CONFIG, CONFIG):
        if name in names:
            there = _kind_of_files(_remote_json(api, repo_id, name, revision), name)
            break
    else:
        there = ("", {})
    if there == (kind, identity):
        return
    found = (
        f"a {there[0]} ({_show(there[1])})"
        if there[0]
        else f"files that are not a preset, a Hugging Face model or an adapter "
        f"({', '.join(sorted(names)[:5])}{', ...' if len(names) > 5 else ''})"
    )
    raise HubUploadError(
        f"{repo_id} already holds {found}, and this is a {kind} ({_show(identity)}). "
        "Pass overwrite=True (`--overwrite` on the command line) to replace its "
        "files with this directory's, or push to another repository."
    )


def _remote_json(api, repo_id, name, revision) -> dict:
    from huggingface_hub.errors import EntryNotFoundError

    try:
        path = api.hf_hub_download(repo_id, name, revision=revision)
    except EntryNotFoundError:
        return {}
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _show(identity: dict) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in identity.items())


@contextlib.contextmanager
def _translated(repo_id):
    """Turns `huggingface_hub`'s errors during a push into
    `HubAccessError`s that say what to do."""
    from huggingface_hub import constants
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    namespace = repo_id.split("/")[0] if "/" in repo_id else "your account"
    try:
        yield
    except OfflineModeIsEnabled:
        raise _offline(repo_id) from None
    except HfHubHTTPError as error:
        if not _is_http_error(error, below=500):
            raise _unreachable(repo_id, constants.ENDPOINT, error) from None
        status = error.response.status_code
        if status == 401:
            fix = (
                "the hub rejected the token. Set HF_TOKEN to a valid access token "
                "(https://huggingface.co/settings/tokens) or run `hf auth login`"
            )
        elif status in (403, 404):
            fix = (
                f"the token cannot create or write to repositories of {namespace!r}. "
                "Use a token with write access to it (a 'write' token, or a "
                "fine-grained one that may write there), or push to your own namespace"
            )
        else:
            fix = f"the hub answered ({str(error).strip().splitlines()[0]})"
        raise HubAccessError(
            f"Cannot push to {repo_id}: HTTP {status}: {fix}."
        ) from None
    except _unreachable_errors() as error:
        raise _unreachable(repo_id, constants.ENDPOINT, error) from None


def _offline(repo_id) -> HubAccessError:
    return HubAccessError(
        f"Cannot push to {repo_id}: HF_HUB_OFFLINE is set, and an upload needs "
        "the network. Unset HF_HUB_OFFLINE (or set it to 0) and push again."
    )


def _unreachable(repo_id, endpoint, error) -> HubAccessError:
    return HubAccessError(
        f"Cannot push to {repo_id}: the hub at {endpoint} could not be reached "
        f"({type(error).__name__}: {error}). Check the connection and push again; "
        "a push is one commit, so the repository holds the old files or the new ones."
    )
