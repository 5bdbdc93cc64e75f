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

The load itself, one pass from handle to model, is
`keras_transformers.loading.load_model`; the files are read and written by
`keras_transformers.preset_io`, and the class to build comes from
`keras_transformers.registry`.
"""

from __future__ import annotations

from keras_transformers import preset_io
from keras_transformers.loading import load_config, load_model
from keras_transformers.preset_io import (
    CONFIG_FILE,
    METADATA_FILE,
    TOKENIZER_DIR,
    WEIGHTS_FILE,
    cls_task_arguments,
    load_assets,
    read_builtin,
    save_model,
)
from keras_transformers.registry import FAMILIES


def list_presets(family: str | None = None) -> dict[str, dict]:
    """Built-in presets: `{name: {"family", "description", "params", "reference"}}`.

    Args:
        family: keep only this family ("gpt", "bert", "transformer",
            "mixtral", "vit").
    """
    if family is not None and family not in FAMILIES:
        raise ValueError(f"Unknown family {family!r}. Expected one of {FAMILIES}.")
    out = {}
    for name in sorted(preset_io.builtin_files()):
        data = read_builtin(name)
        if family is None or data["family"] == family:
            out[name] = {"family": data["family"], **data["metadata"]}
    return out


def from_preset(handle, **overrides):
    """Builds the right model class for `handle` (see `load_model`)."""
    return load_model(handle, cls=None, **overrides)


__all__ = [
    "CONFIG_FILE",
    "FAMILIES",
    "METADATA_FILE",
    "TOKENIZER_DIR",
    "WEIGHTS_FILE",
    "cls_task_arguments",
    "from_preset",
    "list_presets",
    "load_assets",
    "load_config",
    "load_model",
    "save_model",
]
