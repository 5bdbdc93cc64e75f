"""Who can be loaded: model classes by family and task, Hugging Face
converters by `model_type`.

Each model class registers itself with `@register_model(task)` (its family
is its `family` attribute), and each converter module with
`@register_converter(MODEL_TYPE)` on its `config_from_hf`. Loading code asks
this module, and so never imports the model or converter modules it picks
from. The first lookup loads the built-in registrations (it imports
`keras_transformers.models` and `keras_transformers.convert`).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from types import ModuleType

# The built-in families, in the order listings show them.
FAMILIES = ("gpt", "bert", "transformer", "mixtral", "vit")
_BUILTIN_MODELS = "keras_transformers.models"
_BUILTIN_CONVERTERS = "keras_transformers.convert"

# family -> task -> class; family -> the class `keras_transformers.from_preset`
# builds; model_type -> converter module.
_MODELS: dict[str, dict[str, type]] = {}
_DEFAULTS: dict[str, type] = {}
_CONVERTERS: dict[str, ModuleType] = {}


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


def register_converter(model_type: str) -> Callable:
    """Decorator for a converter module's `config_from_hf`: registers that
    module as the converter of Hugging Face `model_type`."""

    def register(config_from_hf: Callable) -> Callable:
        _CONVERTERS[model_type] = sys.modules[config_from_hf.__module__]
        return config_from_hf

    return register


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


def converter_family(module: ModuleType) -> str:
    """The model family a converter module builds ("gpt" unless it says)."""
    return getattr(module, "FAMILY", "gpt")


def _listing_order(family: str) -> tuple:
    """Built-in families as in `FAMILIES`, then the others by name."""
    return (
        (FAMILIES.index(family), "") if family in FAMILIES else (len(FAMILIES), family)
    )


def converter(model_type: str | None) -> ModuleType:
    """The converter module of Hugging Face `model_type`.

    Raises:
        ValueError: `model_type` has no converter; the message lists the
            supported ones by family.
    """
    _load_builtins(_CONVERTERS, _BUILTIN_CONVERTERS)
    if model_type not in _CONVERTERS:
        by_family: dict[str, list[str]] = {}
        for name, module in _CONVERTERS.items():
            by_family.setdefault(converter_family(module), []).append(name)
        order = sorted(by_family, key=_listing_order)
        listed = ", ".join(f"{sorted(by_family[f])} ({f})" for f in order)
        raise ValueError(
            f"Hugging Face model_type {model_type!r} is not supported. "
            f"Supported model types: {listed}."
        )
    return _CONVERTERS[model_type]


def export_converter(family: str, config) -> ModuleType:
    """The converter a `family` model with `config` exports with when no
    `model_type` is asked for: of the family's converters that declare
    `EXPORT_ORDER` and `exports(config)`, the first (lowest order) whose
    `exports(config)` is true.

    Raises:
        ValueError: no converter of `family` exports `config`.
    """
    modules = {id(m): m for m in converters().values()}.values()
    ranked = sorted(
        (m for m in modules if converter_family(m) == family and hasattr(m, "exports")),
        key=lambda m: m.EXPORT_ORDER,
    )
    for module in ranked:
        if module.exports(config):
            return module
    raise ValueError(
        f"No {family}-family converter exports this config; pass model_type."
    )


def converters() -> dict[str, ModuleType]:
    """`{model_type: converter module}` of every registered converter."""
    _load_builtins(_CONVERTERS, _BUILTIN_CONVERTERS)
    return dict(_CONVERTERS)
