"""The option groups of `TransformerConfig`: the sparse mixture of experts
(`moe`), image inputs (`vision`), DeBERTa's disentangled attention
(`disentangled`) and the Gated DeltaNet of "linear_attention" layers
(`linear_attention`). Import them from `keras_transformers.config`."""

from __future__ import annotations

from dataclasses import dataclass

from keras_transformers.config.serialization import _Group
from keras_transformers.config.validation import (
    _check_bool,
    _check_choice,
    _check_float,
    _check_int,
    _check_numbers,
    _fail,
)

DISPATCH_MODES = ("sparse", "dense")
POOLINGS = ("token", "mean", "token_and_mean")
ATTENTION_TERMS = ("c2p", "p2c")


@dataclass(frozen=True)
class MoEConfig(_Group):
    """Sparse mixture-of-experts feed-forward (Mixtral-style).

    Attributes:
        num_experts: experts per MoE layer (Mixtral: 8).
        num_experts_per_token: top-k experts each token is routed to.
        expert_intermediate_dim: each expert's width F; None = `intermediate_dim`.
        normalize_router_weights: renormalise the top-k weights (Mixtral does).
        router_aux_loss_coef: load-balancing loss coefficient (same in HF).
        router_z_loss_coef: router z-loss coefficient (ST-MoE).
        router_jitter: multiplicative jitter noise on router inputs in training.
        capacity_factor: expert capacity / even share of tokens; None: dropless.
        dispatch: "sparse" (grouped matmul) or "dense" (all experts: reference).
        every_k_layers: MoE in blocks k-1, 2k-1, ... (HF `decoder_sparse_step`).
        num_shared_experts: always-on experts added to the routed ones.
        shared_expert_intermediate_dim: each shared expert's width; None = F.
        shared_expert_gate: shared output times `sigmoid(x @ w)`, `w [D, 1]`.
        router_bias: a learned `[E]` bias on the router logits (gpt-oss).
        expert_bias: learned biases on the experts' projections, `[E, 2F]`
            (or `[E, F]`) and `[E, D]` (gpt-oss).
        glu_limit: clamped GLU (gpt-oss): the experts compute
            `act(min(gate, L)) * (clip(up, -L, L) + 1)` with `L = glu_limit`
            (gated experts only); None: `act(gate) * up`.
        router_input_norm: the router reads its input RMS-normalised times
            a learned `[D]` scale and `D**-0.5`, and a learned `[E]` scale
            multiplies the top-k weights (Gemma 4; `NormedRouterMoE`).
        dense_alongside: the dense feed-forward (`intermediate_dim`) runs
            beside the experts, each branch with its own norms, the router
            and experts reading the block's input (Gemma 4;
            `DenseAndExperts`).
    """

    num_experts: int = 8
    num_experts_per_token: int = 2
    expert_intermediate_dim: int | None = None
    normalize_router_weights: bool = True
    router_aux_loss_coef: float = 0.02
    router_z_loss_coef: float = 0.0
    router_jitter: float = 0.0
    capacity_factor: float | None = None
    dispatch: str = "sparse"
    every_k_layers: int = 1
    num_shared_experts: int = 0
    shared_expert_intermediate_dim: int | None = None
    shared_expert_gate: bool = False
    router_bias: bool = False
    expert_bias: bool = False
    glu_limit: float | None = None
    router_input_norm: bool = False
    dense_alongside: bool = False

    def __post_init__(self) -> None:
        _check_int("moe.num_experts", self.num_experts, 1)
        _check_bool("moe.router_input_norm", self.router_input_norm)
        _check_bool("moe.dense_alongside", self.dense_alongside)
        k, e = self.num_experts_per_token, self.num_experts
        _check_int("moe.num_experts_per_token", k, 1)
        if k > e:
            _fail("moe.num_experts_per_token", k, f"at most moe.num_experts={e}")
        _check_int("moe.expert_intermediate_dim", self.expert_intermediate_dim, 1, True)
        _check_bool("moe.normalize_router_weights", self.normalize_router_weights)
        _check_float("moe.router_aux_loss_coef", self.router_aux_loss_coef, 0.0)
        _check_float("moe.router_z_loss_coef", self.router_z_loss_coef, 0.0)
        _check_float("moe.router_jitter", self.router_jitter, 0.0, 1.0)
        if self.capacity_factor is not None:
            _check_float("moe.capacity_factor", self.capacity_factor, 1e-9)
        _check_choice("moe.dispatch", self.dispatch, DISPATCH_MODES)
        _check_int("moe.every_k_layers", self.every_k_layers, 1)
        _check_int("moe.num_shared_experts", self.num_shared_experts, 0)
        dim, gate = self.shared_expert_intermediate_dim, self.shared_expert_gate
        _check_int("moe.shared_expert_intermediate_dim", dim, 1, True)
        _check_bool("moe.shared_expert_gate", gate)
        if not self.num_shared_experts and (dim or gate):  # Qwen2-MoE: 1 gated
            _fail("moe.num_shared_experts", 0, ">= 1 with shared_expert_* set")
        _check_bool("moe.router_bias", self.router_bias)
        _check_bool("moe.expert_bias", self.expert_bias)
        if self.glu_limit is not None:
            _check_float("moe.glu_limit", self.glu_limit, 1e-9)


