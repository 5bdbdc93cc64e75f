"""The record of what belongs together in a saved preset, and its checks.

`save_to_preset` writes `metadata.json` last, after every other file of the
save. Besides `params`, `keras_version`, `backend`, `dtype` and `saved`, it
holds::

    "files": {"config.json": {"size": 1093, "sha256": "9f2c..."},
              "model.weights.h5": {"size": 497839416, "sha256": "41d0..."},
              "tokenizer/tokenizer.json": {...}, ...},
    "tokenizer": {"class_name": "HFTokenizer", "vocabulary_size": 49152}

(`"tokenizer": null` for a model without one). Loading a preset checks it
before building anything (`check_files`) and names the first mismatch with
the fix: a listed file that is missing (an incomplete copy), a file whose
size or SHA-256 differs (weights or a tokenizer from another save, a
`config.json` edited after saving), a tokenizer file the save did not write
(a stale one copied in). After loading the tokenizer, `check_tokenizer`
compares its vocabulary with the record and with the model's embedding
table: a tokenizer larger than `vocabulary_size` would produce ids outside
it. Presets saved before the record existed (no `"files"` entry) load
unchecked, with a warning for an oversized tokenizer; deleting the
`"files"` entry is also the way to load edited files deliberately.

Cost: SHA-256 streams each file once, in 1 MiB blocks, at about the speed
of reading it (measured here: see `README.md`, section Presets).
"""

from __future__ import annotations

import datetime
import hashlib
import os
import warnings
from pathlib import Path

from keras_transformers._json import dtype_policy_json, read_json_object

FILES, TOKENIZER = "files", "tokenizer"
WEIGHTS_SUFFIXES = (".h5", ".safetensors", ".npz")
LOADED_BESIDE = ("generation_config.json",)  # files besides tokenizer/ that load
FIX = (
    "save the model again, or copy config.json, the weights, metadata.json "
    "and tokenizer/ of one save together (to load the files as they are "
    'anyway, delete the "files" entry of metadata.json)'
)


def sha256(path) -> str:
    """Hex SHA-256 of a file, streamed in 1 MiB blocks."""
    with open(path, "rb") as file:
        if hasattr(hashlib, "file_digest"):  # Python 3.11+
            return hashlib.file_digest(file, "sha256").hexdigest()
        digest = hashlib.sha256()
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
        return digest.hexdigest()


def _files(directory: Path) -> list[str]:
    """Relative POSIX paths of every file under `directory`, sorted."""
    out = []
    for root, _, names in os.walk(directory):
        for name in names:
            out.append((Path(root) / name).relative_to(directory).as_posix())
    return sorted(out)


def vocabulary_size(tokenizer) -> int | None:
    """Number of ids a tokenizer (or a preprocessor's tokenizer) produces."""
    for candidate in (tokenizer, getattr(tokenizer, "tokenizer", None)):
        size = getattr(candidate, "vocabulary_size", None)
        size = size() if callable(size) else size
        if isinstance(size, int):
            return size
    return None


def check_vocabulary(tokenizer, config, where) -> None:
    """Raises when `tokenizer` produces ids beyond `config.vocabulary_size`."""
    size = vocabulary_size(tokenizer)
    if size is not None and size > config.vocabulary_size:
        raise ValueError(
            f"The tokenizer {where} has {size} tokens, more than the model's embedding "
            f"table (vocabulary_size={config.vocabulary_size}): its ids would fall "
            "outside it. Use the tokenizer the model was trained with, or a config "
            f"with vocabulary_size >= {size}."
        )


