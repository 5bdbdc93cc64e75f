"""Reading the JSON files of presets and checkpoints, with errors that name
the file and the fix."""

from __future__ import annotations

import json
from pathlib import Path


def read_json_object(path, what: str = "", fix: str = "Save the preset again.") -> dict:
    """The JSON object in `path` (a path or a traversable with `read_text`).

    Raises `FileNotFoundError` when it is missing, and `ValueError` naming
    `what` (e.g. "Preset config"), the file and `fix` when it is not valid
    JSON or not an object.
    """
    name = f"{what} {path}" if what else str(path)
    reader = path if hasattr(path, "read_text") else Path(path)
    try:
        text = reader.read_text()
    except FileNotFoundError:
        raise FileNotFoundError(f"{what or 'File'} not found: {path}.") from None
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{name} is not valid JSON ({error}). {fix}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{name} must hold a JSON object. {fix}")
    return data


def dtype_policy_json(policy) -> dict:
    """A Keras dtype policy as `keras.dtype_policies.serialize` writes it
    (`keras.dtype_policies.deserialize` reads it back), without Keras'
    serializer: that one imports TensorFlow, wherever it is installed, on
    every backend (seconds and hundreds of MB for a JAX or PyTorch user)."""
    return {
        "module": "keras.dtype_policies",
        "class_name": type(policy).__name__,
        "config": policy.get_config(),
        "registered_name": None,
    }
