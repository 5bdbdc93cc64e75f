"""Rotary position embedding (RoPE) and the angles that the layers of one
rotary setting share in a forward pass.

Hugging Face's models compute rotary `(cos, sin)` once per forward pass and
hand them to every layer. Ours do the same: a backbone groups its layers by
rotary setting (`RotaryEmbedding.setting`: rotated features, base and
scalings; Gemma 2 and 3's local and global layers differ, no-rope layers
have none), computes each group's `RotaryAngles` once (`angles`) and
passes them to the group's self-attention as its `positions`; `rotate`
takes them as they are when they are of its own setting, else computes
its own from their positions. The numbers are those each layer would
compute itself.
"""

from __future__ import annotations

import functools
import json

import keras
import numpy as np
from keras import ops

from keras_transformers import backend
from keras_transformers.layers.serializable import serializable
from keras_transformers.rotary_scaling import (
    dynamic_base,
    rope_type,
    rotary_frequencies,
)


@functools.cache
def inverse_frequencies(head_dim: int, max_wavelength: float):
    """`1 / max_wavelength ** (2i / H)` for i < H/2, repeated for both halves
    of a head: `[H]` float32 (a constant: no ops per call)."""
    exponent = np.arange(0, head_dim, 2, dtype="float32") / np.float32(head_dim)
    inverse = np.float32(1.0) / np.power(np.float32(max_wavelength), exponent)
    return np.concatenate([inverse, inverse]).astype("float32")


@functools.cache
def _scaled_frequencies(head_dim, max_wavelength, scaling_json, max_position, long):
    """`rotary_frequencies` for a scaling given as JSON, repeated for both
    halves of a head: `([H] float32, cos/sin factor)`, computed once."""
    half, factor = rotary_frequencies(
        head_dim, max_wavelength, json.loads(scaling_json), max_position, long
    )
    return np.concatenate([half, half]), factor


class RotaryAngles:
    """Positions with the cos and sin of one rotary setting at them.

    A plain object (not a tuple), so that Keras passes it to a layer as it
    is: a layer's call would cast float tensors in a tuple to its compute
    dtype, and rotary angles stay float32.

    Args:
        positions: `[T]` or `[B, T]` int positions.
        setting: the rotary setting the angles are for (`RotaryEmbedding.
            setting`: rotated features, base, scalings).
        cos: `[B|1, T, 1, R]` float32, `R` the rotated features.
        sin: `[B|1, T, 1, R]` float32.
    """

    def __init__(self, positions, setting: tuple, cos, sin) -> None:
        self.positions = positions
        self.setting = setting
        self.cos = cos
        self.sin = sin


