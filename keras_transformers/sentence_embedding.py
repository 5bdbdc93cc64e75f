"""sentence-transformers directories: what their `modules.json` says, as a
`TextEmbedder`.

A directory saved by `SentenceTransformer.save` lists its modules in
`modules.json`: a Transformer (a Hugging Face model directory: the root,
or a sub-directory such as `0_Transformer`), a Pooling module
(`1_Pooling/config.json`) and optionally a Normalize module. `redirect`
turns such a directory into what `keras_transformers.loading` loads: the
transformer's directory, the class `TextEmbedder` and its task arguments
(pooling modes, normalisation, `max_seq_length`, `do_lower_case`). Both
the current file layout (`"pooling_mode": "mean"`) and the older one
(`"pooling_mode_mean_tokens": true`) are read.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from keras_transformers import registry
from keras_transformers._json import read_json_object

MODULES_FILE = "modules.json"
SETTINGS_FILE = "sentence_bert_config.json"  # the Transformer module's settings
SUPPORTED = ("Transformer", "Pooling", "Normalize")
_LARGEST_LENGTH = 1_000_000  # larger `model_max_length`s mean "no limit"


@dataclass
class Layout:
    """A sentence-transformers directory: where its transformer is and the
    `TextEmbedder` task arguments its other modules give."""

    transformer: Path
    task: dict = field(default_factory=dict)


def is_sentence_transformers(handle) -> bool:
    """Whether `handle` is a local directory with a `modules.json`."""
    return (
        isinstance(handle, (str, os.PathLike))
        and (Path(handle) / MODULES_FILE).is_file()
    )


def redirect(handle, cls, overrides: dict):
    """What to load for `handle` asked as `cls` with `overrides`.

    A sentence-transformers directory asked as any class (None) or as
    `TextEmbedder` loads its transformer as a `TextEmbedder` with the
    pooling settings of its modules (`overrides` win); asked as another
    class (e.g. `BertBackbone`), its transformer loads as that class.
    Anything else is returned unchanged.

    Returns:
        `(handle, cls, overrides)`.

    Raises:
        ValueError: a module `TextEmbedder` cannot build (named), an
            unknown pooling mode, or a pooling width unlike the model's.
    """
    if not is_sentence_transformers(handle):
        return handle, cls, overrides
    embedder = registry.model_classes()["TextEmbedder"]
    if cls is not None and not issubclass(cls, embedder):
        return (
            _transformer_directory(Path(handle), _modules(Path(handle))),
            cls,
            overrides,
        )
    layout = read_layout(handle)
    return layout.transformer, cls or embedder, {**layout.task, **overrides}


def read_layout(directory) -> Layout:
    """The `Layout` of a sentence-transformers directory.

    Raises:
        ValueError: see `redirect`.
    """
    directory = Path(directory)
    modules = _modules(directory)
    transformer = _transformer_directory(directory, modules)
    kinds = [_kind(module) for module in modules]
    for module, kind in zip(modules[1:], kinds[1:]):
        if kind not in SUPPORTED[1:]:
            raise ValueError(
                f"{directory / MODULES_FILE} names module {module.get('type')!r} "
                f"(path {module.get('path')!r}), which a TextEmbedder cannot build: "
                f"it builds {', '.join(SUPPORTED)} modules. Load the transformer "
                "alone with BertBackbone.from_preset(directory) and add that step "
                "yourself."
            )
    if kinds[1:2] != ["Pooling"] or kinds[2:] not in ([], ["Normalize"]):
        raise ValueError(
            f"{directory / MODULES_FILE} lists the modules {kinds}; a TextEmbedder "
            "is a Transformer, a Pooling and optionally a Normalize module, in that "
            "order."
        )
    pooling = _pooling(directory / (modules[1].get("path") or ""), transformer)
    settings = _read_if_present(transformer / SETTINGS_FILE)
    task = {
        "pooling": pooling,
        "normalize": kinds[-1] == "Normalize",
        "lowercase": bool(settings.get("do_lower_case", False)),
    }
    length = settings.get("max_seq_length") or _tokenizer_length(transformer)
    if length is not None:
        task["max_length"] = int(length)
    return Layout(transformer, task)


def _modules(directory: Path) -> list[dict]:
    """`modules.json`'s entries, by `idx`."""
    path = directory / MODULES_FILE
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON ({error}).") from None
    if not isinstance(data, list) or not all(isinstance(m, dict) for m in data):
        raise ValueError(f"{path} must hold a JSON list of modules (objects).")
    modules = sorted(data, key=lambda m: m.get("idx", 0))
    if not modules or _kind(modules[0]) != "Transformer":
        raise ValueError(
            f"{path} does not start with a Transformer module (it lists "
            f"{[m.get('type') for m in modules]}): a TextEmbedder needs the Hugging "
            "Face model as the first module."
        )
    return modules


