"""Per-backend choices that shared code asks about by what they do, so no
layer, optimizer or training helper names a backend itself."""

from __future__ import annotations

import keras

from keras_transformers.backend import xla_cpu


def exact_gelu(x):
    """GELU, exact: `x * Phi(x) = 0.5 x (1 + erf(x / sqrt(2)))`, the formula
    of PyTorch's kernel (and so Hugging Face's "gelu"). PyTorch runs its
    fused kernel; JAX and TensorFlow spell their exact GELU with `erfc`,
    which XLA:CPU evaluates ~30% slower forward and backward than `erf`, so
    there the formula is written out (equal to 1e-7)."""
    if keras.config.backend() == "torch":
        return keras.activations.gelu(x, approximate=False)
    return 0.5 * x * (1.0 + keras.ops.erf(x * 0.7071067811865476))


def explicit_attention_faster(half: bool, one_query: bool, ungrouped_cpu: bool) -> bool:
    """Whether explicit attention (scores, softmax, weighted sum) beats the
    backend's fused op here. TensorFlow has no fused kernel: Keras' op is an
    explicit one with more transposes (0.202 vs 0.209 s). On JAX: the fused
    op asks XLA for an F16_F16_F32 dot, which XLA:CPU (and TPU) reject when
    compiling (`half`: float16); one query token (a decoding step) is 3-9%
    faster explicit, the fused op's grouped reshapes costing more than T = 1;
    and on XLA:CPU so are ungrouped heads (their group axis costs a
    head-layout copy per layer: BERT masked-LM step 0.298 vs 0.320 s)."""
    name = keras.config.backend()
    return name == "tensorflow" or (
        name == "jax" and (half or one_query or ungrouped_cpu)
    )


def one_query_by_reduction() -> bool:
    """Whether attention of one query token (a decoding step) computes its
    scores and weighted values as products summed over an axis, reading
    the `[B, S, K, H]` cache as it lies, rather than as matrix products
    batched over the heads, for which XLA:CPU copies the keys and values
    into a `[B, K, S, H]` layout every step. JAX on CPU: measured on a
    2-core CPU, SmolLM2-135M's attention alone (9 / 3 heads of 64, 256
    cached positions, 30 layers) took 18 ms instead of 95 at 8 rows and
    2.2 ms instead of 2.3 at one row; a greedy serving step of 8 rows, 84
    ms instead of 98 (with `vocabulary_first_head`)."""
    return xla_cpu()


def vocabulary_first_head(rows: int) -> bool:
    """Whether a greedy decoding step of `rows` rows takes its argmax over
    `[V, rows]` logits (`TextBackbone.logits(..., vocabulary_first=True)`)
    rather than `[rows, V]`: JAX on CPU from two rows (XLA:CPU's product
    of a few rows with the tied `[V, D]` table is faster in that layout;
    at one row it is the slower)."""
    return rows >= 2 and xla_cpu()


def fused_attention_saves_memory(half: bool) -> bool:
    """Whether the backend's fused attention keeps no `[T, S]` scores for
    the backward pass: PyTorch's `scaled_dot_product_attention` (flash and
    memory-efficient kernels, on CPU too), and on a JAX GPU in half
    precision (cuDNN's flash attention, which Keras picks there). XLA's
    own attention (JAX on CPU, or in float32) and TensorFlow's do keep
    them: there long sequences take blockwise attention."""
    name = keras.config.backend()
    if name == "torch":
        return True
    if name != "jax" or not half:
        return False
    import jax

    return jax.default_backend() == "gpu"


def chunked_loss_pays_more() -> bool:
    """Whether the chunked cross-entropy pays from fewer logits here (JAX:
    its plain loss keeps several `[B, T, V]` tensors; measured with
    SmolLM2's 2,048 x 49,152 logits: 12.9 GB and 30.8 s per step plain,
    11.7 GB and 30.5 s chunked). PyTorch's plain loss keeps one buffer
    (`backend.cross_entropy`: 6.9 GB and 44.6 s plain, 6.8 GB and 50.6 s
    chunked), and TensorFlow's loop of chunks is slow (39.2 s plain, 50.7 s
    chunked, the same memory)."""
    return keras.config.backend() == "jax"


def optimizer_updates_in_place() -> bool:
    """Whether the optimizers update variables with the fused in-place kernel
    of `backend.optimizer.adam_update` (PyTorch's `_foreach` ops)."""
    return keras.config.backend() == "torch"


def recompute_reads_variables() -> bool:
    """Whether rematerialisation differentiates the variables it sees read
    (TensorFlow's `recompute_grad`): feeding them as inputs as well would
    count their gradients twice."""
    return keras.config.backend() == "tensorflow"
