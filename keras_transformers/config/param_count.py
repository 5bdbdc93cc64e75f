"""Closed-form parameter counts of a `TransformerConfig` (its
`num_params()` and `num_active_params()`); no weights are allocated."""

from __future__ import annotations

from keras_transformers.config.layer_types import kv_sharing, layer_settings


def count_params(config, active: bool) -> int:
    """Parameters of the model `config` (a `TransformerConfig`) describes;
    with `active`, only `num_experts_per_token` experts per MoE layer."""
    d = config.hidden_dim
    norm = 2 * d if config.norm_type == "layer" else d  # rms, layer_no_bias
    total = 0
    # Embeddings (`embedding_dim` wide, then projected to `hidden_dim`).
    e = config.embedding_dim or d
    if config.embedding_dim is not None:
        total += e * d + d
    if config.vision is not None:
        v = config.vision
        total += v.patch_size**2 * v.num_channels * d + d
        tokens = v.num_patches + v.num_prefix_tokens  # position table rows
        tokens *= not config.rotary  # no table with 2-D rotary positions
        total += tokens * d + v.num_prefix_tokens * d  # + the tokens themselves
    else:
        total += config.vocabulary_size * e
        if config.position_embedding == "learned":  # the decoder's table too
            tables = 2 if config.separate_decoder_positions else 1
            total += tables * config.max_sequence_length * e
    total += config.num_segments * e
    if config.position_embedding == "relative":  # a [buckets, N] table per stack
        stacks = 2 if config.stacks == "encoder_decoder" else 1
        total += stacks * config.relative_attention_buckets * config.num_heads
    if config.position_embedding == "transformer_xl":  # u, v [N, H], W_r [D, N, H]
        heads = config.num_heads * config.resolved_head_dim
        total += config.num_layers * (2 * heads + d * heads)
    if config.embedding_norm:  # one per stack
        total += norm // d * e * (2 if config.stacks == "encoder_decoder" else 1)
    # Blocks (LayerScale: one `[D]` scale per residual branch; "sandwich"
    # norms: a second norm per branch, on its output).
    scale = d if config.layer_scale is not None else 0
    per_branch = norm * (2 if config.norm_position == "sandwich" else 1)
    attention = _attention_params(config) + scale
    if config.stacks == "encoder_decoder":
        ffn = _ffn_params(config) + scale
        encoder = config.num_layers * (attention + ffn + 2 * per_branch)
        decoder = config.resolved_num_decoder_layers * (
            2 * attention + ffn + 3 * per_branch
        )
        total += encoder + decoder
        if config.final_norm:
            total += 2 * norm
    else:
        groups = config.num_layer_groups or config.num_layers  # distinct blocks
        causal = config.stacks == "decoder"
        for i in range(0, config.num_layers, config.num_layers // groups):
            moe = config.moe_layer(i)
            reuse = causal and kv_sharing(config, i)[1] is not None
            width = config.kv_shared_intermediate_dim if reuse else None
            ffn = _moe_params(config, active) if moe else _ffn_params(config, width)
            ffn += scale
            mixer = attention
            if causal:
                mixer = _attention_params(config, i) + scale
            if config.layer_types and config.layer_types[i] == "linear_attention":
                mixer = _linear_attention_params(config) + scale
            total += mixer + 2 * per_branch + ffn
        if config.final_norm:
            total += norm
        if not config.first_attention_norm:
            total -= norm
    p = config.per_layer_input_dim
    if p:  # the token table, the projection and its norm; per block a gate
        rows = config.per_layer_vocabulary_size or config.vocabulary_size
        total += (rows + d) * config.num_layers * p + p
        total += config.num_layers * (2 * d * p + d)
    if config.disentangled is not None:
        total += _disentangled_params(config, norm)
    if config.pooler:
        total += d * d + d
    # Output head.
    if config.vocabulary_size and not config.tie_embeddings:
        total += config.vocabulary_size * e
    if config.logits_bias:
        total += config.vocabulary_size
    return total


def _attention_params(config, index: int | None = None) -> int:
    """One self-attention's parameters: layer `index` of a decoder (its
    type's head size, key/value heads, values from keys, KV sharing), or
    the config's own with None."""
    d, h = config.hidden_dim, config.resolved_head_dim
    heads, from_key, reuse = config.resolved_num_kv_heads, False, False
    if index is not None:
        own = layer_settings(config, index)
        h, heads, from_key = own["head_dim"], own["num_kv_heads"], own["value_from_key"]
        reuse = kv_sharing(config, index)[1] is not None
    q = config.num_heads * h
    kv = heads * h
    if reuse:  # queries and output only; no key norm
        qk_norm = {True: h, "projection": q, False: 0}[config.qk_norm]
        return 2 * d * q + qk_norm + (config.num_heads if config.attention_sinks else 0)
    weights = d * q + (1 if from_key else 2) * d * kv + q * d
    biases = (q + 2 * kv + d) if config.use_bias else 0
    if config.qkv_bias and not config.use_bias:
        biases = q + 2 * kv
    if biases and not config.key_bias:
        biases -= kv
    qk_norm = {True: 2 * h, "projection": q + kv, False: 0}[config.qk_norm]
    sinks = config.num_heads if config.attention_sinks else 0
    gate = 0
    if config.attention_output_gate:  # [D, N * H] (+ [N * H] as the query's)
        gate = d * q + (q if config.use_bias or config.qkv_bias else 0)
    return weights + biases + qk_norm + sinks + gate


def _linear_attention_params(config) -> int:
    """A Gated DeltaNet (`linear_attention` group): the query / key / value
    projection `[D, C]`, the depthwise convolution `[K, C]`, the output
    gate `[D, V * Hv]`, write strength and decay projections `[D, V]` each,
    the per-head `dt_bias` and `A_log` `[V]`, the gated norm `[Hv]` and the
    output projection `[V * Hv, D]` (no biases)."""
    group, d = config.linear_attention, config.hidden_dim
    values = group.num_value_heads * group.value_head_dim
    conv = group.conv_dim * (d + group.conv_kernel_size)
    heads = group.num_value_heads
    return conv + 2 * d * values + 2 * d * heads + 2 * heads + group.value_head_dim


def _disentangled_params(config, norm: int) -> int:
    """DeBERTa's relative embeddings `[2 * span, D]` (and their norm), plus
    per block a `[D, N * H]` projection with bias per position term unless
    the blocks' own query / key projections are shared."""
    group, d = config.disentangled, config.hidden_dim
    total = 2 * group.span * d + (norm if group.norm_relative_embeddings else 0)
    if not group.share_att_key:
        width = config.num_heads * config.resolved_head_dim
        total += config.num_layers * len(group.attention_terms) * (d + 1) * width
    return total


def _ffn_params(config, intermediate: int | None = None) -> int:
    d, f = config.hidden_dim, intermediate or config.intermediate_dim
    if config.gated_feed_forward:
        return 3 * d * f + ((2 * f + d) if config.use_bias else 0)
    return 2 * d * f + ((f + d) if config.use_bias else 0)


def _moe_params(config, active: bool) -> int:
    """Router, routed experts (all, or the top-k when `active`) and the
    always-on shared experts (each of `shared_expert_intermediate_dim`, plus
    a `[D, 1]` gate with `shared_expert_gate`); the router's `[E]` bias and
    each expert's `[2F]` (or `[F]`) and `[D]` biases when the `moe` group
    asks for them."""
    moe, d = config.moe, config.hidden_dim
    f = moe.expert_intermediate_dim or config.intermediate_dim
    per_unit = (3 if config.gated_feed_forward else 2) * d  # per hidden unit
    expert = per_unit * f
    if moe.expert_bias:  # [2F] (or [F]) and [D]
        expert += (2 if config.gated_feed_forward else 1) * f + d
    experts = moe.num_experts_per_token if active else moe.num_experts
    router = (d + int(moe.router_bias)) * moe.num_experts
    shared = (
        moe.num_shared_experts * per_unit * (moe.shared_expert_intermediate_dim or f)
    )
    gate = d if moe.shared_expert_gate else 0
    if moe.router_input_norm:  # router_scale [D], expert_scale [E]
        router += d + moe.num_experts
    if moe.dense_alongside:  # the dense feed-forward and three [D] norms
        gate += _ffn_params(config) + 3 * d
    return router + experts * expert + shared + gate


def classifier_params(config, num_classes: int, distillation_head=False) -> int:
    """Parameters of an image classifier's head (`ViTClassifier`): a dense
    layer with bias from the pooled width (`2 * hidden_dim` for
    `vision.pooling="token_and_mean"`) to `num_classes`, plus DeiT's
    `distillation_head` (`[hidden_dim, num_classes]` and a bias)."""
    d = config.hidden_dim
    pair = config.vision is not None and config.vision.pooling == "token_and_mean"
    width = 2 * d if pair else d
    return (width + 1 + (d + 1 if distillation_head else 0)) * num_classes
