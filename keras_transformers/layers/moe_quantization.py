"""Quantized expert kernels of `SparseMoE`: int8, int4 and NF4.

The stacked kernels `expert_gate_up [E, D, 2F]` and `expert_down [E, F, D]`
(`[E, in, out]`) are stored quantized and dequantized for the expert
matmul, so every dispatch path runs unchanged:

- int8: per-expert, per-output-channel abs-max (`keras.quantizers.
  abs_max_quantize`, `q = round(w * scale)`), scale `[E, 1, out]`;
- int4: the same in [-8, 7], two values per byte along `in`
  (`keras.quantizers.pack_int4`): `[E, ceil(in / 2), out]`;
- nf4: QLoRA's NF4 in blocks of `block_size` inputs
  (`keras_transformers.layers.nf4`): codes `[E, in, ceil(out / 2)]` uint8,
  scales `[E, ceil(in / block_size), out]` float32.

The router stays float32.
"""

from __future__ import annotations

import keras
from keras import ops

from keras_transformers import backend
from keras_transformers.layers.nf4 import (
    BLOCK_SIZE,
    NF4DTypePolicy,
    check_block_size,
    nf4_dequantize,
    nf4_quantize,
)

KERNELS = ("expert_gate_up", "expert_down")
MODES = ("int8", "int4", "nf4")


def quantize_experts(layer, mode: str, block_size: int = BLOCK_SIZE) -> None:
    """Replaces `layer`'s expert kernels by their `mode` storage."""
    if mode not in MODES:
        raise NotImplementedError(
            f"SparseMoE experts support quantize() with modes {MODES}; they stay "
            f"float. Received: mode={mode!r}"
        )
    if mode == "nf4":
        block_size = check_block_size(block_size)
    layer._expert_rows = {}
    for name in KERNELS:
        kernel = getattr(layer, name)
        layer._expert_rows[name] = int(kernel.shape[1])
        stored = _quantized(kernel, mode, block_size)  # {suffix: array}
        layer._tracker.unlock()
        try:
            delattr(layer, name)
            for suffix, value in stored.items():
                weight = layer.add_weight(
                    name=name + suffix,
                    shape=tuple(value.shape),
                    initializer="zeros",
                    dtype=keras.backend.standardize_dtype(value.dtype),
                    trainable=False,
                    autocast=False,
                )
                weight.assign(value)
                setattr(layer, name + suffix, weight)
        finally:
            layer._tracker.lock()
    layer._is_quantized = True
    layer._nf4_block = block_size
    source = layer.dtype_policy.name
    if mode == "nf4":
        layer.dtype_policy = NF4DTypePolicy(f"nf4/{block_size}", source)
    else:
        layer.dtype_policy = f"{'int4/-1' if mode == 'int4' else mode}_from_{source}"


def _quantized(kernel, mode, block_size) -> dict:
    """`{name suffix: NumPy array}` of `kernel [E, in, out]` quantized."""
    if mode == "nf4":
        packed, absmax = nf4_quantize(ops.convert_to_numpy(kernel), block_size)
        return {"": packed, "_absmax": absmax}
    bits = {"int8": (-127, 127), "int4": (-8, 7)}[mode]
    q, scale = keras.quantizers.abs_max_quantize(
        kernel, axis=1, value_range=bits, dtype="int8", to_numpy=True
    )  # q [E, in, out] int8, scale [E, 1, out]
    q, scale = ops.convert_to_numpy(q), ops.convert_to_numpy(scale)
    if mode == "int4":
        q, _, _ = keras.quantizers.pack_int4(q, axis=1)
        q = ops.convert_to_numpy(q)
    return {"": q, "_scale": scale}


def dequantized_kernel(layer, name: str, dtype):
    """Expert kernel `name` `[E, in, out]` of a quantized `layer` in `dtype`."""
    mode, stored = layer.quantization_mode, backend.value(getattr(layer, name))
    if mode == "nf4":
        absmax = backend.value(getattr(layer, name + "_absmax"))
        return nf4_dequantize(stored, absmax, layer._nf4_block, dtype)
    if mode == "int4":
        stored = keras.quantizers.unpack_int4(stored, layer._expert_rows[name], axis=1)
    scale = ops.cast(backend.value(getattr(layer, name + "_scale")), dtype)
    return ops.cast(stored, dtype) / scale
