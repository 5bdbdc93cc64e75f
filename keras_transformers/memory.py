"""Training memory: per-block rematerialisation and a memory / FLOP estimator.

* `rematerialized(layer, layer_call)`: what `TransformerBlock` runs when the
  config sets `remat` (each block is created inside a `keras.RematScope`
  that names it): the whole block becomes one rematerialised unit
  (`backend.remat.remat`: `jax.checkpoint`, `tf.recompute_grad` or
  `torch.utils.checkpoint`). With `remat=True` its backward pass keeps only
  the block input and recomputes the rest; with `remat="matmuls"` it also
  keeps the outputs of the weight products and of attention (JAX and
  PyTorch).
* `estimate_memory(config, batch_size, sequence_length, ...)`: bytes of
  parameters, gradients, optimizer state and activations of one training
  step, and the training FLOPs per token, from the config alone (no weights:
  it answers for `mixtral_8x7b`).
* `training_flops_per_token(config, sequence_length)`: the 6N + 12LDT
  convention used for MFU (also exported from `keras_transformers.training`).
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any

import keras
from keras import ops

from keras_transformers.backend.choices import recompute_reads_variables
from keras_transformers.backend.remat import keeps_selectively
from keras_transformers.backend.remat import remat as backend_remat
from keras_transformers.config import TransformerConfig
from keras_transformers.config.layer_types import sliding_windows

# Optimizer slots per trainable parameter (Keras implementations).
OPTIMIZER_SLOTS = {
    "sgd": 0,
    "momentum": 1,
    "adagrad": 1,
    "rmsprop": 1,
    "lion": 1,
    "adam": 2,
    "adamw": 2,
    "nadam": 2,
    "adamax": 2,
}
_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


def _is_float(x) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and "float" in keras.backend.standardize_dtype(dtype)


def rematerialized(layer, layer_call):
    """`layer_call` run as one rematerialised unit that is a pure function
    of its float tensors and `layer`'s weights; `layer.remat_keep` (None or
    "matmuls", see `keras_transformers.backend.remat`) says what it keeps.

    Keras' own `remat` of a bound `call` breaks on three things a
    transformer block does: a Python `training` flag (JAX traces it), random
    dropout (the recomputation would draw new masks from the advanced seed
    state) and side effects (`add_loss` and router statistics of a MoE
    layer). Here `training` and every non-float argument are closed over,
    the layer's non-trainable state (seed generators, statistics) enters as
    a snapshot and its update and the added losses leave as outputs, so the
    forward pass and its recomputation see the same seeds.

    Args:
        layer: the built layer (e.g. a `TransformerBlock`).
        layer_call: its `call` (what Keras passes to `rematerialized_call`).

    Returns:
        A function with `layer_call`'s signature and outputs.
    """
    pass_weights = not recompute_reads_variables()

    def run(*args, training=None, **kwargs):
        given = {**dict(enumerate(args)), **kwargs}
        keys = [key for key, value in given.items() if _is_float(value)]
        fixed = {key: value for key, value in given.items() if key not in keys}
        trainable = layer.trainable_variables if pass_weights else []
        state = layer.non_trainable_variables
        snapshot = [ops.copy(v) for v in state]  # values now, not references

        def pure(*inputs):
            values = {**fixed, **dict(zip(keys, inputs))}
            call_args = [values.pop(i) for i in range(len(args))]
            weights = inputs[len(keys) :]
            mapping = [*zip(trainable, weights), *zip(state, snapshot)]
            with keras.StatelessScope(mapping, collect_losses=True) as scope:
                out = layer_call(*call_args, training=training, **values)
            new = [scope.get_current_value(v) for v in state]
            new = [s if n is None else n for s, n in zip(snapshot, new)]
            return out, new, list(scope.losses)

        inputs = [given[key] for key in keys] + [v.value for v in trainable]
        keep = getattr(layer, "remat_keep", None)
        out, new_state, losses = backend_remat(pure, keep)(*inputs)
        for variable, value in zip(state, new_state):
            variable.assign(value)
        for loss in losses:
            layer.add_loss(loss)
        return out

    return run


# --------------------------------------------------------------- estimator
def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(
            f"`{name}` must be a positive integer. Received: {name}={value!r}"
        )
    return int(value)


def training_flops_per_token(config: TransformerConfig, sequence_length: int) -> float:
    """Training FLOPs per token: `6 * N + 12 * L * D * T` (Kaplan et al. 2020).

    `6 * N` covers the forward (2N) and backward (4N) matmuls of the weights;
    `12 * L * D * T` covers the attention scores and weighted sum
    (`QK^T` and `AV`) over a context of `T` tokens in `L` attention layers.
    This is the convention of the PaLM MFU definition (causal masking is not
    discounted; rematerialisation's extra forward pass is not counted).

    * `N` = non-embedding parameters: `config.num_active_params()` (only the
      routed top-k plus shared experts for MoE) minus the embedding
      *lookups* (token, learned position, segment embeddings; ViT's patch
      positions and class token). An untied LM head and the ViT patch
      projection stay in `N` (they are matmuls); a tied head is not counted.
    * `D` = the attention width `num_heads * head_dim`.
    * `T` = `sequence_length`, capped at each layer's sliding window (see
      `keras_transformers.config.layer_types`); the term sums over layers.
    * `L` = attention sub-layers: `num_layers`, or `num_layers + 2 *
      num_decoder_layers` (self- plus cross-attention) for "encoder_decoder",
      per target token with source and target both `sequence_length` long.

    Args:
        config: a `TransformerConfig`.
        sequence_length: tokens per training sequence.

    Returns:
        FLOPs per trained token (float). GPT-2 small at 1024 tokens: ~6.2e8.
    """
    sequence_length = _positive("sequence_length", sequence_length)
    d = config.hidden_dim
    embeddings = config.num_segments * d
    if config.vision is not None:
        vision = config.vision
        # The position table and the learned class / distillation tokens.
        embeddings += (vision.num_patches + 2 * vision.num_prefix_tokens) * d
    else:
        embeddings += config.vocabulary_size * d
        if config.position_embedding == "learned":
            embeddings += config.max_sequence_length * d
    non_embedding = config.num_active_params() - embeddings
    return float(6 * non_embedding + _attention_flops(config, sequence_length))


def _attention_flops(config: TransformerConfig, sequence_length: int) -> int:
    """The `12 * L * D * T` term of `training_flops_per_token`."""
    width = config.num_heads * config.resolved_head_dim
    if config.stacks == "decoder":
        windows = sliding_windows(config)
    else:
        windows = [config.sliding_window] * _attention_layers(config)
    contexts = sum(min(sequence_length, w or sequence_length) for w in windows)
    return 12 * width * contexts


def _attention_layers(config: TransformerConfig) -> int:
    if config.stacks == "encoder_decoder":
        return config.num_layers + 2 * config.resolved_num_decoder_layers
    return config.num_layers


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """What one training step holds, in bytes, plus its FLOPs.

    Attributes:
        parameters: all weights (every expert of a MoE layer).
        gradients: one gradient per weight, in the weight dtype.
        optimizer_state: optimizer slots (Adam: 2 per weight) plus the
            gradient accumulators of `gradient_accumulation_steps > 1`.
        activations: what the forward pass keeps for the backward pass, plus
            the largest backward temporaries (the logits' gradient).
        flops_per_token: `training_flops_per_token` (the MFU convention).
        recompute_flops_per_token: the extra forward pass of the blocks that
            remat costs (0 without remat).
    """

    parameters: int
    gradients: int
    optimizer_state: int
    activations: int
    flops_per_token: float
    recompute_flops_per_token: float = 0.0

    @property
    def total(self) -> int:
        """Bytes of everything above: the estimated peak of one step."""
        return (
            self.parameters + self.gradients + self.optimizer_state + self.activations
        )

    def to_dict(self) -> dict[str, float]:
        return {**dataclasses.asdict(self), "total": self.total}

    def __str__(self) -> str:
        rows = [
            f"{k:<16}{v / 2**30:10.3f} GiB"
            for k, v in self.to_dict().items()
            if "flops" not in k
        ]
        rows.append(f"{'flops/token':<16}{self.flops_per_token:10.3e}")
        return "\n".join(rows)


def _dtype_bytes(dtype: str) -> tuple[int, int]:
    """(weight bytes, activation bytes) of a dtype or mixed policy name."""
    if not isinstance(dtype, str):
        dtype = getattr(dtype, "name", dtype)
    name = str(dtype).removeprefix("mixed_")
    if name not in _BYTES:
        raise ValueError(
            f"`dtype` must be one of {sorted(_BYTES)} or 'mixed_bfloat16' / "
            f"'mixed_float16'. Received: dtype={dtype!r}"
        )
    mixed = str(dtype).startswith("mixed_")
    return (4 if mixed else _BYTES[name]), _BYTES[name]


def _optimizer_slots(optimizer, accumulation_steps: int) -> int:
    """Slots per weight of an optimizer name or `keras.optimizers` instance,
    plus one accumulator with gradient accumulation."""
    if isinstance(optimizer, keras.optimizers.Optimizer):
        name = type(optimizer).__name__.lower()
        slots = OPTIMIZER_SLOTS.get(name)
        if name == "sgd" and getattr(optimizer, "momentum", 0):
            slots = 1
        if name == "adam" and getattr(optimizer, "amsgrad", False):
            slots = 3
        steps = optimizer.gradient_accumulation_steps or 1
        accumulation_steps = max(accumulation_steps, steps)
    else:
        slots = OPTIMIZER_SLOTS.get(str(optimizer).lower())
    if slots is None:
        raise ValueError(
            f"Unknown `optimizer` {optimizer!r}. Pass one of "
            f"{sorted(OPTIMIZER_SLOTS)} or a keras.optimizers instance of those."
        )
    return slots + (accumulation_steps > 1)


def _block_elements(config, tokens_context, moe, cross_context=0, fused=True):
    """`(elements, float32 elements)` one block keeps per token for backward.

    Per token: block input and norm output (2D) per sub-layer, q/k/v and the
    attention output ((2N + 2K) H), the softmax (fused: log-sum-exp, N;
    explicit: masked logits, exponentials and probabilities, 3 N S float32,
    plus the mask), the feed-forward pre-activation, activation intermediate
    and output (3F; gated, only gate and up: 2F, the backward pass computes
    the rest again) or, for MoE, k copies of the dispatched
    row, hidden and output plus the router's 2E floats; a one-byte mask per
    dropout. Cross-attention counts a source as long as the target.
    """
    c = config
    d, h, n, k = c.hidden_dim, c.resolved_head_dim, c.num_heads, c.resolved_num_kv_heads
    elements, f32 = 0, 0
    for context in (tokens_context, cross_context):
        if not context:
            continue
        elements += 2 * d + (2 * n + 2 * k) * h
        f32 += n if fused else 3.25 * n * context
        if c.dropout:  # one byte mask on the sub-layer output
            f32 += d / 4
        if c.attention_dropout and not fused:
            f32 += n * context / 4
    ffn_hidden = (2 if c.gated_feed_forward else 3) * c.intermediate_dim
    elements += 2 * d
    if moe:
        m = c.moe
        f = m.expert_intermediate_dim or c.intermediate_dim
        per_unit = 4 if c.gated_feed_forward else 3
        shared = m.shared_expert_intermediate_dim or f
        elements += m.num_experts_per_token * (per_unit * f + 2 * d)
        elements += m.num_shared_experts * (per_unit * shared + 2 * d)
        f32 += 2 * m.num_experts
    else:
        elements += ffn_hidden
    return elements, f32


def _matmul_elements(config, moe, cross) -> int:
    """Elements per token of one block's weight-product outputs (what
    `remat="matmuls"` keeps besides the block input): q, k, v, attention's
    output and its output projection per attention, the feed-forward's
    input products (2F gated, F plain; k experts' for MoE) and its output."""
    c = config
    d, h, n, k = c.hidden_dim, c.resolved_head_dim, c.num_heads, c.resolved_num_kv_heads
    attention = ((2 * n + 2 * k) * h + d) * (2 if cross else 1)
    units = 2 if c.gated_feed_forward else 1
    if moe:
        m = c.moe
        f = m.expert_intermediate_dim or c.intermediate_dim
        shared = m.shared_expert_intermediate_dim or f
        return (
            attention
            + m.num_experts_per_token * (units * f + d)
            + (m.num_shared_experts * (units * shared + d))
        )
    return attention + units * c.intermediate_dim + d


def _stacks(config):
    """`(moe flag per block, cross-attention)` for each stack of blocks."""
    c = config
    encoder = ([False] * c.num_layers, False)
    if c.stacks == "encoder":
        return [encoder]
    if c.stacks == "decoder":
        return [([c.moe_layer(i) for i in range(c.num_layers)], False)]
    decoder = [c.moe_layer(i) for i in range(c.resolved_num_decoder_layers)]
    return [encoder, (decoder, True)]


def estimate_memory(
    config: TransformerConfig,
    batch_size: int,
    sequence_length: int | None = None,
    dtype: str = "float32",
    optimizer: Any = "adamw",
    remat: bool | str | None = None,
    fused_attention: bool = True,
    gradient_accumulation_steps: int = 1,
) -> MemoryEstimate:
    """Estimates the memory of one training step from the config alone.

    Activations follow the model's computation (see `_block_elements`):
    fused attention keeps no `[B, N, T, T]` scores (explicit attention, e.g.
    XLA:CPU, attention dropout, keeps them in float32), MoE blocks keep
    `num_experts_per_token` copies of the expert activations, and with remat
    the blocks keep only their inputs plus one block's activations during
    its recomputation. Causal LMs and seq2seq add the `[B, T, V]` logits, their
    float32 softmax and gradient; encoders (BERT, ViT) add no logits. Not
    counted: the framework's workspace, fragmentation, the data pipeline,
    and the per-block copies of expert kernels that the `keras.ops` MoE
    dispatch (XLA:CPU, TensorFlow XLA; not `ragged_dot` on GPU) keeps.

    Args:
        config: a `TransformerConfig` (e.g. `load_config("llama2_7b")`).
        batch_size: sequences per optimizer micro-step.
        sequence_length: tokens per sequence (source and target alike for
            seq2seq); None = `max_sequence_length`, or the patches (+ class
            token) for ViT.
        dtype: "float32", "bfloat16", "float16", or a mixed policy
            ("mixed_bfloat16": float32 weights, bfloat16 activations).
        optimizer: "sgd", "momentum", "adam", "adamw", "lion", ... or a
            `keras.optimizers` instance (its slots, momentum, amsgrad and
            `gradient_accumulation_steps` are read).
        remat: rematerialise each block (True, or "matmuls": keep the
            weight products' outputs too); None = `config.remat`.
        fused_attention: the attention kernel keeps no scores (flash /
            cuDNN on GPU); False for XLA:CPU, whose `dot_product_attention`
            is explicit. Attention dropout always takes the explicit path.
        gradient_accumulation_steps: > 1 adds one accumulator per weight.

    Returns:
        A `MemoryEstimate` (bytes; `.total`, `.to_dict()`, `str()` in GiB).

    Examples:
        >>> from keras_transformers import estimate_memory, load_config
        >>> e = estimate_memory(load_config("llama2_7b"), 1, 4096, "mixed_bfloat16")
        >>> round(e.parameters / 2**30, 1)  # 6.7e9 float32 weights
        25.1
    """
    batch_size = _positive("batch_size", batch_size)
    if sequence_length is None:
        vision = config.vision
        sequence_length = (
            vision.num_patches + vision.num_prefix_tokens
            if vision
            else config.max_sequence_length
        )
    sequence_length = _positive("sequence_length", sequence_length)
    steps = _positive("gradient_accumulation_steps", gradient_accumulation_steps)
    remat = config.remat if remat is None else remat
    if remat not in (False, True, "matmuls") or not isinstance(fused_attention, bool):
        raise ValueError(
            '`remat` (or None) must be False, True or "matmuls" and '
            "`fused_attention` True or False. "
            f"Received: remat={remat!r}, fused_attention={fused_attention!r}"
        )
    weight_bytes, act_bytes = _dtype_bytes(dtype)
    slots = _optimizer_slots(optimizer, steps)
    fused_attention = fused_attention and not config.attention_dropout
    params = config.num_params() * weight_bytes
    tokens = batch_size * sequence_length
    inputs = largest = stored = 0
    for moe_flags, cross in _stacks(config):
        for moe in moe_flags:
            cross_context = sequence_length if cross else 0
            elements, f32 = _block_elements(
                config, sequence_length, moe, cross_context, fused_attention
            )
            size = tokens * (elements * act_bytes + f32 * 4)
            stored, largest = stored + size, max(largest, size)
            inputs += tokens * config.hidden_dim * act_bytes
            if remat == "matmuls" and keeps_selectively():
                kept = _matmul_elements(config, moe, bool(cross))
                inputs += tokens * kept * act_bytes
                # recomputed: element-wise results only (the norms' outputs)
                largest = tokens * 2 * config.hidden_dim * act_bytes
    blocks_bytes = inputs + largest if remat else stored
    d, v = config.hidden_dim, config.vocabulary_size
    outside = tokens * 3 * d * act_bytes  # embeddings, final norm in and out
    if config.stacks != "encoder" and v:
        outside += tokens * v * (act_bytes + 8)  # logits, float32 softmax, grad
    flops = training_flops_per_token(config, sequence_length)
    # Remat runs the blocks' forward pass again: (6N + 12LDT) / 3 without the head.
    recompute = (flops - 6 * _head_params(config)) / 3 if remat else 0.0
    if remat == "matmuls" and keeps_selectively():
        recompute = 0.0  # element-wise work only (no products run again)
    return MemoryEstimate(
        parameters=params,
        gradients=params,
        optimizer_state=slots * params,
        activations=int(blocks_bytes + outside),
        flops_per_token=flops,
        recompute_flops_per_token=float(recompute),
    )


def _head_params(config: TransformerConfig) -> int:
    """Matmul weights outside the blocks counted in `N` (untied LM head)."""
    if config.vocabulary_size and not config.tie_embeddings:
        return config.vocabulary_size * config.hidden_dim
    return 0


__all__ = [
    "MemoryEstimate",
    "estimate_memory",
    "rematerialized",
    "training_flops_per_token",
]
