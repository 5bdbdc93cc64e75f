"""Hugging Face hub handles: `hf://org/name` and `hf://org/name@revision`.

`resolve(handle)` fetches what a model needs (config, safetensors weights
and their index, tokenizer files, chat template, generation and
preprocessor configs) into the standard Hugging Face cache and returns the
snapshot directory, which then loads like any Hugging Face model directory
(or like a `save_to_preset` directory, for a repository written by it).

Everything goes through `huggingface_hub`, which reads `HF_HOME` /
`HF_HUB_CACHE` (cache location), `HF_ENDPOINT`, `HF_HUB_OFFLINE` and
`HF_TOKEN` (or the token of `hf auth login`) itself. Pickled weights
(`pytorch_model.bin`) are never downloaded or unpickled.
"""

from __future__ import annotations

import contextlib
import json
import re
import warnings
from pathlib import Path

PREFIX = "hf://"
CONFIG = "config.json"
SAFETENSORS = "model.safetensors"
INDEX = "model.safetensors.index.json"
SAVED_WEIGHTS = "model.weights.h5"  # a repository written by `save_to_preset`
ASSETS = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tokenizer.model",
    "source.spm",
    "target.spm",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
    "preprocessor_config.json",
    "metadata.json",
    "labels.json",
    "modules.json",  # sentence-transformers: the modules, their settings
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
)
ASSET_FOLDERS = ("additional_chat_templates/", "tokenizer/")
# A sentence-transformers module's settings, e.g. `1_Pooling/config.json`.
MODULE_CONFIG = re.compile(r"\d+_\w+/config\.json")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")


class HubError(Exception):
    """Base class of the errors raised resolving an `hf://` handle."""


class HubAccessError(HubError, FileNotFoundError):
    """The repository, revision or files cannot be reached: not found,
    gated, or offline with nothing cached."""


class HubContentError(HubError, ValueError):
    """The repository holds nothing we can load: a malformed handle, pickle
    weights only, no `config.json`, or an unsupported `model_type`."""


def is_hub_handle(handle) -> bool:
    """Whether `handle` is an `hf://` hub handle."""
    return isinstance(handle, str) and handle.startswith(PREFIX)


def parse_handle(handle: str) -> tuple[str, str | None]:
    """Splits `hf://org/name@revision` into `("org/name", "revision")`.

    Args:
        handle: `hf://org/name`, optionally followed by `@revision` (a
            branch, tag, commit id or `refs/pr/N`).

    Returns:
        The repository id and the revision (None: the default branch).

    Raises:
        HubContentError: not of that form.
    """
    if not is_hub_handle(handle):
        raise HubContentError(f"{handle!r} is not a hub handle (hf://org/name).")
    repo_id, at, revision = handle[len(PREFIX) :].partition("@")
    parts = repo_id.split("/")
    if len(parts) > 2 or not all(parts) or (at and not revision):
        raise HubContentError(
            f"Malformed hub handle {handle!r}. Expected hf://org/name or "
            "hf://org/name@revision (a branch, tag or commit id)."
        )
    return repo_id, revision or None


def cache_dir() -> str:
    """The hub cache in use (`HF_HUB_CACHE`, else `$HF_HOME/hub`)."""
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def resolve(handle: str, weights: bool = True) -> Path:
    """The local snapshot directory of a hub handle, fetched if needed.

    Online, the revision is resolved to a commit, the repository's file
    list and `config.json` are checked (supported `model_type`,
    safetensors weights) before anything large is downloaded, and only the
    files a model needs are fetched. Offline (`HF_HUB_OFFLINE=1`, or the
    hub cannot be reached) the cached snapshot of the revision is used.

    Args:
        handle: `hf://org/name` or `hf://org/name@revision`.
        weights: also fetch the weights (False: config and tokenizer only).

    Returns:
        The snapshot directory inside the hub cache.

    Raises:
        HubAccessError: repository or revision not found, gated without
            access, or offline with nothing cached (the message names the
            cache directory).
        HubContentError: malformed handle, only pickle weights, no
            `config.json`, or an unsupported `model_type`.
    """
    import huggingface_hub
    from huggingface_hub import HfApi

    repo_id, revision = parse_handle(handle)
    if huggingface_hub.is_offline_mode():
        return _from_cache(handle, repo_id, revision, weights, "HF_HUB_OFFLINE is set")
    api = HfApi()
    with _translated(handle, repo_id, revision):
        try:
            pinned = api.resolve_revision(repo_id, revision=revision)
            info = api.model_info(repo_id, revision=pinned.resolved)
        except _unreachable_errors() as error:
            if _is_http_error(error, below=500):
                raise
            cause = type(error.__cause__ or error).__name__
            reason = f"the hub at {api.endpoint} could not be reached: {cause}"
            return _from_cache(handle, repo_id, revision, weights, reason)
        names = [s.rfilename for s in info.siblings or ()]
        return _download(handle, repo_id, pinned, names, weights)