def _kind(module: dict) -> str:
    """ "Transformer", "Pooling", "Normalize" for sentence-transformers' own
    classes (any of their module paths); else the full type name."""
    name = str(module.get("type", ""))
    last = name.rsplit(".", 1)[-1]
    if name.startswith("sentence_transformers.") and last in SUPPORTED:
        return last
    return name


def _transformer_directory(directory: Path, modules: list[dict]) -> Path:
    path = directory / (modules[0].get("path") or "")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"The Transformer module of {directory} (path {str(path)!r}) has no "
            "config.json: the sentence-transformers directory is incomplete."
        )
    return path


def _pooling(path: Path, transformer: Path):
    """The pooling mode(s) of a Pooling module's `config.json`: its
    `pooling_mode`, or the older `pooling_mode_<name>` flags."""
    from keras_transformers.layers.pooling import POOLING_MODES, check_pooling

    config = _read_if_present(path / "config.json")
    if "pooling_mode" in config:
        modes = config["pooling_mode"]
    else:
        flags = {
            "cls": "pooling_mode_cls_token",
            "max": "pooling_mode_max_tokens",
            "mean": "pooling_mode_mean_tokens",
            "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
            "weightedmean": "pooling_mode_weightedmean_tokens",
            "lasttoken": "pooling_mode_lasttoken",
        }
        unknown = [k for k, v in config.items() if k.startswith("pooling_mode_") and v]
        unknown = [k for k in unknown if k not in flags.values()]
        if unknown:
            raise ValueError(
                f"{path / 'config.json'} sets {unknown[0]}, an unknown pooling mode. "
                f"Valid modes: {POOLING_MODES}."
            )
        modes = [mode for mode in POOLING_MODES if config.get(flags[mode])] or "mean"
    try:
        modes = check_pooling(modes)
    except ValueError as error:
        raise ValueError(f"{path / 'config.json'}: {error}") from None
    width = config.get("embedding_dimension", config.get("word_embedding_dimension"))
    hidden = _read_if_present(transformer / "config.json").get("hidden_size")
    if width is not None and hidden is not None and width != hidden:
        raise ValueError(
            f"{path / 'config.json'} pools {width}-wide token states, but the "
            f"transformer's hidden_size is {hidden}: the directory mixes two models."
        )
    return modes[0] if len(modes) == 1 else list(modes)


def _tokenizer_length(transformer: Path) -> int | None:
    """`model_max_length` of `tokenizer_config.json` (what sentence-transformers
    truncates to when `sentence_bert_config.json` sets no `max_seq_length`)."""
    length = _read_if_present(transformer / "tokenizer_config.json").get(
        "model_max_length"
    )
    if isinstance(length, int) and 2 <= length < _LARGEST_LENGTH:
        return length
    return None


def _read_if_present(path: Path) -> dict:
    if not path.is_file():
        return {}
    return read_json_object(path, path.name, "Save the model again.")
