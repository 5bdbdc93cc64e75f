"""Presets: built-in architectures, saved preset directories, Hugging Face
model directories and Hugging Face hub handles, behind one
`from_preset(handle)`.

A built-in preset is `presets/<name>.json` (sub-folders allowed)::

    {"family": "gpt", "config": {...TransformerConfig fields...},
     "metadata": {"description": "...", "params": 124439808, "reference": "..."}}

A saved preset directory holds `config.json` (class, family, config),
`model.weights.h5`, `metadata.json` and, when the model has one, the
tokenizer's files under `tokenizer/`: exactly the files of its last save,
which replaced the directory atomically (see `save_model`). `metadata.json`
records those files (sizes, SHA-256) and loading checks them (see
`keras_transformers.preset_record`).

A hub handle `hf://org/name` (optionally `@revision`) is fetched into the
Hugging Face cache by `keras_transformers.hub.resolve` once, at the start of
a load, and the snapshot directory then loads as a Hugging Face directory.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

from keras_transformers import _atomic, preset_record
from keras_transformers._json import read_json_object
from keras_transformers.config import TransformerConfig

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.weights.h5"
METADATA_FILE = "metadata.json"
TOKENIZER_DIR = "tokenizer"
FAMILIES = ("gpt", "bert", "transformer", "mixtral", "vit")


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


def _builtin_files() -> dict[str, Any]:
    return {entry.name[: -len(".json")]: entry for entry in _walk(_builtin_root())}


def _read_json(path, what: str) -> dict:
    return read_json_object(path, what, "Restore it, or save the preset again.")


def _builtin(name: str) -> dict:
    files = _builtin_files()
    if name not in files:
        raise ValueError(
            f"Unknown preset {name!r}. Built-in presets: {sorted(files)}. A preset can "
            "also be a directory written by `save_to_preset`, a Hugging Face model "
            "directory or a hub handle `hf://org/name`."
        )
    data = _read_json(files[name], "Preset file")
    for key in ("family", "config", "metadata"):
        if key not in data:
            raise ValueError(f"Preset file for {name!r} lacks the {key!r} entry.")
    return data


def list_presets(family: str | None = None) -> dict[str, dict]:
    """Built-in presets: `{name: {"family", "description", "params", "reference"}}`.

    Args:
        family: keep only this family ("gpt", "bert", "transformer",
            "mixtral", "vit").
    """
    if family is not None and family not in FAMILIES:
        raise ValueError(f"Unknown family {family!r}. Expected one of {FAMILIES}.")
    out = {}
    for name in sorted(_builtin_files()):
        data = _builtin(name)
        if family is None or data["family"] == family:
            out[name] = {"family": data["family"], **data["metadata"]}
    return out


def _kind(handle) -> str:
    if isinstance(handle, (str, os.PathLike)) and Path(handle).is_dir():
        path = Path(handle)
        if not (path / CONFIG_FILE).exists():
            raise FileNotFoundError(
                f"{path} has no {CONFIG_FILE}: not a preset directory. Pass a built-in "
                "preset name, a directory written by `save_to_preset`, or a Hugging Face model directory."
            )
        data = _read_json(path / CONFIG_FILE, "Preset config")
        return "huggingface" if "model_type" in data else "saved"
    if isinstance(handle, str) and handle.endswith(".json") and Path(handle).is_file():
        return "file"
    return "builtin"


def _local(handle, weights: bool = True):
    """The snapshot directory of an `hf://` handle (fetched if needed, see
    `keras_transformers.hub.resolve`); any other handle unchanged."""
    from keras_transformers import hub

    if hub.is_hub_handle(handle):
        return hub.resolve(handle, weights=weights)
    if isinstance(handle, (str, os.PathLike)):  # a save killed mid-swap
        _atomic.recover(handle, only_if_missing=True)
    return handle


def _preset_data(handle) -> dict:
    handle = _local(handle, weights=False)
    kind = _kind(handle)
    if kind == "builtin":
        return _builtin(str(handle))
    if kind == "file":
        return _read_json(handle, "Preset file")
    if kind == "saved":
        return _read_json(Path(handle) / CONFIG_FILE, "Preset config")
    from keras_transformers.convert import hf_preset_data

    return hf_preset_data(Path(handle))


def load_config(name_or_path, **overrides) -> TransformerConfig:
    """The `TransformerConfig` of a preset, with `overrides` applied.

    Args:
        name_or_path: a built-in preset name, a preset JSON file, a saved
            preset directory, a Hugging Face model directory or a hub handle
            `hf://org/name[@revision]` (only its config and tokenizer files
            are fetched).
        **overrides: config fields to change, e.g. `max_sequence_length=256`.

    Raises:
        ValueError: unknown preset, invalid config, or (`HubContentError`) a
            hub repository we cannot load.
        FileNotFoundError: missing files, or (`HubAccessError`) a hub
            repository or revision that cannot be reached.
    """
    data = _preset_data(name_or_path)
    if "config" not in data:
        raise ValueError(f"Preset {name_or_path!r} has no 'config' entry.")
    config = TransformerConfig.from_dict(data["config"])
    return config.replace(**overrides) if overrides else config


def _resolve_class(data: dict, cls):
    from keras_transformers import models

    family = data.get("family")
    if family not in models.FAMILY_CLASSES:
        raise ValueError(
            f"Preset family {family!r} is not available. Known families: {sorted(models.FAMILY_CLASSES)}."
        )
    backbone_cls, default_cls = models.FAMILY_CLASSES[family]
    saved_cls = models.CLASSES.get(data.get("class_name"), default_cls)
    if cls is None:
        return saved_cls, saved_cls
    if cls.family != family:
        raise ValueError(
            f"Preset is a {family!r} model; {cls.__name__} is a {cls.family!r} model. "
            f"Use {default_cls.__name__}.from_preset or keras_transformers.from_preset."
        )
    return cls, saved_cls


def load_model(
    handle,
    cls=None,
    load_weights: bool = True,
    dtype=None,
    distribution=None,
    **overrides,
):
    """Builds the model a preset describes (used by every `from_preset`).

    Args:
        handle: built-in name, saved preset directory, Hugging Face directory
            or hub handle `hf://org/name[@revision]` (fetched into the
            Hugging Face cache first, see `keras_transformers.hub`).
        cls: the class asked for (None: the preset's own class).
        load_weights: load the saved or converted weights (built-in presets
            have none: random initialisation).
        dtype: dtype policy, e.g. "bfloat16" or "mixed_bfloat16".
        distribution: JAX only: `"auto"`, `"data"`, `"model"`, a dict of mesh
            axis sizes or a `keras.distribution` `DataParallel` / `ModelParallel` (see
            `keras_transformers.distribution.make_distribution`). It is set as
            the global distribution (what `fit()` and `generate()` then use)
            and the weights are created sharded by its layout.
        **overrides: config fields to change.

    Raises:
        ValueError: unknown preset or class mismatch, invalid config, or
            (`keras_transformers.hub.HubContentError`) a hub repository with
            only pickle weights or an unsupported `model_type`.
        FileNotFoundError: missing files, or
            (`keras_transformers.hub.HubAccessError`) a hub repository or
            revision not found, gated, or offline with nothing cached.
    """
    handle = _local(handle, weights=load_weights)
    if distribution is not None:
        _activate_distribution(handle, cls, distribution, overrides)
    kind = _kind(handle)
    if kind == "huggingface":
        from keras_transformers.convert import load_hf_model

        return load_hf_model(
            Path(handle), cls=cls, load_weights=load_weights, dtype=dtype, **overrides
        )
    data = _preset_data(handle)
    cls, saved_cls = _resolve_class(data, cls)
    task_args = {
        k: overrides.pop(k) for k in list(overrides) if k in cls_task_arguments(cls)
    }
    if saved_cls is cls:
        task_args = {**data.get("task", {}), **task_args}
    config = load_config(handle, **overrides)
    tokenizer = None
    if kind == "saved":
        meta = preset_record.check_files(handle, METADATA_FILE, weights=load_weights)
        if (Path(handle) / TOKENIZER_DIR).is_dir():
            tokenizer = load_assets(Path(handle) / TOKENIZER_DIR)
        preset_record.check_tokenizer(handle, meta, tokenizer, config)
    if kind != "saved" or not load_weights:
        return _instantiate(cls, config, dtype, tokenizer, task_args)
    weights = Path(handle) / WEIGHTS_FILE
    if not weights.exists():
        raise FileNotFoundError(
            f"{weights} is missing. Save the model again with `save_to_preset`, or pass "
            "`load_weights=False` for a randomly initialised model."
        )
    saved_size = _image_size(TransformerConfig.from_dict(data["config"]))
    resize = saved_size is not None and saved_size != _image_size(config)
    at_saved = config.replace(image_size=saved_size) if resize else config
    source = _instantiate(saved_cls, at_saved, dtype, tokenizer, data.get("task"))
    _load_weights(source, weights)
    if resize:  # e.g. a ViT fine-tuned at another resolution
        from keras_transformers.models.vit import with_image_size

        source = with_image_size(source, config.vision.image_size)
    from keras_transformers.generation.config import attach_generation_config

    model = _convert_between(source, cls, tokenizer, task_args)
    attach_generation_config(model, handle)  # generation_config.json, if any
    return model


def _activate_distribution(handle, cls, distribution, overrides):
    """Makes `distribution` (for the config `handle` and `overrides` give)
    the global `keras.distribution`."""
    import keras

    from keras_transformers.distribution import make_distribution

    if isinstance(distribution, (str, dict)):
        target, _ = _resolve_class(_preset_data(handle), cls)
        task = cls_task_arguments(target)
        fields = {k: v for k, v in overrides.items() if k not in task}
        distribution = make_distribution(load_config(handle, **fields), distribution)
    keras.distribution.set_distribution(distribution)


def _image_size(config):
    return config.vision.image_size if config.vision is not None else None


def cls_task_arguments(cls) -> tuple:
    """Head arguments a class takes besides the config (e.g. `num_classes`)."""
    return tuple(getattr(cls, "task_arguments", ()))


def _instantiate(cls, config, dtype, tokenizer, task_args=None):
    length = getattr(tokenizer, "sequence_length", None)
    if length is not None and length > config.max_sequence_length:
        # e.g. a Hugging Face vocab.txt gets BERT's default 512 positions.
        tokenizer.sequence_length = config.max_sequence_length
    if getattr(cls, "backbone_cls", None) is not None:
        return cls(config=config, dtype=dtype, tokenizer=tokenizer, **(task_args or {}))
    return cls(config=config, dtype=dtype)


def _convert_between(model, cls, tokenizer, task_args=None):
    """A task preset loads as its backbone, a backbone preset as any task of
    its family (with a new head), and a task with other head arguments keeps
    its backbone, and its head weights wherever their shapes still fit."""
    task_args = task_args or {}
    if isinstance(model, cls) and all(
        getattr(model, k) == v for k, v in task_args.items()
    ):
        return model
    backbone = getattr(model, "backbone", model)
    if isinstance(backbone, cls):
        return backbone
    if getattr(cls, "backbone_cls", None) is None or not isinstance(
        backbone, cls.backbone_cls
    ):
        raise ValueError(
            f"A {type(model).__name__} preset cannot be loaded as {cls.__name__}."
        )
    new = cls(
        backbone, tokenizer=tokenizer or getattr(model, "tokenizer", None), **task_args
    )
    if type(model) is cls:  # same head, other arguments (e.g. dropout)
        _copy_head_weights(model, new)
    return new


def _copy_head_weights(source, target):
    backbone_ids = {id(v) for v in source.backbone.weights}
    old = [v for v in source.weights if id(v) not in backbone_ids]
    new = [
        v
        for v in target.weights
        if id(v) not in {id(w) for w in target.backbone.weights}
    ]
    for a, b in zip(old, new):
        if tuple(a.shape) == tuple(b.shape):
            b.assign(a.value)


def _load_weights(model, path):
    try:
        model.load_weights(str(path))
    except Exception as error:  # h5py / keras raise many kinds
        raise ValueError(
            f"Could not load weights from {path}: {error}. The file is corrupt or was "
            "saved from a different architecture; check config.json against the "
            "weights, or save the preset again."
        ) from None


def save_model(model, directory) -> None:
    """Writes `model` as a preset directory (see the module docstring).

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
    (path / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    model.save_weights(str(path / WEIGHTS_FILE))
    if tokenizer is not None:
        tokenizer.save_assets(str(path / TOKENIZER_DIR))
    from keras_transformers.generation.config import save_generation_config

    save_generation_config(model, path)  # generation_config.json, if any
    metadata = preset_record.metadata(model, path, tokenizer, skip=METADATA_FILE)
    (path / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")


def load_assets(directory):
    """The tokenizer or preprocessor saved in `directory`, or None: what
    `HFTokenizer.save_assets` wrote; else a WordPiece (BERT) preprocessor
    when there is a `vocab.txt` or a WordPiece `tokenizer.json`; else an
    `HFTokenizer` for any other Hugging Face `tokenizer.json`; else a
    byte-level BPE tokenizer (`vocab.json` + `merges.txt`)."""
    from keras_transformers.preprocessing import load_preprocessor
    from keras_transformers.tokenizer import load_tokenizer
    from keras_transformers.tokenizer.hf import load_hf_tokenizer, saved_by_hf_tokenizer

    if saved_by_hf_tokenizer(directory):
        return load_hf_tokenizer(directory)
    return (
        load_preprocessor(directory)
        or load_hf_tokenizer(directory)
        or load_tokenizer(directory)
    )


def from_preset(handle, **overrides):
    """Builds the right model class for `handle` (see `load_model`)."""
    return load_model(handle, cls=None, **overrides)