def _download(handle, repo_id, pinned, names, weights) -> Path:
    from huggingface_hub import hf_hub_download, snapshot_download

    def fetch(name):
        return hf_hub_download(repo_id, name, revision=pinned)

    if CONFIG not in names:
        raise HubContentError(
            f"{handle}: the repository has no {CONFIG}, so it is not a Hugging Face "
            "transformers model or a keras_transformers preset."
        )
    saved = _check_config(handle, _read_json(fetch(CONFIG)))
    wanted = {CONFIG} | {name for name in names if _is_asset(name)}
    if weights:
        wanted |= set(_weight_files(handle, names, saved, lambda: fetch(INDEX)))
    folder = snapshot_download(repo_id, revision=pinned, allow_patterns=sorted(wanted))
    return Path(folder)


def _from_cache(handle, repo_id, revision, weights, reason) -> Path:
    from huggingface_hub import try_to_load_from_cache

    config = try_to_load_from_cache(repo_id, CONFIG, revision=revision)
    if not isinstance(config, str):
        raise HubAccessError(
            f"{handle}: offline ({reason}) and {repo_id} "
            f"(revision {revision or 'main'}) is not in the hub cache at {cache_dir()}. "
            "Download it once with network access (HF_HUB_OFFLINE unset), or point "
            "HF_HOME / HF_HUB_CACHE at a cache that holds it."
        )
    folder = Path(config).parent
    saved = _check_config(handle, _read_json(config))
    if weights:
        names = [p.relative_to(folder).as_posix() for p in folder.rglob("*")]
        needed = _weight_files(handle, names, saved, lambda: folder / INDEX)
        missing = [name for name in needed if not (folder / name).exists()]
        if missing:
            raise HubAccessError(
                f"{handle}: offline ({reason}) and the cached snapshot {folder} lacks "
                f"{missing}. Load it once with network access (HF_HUB_OFFLINE unset) "
                "to complete it, or pass `load_weights=False`."
            )
    return folder


def _is_asset(name: str) -> bool:
    return (
        name in ASSETS
        or name.startswith(ASSET_FOLDERS)
        or MODULE_CONFIG.fullmatch(name) is not None
    )


def _read_json(path) -> dict:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise HubContentError(f"{path} is not valid JSON ({error}).") from None
    if not isinstance(data, dict):
        raise HubContentError(f"{path} must hold a JSON object.")
    return data


def _check_config(handle, hf: dict) -> bool:
    """Fails fast on a config we cannot load; True for a `save_to_preset`
    repository (no `model_type`, our `family` and `config` entries)."""
    model_type = hf.get("model_type")
    if model_type is None:
        if "family" in hf and "config" in hf:
            return True
        raise HubContentError(
            f"{handle}: {CONFIG} has no model_type: not a Hugging Face transformers "
            "model or a keras_transformers preset."
        )
    from keras_transformers.registry import converter

    try:
        known = converter(model_type)
        with warnings.catch_warnings():  # the load itself warns, once
            warnings.simplefilter("ignore")
            known.preset_data(hf)
    except (ValueError, KeyError, TypeError) as error:
        raise HubContentError(f"{handle}: {error}") from None
    return False


