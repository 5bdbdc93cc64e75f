"""Registration of the package's Keras objects for saving and loading, and
the constructor arguments a layer keeps and serialises."""

import inspect

import keras


def serializable(cls):
    """Registers `cls` under the `keras_transformers` package name."""
    return keras.saving.register_keras_serializable(package="keras_transformers")(cls)


def _arguments(cls) -> list[str]:
    """The named constructor arguments of `cls` (not `self`, `**kwargs`)."""
    parameters = inspect.signature(cls.__init__).parameters.values()
    plain = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in parameters if p.name != "self" and p.kind in plain]


def store_arguments(layer, values: dict, skip=()) -> None:
    """Keeps each constructor argument of `type(layer)` as the attribute of
    its name, from `values` (the constructor's `locals()`), except `skip`:
    an argument is then written once, in the signature (and `get_config`
    follows it, see `argument_config`)."""
    for name in _arguments(type(layer)):
        if name not in skip:
            setattr(layer, name, values[name])


def argument_config(layer, skip=()) -> dict:
    """`{argument: attribute}` for the constructor arguments of
    `type(layer)` except `skip` (those need their own serialisation, e.g.
    an initializer or a sub-layer)."""
    return {n: getattr(layer, n) for n in _arguments(type(layer)) if n not in skip}
