"""2-D rotary positions of image patches (DINOv3).

Each patch sits at its centre's `(y, x)` coordinates, normalised to
`[-1, 1]` over the patch grid (so any grid size, square or not, spans the
same range). A head of H features is rotated by the angles
`2 * pi * coordinate * inv_freq`, `inv_freq = 1 / theta ** arange(0, 1,
4 / H)` (`H / 4` frequencies per axis): the y angles, then the x angles,
the pair repeated to fill H (`rotate_half` layout). The prefix tokens (class
and register tokens) are not rotated.
"""

from __future__ import annotations

import math

import numpy as np
from keras import ops

from keras_transformers.layers.attention import MultiHeadAttention
from keras_transformers.layers.serializable import serializable


def patch_coordinates(height: int, width: int) -> np.ndarray:
    """`[height * width, 2]` float32 `(y, x)` centres of a `height x width`
    patch grid, row-major, normalised to `[-1, 1]`."""
    ys = (np.arange(height) + 0.5) / height
    xs = (np.arange(width) + 0.5) / width
    grid = np.stack(np.meshgrid(ys, xs, indexing="ij"), axis=-1).reshape(-1, 2)
    return (2.0 * grid - 1.0).astype("float32")


def _rotate_half(x):
    half = x.shape[-1] // 2
    return ops.concatenate([-x[..., half:], x[..., :half]], axis=-1)


@serializable
class PatchRotaryAttention(MultiHeadAttention):
    """Self-attention with 2-D rotary positions on the patch tokens.

    The arguments are `MultiHeadAttention`'s; `rope_max_wavelength` is
    the rotary base (theta) of both axes (`rotary_dim` and `rope_scaling`
    do not apply).

    Call arguments:
        positions: `[P, 2]` patch coordinates (`patch_coordinates`) of the
            last P tokens of `query` `[B, T, D]`; the first `T - P` tokens
            (class, registers) keep their features. Required.
        The others are `MultiHeadAttention`'s.

    Examples:
        >>> layer = PatchRotaryAttention(num_heads=2, head_dim=8, rope_max_wavelength=100.0)
        >>> coords = patch_coordinates(2, 3)
        >>> tuple(layer(np.ones((1, 7, 16), "float32"), positions=coords).shape)
        (1, 7, 16)
    """

    def build(self, query_shape, key_value_shape=None):
        if self.head_dim % 4 or self.rope_max_wavelength is None:
            raise ValueError(
                "2-D rotary positions need `rope_max_wavelength` (theta) and a "
                "head_dim that is a multiple of 4 (a quarter per axis for sine "
                f"and cosine). Received: head_dim={self.head_dim}, "
                f"rope_max_wavelength={self.rope_max_wavelength}"
            )
        super().build(query_shape, key_value_shape)

    def process_heads(self, query, key, positions):
        """Rotates the last P tokens of `query [B, T, N, H]` and `key [B, T,
        K, H]` by the angles of `positions [P, 2]`."""
        if positions is None or len(positions.shape) != 2 or positions.shape[-1] != 2:
            raise ValueError(
                "PatchRotaryAttention needs `positions`: the `[P, 2]` patch "
                "coordinates (`patch_coordinates(h, w)`) of the last P tokens."
            )
        h = self.head_dim
        inv_freq = 1.0 / self.rope_max_wavelength ** np.arange(0, 1, 4 / h)  # [H/4]
        coords = ops.cast(positions, "float32")
        angles = 2 * math.pi * coords[:, :, None] * inv_freq.astype("float32")
        angles = ops.reshape(angles, (-1, h // 2))  # y angles, then x angles
        angles = ops.concatenate([angles, angles], axis=-1)[:, None, :]  # [P, 1, H]
        prefix = ops.shape(query)[1] - ops.shape(coords)[0]

        def rotate(x):
            cos, sin = (
                ops.cast(ops.cos(angles), x.dtype),
                ops.cast(ops.sin(angles), x.dtype),
            )
            patches = x[:, prefix:]
            patches = patches * cos + _rotate_half(patches) * sin
            return ops.concatenate([x[:, :prefix], patches], axis=1)

        return rotate(query), rotate(key)


__all__ = ["PatchRotaryAttention", "patch_coordinates"]