def _weight_files(handle, names, saved: bool, index_path) -> list[str]:
    """The weight files to fetch: `model.safetensors`, or the index and the
    shards it names (`model.weights.h5` for a saved preset).

    Raises:
        HubContentError: no safetensors weights (only pickles, or none).
    """
    if saved and SAVED_WEIGHTS in names:
        return [SAVED_WEIGHTS]
    if SAFETENSORS in names:
        return [SAFETENSORS]
    if INDEX in names:
        weight_map = _read_json(index_path()).get("weight_map", {})
        return [INDEX, *sorted(set(weight_map.values()))]
    pickles = sorted(n for n in names if "/" not in n and n.endswith(PICKLE_SUFFIXES))
    if pickles:
        raise HubContentError(
            f"{handle}: the repository only has PyTorch pickle weights {pickles}, which "
            "keras_transformers never downloads or unpickles. Use a revision with "
            "safetensors (the hub's safetensors conversion opens a pull request: "
            f"hf://{parse_handle(handle)[0]}@refs/pr/N), or convert them "
            "yourself with transformers: `AutoModel.from_pretrained(name)."
            "save_pretrained(dir, safe_serialization=True)` and load that directory."
        )
    raise HubContentError(
        f"{handle}: the repository has no {SAFETENSORS} or {INDEX}. Pass "
        "`load_weights=False` for a random init with its config."
    )


def _unreachable_errors() -> tuple:
    """Errors meaning the hub could not be asked (offline, network down,
    hub down), after which the cache is used."""
    from huggingface_hub.errors import (
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RevisionResolutionError,
    )

    errors = [HfHubHTTPError, OfflineModeIsEnabled, RevisionResolutionError]
    for module in ("httpx2", "httpx", "requests"):
        with contextlib.suppress(ImportError, AttributeError):
            lib = __import__(module)
            errors.append(getattr(lib, "TransportError", None) or lib.ConnectionError)
    return tuple(errors)


def _is_http_error(error, below: int) -> bool:
    """An HTTP error answered by the hub with a status under `below`."""
    response = getattr(error, "response", None)
    status = getattr(response, "status_code", None)
    return status is not None and status < below


@contextlib.contextmanager
def _translated(handle, repo_id, revision):
    """Turns `huggingface_hub`'s errors into `HubAccessError`s that say
    what to do."""
    from huggingface_hub import constants, get_token
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    page = f"{constants.ENDPOINT}/{repo_id}"
    token = get_token() is not None
    try:
        yield
    except GatedRepoError:
        state = "the token in use has no access" if token else "no token is set"
        raise HubAccessError(
            f"{handle}: {repo_id} is a gated repository and {state}. Accept its terms "
            f"on {page} while signed in, then set HF_TOKEN to an access token of that "
            "account (or run `hf auth login`)."
        ) from None
    except RepositoryNotFoundError:
        hint = (
            "the token in use has no access to it"
            if token
            else "a private repository needs HF_TOKEN (or `hf auth login`)"
        )
        raise HubAccessError(
            f"{handle}: repository {repo_id!r} not found on {constants.ENDPOINT}. "
            f"Check the spelling (org/name); {hint}."
        ) from None
    except RevisionNotFoundError:
        raise HubAccessError(
            f"{handle}: revision {revision!r} not found in {repo_id}. Use a branch, "
            f"tag or commit id listed on {page} (or refs/pr/N for a pull request)."
        ) from None
    except HfHubHTTPError as error:
        status = getattr(getattr(error, "response", None), "status_code", "?")
        raise HubAccessError(
            f"{handle}: the hub answered HTTP {status} for {repo_id} "
            f"({str(error).strip().splitlines()[0]}). If the repository is private or "
            "gated, set HF_TOKEN to a token with access."
        ) from None
    except (LocalEntryNotFoundError, *_unreachable_errors()) as error:
        raise HubAccessError(
            f"{handle}: the download from {constants.ENDPOINT} failed "
            f"({type(error).__name__}: {error}). Check the connection and try again; "
            f"the files already fetched stay in the hub cache at {cache_dir()}."
        ) from None
