"""`TransformerConfig`: the schema every model is built from (see the
package docstring for the glossary)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields

from keras_transformers.config.groups import (  # noqa: F401 (public names)
    ATTENTION_TERMS,
    DISPATCH_MODES,
    GROUPS,
    POOLINGS,
    DisentangledConfig,
    LinearAttentionConfig,
    MoEConfig,
    VisionConfig,
    check_disentangled,
    check_group_types,
)
from keras_transformers.config.layer_types import (
    check_layer_inputs,
    check_layer_types,
    check_windows,
)
from keras_transformers.config.param_count import count_params
from keras_transformers.config.rotary_checks import (
    check_layer_rotaries,
    check_rope_scaling,
    check_rotary_fraction,
)
from keras_transformers.config.serialization import _Group
from keras_transformers.config.validation import (
    _check_attention_knobs,
    _check_bool,
    _check_choice,
    _check_float,
    _check_int,
    _check_remat,
    _fail,
)

STACKS = ("decoder", "encoder", "encoder_decoder")
NORM_POSITIONS = ("pre", "post", "sandwich", "output", "parallel")
NORM_TYPES = ("layer", "rms", "layer_no_bias")
QK_NORMS = (False, True, "projection")
POSITION_EMBEDDINGS = (
    "learned",
    "sinusoidal",
    "rotary",
    "relative",
    "disentangled",
    "transformer_xl",
    "none",
)
ACTIVATIONS = ("gelu", "gelu_approximate", "relu", "silu", "quick_gelu")
POOLER_ACTIVATIONS = ("tanh", *ACTIVATIONS)


@dataclass(frozen=True)
class TransformerConfig(_Group):
    """Hyperparameters of every model in the library.

    Attributes:
        vocabulary_size: number of token ids (0 for image models).
        num_layers: transformer blocks (the encoder stack for seq2seq).
        hidden_dim: model width D.
        num_heads: attention (query) heads N.
        intermediate_dim: feed-forward hidden size F.
        max_sequence_length: longest sequence the model accepts.
        num_kv_heads: key/value heads K for grouped-query attention; None = MHA.
        head_dim: per-head size H; None = hidden_dim // num_heads.
        stacks: "decoder" (causal LM), "encoder" or "encoder_decoder".
        num_decoder_layers: decoder blocks for "encoder_decoder"; None = num_layers.
        norm_position: "pre" (x + f(norm(x))), "post" (norm(x + f(x))),
            "sandwich" (x + norm'(f(norm(x))): a second norm on each
            sub-layer's output, as Gemma 2 and 3), "output" (x + norm(f(x)):
            the one norm on the output, as OLMo 2) or "parallel"
            (x + attn(norm(x)) + ff(norm'(x)): both sub-layers read the
            block's input, as GPT-NeoX and Pythia; not with cross-attention).
        norm_type: "layer" (LayerNorm), "rms" (RMSNorm) or "layer_no_bias"
            (LayerNorm without its bias, ModernBERT's `norm_bias=False`).
        norm_epsilon: epsilon of every norm.
        final_norm: a norm after the last block (pre-norm stacks).
        first_attention_norm: False: the first block's self-attention reads
            its input without a norm (ModernBERT: the embedding norm's output).
        embedding_norm: a norm after the embeddings (BERT).
        pooler: a dense layer on the first token's final state (BERT's
            `pooled_output`).
        pooler_activation: the pooler's activation: "tanh" (BERT) or one of
            `activation`'s names (DeBERTa's ContextPooler: "gelu").
        position_embedding: "learned", "sinusoidal", "rotary", "relative"
            (T5's bucketed bias on self-attention logits), "transformer_xl"
            (Transformer-XL's sinusoidal relative encodings with per-layer
            content and position biases; decoders only) or "none".
        memory_length: Transformer-XL segment memory in training: each block
            also attends to its input hidden states of this many earlier
            positions (kept without gradient; see `GPTBackbone.reset_memory`).
            0 = no memory. Needs position_embedding="transformer_xl".
        eval_memory_length: the memory outside training (evaluation,
            prediction, generation); None = memory_length.
        clamp_len: "transformer_xl" distances beyond this share its encoding;
            None = no clamp.
        relative_attention_buckets: rows of each stack's "relative" table.
        relative_attention_max_distance: "relative" distances >= this share one bucket.
        sinusoidal_interleave: sinusoidal layout: sin/cos interleaved per
            feature pair (the paper's formula) or sines in the first half of
            the features and cosines in the second (tensor2tensor, fairseq,
            Marian).
        separate_decoder_positions: "encoder_decoder" with learned positions
            only: the decoder has its own position table (BART's
            `encoder.embed_positions` and `decoder.embed_positions`) instead
            of reading the encoder's.
        rope_max_wavelength: rotary base (theta). With `vision`, "rotary"
            positions are 2-D, on the patch grid (DINOv3; see
            `keras_transformers.layers.patch_rotary`): no learned table.
        rope_scaling_factor: linear position-interpolation factor for rotary.
        rope_scaling: a Hugging Face rotary scaling for long context (its
            `rope_parameters` without `rope_theta`): `llama3`, `yarn` or
            `longrope` with their fields (see
            `keras_transformers.rotary_scaling`); None: none.
        rotary_fraction: the part of each head that rotary positions rotate
            (its first `int(head_dim * rotary_fraction)` features; GPT-NeoX's
            rotary_pct, Phi's partial_rotary_factor); 1.0: all.
        activation: feed-forward activation: "gelu", "gelu_approximate"
            (tanh form, GPT-2's gelu_new), "relu", "silu" or "quick_gelu"
            (`x * sigmoid(1.702 x)`).
        gated_feed_forward: gated (GLU) feed-forward, e.g. SwiGLU with "silu".
        use_bias: biases in attention and feed-forward projections.
        qkv_bias: biases on the query, key and value projections even when
            `use_bias` is False (Qwen2: `[N * H]` and `[K * H]` biases, none
            on the attention output or the feed-forward).
        key_bias: False drops the key projection's bias when the others
            have theirs (DINOv3: query and value biases, no key bias).
        qk_norm: RMSNorms (`norm_epsilon`) on queries and keys before rotary
            positions: True over each head's H features (weights `[H]`,
            Qwen3's `q_norm` / `k_norm`), "projection" over all heads'
            features of the projection (weights `[N * H]` and `[K * H]`,
            OLMo 2's), or False for none.
        layer_scale: LayerScale: each block multiplies the output of each
            residual branch (attention, feed-forward) by a learned
            per-channel scale `[D]` before adding it, initialised to this
            value (DINOv2's `layerscale_value`); None = no scale.
        tie_embeddings: share input embedding and output projection (for
            "encoder_decoder": encoder, decoder and output share one matrix).
        logits_bias: a learned bias on the output logits (Marian's
            `final_logits_bias`).
        scale_embeddings: multiply token embeddings by sqrt(hidden_dim) (2017).
        scale_logits: multiply the output layer's input by hidden_dim**-0.5 (T5).
        attention_scale: query-key logits factor; None = 1/sqrt(H) (T5: 1.0).
        num_segments: segment (token type) vocabulary; 0 = none (BERT: 2).
        sliding_window: attend to at most this many previous tokens; None = all.
            Without `layer_types` it applies to every layer; with them, to
            the "sliding_attention" layers.
        layer_types: per layer (num_layers entries), its type:
            "full_attention", "sliding_attention" or "no_rope_attention"
            (full attention without rotary positions; see
            `keras_transformers.config.layer_types`); None = all layers alike.
        layer_settings: per layer type, the settings that differ from this
            config's (`sliding_window`, `rope_max_wavelength`,
            `rope_scaling_factor`, `rope_scaling`, `rotary`,
            `rotary_fraction`), e.g. Gemma 3's
            `{"sliding_attention": {"rope_max_wavelength": 10000.0}}`.
        attention_softcap: soft-capping of the attention logits,
            `cap * tanh(logits / cap)` after scaling (Gemma 2); None = none.
        logit_softcap: soft-capping of the output logits (Gemma 2); None = none.
        attention_sinks: a learned logit per query head (`sinks [N]`) joins
            each query's attention scores as one more column before the
            softmax, which is dropped after it (gpt-oss).
        attention_output_gate: self-attention's output (per head, before the
            output projection) times `sigmoid(x @ W_gate)`, a gate projected
            from the block input as the queries are (Qwen3-Next, Qwen3.5:
            the second half of each head of `q_proj`).
        value_norm, num_kv_shared_layers, kv_shared_intermediate_dim,
            per_layer_input_dim, per_layer_vocabulary_size, layer_output_scale:
            Gemma 4's knobs, see `keras_transformers.config.layer_types`.
        dropout: dropout on embeddings and every sub-layer output.
        attention_dropout: dropout on attention probabilities.
        initializer_range: std of the truncated-normal weight initializer (a
            tied table with `scale_logits` is drawn with std 1, as T5 does).
        remat: rematerialise each block in training: True keeps its input only
            for the backward pass, "matmuls" its weight products' outputs too.
        attention_block_size: memory-efficient attention in blocks of this
            many queries (see `MultiHeadAttention`'s `block_size`); 0: never;
            None (default): automatic for long sequences.
        pad_token_id: id used to pad sequences.
        bos_token_id: id that starts a sequence (None if unused); for
            "encoder_decoder", the decoder start token.
        eos_token_id: id that ends generation (None if unused).
        moe: sparse mixture-of-experts group (None = dense feed-forward).
        linear_attention: the Gated DeltaNet of the "linear_attention"
            layers (a `LinearAttentionConfig`; decoders whose `layer_types`
            name that type); None = no such layers.
        disentangled: DeBERTa's disentangled attention (a `DisentangledConfig`)
            of `position_embedding="disentangled"` (encoders: no absolute
            positions, relative ones in every self-attention); None there
            means the defaults (DeBERTa-v3's).
        token_dropout_mask_id: ESM's token dropout at inference: embeddings
            of this (mask) id are zeroed and every embedding scaled by
            `0.88 / (1 - the mask fraction of the real tokens)`; None = off.
        vision: image-patch group (None = token inputs).
        embedding_dim: encoders: width E of the embeddings and their norm,
            projected to `hidden_dim` by a dense layer (ALBERT, ELECTRA's
            `embedding_size`; masked-LM heads work in E); None = no projection.
        num_layer_groups: encoders: G distinct blocks, each run by
            `num_layers // G` consecutive layers (ALBERT's shared weights);
            None = every layer its own.
    """

    vocabulary_size: int
    num_layers: int
    hidden_dim: int
    num_heads: int
    intermediate_dim: int
    max_sequence_length: int = 1024
    num_kv_heads: int | None = None
    head_dim: int | None = None
    stacks: str = "decoder"
    num_decoder_layers: int | None = None
    norm_position: str = "pre"
    norm_type: str = "layer"
    norm_epsilon: float = 1e-5
    final_norm: bool = True
    first_attention_norm: bool = True
    embedding_norm: bool = False
    pooler: bool = False
    pooler_activation: str = "tanh"
    position_embedding: str = "learned"
    sinusoidal_interleave: bool = True
    memory_length: int = 0
    eval_memory_length: int | None = None
    clamp_len: int | None = None
    relative_attention_buckets: int = 32
    relative_attention_max_distance: int = 128
    separate_decoder_positions: bool = False
    rope_max_wavelength: float = 10000.0
    rope_scaling_factor: float = 1.0
    rope_scaling: dict | None = None
    rotary_fraction: float = 1.0
    activation: str = "gelu"
    gated_feed_forward: bool = False
    use_bias: bool = True
    qkv_bias: bool = False
    key_bias: bool = True
    qk_norm: bool | str = False
    layer_scale: float | None = None
    tie_embeddings: bool = True
    logits_bias: bool = False
    scale_embeddings: bool = False
    scale_logits: bool = False
    attention_scale: float | None = None
    num_segments: int = 0
    sliding_window: int | None = None
    layer_types: tuple | None = None
    layer_settings: dict | None = None
    attention_softcap: float | None = None
    logit_softcap: float | None = None
    attention_sinks: bool = False
    attention_output_gate: bool = False
    value_norm: bool = False
    num_kv_shared_layers: int = 0
    kv_shared_intermediate_dim: int | None = None
    per_layer_input_dim: int | None = None
    per_layer_vocabulary_size: int | None = None
    layer_output_scale: bool = False
    dropout: float = 0.0
    attention_dropout: float = 0.0
    initializer_range: float = 0.02
    remat: bool | str = False
    attention_block_size: int | None = None
    pad_token_id: int = 0
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    token_dropout_mask_id: int | None = None
    moe: MoEConfig | None = field(default=None)
    linear_attention: LinearAttentionConfig | None = field(default=None)
    vision: VisionConfig | None = field(default=None)
    disentangled: DisentangledConfig | None = field(default=None)
    embedding_dim: int | None = None
    num_layer_groups: int | None = None

    def __post_init__(self) -> None:
        _check_int("vocabulary_size", self.vocabulary_size, 0 if self.vision else 1)
        _check_int("num_layers", self.num_layers, 1)
        _check_int("hidden_dim", self.hidden_dim, 1)
        _check_int("num_heads", self.num_heads, 1)
        _check_int("intermediate_dim", self.intermediate_dim, 1)
        _check_int("max_sequence_length", self.max_sequence_length, 1)
        _check_int("num_kv_heads", self.num_kv_heads, 1, optional=True)
        if self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
            _fail(
                "num_kv_heads",
                self.num_kv_heads,
                f"a divisor of num_heads={self.num_heads}",
            )
        _check_int("head_dim", self.head_dim, 1, optional=True)
        _check_int("attention_block_size", self.attention_block_size, 0, optional=True)
        if self.head_dim is None and self.hidden_dim % self.num_heads:
            _fail(
                "num_heads",
                self.num_heads,
                f"a divisor of hidden_dim={self.hidden_dim} (or set head_dim)",
            )
        _check_choice("stacks", self.stacks, STACKS)
        _check_int("num_decoder_layers", self.num_decoder_layers, 1, optional=True)
        _check_choice("norm_position", self.norm_position, NORM_POSITIONS)
        if self.norm_position == "parallel" and self.stacks == "encoder_decoder":
            _fail(
                "norm_position",
                "parallel",
                f'one of {NORM_POSITIONS[:-1]} with stacks="encoder_decoder" '
                "(a decoder block with cross-attention runs its sub-layers in turn)",
            )
        if self.qk_norm not in QK_NORMS or not isinstance(self.qk_norm, (bool, str)):
            _fail("qk_norm", self.qk_norm, "True (per head), 'projection' or False")
        _check_choice("norm_type", self.norm_type, NORM_TYPES)
        _check_float("norm_epsilon", self.norm_epsilon, 0.0)
        for name in (
            "final_norm",
            "first_attention_norm",
            "embedding_norm",
            "pooler",
            "gated_feed_forward",
            "use_bias",
            "qkv_bias",
            "key_bias",
            "tie_embeddings",
            "logits_bias",
            "scale_embeddings",
            "scale_logits",
            "sinusoidal_interleave",
            "separate_decoder_positions",
            "attention_sinks",
            "attention_output_gate",
        ):
            _check_bool(name, getattr(self, name))
        _check_remat(self.remat)
        if self.separate_decoder_positions and (
            self.stacks != "encoder_decoder" or self.position_embedding != "learned"
        ):
            _fail(
                "separate_decoder_positions",
                True,
                'False unless stacks="encoder_decoder" and position_embedding="learned"',
            )
        _check_choice(
            "position_embedding", self.position_embedding, POSITION_EMBEDDINGS
        )
        _check_attention_knobs(self)
        if self.layer_scale is not None:
            _check_float("layer_scale", self.layer_scale, 0.0)
        _check_float("rope_max_wavelength", self.rope_max_wavelength, 1.0)
        _check_float("rope_scaling_factor", self.rope_scaling_factor, 1e-9)
        _check_choice("activation", self.activation, ACTIVATIONS)
        _check_int("num_segments", self.num_segments, 0)
        _check_int("sliding_window", self.sliding_window, 1, optional=True)
        if isinstance(self.layer_types, list):
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
        check_layer_types(self, _fail)
        check_windows(self, _fail)
        check_layer_inputs(self, _fail)
        check_layer_rotaries(self)
        for name in ("attention_softcap", "logit_softcap"):
            if getattr(self, name) is not None:
                _check_float(name, getattr(self, name), 1e-6)
        _check_float("dropout", self.dropout, 0.0, 1.0)
        _check_float("attention_dropout", self.attention_dropout, 0.0, 1.0)
        _check_float("initializer_range", self.initializer_range, 0.0)
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
            value = getattr(self, name)
            optional = name != "pad_token_id"
            _check_int(name, value, 0, optional=optional)
            if (
                value is not None
                and self.vocabulary_size
                and value >= self.vocabulary_size
            ):
                _fail(name, value, f"< vocabulary_size={self.vocabulary_size}")
        check_group_types(self)
        _check_choice("pooler_activation", self.pooler_activation, POOLER_ACTIVATIONS)
        check_disentangled(self)
        if self.rotary and self.resolved_head_dim % 2:
            _fail(
                "head_dim",
                self.resolved_head_dim,
                "an even number with rotary positions",
            )
        check_rotary_fraction(self, self.rotary_fraction, "rotary_fraction")
        if self.rope_scaling is not None:
            check_rope_scaling(self)

    @staticmethod
    def _groups():
        return GROUPS

    # ----------------------------------------------------------- derived values
    @property
    def resolved_num_kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim or self.hidden_dim // self.num_heads

    @property
    def resolved_attention_scale(self) -> float | None:
        """`attention_scale`; when None with disentangled attention, its
        `1 / sqrt(H * disentangled.scale_factor)` (None: `1 / sqrt(H)`)."""
        if self.attention_scale is None and self.disentangled is not None:
            factor = self.resolved_head_dim * self.disentangled.scale_factor
            return factor**-0.5
        return self.attention_scale

    @property
    def resolved_num_decoder_layers(self) -> int:
        return self.num_decoder_layers or self.num_layers

    @property
    def rotary(self) -> bool:
        return self.position_embedding == "rotary"

    def moe_layer(self, index: int) -> bool:
        """Whether block `index` (0-based) of a decoder uses the MoE layer."""
        return self.moe is not None and (index + 1) % self.moe.every_k_layers == 0

    # ------------------------------------------------------- parameter counting
    def num_params(self) -> int:
        """Closed-form parameter count of the model this config describes.

        Counts embeddings, all blocks, norms and the output head (the LM head
        when untied). No weights are allocated, so this answers for any size.
        """
        return count_params(self, active=False)

    def num_active_params(self) -> int:
        """Parameters used per token: only `num_experts_per_token` experts of
        each MoE layer count. Equals `num_params()` for dense models."""
        return count_params(self, active=True)

    def __repr__(self) -> str:
        changed = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.default is dataclasses.MISSING or getattr(self, f.name) != f.default
        }
        inner = ", ".join(f"{k}={v!r}" for k, v in changed.items())
        return f"TransformerConfig({inner})"


__all__ = ["TransformerConfig"]
