"""Validation helpers and the shared `to_dict` / `from_dict` of the config
dataclasses (see `keras_transformers.config`)."""

from __future__ import annotations

import math
import numbers
from typing import Any


def _fail(field_name: str, value: Any, expected: str) -> None:
    raise ValueError(
        f"Invalid config value `{field_name}={value!r}`: expected {expected}."
    )


def _check_int(name: str, value: Any, minimum: int, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, int)):
        _fail(
            name, value, f"a Python int >= {minimum} (convert NumPy integers: int(x))"
        )
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        _fail(name, value, f"an integer >= {minimum}")


def check_dtype(dtype: Any) -> Any:
    """`dtype` (None, a name or a `keras.DTypePolicy`) unchanged when the
    model's variables and computations would be floats; else a ValueError."""
    if dtype is None:
        return dtype
    import keras

    try:
        policy = keras.dtype_policies.get(dtype)
        ok = all("float" in d for d in (policy.variable_dtype, policy.compute_dtype))
    except (ValueError, TypeError):
        ok = False
    if not ok:
        raise ValueError(
            "`dtype` must be a float dtype or a Keras dtype policy, e.g. 'float32', "
            f"'bfloat16' or 'mixed_bfloat16'. Received: dtype={dtype!r}"
        )
    return dtype


