"""The files of a preset: finding them, reading them, writing them.

The steps of a load that need neither a choice of model class nor a
Hugging Face converter: resolve a handle to a local path, read a built-in
or saved preset's data, load tokenizer assets, build a given class from a
config, load saved weights into a model; and writing a preset directory.
`keras_transformers.loading` puts them together.

A saved preset directory holds `config.json` (class, family, config and,
for a quantized model, each quantized layer's mode),
`model.weights.h5`, `metadata.json` and, when the model has one, the
tokenizer's files under `tokenizer/`.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

from keras_transformers import _atomic, preset_record
from keras_transformers._json import read_json_object

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.weights.h5"
METADATA_FILE = "metadata.json"
TOKENIZER_DIR = "tokenizer"


# ---------------------------------------------------------------- reading
def _builtin_root():
    source = Path(__file__).resolve().parent.parent / "presets"
    if source.is_dir():  # a source checkout or an editable install
        return source
    return resources.files("keras_transformers.preset_files")


def _walk(root):
    for entry in root.iterdir():
        if entry.is_dir():
            yield from _walk(entry)
        elif entry.name.endswith(".json"):
            yield entry


def builtin_files() -> dict[str, Any]:
    """`{name: file}` of the built-in presets (`presets/**/<name>.json`)."""
    return {entry.name[: -len(".json")]: entry for entry in _walk(_builtin_root())}


def read_json(path, what: str) -> dict:
    """The JSON object in `path` (`what` names it in errors)."""
    return read_json_object(path, what, "Restore it, or save the preset again.")


def read_builtin(name: str) -> dict:
    """The data of built-in preset `name`: `family`, `config`, `metadata`."""
    files = builtin_files()
    text = str(name)
    if name not in files and ("/" in text or "\\" in text or text[:1] in (".", "~")):
        raise FileNotFoundError(
            f"No preset at {name!r}: that path does not exist. Check it (a preset "
            "directory is what `save_to_preset` writes), or pass a built-in preset "
            "name or a hub handle `hf://org/name`."
        )
    if name not in files:
        raise ValueError(
            f"Unknown preset {name!r}. Built-in presets: {sorted(files)}. A preset can "
            "also be a directory written by `save_to_preset`, a Hugging Face model "
            "directory or a hub handle `hf://org/name`."
        )
    data = read_json(files[name], "Preset file")
    for key in ("family", "config", "metadata"):
        if key not in data:
            raise ValueError(f"Preset file for {name!r} lacks the {key!r} entry.")
    return data


def resolve(handle, weights: bool = True):
    """The local form of `handle`: the snapshot directory of an `hf://`
    handle (fetched if needed, see `keras_transformers.hub.resolve`); any
    other handle unchanged (a save killed mid-swap is recovered first)."""
    from keras_transformers import hub

    if hub.is_hub_handle(handle):
        return hub.resolve(handle, weights=weights)
    if isinstance(handle, (str, os.PathLike)):
        _atomic.recover(handle, only_if_missing=True)
    return handle


def kind(handle) -> str:
    """What a resolved handle is: "saved" (a `save_to_preset` directory),
    "huggingface" (a Hugging Face model directory), "file" (a preset JSON
    file) or "builtin" (a built-in preset name)."""
    if isinstance(handle, (str, os.PathLike)) and Path(handle).is_dir():
        path = Path(handle)
        if not (path / CONFIG_FILE).exists():
            raise FileNotFoundError(
                f"{path} has no {CONFIG_FILE}: not a preset directory. Pass a built-in "
                "preset name, a directory written by `save_to_preset`, or a Hugging Face model directory."
            )
        data = read_json(path / CONFIG_FILE, "Preset config")
        return "huggingface" if "model_type" in data else "saved"
    if isinstance(handle, str) and handle.endswith(".json") and Path(handle).is_file():
        return "file"
    return "builtin"


def read_preset(handle, handle_kind: str) -> dict:
    """The data of a built-in preset, preset file or saved preset directory."""
    if handle_kind == "builtin":
        return read_builtin(str(handle))
    if handle_kind == "file":
        return read_json(handle, "Preset file")
    return read_json(Path(handle) / CONFIG_FILE, "Preset config")


def load_assets(directory):
    """The tokenizer or preprocessor saved in `directory`, or None when it
    has no tokenizer files: what `HFTokenizer.save_assets` wrote; else ESM's
    protein tokenizer (`vocab.txt` with `"tokenizer_class": "EsmTokenizer"`);
    else a WordPiece (BERT) preprocessor when there is a `vocab.txt` or a WordPiece
    `tokenizer.json`; else an `HFTokenizer` for any other Hugging Face
    `tokenizer.json` or, without one, a SentencePiece model
    (`tokenizer.model`, `spiece.model`, `sentencepiece.bpe.model`,
    `spm.model`); else a byte-level BPE tokenizer (`vocab.json` +
    `merges.txt`). Files it cannot read raise, naming the file and the fix."""
    from keras_transformers.preprocessing import load_preprocessor
    from keras_transformers.tokenizer import load_tokenizer
    from keras_transformers.tokenizer.esm import EsmTokenizer, is_esm_directory
    from keras_transformers.tokenizer.files import _has_assets
    from keras_transformers.tokenizer.hf import load_hf_tokenizer, saved_by_hf_tokenizer

    if saved_by_hf_tokenizer(directory):
        return load_hf_tokenizer(directory)
    if is_esm_directory(directory):
        return EsmTokenizer.from_assets(directory)
    found = load_preprocessor(directory) or load_hf_tokenizer(directory)
    if found is None and _has_assets(directory):
        found = load_tokenizer(directory)
    return found


def saved_tokenizer(directory, config, weights: bool = True):
    """The tokenizer of a saved preset directory (None if it has none),
    once its files match `metadata.json` (see `keras_transformers.preset_record`;
    `weights=False` leaves the weights file unchecked)."""
    meta = preset_record.check_files(directory, METADATA_FILE, weights=weights)
    tokenizer = None
    if (Path(directory) / TOKENIZER_DIR).is_dir():
        tokenizer = load_assets(Path(directory) / TOKENIZER_DIR)
    preset_record.check_tokenizer(directory, meta, tokenizer, config)
    return tokenizer


# --------------------------------------------------------------- building
def cls_task_arguments(cls) -> tuple:
    """Head arguments a class takes besides the config (e.g. `num_classes`)."""
    return tuple(getattr(cls, "task_arguments", ()))


def split_task_arguments(cls, overrides: dict) -> dict:
    """Removes the head arguments of `cls` from `overrides`; returns them."""
    return {k: overrides.pop(k) for k in cls_task_arguments(cls) if k in overrides}


def instantiate(cls, config, dtype, tokenizer, task_args=None):
    """`cls` built from `config`; a task model gets `tokenizer` (its
    sequence length cut to the model's positions) and `task_args`."""
    length = getattr(tokenizer, "sequence_length", None)
    if length is not None and length > config.max_sequence_length:
        # e.g. a Hugging Face vocab.txt gets BERT's default 512 positions.
        tokenizer.sequence_length = config.max_sequence_length
    if getattr(cls, "backbone_cls", None) is not None:
        return cls(config=config, dtype=dtype, tokenizer=tokenizer, **(task_args or {}))
    return cls(config=config, dtype=dtype)


def load_weights(model, path) -> None:
    """Loads `model.weights.h5` at `path` into `model`.

    Raises:
        ValueError: a corrupt file, or weights of another architecture.
    """
    try:
        model.load_weights(str(path))
    except Exception as error:  # h5py / keras raise many kinds
        raise ValueError(
            f"Could not load weights from {path}: {error}. The file is corrupt or was "
            "saved from a different architecture; check config.json against the "
            "weights, or save the preset again."
        ) from None


# ---------------------------------------------------------------- writing
def save_model(model, directory) -> None:
    """Writes `model` as a preset directory.

    The save is atomic (see `keras_transformers._atomic`): the files go to
    a fresh sibling directory that replaces `directory` in one rename at
    the end, so a save killed at any moment leaves the previous preset or
    the new one, whole, and the directory holds exactly this save's files.
    `metadata.json`, written last, records every file's size and SHA-256
    and the tokenizer's vocabulary size (see `keras_transformers.preset_record`).

    Raises:
        ValueError: `directory` holds files other than a preset's, or the
            tokenizer has more tokens than the model's embedding table.
    """
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is not None:
        preset_record.check_vocabulary(tokenizer, model.config, "of this model")
    with _atomic.atomic_directory(
        directory, markers=(CONFIG_FILE, METADATA_FILE)
    ) as path:
        _write_preset(model, path, tokenizer)


def _write_preset(model, path: Path, tokenizer) -> None:
    meta = {
        "class_name": type(model).__name__,
        "family": model.family,
        "config": model.config.to_dict(),
    }
    if hasattr(model, "task_config") and model.task_config():
        meta["task"] = model.task_config()
    from keras_transformers.quantization import spec

    quantized = spec(model)  # each quantized layer's mode, e.g. "nf4/64"
    if quantized is not None:
        meta["quantization"] = quantized
    (path / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    model.save_weights(str(path / WEIGHTS_FILE))
    if tokenizer is not None:
        tokenizer.save_assets(str(path / TOKENIZER_DIR))
    from keras_transformers.generation.config import save_generation_config

    save_generation_config(model, path)  # generation_config.json, if any
    metadata = preset_record.metadata(model, path, tokenizer, skip=METADATA_FILE)
    (path / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")
