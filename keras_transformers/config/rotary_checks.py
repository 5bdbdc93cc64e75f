"""Checks of a config's rotary settings: its own (`rotary_fraction`,
`rope_scaling`) and each layer type's (`layer_settings`). Pure Python, as
the rest of the config's validation."""

from __future__ import annotations

from keras_transformers.config.validation import _check_float, _fail
from keras_transformers.rotary_scaling import rotary_frequencies


def check_rotary_fraction(config, fraction, name: str) -> None:
    """`fraction` of the head rotates: an even number of features >= 2."""
    _check_float(name, fraction, 1e-9, 1.0 + 1e-9)
    features = int(config.resolved_head_dim * fraction)
    if config.rotary and (features < 2 or features % 2):
        _fail(
            name,
            fraction,
            f"a fraction of head_dim={config.resolved_head_dim} that is an even "
            "number of features >= 2",
        )


def check_rope_scaling(config, scaling=None, base=None) -> None:
    """`rope_scaling` (or a layer type's `scaling` with rotary base `base`):
    a dict of a supported type with the fields it needs, only with rotary
    positions."""
    scaling = config.rope_scaling if scaling is None else scaling
    base = config.rope_max_wavelength if base is None else base
    if not isinstance(scaling, dict) or not config.rotary:
        _fail(
            "rope_scaling",
            scaling,
            "None, or a dict (Hugging Face's rope_parameters without rope_theta) "
            'with position_embedding="rotary"',
        )
    try:
        rotary_dim = int(config.resolved_head_dim * config.rotary_fraction)
        rotary_frequencies(rotary_dim, base, scaling)
    except ValueError as error:
        raise ValueError(f"Invalid config value `rope_scaling`: {error}") from None


def check_layer_rotaries(config) -> None:
    """Each layer type's rotary base, scaling factor, scaling and fraction
    in `layer_settings`."""
    for kind, own in (config.layer_settings or {}).items():
        base = own.get("rope_max_wavelength", 1.0)
        _check_float(f"layer_settings[{kind!r}]['rope_max_wavelength']", base, 1.0)
        factor = own.get("rope_scaling_factor", 1.0)
        _check_float(f"layer_settings[{kind!r}]['rope_scaling_factor']", factor, 1e-9)
        if own.get("rope_scaling") is not None:
            check_rope_scaling(config, own["rope_scaling"], base)
        if "rotary_fraction" in own:
            name = f"layer_settings[{kind!r}]['rotary_fraction']"
            check_rotary_fraction(config, own["rotary_fraction"], name)
