"""Token embeddings that double as the (tied) output projection."""

from __future__ import annotations

import keras
from keras import ops

from keras_transformers import backend
from keras_transformers.layers.serializable import serializable


@serializable
class TokenEmbedding(keras.layers.ReversibleEmbedding):
    """Token embedding whose reverse call is the LM head.

    `layer(ids)` embeds `[B, T]` ids to `[B, T, D]`; `layer(hidden, reverse=True)`
    projects `[B, T, D]` to `[B, T, V]` logits, with the transposed embedding
    matrix when `tie_weights=True` (GPT-2, BERT, the 2017 paper) or with a
    separate `reverse_embeddings` matrix `[D, V]` otherwise (Llama).

    Args:
        input_dim: V, vocabulary size.
        output_dim: D, embedding width.
        tie_weights: share the input and output matrices. Defaults to True.
        scale: multiply embeddings by this factor (sqrt(D) in the 2017 paper).
        embeddings_initializer: initializer of the matrices.

    Examples:
        >>> emb = TokenEmbedding(100, 16)
        >>> tuple(emb(emb(keras.ops.ones((2, 3), "int32")), reverse=True).shape)
        (2, 3, 100)
    """

    # Logical axes of each weight (see keras_transformers.distribution).
    weight_axes = {
        "embeddings": ("vocab", "embed"),
        "reverse_embeddings": ("embed", "vocab"),
    }

    def __init__(self, input_dim, output_dim, tie_weights=True, scale=1.0, **kwargs):
        super().__init__(input_dim, output_dim, tie_weights=tie_weights, **kwargs)
        self.scale = scale

    def call(self, inputs, reverse=False):
        if self.quantization_mode is not None:  # a direct `layer.call`
            return self.quantized_call(inputs, reverse=reverse)
        if reverse and self.reverse_dtype is None:
            return self._project(inputs)
        return self._scaled(super().call(inputs, reverse=reverse), reverse)

    def head_kernel(self):
        """The LM head's matrix in the compute dtype and whether it is
        `[V, D]` (the tied embedding table) rather than `[D, V]`."""
        kernel = self.embeddings if self.tie_weights else self.reverse_embeddings
        return ops.cast(kernel, self.compute_dtype), self.tie_weights

    def _project(self, hidden):
        """The LM head, `[B, T, D]` -> `[B, T, V]` logits in the compute dtype.
        Keras' `Embedding` does not autocast its variables, so its own reverse
        call would multiply in float32 (and return float32 logits) under a
        mixed policy; the loss upcasts the logits itself."""
        kernel, transposed = self.head_kernel()
        if transposed:
            kernel = ops.transpose(kernel)  # [V, D] -> [D, V]
        hidden = ops.cast(hidden, self.compute_dtype)
        logits = backend.linear(hidden, kernel, None, 1)
        if logits is None:
            logits = ops.matmul(hidden, kernel)
        return self._capped(logits)

    def _capped(self, logits):
        """`logit_soft_cap * tanh(logits / logit_soft_cap)`, or `logits`."""
        if self.logit_soft_cap is None:
            return logits
        return ops.tanh(logits / self.logit_soft_cap) * self.logit_soft_cap

    def reverse_columns(self, hidden):
        """The LM head's logits vocabulary first: `hidden [N, D]` -> `[V, N]`,
        the transpose of `layer(hidden, reverse=True)`. With tied weights the
        product is `table [V, D] @ hidden.T`: for a few rows (a batched
        decoding step) XLA:CPU computes it faster in that layout (a consumer
        then reduces over axis 0, as a greedy argmax does): measured with
        SmolLM2's 49,152 x 576 table and 8 rows, 8-13 ms as `[V, N]` against
        12-19 ms as `[N, V]` (the same at one row)."""
        plain = self.quantization_mode is None and self.reverse_dtype is None
        if not (plain and self.tie_weights):
            return ops.transpose(self(hidden, reverse=True))
        kernel, _ = self.head_kernel()  # [V, D]
        hidden = ops.cast(hidden, self.compute_dtype)
        return self._capped(ops.matmul(kernel, ops.transpose(hidden)))  # [V, N]

    def quantized_call(self, inputs, reverse=False):
        """The quantized (e.g. int8, `model.quantize("int8")`) forward pass;
        Keras calls it instead of `call` once the layer is quantized."""
        return self._scaled(super().quantized_call(inputs, reverse=reverse), reverse)

    def quantize(self, mode=None, type_check=True, config=None):
        """Keras' `ReversibleEmbedding.quantize` (int8: per-row abs-max for
        the lookup and per-column for an untied LM head). Keras refuses
        subclasses by default because of custom `call`s; ours applies
        `scale` in `quantized_call` too."""
        super().quantize(mode, type_check=False, config=config)

    def _scaled(self, out, reverse):
        if not reverse and self.scale != 1.0:
            out = out * ops.cast(self.scale, out.dtype)
        return out

    def get_config(self):
        config = super().get_config()
        config["scale"] = self.scale
        return config
