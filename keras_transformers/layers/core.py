"""Keras' projection and norm layers with PyTorch's fused kernels called
directly: `Dense` and `EinsumDense` (bias fused into the product, see
`backend.linear`), `LayerNormalization` and `RMSNormalization`.

Same weights, names, initialisers, LoRA (`enable_lora`) and quantization
(`quantize`) as the Keras layers they extend, and the same numbers; only
the PyTorch path of an unquantized call changes: one `addmm` instead of a
`matmul`/`einsum` then an `add` (~7% less time forward and backward on
`[2048, 256] x [256, 1024]`), and no per-call dtype bookkeeping (a third to
a half of the time of a small layer while decoding one token). On JAX's
CPU backend the same products run as 2-D matrix products over the flattened
leading axes, which XLA:CPU differentiates without transposed copies
(`backend._flat_linear`: a training step of the Mixtral benchmark's dense
decoder 1.03 -> 0.50 s).
"""

from __future__ import annotations

import random

import keras
from keras import ops

from keras_transformers import backend
from keras_transformers.layers.nf4 import NF4Projection
from keras_transformers.layers.serializable import serializable


def _contracted_axes(equation: str, bias_axes) -> int | None:
    """For `"bt<C>,<C><O>->bt<O>"` (every input axis after the first two is
    contracted, in order, and the output keeps them as the kernel's last
    axes) with a bias over all of `<O>` or none: `len(<C>)`. Else None."""
    inputs, output = equation.split("->")
    x, kernel = inputs.split(",")
    lead, contracted = x[:2], x[2:]
    out = output[2:]
    if output[:2] != lead or kernel != contracted + out or not contracted:
        return None
    if bias_axes is not None and bias_axes != out:
        return None
    return len(contracted)


class _FusedProjection(NF4Projection):
    """`call` and `quantize` shared by `Dense` and `EinsumDense`; subclasses
    say how many trailing input axes they contract (`_contracted`, None:
    Keras' own arithmetic). Besides Keras' quantization modes, NF4
    (`quantize_nf4`, see `keras_transformers.layers.nf4`). With LoRA
    enabled (Keras' `enable_lora`), the update is computed beside the
    frozen kernel, `x @ W + (alpha / rank) * (x @ A) @ B`, as PEFT does,
    rather than through Keras' merged kernel `W + (alpha / rank) * A @ B`,
    which training would keep, with its gradient, for every layer."""

    def call(self, inputs, training=None):
        if self.quantization_mode is not None:  # a direct `layer.call`
            return self.quantized_call(inputs, training=training)
        lora = self.lora_enabled
        x = None
        if self._contracted is not None:
            # The stored kernel: not quantized here, and LoRA's update is
            # added apart below.
            x = backend.linear(inputs, self._kernel, self.bias, self._contracted)
        if x is None and not lora:
            return super().call(inputs, training=training)
        if lora:  # beside the frozen kernel: no merged kernel, nor its gradient
            x = self._frozen_product(inputs) if x is None else x
            x = x + self._lora_output(inputs)
        return x if self.activation is None else self.activation(x)

    def _frozen_product(self, inputs):
        """`inputs` times the kernel (without LoRA's update), plus the bias."""
        kernel = ops.cast(self._kernel, self.compute_dtype)
        equation = getattr(self, "equation", None)
        if equation is None:
            x = ops.matmul(inputs, kernel)
        else:
            x = ops.einsum(equation, inputs, kernel)
        return x if self.bias is None else x + ops.cast(self.bias, x.dtype)

    def quantize(self, mode=None, type_check=True, config=None):
        """Keras' `quantize` (it refuses subclasses by default)."""
        super().quantize(mode, type_check=False, config=config)

    def quantized_call(self, inputs, training=None):
        if self.quantization_mode == "nf4":
            return self._nf4_call(inputs, training=training)
        return super().quantized_call(inputs, training=training)

    def enable_lora(
        self, rank, lora_alpha=None, a_initializer="he_uniform", b_initializer="zeros"
    ):
        """Keras' `enable_lora`, on NF4 kernels too."""
        if self.quantization_mode == "nf4":
            self._nf4_enable_lora(rank, lora_alpha, a_initializer, b_initializer)
        else:
            super().enable_lora(rank, lora_alpha, a_initializer, b_initializer)

    @property
    def kernel(self):
        """Keras' `kernel` (int8: the int8 values; int4: unpacked); NF4: the
        dequantized float kernel. LoRA's update included."""
        if self.quantization_mode != "nf4":
            return super().kernel
        kernel = self.nf4_kernel()
        if self.lora_enabled:
            update = ops.matmul(self.lora_kernel_a, self.lora_kernel_b)
            kernel = kernel + ops.cast(
                self.lora_alpha / self.lora_rank * update, kernel.dtype
            )
        return kernel

    @property
    def kernel_shape(self) -> tuple:
        """The float kernel's shape, whatever the storage (packed or not)."""
        if self.quantization_mode == "nf4":
            return tuple(self._nf4_shape)
        if self.quantization_mode == "int4":
            if hasattr(self, "original_kernel_shape"):  # EinsumDense
                return tuple(self.original_kernel_shape)
            return (self._orig_input_dim, self._orig_output_dim)
        return tuple(int(d) for d in self._kernel.shape)

    @property
    def variable_serialization_spec(self):
        spec = dict(super().variable_serialization_spec)
        spec["nf4"] = ["kernel", "bias", "kernel_absmax"]
        return spec

    def _get_kernel_with_merged_lora(self):
        """What Keras saves as the kernel: NF4 codes are saved as they are
        (LoRA is saved apart, e.g. `save_lora_weights`)."""
        if self.quantization_mode == "nf4":
            return self._kernel, None, None
        return super()._get_kernel_with_merged_lora()