@dataclass(frozen=True)
class VisionConfig(_Group):
    """Image inputs split into patches (ViT).

    Attributes:
        image_size: input height and width in pixels (square images).
        patch_size: patch height and width; must divide `image_size`.
        num_channels: input channels (3 for RGB, 1 for grey).
            The model's token count follows the images it is given
            (`max_sequence_length` does not apply to image models).
        pooling: "token" (class token), "mean" (mean over patch tokens) or
            "token_and_mean" (both concatenated, `[B, 2 * D]`: the input of
            HF Dinov2ForImageClassification's head).
        class_token: prepend a learned class token.
        distillation_token: a second learned token after the class token
            (DeiT's distillation token; its position embedding is the
            table's second row). Needs `class_token`.
        register_tokens: learned register tokens after the class (and
            distillation) token, before the patches (DINOv3); pooling
            leaves them out.
        rescale: input pixels are multiplied by this first (1/255 for a
            model that takes raw 0..255 pixels; 1.0 for prepared inputs).
        mean: per-channel (or one) value subtracted after `rescale`; None = 0.
        std: per-channel (or one) divisor after `mean`; None = 1.

    The model computes `(images * rescale - mean) / std`, so a saved model
    carries its own input normalisation.
    """

    image_size: int = 224
    patch_size: int = 16
    num_channels: int = 3
    pooling: str = "token"
    class_token: bool = True
    distillation_token: bool = False
    register_tokens: int = 0
    rescale: float = 1.0
    mean: tuple | None = None
    std: tuple | None = None

    def __post_init__(self) -> None:
        _check_int("vision.image_size", self.image_size, 1)
        _check_int("vision.patch_size", self.patch_size, 1)
        if self.image_size % self.patch_size:
            _fail(
                "vision.image_size",
                self.image_size,
                f"a multiple of vision.patch_size={self.patch_size}",
            )
        _check_int("vision.num_channels", self.num_channels, 1)
        _check_choice("vision.pooling", self.pooling, POOLINGS)
        _check_bool("vision.class_token", self.class_token)
        _check_bool("vision.distillation_token", self.distillation_token)
        _check_int("vision.register_tokens", self.register_tokens, 0)
        if self.pooling != "mean" and not self.class_token:
            _fail("vision.pooling", self.pooling, "'mean' when class_token=False")
        if self.distillation_token and not self.class_token:
            _fail("vision.distillation_token", True, "False when class_token=False")
        _check_float("vision.rescale", self.rescale, 1e-12)
        for name in ("mean", "std"):
            values = _check_numbers(
                f"vision.{name}", getattr(self, name), (1, self.num_channels)
            )
            if name == "std" and values and min(values) <= 0:
                _fail("vision.std", self.std, "positive numbers")
            object.__setattr__(self, name, values)

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def num_prefix_tokens(self) -> int:
        """Learned tokens before the patches (class, distillation,
        registers)."""
        return (
            int(self.class_token) + int(self.distillation_token) + self.register_tokens
        )


@dataclass(frozen=True)
class DisentangledConfig(_Group):
    """DeBERTa's disentangled attention (`position_embedding="disentangled"`):
    the content-to-content logits plus position terms read from one learned
    table of relative-position embeddings `[2 * span, D]` shared by the
    blocks; all terms are scaled by `1 / sqrt(H * (1 + len(attention_terms)))`.

    Attributes:
        position_buckets: log buckets per direction (`span`, Hugging Face
            `position_buckets`): distances below `position_buckets // 2` are
            exact, longer ones share log-spaced buckets up to
            `max_relative_positions`; 0 = no buckets (`span` is then
            `max_relative_positions` and longer distances are clipped).
        max_relative_positions: the longest distance told apart.
        share_att_key: position queries and keys come from each block's own
            query and key projections applied to the table (DeBERTa-v3);
            False gives each block separate `position_key` / `position_query`
            projections.
        attention_terms: the position terms (Hugging Face `pos_att_type`):
            "c2p" (each query against the embedding of its distance to the
            key) and "p2c" (each key against the embedding of the distance).
        norm_relative_embeddings: a LayerNorm (`norm_epsilon`) on the table
            (Hugging Face `norm_rel_ebd="layer_norm"`).
    """

    position_buckets: int = 256
    max_relative_positions: int = 512
    share_att_key: bool = True
    attention_terms: tuple = ATTENTION_TERMS
    norm_relative_embeddings: bool = True

    def __post_init__(self) -> None:
        buckets, longest = self.position_buckets, self.max_relative_positions
        _check_int("disentangled.position_buckets", buckets, 0)
        _check_int("disentangled.max_relative_positions", longest, 1)
        if buckets and buckets < 4:
            _fail("disentangled.position_buckets", buckets, "0 (no buckets) or >= 4")
        if buckets and longest < buckets // 2 + 2:
            _fail(
                "disentangled.max_relative_positions",
                longest,
                f">= position_buckets // 2 + 2 = {buckets // 2 + 2} (log buckets "
                "past the exact distances)",
            )
        _check_bool("disentangled.share_att_key", self.share_att_key)
        _check_bool(
            "disentangled.norm_relative_embeddings", self.norm_relative_embeddings
        )
        terms = self.attention_terms
        if isinstance(terms, str) or not isinstance(terms, (list, tuple)):
            _fail("disentangled.attention_terms", terms, 'a list of "c2p", "p2c"')
        if len(set(terms)) != len(terms) or set(terms) - set(ATTENTION_TERMS):
            _fail(
                "disentangled.attention_terms",
                terms,
                f"distinct values among {list(ATTENTION_TERMS)}",
            )
        object.__setattr__(self, "attention_terms", tuple(terms))

    @property
    def span(self) -> int:
        """Relative positions each side; the table has `2 * span` rows."""
        return self.position_buckets or self.max_relative_positions

    @property
    def scale_factor(self) -> int:
        """`1 + len(attention_terms)`: logits are divided by `sqrt(H * this)`."""
        return 1 + len(self.attention_terms)


