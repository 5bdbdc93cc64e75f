"""NF4 weights: QLoRA's 4-bit NormalFloat with per-block abs-max scales.

NF4 (Dettmers et al., 2023, https://arxiv.org/abs/2305.14314) stores each
weight as the index of one of 16 levels (`NF4_LEVELS`, quantiles of a
standard normal scaled to [-1, 1], with an exact zero) times the abs-max of
its block of `block_size` (64) consecutive input features. A kernel
`[C, O]` (input features `C`, outputs `O`) is stored as

- `kernel`: the codes, two per byte along the outputs
  (`keras.quantizers.pack_int4`, dtype uint8, the even column in the low
  nibble): `[C, ceil(O / 2)]`;
- `kernel_absmax`: float32 `[ceil(C / block_size), O]`.

That is 4 bits per weight plus 32 / `block_size` (0.5 bits at 64) for the
scales: about 1/7 of float32. Blocks run along the input features of each
output, as bitsandbytes' blocks of a PyTorch `[out, in]` weight do, so the
codes and scales are those of `bitsandbytes.functional.quantize_4bit(w,
quant_type="nf4")` for the same weight (bitsandbytes packs the nibbles in
the other order and can also quantize the scales, QLoRA's "double
quantization", which is not done here).

`NF4Projection` gives `Dense` / `EinsumDense` the NF4 storage: the matrix
product dequantizes the kernel on the fly with `keras.ops` (each byte's two
levels from a 256-entry table, times the block scales) and its backward
pass recomputes it from the codes, so a QLoRA step keeps only the 4-bit
codes, never a float copy of the kernel (`backend.custom_vjp`).
"""

from __future__ import annotations

import functools
import math

import keras
import numpy as np
from keras import ops

from keras_transformers import backend
from keras_transformers.backend.custom_vjp import custom_vjp
from keras_transformers.backend.lookup import lookup

BLOCK_SIZE = 64
# The 16 NF4 levels of QLoRA (bitsandbytes' `get_4bit_type("nf4")`).
NF4_LEVELS = np.array(
    [
        -1.0,
        -0.6961928009986877,
        -0.5250730514526367,
        -0.39491748809814453,
        -0.28444138169288635,
        -0.18477343022823334,
        -0.09105003625154495,
        0.0,
        0.07958029955625534,
        0.16093020141124725,
        0.24611230194568634,
        0.33791524171829224,
        0.44070982933044434,
        0.5626170039176941,
        0.7229568362236023,
        1.0,
    ],
    dtype=np.float32,
)
# A value closer to a midpoint's upper level than to its lower one rounds up
# (bitsandbytes' `x > midpoint` decision tree).
_MIDPOINTS = (NF4_LEVELS[1:] + NF4_LEVELS[:-1]) / 2
# The two levels of each byte of packed codes: (low nibble, high nibble).
_PAIRS = np.stack(
    [NF4_LEVELS[np.arange(256) & 15], NF4_LEVELS[np.arange(256) >> 4]], -1
)


def check_block_size(block_size) -> int:
    """`block_size` if it is a positive even integer, else a ValueError."""
    if (
        isinstance(block_size, bool)
        or not isinstance(block_size, int)
        or block_size < 2
        or block_size % 2
    ):
        raise ValueError(
            "NF4 `block_size` must be a positive even integer (QLoRA uses 64). "
            f"Received: block_size={block_size!r}"
        )
    return block_size


def nf4_codes(w, block_size: int = BLOCK_SIZE):
    """NumPy NF4 quantization of `w [..., C, O]` in blocks of `block_size`
    along `C`: `(codes uint8 [..., C, O] in 0..15, absmax float32
    [..., ceil(C / block_size), O])`. A block of zeros has absmax 0 and the
    code of 0.0."""
    w = np.asarray(w, dtype=np.float32)
    *lead, c, o = w.shape
    blocks = math.ceil(c / block_size)
    padded = np.zeros((*lead, blocks * block_size, o), np.float32)
    padded[..., :c, :] = w
    grouped = padded.reshape(*lead, blocks, block_size, o)
    absmax = np.abs(grouped).max(axis=-2)  # [..., blocks, O]
    safe = np.where(absmax == 0, 1.0, absmax)[..., None, :]
    normalized = (grouped / safe).reshape(padded.shape)[..., :c, :]
    codes = np.searchsorted(_MIDPOINTS, normalized, side="left").astype(np.uint8)
    return codes, absmax.astype(np.float32)


