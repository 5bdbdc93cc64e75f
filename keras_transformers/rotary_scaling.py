"""Rotary scalings: how long-context checkpoints stretch rotary positions.

Each Hugging Face `rope_type` changes the inverse frequencies of the
rotated pairs, and YaRN and LongRoPE also scale cos and sin by an
"attention factor":

- `default`: `1 / base ** (2i / d)`.
- `linear`: every frequency divided by `factor` (positions interpolated).
- `llama3` (Llama 3.1-3.3): wavelengths longer than
  `original_max_position_embeddings / low_freq_factor` divided by `factor`,
  those shorter than `... / high_freq_factor` kept, the band between
  blended smoothly.
- `yarn` (Qwen2.5 / Qwen3 long context, gpt-oss): each frequency blends
  its interpolated (`/ factor`) and original value along a ramp between
  the pairs that turn `beta_fast` and `beta_slow` times within the
  original context; cos and sin times `0.1 ln(factor) + 1` (or the ratio
  of the `mscale` terms, or `attention_factor` as given).
- `dynamic` (dynamic NTK): while the sequence (the largest position + 1)
  fits `original_max_position_embeddings`, the default frequencies; past
  it, those of the base `base * (factor * L / original - (factor - 1)) **
  (d / (d - 2))` for a sequence of length `L`, computed per call (see
  `RotaryEmbedding`).
- `longrope` (Phi-3 / Phi-4 long context): each frequency divided by its
  own factor, `short_factor` while the sequence fits the original context
  and `long_factor` beyond it; cos and sin times
  `sqrt(1 + ln(factor) / ln(original_max_position_embeddings))`.

- `proportional` (Gemma 4's full-attention layers): the first
  `int(partial_rotary_factor * d // 2)` pairs keep the default
  frequencies of the whole head (`1 / base ** (2i / d)`), the others get
  frequency 0 (they pass unrotated), all divided by `factor` (default 1).
  The pairs are `(i, i + d/2)` of the whole head, unlike a partial rotary
  that rotates the first features only.

`scaling` is the Hugging Face dict (`rope_parameters`, or the older
`rope_scaling`) without `rope_theta`. The arithmetic is float32 in
transformers' order, so the angles agree to the last bit or two.
"""

from __future__ import annotations

import math

import numpy as np

ROPE_TYPES = (
    "default",
    "linear",
    "llama3",
    "yarn",
    "longrope",
    "dynamic",
    "proportional",
)
_F32 = np.float32


def rope_type(scaling) -> str:
    """The `rope_type` (or older `type`) of a scaling dict; "default" for
    None. Raises ValueError naming the supported types for another."""
    kind = (scaling or {}).get("rope_type") or (scaling or {}).get("type") or "default"
    if kind not in ROPE_TYPES:
        raise ValueError(
            f"Rotary scaling type {kind!r} is not supported; supported: "
            f"{', '.join(ROPE_TYPES)}."
        )
    return kind


def _required(scaling, kind, *names):
    missing = [n for n in names if scaling.get(n) is None]
    if missing:
        raise ValueError(
            f"Rotary scaling {kind!r} needs {', '.join(missing)} (got "
            f"{sorted(scaling)}); copy them from the checkpoint's config.json."
        )


def _default(rotary_dim: int, base: float) -> np.ndarray:
    exponent = np.arange(0, rotary_dim, 2, dtype=np.int64).astype(_F32) / _F32(
        rotary_dim
    )
    return _F32(1.0) / np.power(_F32(base), exponent)