@serializable
class RotaryEmbedding(keras.layers.Layer):
    """Rotary position embedding (RoPE), applied to queries and keys.

    Uses the "rotate half" layout of GPT-NeoX and Hugging Face Llama: the
    first and second halves of each head are the two coordinates of every
    rotated pair.

    Args:
        max_wavelength: the base (theta) of the frequencies. Defaults to 10000.
        scaling_factor: linear position interpolation; positions are divided
            by this factor. Defaults to 1.0.
        scaling: a Hugging Face rotary scaling dict (`rope_parameters` or
            `rope_scaling` without `rope_theta`): `linear`, `llama3`,
            `yarn` or `longrope` (see `keras_transformers.rotary_scaling`).
            None: plain rotary.
        max_position: the model's `max_position_embeddings`, from which YaRN
            and LongRoPE derive their factor when `scaling` gives none.
        rotary_dim: features rotated per head, the first ones (partial
            rotary: GPT-NeoX, Phi-4-mini); None: all of them.

    Call arguments:
        x: `[B, T, N, H]` queries or keys.
        positions: `[T]` or `[B, T]` integer positions, or `RotaryAngles`
            (`angles`). Defaults to `arange(T)`.

    Returns:
        `[B, T, N, H]`, same dtype as `x`.

    Reference:
        Su et al., "RoFormer: Enhanced Transformer with Rotary Position
        Embedding", 2021.
    """

    def __init__(
        self,
        max_wavelength=10000.0,
        scaling_factor=1.0,
        scaling=None,
        max_position=None,
        rotary_dim=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if rotary_dim is not None and (rotary_dim < 2 or rotary_dim % 2):
            raise ValueError(
                f"`rotary_dim` must be an even number >= 2. Received: {rotary_dim}"
            )
        self.rotary_dim = rotary_dim
        self.max_wavelength = max_wavelength
        self.scaling_factor = scaling_factor
        self.scaling = dict(scaling) if scaling else None
        self.max_position = max_position
        rope_type(self.scaling)  # an unsupported type fails here
        # The scaling as a hashable key (memo and frequency cache).
        self._scaling_key = json.dumps(self.scaling, sort_keys=True)
        self.built = True

    def call(self, x, positions=None):
        return self.rotate((x,), positions)[0]

    def setting(self, head_dim: int) -> tuple:
        """What the angles for `[..., head_dim]` heads depend on besides
        the positions: `(rotated features, base, factor, scaling, max_position)`."""
        rotary_dim = min(self.rotary_dim or head_dim, head_dim)
        return (
            rotary_dim,
            self.max_wavelength,
            self.scaling_factor,
            self._scaling_key,
            self.max_position,
        )

    def angles(self, positions, head_dim: int) -> RotaryAngles:
        """The `RotaryAngles` of `positions` (`[T]` or `[B, T]`) for
        `[..., head_dim]` heads, which `rotate` of every layer of this
        setting takes in place of positions (computed once per forward)."""
        setting = self.setting(head_dim)
        return RotaryAngles(positions, setting, *self.cos_sin(positions, setting[0]))

    def rotate(self, tensors, positions=None):
        """Rotates each `[B, T, *, H]` tensor of `tensors` (e.g. queries and
        keys) by `positions`, computing the angles once for all of them;
        `positions` may be `RotaryAngles` of this setting (`angles`),
        computed once per forward pass for every layer. Else while PyTorch
        decodes eagerly the angles are computed once per step for all
        layers (`backend.memo`)."""
        head_dim, length = tensors[0].shape[-1], ops.shape(tensors[0])[1]
        setting = self.setting(head_dim)
        rotary_dim = setting[0]
        if isinstance(positions, RotaryAngles) and positions.setting == setting:
            cos, sin = positions.cos, positions.sin
        else:
            if isinstance(positions, RotaryAngles):  # another setting's
                positions = positions.positions
            if positions is None:
                positions = ops.arange(length)
            key = lambda: ("rotary", id(positions), *setting)  # noqa: E731
            # The memo keeps `positions` alive, so its id stays its own.
            _, cos, sin = backend.memo(
                key, lambda: (positions, *self.cos_sin(positions, rotary_dim))
            )
        half = rotary_dim // 2
        out = []
        for x in tensors:
            x32 = x if x.dtype == cos.dtype else ops.cast(x, "float32")
            rest = None
            if rotary_dim < head_dim:  # the other features pass unrotated
                x32, rest = x32[..., :rotary_dim], x32[..., rotary_dim:]
            rotated = ops.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
            y = x32 * cos + rotated * sin
            y = y if rest is None else ops.concatenate([y, rest], axis=-1)
            out.append(y if x.dtype == y.dtype else ops.cast(y, x.dtype))
        return out

    def cos_sin(self, positions, rotary_dim):
        """`positions [T]` or `[B, T]` -> `(cos, sin)`, each `[B|1, T, 1, R]`
        float32 (`R = rotary_dim`)."""
        inverse, factor = self._inverse(positions, rotary_dim)
        positions = ops.cast(positions, "float32")
        if self.scaling_factor != 1.0:
            positions = positions / self.scaling_factor
        angles = ops.multiply(positions[..., None], inverse)  # on positions' device
        if len(angles.shape) == 2:  # [T, H] or [B, T, H]
            angles = angles[None]
        cos, sin = ops.cos(angles), ops.sin(angles)
        if factor != 1.0:
            cos, sin = cos * factor, sin * factor
        return cos[:, :, None, :], sin[:, :, None, :]

    def _inverse(self, positions, head_dim):
        """`([H] float32 inverse frequencies, the cos/sin factor)`: LongRoPE
        takes its long set when the sequence (the largest position + 1)
        passes the original context, as transformers does per call."""
        if self.scaling is None:
            inverse = inverse_frequencies(head_dim, self.max_wavelength)
            return backend.from_numpy(inverse), 1.0

        def both_halves(long):
            inverse, factor = _scaled_frequencies(
                head_dim,
                self.max_wavelength,
                self._scaling_key,
                self.max_position,
                long,
            )
            return backend.from_numpy(inverse), factor

        inverse, factor = both_halves(False)
        if rope_type(self.scaling) == "dynamic":
            return self._dynamic(positions, head_dim, inverse), factor
        if rope_type(self.scaling) == "longrope":
            long_inverse, _ = both_halves(True)
            original = self.scaling["original_max_position_embeddings"]
            longer = ops.max(positions) + 1 > original
            inverse = ops.where(longer, long_inverse, inverse)
        return inverse, factor

    def _dynamic(self, positions, rotary_dim, inverse):
        """Dynamic NTK's inverse frequencies for the sequence up to the
        largest position (`inverse`, the default ones, within the original
        context), as transformers recomputes them per call."""
        original = float(self.scaling["original_max_position_embeddings"])
        length = ops.cast(ops.max(positions) + 1, "float32")
        base = dynamic_base(
            self.max_wavelength,
            self.scaling,
            ops.maximum(length, original),
            rotary_dim,
            ops,
        )
        exponent = np.arange(0, rotary_dim, 2).astype("float32") / np.float32(
            rotary_dim
        )
        stretched = 1.0 / ops.power(base, backend.from_numpy(exponent))
        stretched = ops.concatenate([stretched, stretched])  # both halves: [R]
        return ops.where(length > original, stretched, inverse)

    def get_config(self):
        config = super().get_config()
        config.update(
            max_wavelength=self.max_wavelength,
            scaling_factor=self.scaling_factor,
            scaling=self.scaling,
            max_position=self.max_position,
            rotary_dim=self.rotary_dim,
        )
        return config


__all__ = ["RotaryAngles", "RotaryEmbedding", "inverse_frequencies"]