def nf4_quantize(w, block_size: int = BLOCK_SIZE):
    """`w [..., C, O]` -> `(packed uint8 [..., C, ceil(O / 2)], absmax
    float32 [..., ceil(C / block_size), O])`: `nf4_codes` with two codes
    per byte along `O` (`keras.quantizers.pack_int4`: the even column in the
    low nibble)."""
    codes, absmax = nf4_codes(w, block_size)
    packed, _, _ = keras.quantizers.pack_int4(codes, axis=codes.ndim - 1, dtype="uint8")
    return ops.convert_to_numpy(packed), absmax


def nf4_dequantize(packed, absmax, block_size: int = BLOCK_SIZE, dtype="float32"):
    """The float kernel `[..., C, O]` of packed codes `[..., C, ceil(O /
    2)]` and scales `[..., ceil(C / block_size), O]`, in `dtype`: one
    lookup of each byte's two levels (`keras.ops` only, so it runs inside a
    compiled step), times its block's scale."""
    *lead, rows, half = (int(d) for d in packed.shape)
    columns = int(absmax.shape[-1])
    pairs = ops.convert_to_tensor(_PAIRS, dtype)  # [256, 2]: (low, high) levels
    values = lookup(pairs, ops.cast(packed, "int32"))  # [..., C, O/2, 2]
    values = ops.reshape(values, (*lead, rows, 2 * half))
    if 2 * half != columns:
        values = values[..., :columns]
    absmax = ops.cast(absmax, dtype)
    if rows % block_size == 0:  # [..., blocks, block_size, O] * [..., blocks, 1, O]
        grouped = ops.reshape(values, (*lead, rows // block_size, block_size, columns))
        return ops.reshape(
            grouped * ops.expand_dims(absmax, -2), (*lead, rows, columns)
        )
    return values * ops.repeat(absmax, block_size, axis=-2)[..., :rows, :]


@functools.cache
def _nf4_matmul(rows: int, block_size: int):
    """`f(x [N, rows], packed, absmax) -> x @ kernel [N, O]` whose backward
    pass dequantizes the kernel again (kept for it: only the codes)."""

    def kernel(packed, absmax, dtype):
        return nf4_dequantize(packed, absmax, block_size, dtype)

    def forward(x, packed, absmax):
        return ops.matmul(x, kernel(packed, absmax, x.dtype)), (packed, absmax)

    def backward(residuals, grad):
        packed, absmax = residuals
        w = kernel(packed, absmax, grad.dtype)
        return ops.matmul(grad, ops.transpose(w)), None, None

    return custom_vjp(forward, backward)


class NF4DTypePolicy(keras.dtype_policies.QuantizedDTypePolicy):
    """The dtype policy of an NF4 layer: `"nf4/<block_size>_from_<source>"`.

    Args:
        mode: `"nf4/<block_size>"` (e.g. `"nf4/64"`) or `"nf4"` (64).
        source_name: the float policy the layer had, e.g. `"float32"`.
    """

    def __init__(self, mode="nf4", source_name=None):
        base, _, size = str(mode).partition("/")
        if base != "nf4":
            raise ValueError(
                f"NF4DTypePolicy needs mode 'nf4/<block_size>'. Got {mode!r}"
            )
        self.block_size = check_block_size(int(size) if size else BLOCK_SIZE)
        super().__init__("nf4", source_name)
        self._name = f"nf4/{self.block_size}_from_{self._source_name}"

    def _check_quantization_mode(self, mode, compute_dtype):
        pass  # "nf4" is ours: Keras' list of modes does not know it

    def __eq__(self, other):
        if not isinstance(other, NF4DTypePolicy):
            return False
        return super().__eq__(other) and self.block_size == other.block_size

    def get_config(self):
        return {"mode": f"nf4/{self.block_size}", "source_name": self._source_name}


keras.saving.register_keras_serializable("keras_transformers")(NF4DTypePolicy)


class NF4Projection:
    """NF4 storage and matrix product for `Dense` / `EinsumDense` layers whose
    kernel `[C_1..C_n, O_1..O_m]` contracts its first `n = _contracted` axes
    (`x [..., C_1..C_n] -> [..., O_1..O_m]`), seen as a `[C, O]` matrix.
    `quantize_nf4` replaces the float kernel; `_nf4_call` is the layer's
    quantized call (LoRA added as Keras adds it to int8 / int4 layers)."""

    def quantize_nf4(self, block_size: int = BLOCK_SIZE):
        """Replaces the float kernel by NF4 codes and block scales."""
        block_size = check_block_size(block_size)
        if self._contracted is None:
            raise NotImplementedError(
                f"NF4 needs an equation of the form 'bt<C>,<C><O>->bt<O>'; layer "
                f"{self.name!r} has {getattr(self, 'equation', None)!r}. It stays float."
            )
        if self.lora_enabled:
            raise ValueError(f"Layer {self.name!r} has LoRA enabled: quantize first.")
        shape = tuple(int(d) for d in self._kernel.shape)
        rows = math.prod(shape[: self._contracted])
        kernel = ops.convert_to_numpy(ops.cast(self._kernel, "float32"))
        packed, absmax = nf4_quantize(kernel.reshape(rows, -1), block_size)
        self._tracker.unlock()
        try:
            del self._kernel
            self._nf4_build(shape, block_size)
        finally:
            self._tracker.lock()
        self._kernel.assign(packed)
        self.kernel_absmax.assign(absmax)
        self.dtype_policy = NF4DTypePolicy(f"nf4/{block_size}", self.dtype_policy.name)

    def _nf4_enable_lora(self, rank, lora_alpha, a_initializer, b_initializer):
        """Keras' `enable_lora` (`A [..., rank]` over all kernel axes but the
        last, `B [rank, O_last]`, float32) for an NF4 kernel, read from its
        stored shape: Keras' own reads `self.kernel`, a dequantization."""
        if self.lora_enabled:
            raise ValueError(
                "lora is already enabled. This can only be done once per layer."
            )
        shape = tuple(self._nf4_shape)
        self._tracker.unlock()
        try:
            for name, size, initializer in (
                ("lora_kernel_a", (*shape[:-1], rank), a_initializer),
                ("lora_kernel_b", (rank, shape[-1]), b_initializer),
            ):
                weight = self.add_weight(
                    name=name,
                    shape=size,
                    initializer=keras.initializers.get(initializer),
                    dtype="float32",
                    regularizer=self.kernel_regularizer,
                )
                setattr(self, name, weight)
        finally:
            self._tracker.lock()
        self.lora_enabled, self.lora_rank = True, rank
        self.lora_alpha = lora_alpha if lora_alpha is not None else rank

    def _nf4_build(self, shape, block_size):
        rows = math.prod(shape[: self._contracted])
        columns = math.prod(shape[self._contracted :])
        self._nf4_shape, self._nf4_block = shape, block_size
        self._kernel = self.add_weight(
            name="kernel",
            shape=(rows, (columns + 1) // 2),
            initializer="zeros",
            dtype="uint8",
            trainable=False,
        )
        self.kernel_absmax = self.add_weight(
            name="kernel_absmax",
            shape=(math.ceil(rows / block_size), columns),
            initializer="ones",
            dtype="float32",
            trainable=False,
            autocast=False,
        )
        self._is_quantized = True

    def _nf4_rows(self) -> int:
        return math.prod(self._nf4_shape[: self._contracted])

    def nf4_kernel(self, dtype=None):
        """The dequantized kernel in its float shape (no LoRA update)."""
        w = nf4_dequantize(
            backend.value(self._kernel),
            backend.value(self.kernel_absmax),
            self._nf4_block,
            dtype or self.compute_dtype,
        )
        return ops.reshape(w, self._nf4_shape)

    def _lora_output(self, inputs):
        """LoRA's update `(alpha / rank) * (x @ A) @ B` -> `[..., O_1..O_m]`
        (Keras' `A [C_1..C_n, O_1..O_{m-1}, rank]` through the layer's
        equation, then `B [rank, O_m]`)."""
        a = ops.cast(self.lora_kernel_a, self.compute_dtype)
        b = ops.cast(self.lora_kernel_b, self.compute_dtype)
        equation = getattr(self, "equation", None)
        low = (
            ops.matmul(inputs, a)
            if equation is None
            else ops.einsum(equation, inputs, a)
        )
        return (self.lora_alpha / self.lora_rank) * ops.matmul(low, b)

    def _nf4_call(self, inputs, training=None):
        c, rows = self._contracted, self._nf4_rows()
        lead = tuple(ops.shape(inputs)[: len(inputs.shape) - c])  # TF: None dims
        inputs = ops.cast(inputs, self.compute_dtype)
        matmul = _nf4_matmul(rows, self._nf4_block)
        x = matmul(
            ops.reshape(inputs, (-1, rows)),
            backend.value(self._kernel),
            backend.value(self.kernel_absmax),
        )
        x = ops.reshape(x, lead + tuple(self._nf4_shape[c:]))
        if self.lora_enabled:
            x = x + self._lora_output(inputs)
        if self.bias is not None:
            x = x + ops.cast(self.bias, x.dtype)
        return x if self.activation is None else self.activation(x)
