"""MXFP4 (OCP microscaling, 4-bit floats) weights, as gpt-oss checkpoints
store their experts: dequantised to floats on load.

A weight `W` `[E, I, O]` (experts, inputs, outputs) is stored as two
tensors: `{name}_blocks` `uint8 [E, O, I / 32, 16]`, each byte two E2M1
values (low nibble first) of a group of 32 inputs, and `{name}_scales`
`uint8 [E, O, I / 32]`, each group's shared power of two with a bias of
127. The value of a code `c` in a group with scale `s` is
`FP4_VALUES[c] * 2 ** (s - 127)`.

Examples:
    >>> import numpy as np
    >>> blocks = np.array([[[[0x21] * 16]]], np.uint8)  # codes 1, 2, ... 1, 2
    >>> scales = np.array([[[128]]], np.uint8)  # 2 ** 1
    >>> w = dequantize(blocks, scales)
    >>> w.shape, w[0, :2, 0].tolist()
    ((1, 32, 1), [1.0, 2.0])
"""

from __future__ import annotations

import numpy as np

# The 16 E2M1 codes: sign, 2 exponent bits, 1 mantissa bit.
FP4_VALUES = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    + [-0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    np.float32,
)
SCALE_BIAS = 127


def dequantize(blocks: np.ndarray, scales: np.ndarray, dtype="float32") -> np.ndarray:
    """The float weight `[E, I, O]` of MXFP4 `blocks` `uint8 [E, O, G, 16]`
    and `scales` `uint8 [E, O, G]` (I = 32 G), one expert at a time (the
    float32 intermediate of one expert at most).

    Raises:
        ValueError: the two tensors' shapes do not fit together.
    """
    if (
        blocks.ndim != 4
        or blocks.shape[-1] != 16
        or tuple(scales.shape) != tuple(blocks.shape[:-1])
    ):
        raise ValueError(
            f"MXFP4 blocks {tuple(blocks.shape)} and scales {tuple(scales.shape)} do "
            "not fit: expected blocks [E, O, G, 16] and scales [E, O, G]. The "
            "checkpoint's *_blocks / *_scales tensors are damaged or mismatched."
        )
    experts, outputs, groups, _ = blocks.shape
    out = np.empty((experts, groups * 32, outputs), dtype)
    for e in range(experts):
        codes = np.asarray(blocks[e])
        values = np.empty((outputs, groups, 32), np.float32)
        values[..., 0::2] = FP4_VALUES[codes & 0x0F]
        values[..., 1::2] = FP4_VALUES[codes >> 4]
        exponents = np.asarray(scales[e]).astype(np.int32) - SCALE_BIAS
        values = np.ldexp(values, exponents[..., None])
        out[e] = values.reshape(outputs, groups * 32).T
    return out


__all__ = ["FP4_VALUES", "dequantize"]
