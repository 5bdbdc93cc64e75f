"""Who can be loaded: model classes by family and task, Hugging Face
converters by `model_type`.

Each model class registers itself with `@register_model(task)` (its family
is its `family` attribute), and each converter module declares its
`keras_transformers.convert.protocol.Converter` with
`register_converter(Converter(...))`. Loading code asks
this module, and so never imports the model or converter modules it picks
from. The first lookup loads the built-in registrations (it imports
`keras_transformers.models` and `keras_transformers.convert`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

# A `keras_transformers.convert.protocol.Converter` (not imported: the
# registry sits below the packages it registers).
Converter = Any

# The built-in families, in the order listings show them.
FAMILIES = ("gpt", "bert", "transformer", "mixtral", "vit")
_BUILTIN_MODELS = "keras_transformers.models"
_BUILTIN_CONVERTERS = "keras_transformers.convert"

# family -> task -> class; family -> the class `keras_transformers.from_preset`
# builds; model_type -> converter module.
_MODELS: dict[str, dict[str, type]] = {}
_DEFAULTS: dict[str, type] = {}
_CONVERTERS: dict[str, Converter] = {}


def register_model(task: str, default: bool = False) -> Callable[[type], type]:
    """Class decorator: registers a model class under its `family` and `task`.

    Args:
        task: what the class does with the backbone, e.g. "backbone",
            "causal_lm", "classifier".
        default: the class that `keras_transformers.from_preset` builds for
            a preset of this family that names no class.
    """

    def register(cls: type) -> type:
        family = getattr(cls, "family", "")
        if not family:
            raise ValueError(f"{cls.__name__} has no `family` to register under.")
        _MODELS.setdefault(family, {})[task] = cls
        if default:
            _DEFAULTS[family] = cls
        return cls

    return register


def register_converter(converter: Converter) -> Converter:
    """Registers `converter` (a `keras_transformers.convert.protocol.Converter`)
    as the converter of its `model_type`, and returns it."""
    _CONVERTERS[converter.model_type] = converter
    return converter


def _load_builtins(registrations: dict, module: str) -> None:
    """Loads the built-in registrations (imports `module`) when none are here."""
    if not registrations:
        importlib.import_module(module)


def families() -> dict[str, tuple[type, type]]:
    """`{family: (backbone class, default class)}` of every registered family."""
    _load_builtins(_MODELS, _BUILTIN_MODELS)
    return {f: (tasks["backbone"], _DEFAULTS[f]) for f, tasks in _MODELS.items()}


def model_classes() -> dict[str, type]:
    """`{class name: class}` of every registered model class."""
    _load_builtins(_MODELS, _BUILTIN_MODELS)
    return {cls.__name__: cls for tasks in _MODELS.values() for cls in tasks.values()}


def resolve_class(data: dict, cls: type | None = None) -> tuple[type, type]:
    """The class to build for preset `data` and the class it was saved as.

    Args:
        data: preset data: `family` and (optionally) `class_name`.
        cls: the class asked for (None: the saved one, else the family's
            default class).

    Returns:
        `(target, saved)`; `target` is `cls` when given.

    Raises:
        ValueError: an unknown family, or `cls` of another family.
    """
    known = families()
    family = data.get("family")
    if family not in known:
        raise ValueError(
            f"Preset family {family!r} is not available. Known families: {sorted(known)}."
        )
    default = known[family][1]
    saved = model_classes().get(data.get("class_name"), default)
    if cls is None:
        return saved, saved
    if cls.family != family:
        raise ValueError(
            f"Preset is a {family!r} model; {cls.__name__} is a {cls.family!r} model. "
            f"Use {default.__name__}.from_preset or keras_transformers.from_preset."
        )
    return cls, saved


def _listing_order(family: str) -> tuple:
    """Built-in families as in `FAMILIES`, then the others by name."""
    return (
        (FAMILIES.index(family), "") if family in FAMILIES else (len(FAMILIES), family)
    )


def converter(model_type: str | None) -> Converter:
    """The converter of Hugging Face `model_type`.

    Raises:
        ValueError: `model_type` has no converter; the message lists the
            supported ones by family.
    """
    _load_builtins(_CONVERTERS, _BUILTIN_CONVERTERS)
    if model_type not in _CONVERTERS:
        by_family: dict[str, list[str]] = {}
        for name, known in _CONVERTERS.items():
            by_family.setdefault(known.family, []).append(name)
        order = sorted(by_family, key=_listing_order)
        listed = ", ".join(f"{sorted(by_family[f])} ({f})" for f in order)
        raise ValueError(
            f"Hugging Face model_type {model_type!r} is not supported. "
            f"Supported model types: {listed}."
        )
    return _CONVERTERS[model_type]


def export_converter(family: str, config) -> Converter:
    """The converter a `family` model with `config` exports with when no
    `model_type` is asked for: of the family's converters that declare
    `exports`, the first by `export_order` whose `exports(config)` is true.

    Raises:
        ValueError: no converter of `family` exports `config`.
    """
    ranked = sorted(
        (c for c in converters().values() if c.family == family and c.exports),
        key=lambda c: c.export_order,
    )
    for known in ranked:
        if known.exports(config):
            return known
    raise ValueError(
        f"No {family}-family converter exports this config; pass model_type."
    )


def converters() -> dict[str, Converter]:
    """`{model_type: converter}` of every registered converter."""
    _load_builtins(_CONVERTERS, _BUILTIN_CONVERTERS)
    return dict(_CONVERTERS)