def _is_number(value: Any) -> bool:
    """A finite real number (NumPy scalars included), not a bool."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    return math.isfinite(value)


def _check_float(name: str, value: Any, low: float, high: float | None = None) -> None:
    ok = isinstance(value, (int, float)) and _is_number(value)  # JSON numbers
    ok = ok and value >= low and (high is None or value < high)
    if not ok:
        span = f"in [{low}, {high})" if high is not None else f">= {low}"
        _fail(name, value, f"a finite number {span}")


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        _fail(name, value, f"one of {choices}")


def _check_numbers(name: str, value: Any, lengths: tuple[int, ...]):
    """`value` (a number or a list of numbers of one of `lengths`) as a tuple
    of floats; None stays None."""
    if value is None:
        return None
    values = (value,) if isinstance(value, (int, float)) else value
    ok = isinstance(values, (list, tuple)) and len(values) in lengths
    if not ok or not all(isinstance(v, (int, float)) and _is_number(v) for v in values):
        _fail(
            name,
            value,
            f"a finite number or a list of {' or '.join(map(str, sorted(set(lengths))))} "
            "finite numbers",
        )
    return tuple(float(v) for v in values)


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        _fail(name, value, "True or False")


def _check_remat(value: Any) -> None:
    if not isinstance(value, bool) and value != "matmuls":
        _fail("remat", value, 'True, False or "matmuls"')


def _check_attention_knobs(config) -> None:
    """The relative position bias and attention scale of a
    `TransformerConfig`: at least 4 buckets (one exact distance per side in
    an encoder), a max distance past the exact buckets (a positive log)."""
    if config.position_embedding == "relative" and config.stacks != "encoder_decoder":
        _fail("position_embedding", "relative", 'stacks="encoder_decoder"')
    _check_int("relative_attention_buckets", config.relative_attention_buckets, 4)
    exact = config.relative_attention_buckets // 2
    distance = config.relative_attention_max_distance
    _check_int("relative_attention_max_distance", distance, exact + 1)
    if config.attention_scale is not None:
        _check_float("attention_scale", config.attention_scale, 1e-12)
    _check_memory_knobs(config)
    _check_encoder_knobs(config)
    _check_patch_rotary(config)


def _check_patch_rotary(config) -> None:
    """2-D rotary patch positions (`vision` with "rotary"): a quarter of
    each head per axis, no 1-D rotary options."""
    if config.vision is None or not config.rotary:
        return
    if config.resolved_head_dim % 4:
        _fail(
            "head_dim",
            config.resolved_head_dim,
            "a multiple of 4 with 2-D rotary patch positions",
        )
    if config.rope_scaling is not None or config.rotary_fraction != 1.0:
        _fail(
            "rope_scaling / rotary_fraction",
            (config.rope_scaling, config.rotary_fraction),
            "None / 1.0 with 2-D rotary patch positions (vision)",
        )


def _check_encoder_knobs(config) -> None:
    """Factorised embeddings and shared blocks: encoders with token inputs
    only, and the layer groups divide the layers."""
    _check_int("embedding_dim", config.embedding_dim, 1, optional=True)
    _check_int("num_layer_groups", config.num_layer_groups, 1, optional=True)
    for name in ("embedding_dim", "num_layer_groups"):
        value = getattr(config, name)
        if value is not None and (config.stacks != "encoder" or config.vision):
            _fail(name, value, 'None unless stacks="encoder" with token inputs')
    mask_id = config.token_dropout_mask_id
    _check_int("token_dropout_mask_id", mask_id, 0, optional=True)
    if mask_id is not None and (config.stacks != "encoder" or config.vision):
        _fail("token_dropout_mask_id", mask_id, 'None unless stacks="encoder"')
    if mask_id is not None and mask_id >= config.vocabulary_size:
        _fail("token_dropout_mask_id", mask_id, f"< {config.vocabulary_size=}")
    if not config.first_attention_norm and config.norm_position != "pre":
        _fail("first_attention_norm", False, 'True unless norm_position="pre"')
    groups = config.num_layer_groups
    if groups is not None and config.num_layers % groups:
        _fail(
            "num_layer_groups",
            groups,
            f"a divisor of num_layers={config.num_layers} (each group runs "
            "num_layers // num_layer_groups consecutive layers)",
        )


def _check_memory_knobs(config) -> None:
    """Transformer-XL's knobs: relative encodings only in a decoder stack
    without a sliding window; memory and clamp only with them."""
    xl = config.position_embedding == "transformer_xl"
    if xl and config.stacks != "decoder":
        _fail("position_embedding", "transformer_xl", 'stacks="decoder"')
    if xl and config.sliding_window is not None:
        _fail(
            "sliding_window",
            config.sliding_window,
            'None with position_embedding="transformer_xl" (the memory bounds '
            "the context instead)",
        )
    _check_int("memory_length", config.memory_length, 0)
    _check_int("eval_memory_length", config.eval_memory_length, 0, optional=True)
    _check_int("clamp_len", config.clamp_len, 1, optional=True)
    for name in ("memory_length", "eval_memory_length", "clamp_len"):
        if getattr(config, name) and not xl:
            _fail(
                name,
                getattr(config, name),
                f"{'0' if name == 'memory_length' else 'None'} unless "
                'position_embedding="transformer_xl" (relative positions across '
                "segments)",
            )


# ----------------------------------------------- arguments of functions
def check_argument_int(
    name: str, value: Any, minimum: int, optional: bool = False
) -> int | None:
    """`value` as an int (NumPy integers accepted), or None when `optional`.

    Raises:
        ValueError: not an integer >= `minimum` (bools and floats included).
    """
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        ok = False
    else:
        ok = value >= minimum
    if not ok:
        raise ValueError(
            f"`{name}` must be an integer >= {minimum}. Received: {name}={value!r}"
        )
    return int(value)


def check_argument_number(
    name: str,
    value: Any,
    low: float,
    high: float | None = None,
    *,
    low_open: bool = False,
    optional: bool = False,
) -> float | None:
    """`value` as a float (NumPy scalars accepted), or None when `optional`.

    Raises:
        ValueError: not a finite number in `[low, high]` (`(low, high]`
            with `low_open`; no upper bound when `high` is None).
    """
    if value is None and optional:
        return None
    ok = _is_number(value) and (value > low if low_open else value >= low)
    ok = ok and (high is None or value <= high)
    if not ok:
        span = (
            ("(" if low_open else "[") + f"{low}, " + (f"{high}]" if high else "inf)")
        )
        span = "" if low == -math.inf else f" in {span}"
        raise ValueError(
            f"`{name}` must be a finite number{span}. Received: {name}={value!r}"
        )
    return float(value)


def check_argument_choice(name: str, value: Any, choices: tuple) -> Any:
    """`value` when it is one of `choices` (compared by `==` among
    strings, by identity otherwise)."""
    if not any(value is c or (isinstance(value, str) and value == c) for c in choices):
        raise ValueError(
            f"`{name}` must be one of {choices}. Received: {name}={value!r}"
        )
    return value