def metadata(model, directory, tokenizer, skip: str) -> dict:
    """The `metadata.json` of a save: model facts plus the record of the
    files under `directory` (all but `skip`, the metadata file itself)."""
    import keras

    directory = Path(directory)
    files = {
        name: {
            "size": (directory / name).stat().st_size,
            "sha256": sha256(directory / name),
        }
        for name in _files(directory)
        if name != skip
    }
    tokenizer_entry = None
    if tokenizer is not None:
        tokenizer_entry = {
            "class_name": type(tokenizer).__name__,
            "vocabulary_size": vocabulary_size(tokenizer),
        }
    now = datetime.datetime.now(datetime.timezone.utc)
    return {
        "params": int(model.count_params()),
        "keras_version": keras.__version__,
        "backend": keras.config.backend(),
        "dtype": dtype_policy_json(model.dtype_policy),
        "saved": now.isoformat(timespec="seconds"),
        FILES: files,
        TOKENIZER: tokenizer_entry,
    }


def _read_metadata(path: Path) -> dict:
    """`metadata.json`, or {} where an older save left none."""
    if not path.is_file():
        return {}
    return read_json_object(path, fix="Restore it, or save the preset again.")


def _role(name: str) -> str:
    if name.endswith(WEIGHTS_SUFFIXES):
        return "is corrupt, or holds weights from another save (e.g. another model's)"
    if name == "config.json":
        return (
            "was changed after the weights were saved with it (pass changes as "
            "overrides instead: `from_preset(directory, dropout=0.1)`)"
        )
    if name.startswith(TOKENIZER + "/"):
        return "is corrupt, or belongs to another tokenizer than this model's"
    return "is corrupt, or was changed after saving"


def check_files(directory, metadata_file: str, weights: bool = True) -> dict | None:
    """Checks the files of a saved preset against its record.

    Args:
        directory: the preset directory.
        metadata_file: the name of its metadata file (`metadata.json`).
        weights: also check the weights files (False: they are not loaded).

    Returns:
        The metadata, or None for a preset without a record.

    Raises:
        FileNotFoundError: a listed file is missing.
        ValueError: a file's size or SHA-256 differs from the record, or
            the directory holds a tokenizer or generation file the save did
            not write.
    """
    directory = Path(directory)
    metadata = _read_metadata(directory / metadata_file)
    files = metadata.get(FILES)
    if not isinstance(files, dict):
        return None
    wanted = {
        name: entry
        for name, entry in files.items()
        if weights or not name.endswith(WEIGHTS_SUFFIXES)
    }
    for name in wanted:
        if not (directory / name).is_file():
            raise FileNotFoundError(
                f"{directory / name} is missing: metadata.json lists it as part of "
                f"this preset's save, so the directory is incomplete. Copy the whole "
                f"directory again, or {FIX}."
            )
    for name in _files(directory):
        loaded = name.startswith(TOKENIZER + "/") or name in LOADED_BESIDE
        if loaded and name not in files:
            raise ValueError(
                f"{directory / name} is not part of this preset's save (metadata.json "
                "does not list it), yet it would be loaded with the model. Remove it, "
                f"or {FIX}."
            )
    for check in ("size", "sha256"):
        for name, entry in wanted.items():
            path = directory / name
            found = path.stat().st_size if check == "size" else sha256(path)
            if found != entry.get(check):
                raise ValueError(
                    f"{path} does not match this preset's metadata.json ({check} "
                    f"{found}, recorded {entry.get(check)}): the file {_role(name)}. "
                    f"To fix it, {FIX}."
                )
    return metadata


def check_tokenizer(directory, metadata: dict | None, tokenizer, config) -> None:
    """Checks the loaded `tokenizer` against the record and the model's
    embedding table (a warning instead of an error for presets without a
    record)."""
    where = f"in {Path(directory) / TOKENIZER}"
    if metadata is None:
        try:
            check_vocabulary(tokenizer, config, where)
        except ValueError as error:
            warnings.warn(str(error), stacklevel=3)
        return
    saved = metadata.get(TOKENIZER) or {}
    size = vocabulary_size(tokenizer)
    if saved.get("vocabulary_size") not in (None, size):
        raise ValueError(
            f"The tokenizer {where} has {size} tokens; metadata.json records "
            f"{saved['vocabulary_size']} for the tokenizer saved with this model. "
            f"To fix it, {FIX}."
        )
    check_vocabulary(tokenizer, config, where)