@dataclass(frozen=True)
class LinearAttentionConfig(_Group):
    """The Gated DeltaNet token mixer of a stack's "linear_attention" layers
    (Qwen3-Next, Qwen3.5; see `keras_transformers.layers.GatedDeltaNet`):
    query / key / value projections, a causal depthwise convolution with
    SiLU, L2-normalised queries and keys, the gated delta rule (per-head
    decay and write strength), an output gate and a gated RMSNorm.

    Attributes:
        num_key_heads: query / key heads (HF `linear_num_key_heads`).
        num_value_heads: value heads, a multiple of `num_key_heads` (each
            query / key head serves `num_value_heads // num_key_heads`
            value heads; HF `linear_num_value_heads`).
        key_head_dim: per-head query / key size (HF `linear_key_head_dim`).
        value_head_dim: per-head value size (HF `linear_value_head_dim`).
        conv_kernel_size: taps of the causal convolution (HF
            `linear_conv_kernel_dim`).
    """

    num_key_heads: int = 16
    num_value_heads: int = 32
    key_head_dim: int = 128
    value_head_dim: int = 128
    conv_kernel_size: int = 4

    def __post_init__(self) -> None:
        for name in ("num_key_heads", "num_value_heads", "key_head_dim"):
            _check_int(f"linear_attention.{name}", getattr(self, name), 1)
        _check_int("linear_attention.value_head_dim", self.value_head_dim, 1)
        _check_int("linear_attention.conv_kernel_size", self.conv_kernel_size, 1)
        if self.num_value_heads % self.num_key_heads:
            _fail(
                "linear_attention.num_value_heads",
                self.num_value_heads,
                f"a multiple of linear_attention.num_key_heads={self.num_key_heads}",
            )

    @property
    def conv_dim(self) -> int:
        """Channels of the convolution: queries, keys and values."""
        keys = self.num_key_heads * self.key_head_dim
        return 2 * keys + self.num_value_heads * self.value_head_dim


def check_disentangled(config) -> None:
    """The `disentangled` group: set (by default when None) exactly with
    `position_embedding="disentangled"`, which only encoders have."""
    group = config.disentangled
    wanted = config.position_embedding == "disentangled"
    if group is not None and not isinstance(group, DisentangledConfig):
        _fail("disentangled", group, "a DisentangledConfig or None")
    if group is not None and not wanted:
        _fail("disentangled", group, 'None unless position_embedding="disentangled"')
    if wanted and config.stacks != "encoder":
        _fail("position_embedding", "disentangled", 'stacks="encoder"')
    if wanted and group is None:
        object.__setattr__(config, "disentangled", DisentangledConfig())


# The config's groups: field name -> its dataclass.
GROUPS = {
    "moe": MoEConfig,
    "vision": VisionConfig,
    "disentangled": DisentangledConfig,
    "linear_attention": LinearAttentionConfig,
}


def check_group_types(config) -> None:
    """Each group of `config` but `disentangled` (`check_disentangled`) is
    None or its dataclass; a plain dict gets the fix in its message."""
    for group, cls in GROUPS.items():
        value = getattr(config, group)
        if group == "disentangled" or value is None or isinstance(value, cls):
            continue
        how = f"{cls.__name__}(**{group})" if isinstance(value, dict) else None
        hint = f" (wrap the dict: {group}={how})" if how else ""
        _fail(group, value, f"a {cls.__name__} or None{hint}")