def rotary_frequencies(
    rotary_dim: int,
    base: float,
    scaling: dict | None = None,
    max_position: int | None = None,
    long: bool = False,
) -> tuple[np.ndarray, float]:
    """The inverse frequencies of `rotary_dim` rotated features and the
    factor on cos and sin.

    Args:
        rotary_dim: features rotated per head (the head size, or a part of
            it with partial rotary).
        base: `rope_theta`.
        scaling: the Hugging Face scaling dict (None: plain rotary).
        max_position: the model's `max_position_embeddings` (YaRN and
            LongRoPE derive `factor` from it when the dict has none).
        long: LongRoPE's set for sequences longer than the original context.

    Returns:
        `([rotary_dim // 2] float32, attention_factor)`.

    Raises:
        ValueError: an unsupported type, or a dict missing a field the type
            needs.
    """
    scaling = dict(scaling or {})
    kind = rope_type(scaling)
    if kind == "default":
        return _default(rotary_dim, base), 1.0
    if kind == "linear":
        _required(scaling, kind, "factor")
        return _default(rotary_dim, base) / _F32(scaling["factor"]), 1.0
    if kind == "proportional":
        pairs = int(float(scaling.get("partial_rotary_factor", 1.0)) * rotary_dim // 2)
        inverse = np.zeros(rotary_dim // 2, _F32)
        inverse[:pairs] = _default(rotary_dim, base)[:pairs]
        return inverse / _F32(scaling.get("factor", 1.0)), 1.0
    if kind == "dynamic":  # at or within the original context
        _required(scaling, kind, "factor", "original_max_position_embeddings")
        return _default(rotary_dim, base), 1.0
    if kind == "llama3":
        names = ("factor", "low_freq_factor", "high_freq_factor")
        _required(scaling, kind, *names, "original_max_position_embeddings")
        return _llama3(_default(rotary_dim, base), scaling), 1.0
    _required(scaling, kind, "original_max_position_embeddings")
    original = scaling["original_max_position_embeddings"]
    factor = scaling.get("factor")
    if factor is None:
        if max_position is None:
            raise ValueError(f"Rotary scaling {kind!r} needs factor or max_position.")
        factor = max_position / original
    if kind == "yarn":
        return _yarn(rotary_dim, base, scaling, factor, original)
    _required(scaling, kind, "short_factor", "long_factor")
    factors = scaling["long_factor" if long else "short_factor"]
    if len(factors) != rotary_dim // 2:
        raise ValueError(
            f"LongRoPE factors have {len(factors)} entries; the rotary dimension "
            f"{rotary_dim} needs {rotary_dim // 2}."
        )
    shape = np.arange(0, rotary_dim, 2, dtype=np.int64).astype(_F32) / _F32(rotary_dim)
    inverse = _F32(1.0) / (np.asarray(factors, _F32) * np.power(_F32(base), shape))
    attention = scaling.get("attention_factor")
    if attention is None:
        attention = (
            math.sqrt(1 + math.log(factor) / math.log(original)) if factor > 1 else 1.0
        )
    return inverse.astype(_F32), float(attention)


def dynamic_base(base: float, scaling: dict, length, rotary_dim: int, ops):
    """Dynamic NTK's base for a sequence of `length` (a float32 scalar
    tensor, at least the original context) with the array module `ops`
    (`keras.ops` at run time): transformers' float32 arithmetic."""
    factor = float(scaling["factor"])
    original = float(scaling["original_max_position_embeddings"])
    stretch = (factor * length / original) - (factor - 1.0)
    return base * ops.power(stretch, rotary_dim / (rotary_dim - 2))


def _llama3(inverse: np.ndarray, scaling: dict) -> np.ndarray:
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    low_wavelength, high_wavelength = original / low, original / high
    wavelength = _F32(2 * math.pi) / inverse
    scaled = np.where(wavelength > low_wavelength, inverse / _F32(factor), inverse)
    smooth = (_F32(original) / wavelength - _F32(low)) / _F32(high - low)
    blended = (_F32(1) - smooth) * scaled / _F32(factor) + smooth * scaled
    medium = ~(wavelength < high_wavelength) & ~(wavelength > low_wavelength)
    return np.where(medium, blended, scaled).astype(_F32)


def _yarn(rotary_dim, base, scaling, factor, original):
    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = scaling.get("attention_factor")
    if attention is None:
        m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention = (
            mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
        )
    fast, slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def correction(turns):  # the pair that turns `turns` times in `original`
        return (rotary_dim * math.log(original / (turns * 2 * math.pi))) / (
            2 * math.log(base)
        )

    low, high = correction(fast), correction(slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    positions = np.power(
        _F32(base),
        np.arange(0, rotary_dim, 2, dtype=np.int64).astype(_F32) / _F32(rotary_dim),
    )
    extrapolated = _F32(1.0) / positions
    interpolated = _F32(1.0) / (_F32(factor) * positions)
    ramp = np.clip(
        (np.arange(rotary_dim // 2, dtype=_F32) - _F32(low)) / _F32(high - low), 0, 1
    )
    keep = _F32(1) - ramp.astype(_F32)
    inverse = interpolated * (_F32(1) - keep) + extrapolated * keep
    return inverse.astype(_F32), float(attention)