@serializable
class Dense(_FusedProjection, keras.layers.Dense):
    """`keras.layers.Dense`; `[..., D_in] -> [..., units]` with the bias
    fused into the product on PyTorch."""

    _contracted = 1


@serializable
class EinsumDense(_FusedProjection, keras.layers.EinsumDense):
    """`keras.layers.EinsumDense`; equations of the form
    `"bt<C>,<C><O>->bt<O>"` (e.g. `"btd,dnh->btnh"`, `[B, T, D] -> [B, T, N, H]`,
    and `"btnh,nhd->btd"`) run as one flattened, bias-fused product on
    PyTorch; other equations as in Keras."""

    @property
    def _contracted(self):
        return _contracted_axes(self.equation, self.bias_axes)


# Logical axes of the weights of `layers.attention.MultiHeadAttention` (its
# projections are `EinsumDense`s; see keras_transformers.distribution).
ATTENTION_WEIGHT_AXES = {
    "query/kernel": ("embed", "heads", "head_dim"),
    "query/bias": ("heads", "head_dim"),
    "key/kernel": ("embed", "kv_heads", "head_dim"),
    "key/bias": ("kv_heads", "head_dim"),
    "value/kernel": ("embed", "kv_heads", "head_dim"),
    "value/bias": ("kv_heads", "head_dim"),
    "output_gate/kernel": ("embed", "heads", "head_dim"),
    "output_gate/bias": ("heads", "head_dim"),
    "attention_output/kernel": ("heads", "head_dim", "embed"),
    "attention_output/bias": None,
    "sinks": ("heads",),
}


class _Float32Norm:
    @property
    def _float32(self):
        """Float32 compute: the fused kernel's output needs no cast."""
        return self.compute_dtype == "float32"


@serializable
class LayerNormalization(_Float32Norm, keras.layers.LayerNormalization):
    """`keras.layers.LayerNormalization` (last axis); on PyTorch a float32
    input goes straight to `torch.nn.functional.layer_norm`."""

    weight_axes = {"gamma": None, "beta": None}  # replicated

    def call(self, inputs):
        out = None
        if self.axis in (-1, [-1]) and not self.rms_scaling and self._float32:
            out = backend.norm(inputs, self.gamma, self.beta, self.epsilon)
        return super().call(inputs) if out is None else out


@serializable
class RMSNormalization(_Float32Norm, keras.layers.RMSNormalization):
    """`keras.layers.RMSNormalization` (last axis); on PyTorch a float32
    input goes straight to `torch.nn.functional.rms_norm`."""

    weight_axes = {"scale": None}  # replicated

    def call(self, x):
        out = None
        if self.axis in (-1, [-1]) and self._float32:
            out = backend.norm(x, self.scale, None, self.epsilon, rms=True)
        return super().call(x) if out is None else out


def seeded_dropout(rate: float, dtype=None, name: str | None = None):
    """`keras.layers.Dropout(rate)` with an explicit seed.

    The seed is drawn from Python's `random` as Keras draws one for an
    unseeded layer (so `keras.utils.set_random_seed` fixes it and JAX and
    TensorFlow give the same masks as before). Explicit matters on
    PyTorch: an unseeded Keras dropout draws from PyTorch's global
    generator, whose state no checkpoint holds; a seeded one draws from its
    `SeedGenerator`, which `fit()` advances and saved weights restore (see
    `keras_transformers.training.random_state`), so a resumed run draws the
    same masks.
    """
    seed = random.randint(1, int(1e9))
    return keras.layers.Dropout(rate, seed=seed, dtype=dtype, name=name)
