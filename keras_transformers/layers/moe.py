"""Sparse mixture-of-experts feed-forward (Mixtral / Switch / Qwen-MoE style)."""

from __future__ import annotations

import keras
from keras import ops

from keras_transformers import backend
from keras_transformers.backend import call_layer
from keras_transformers.backend import moe as moe_backend
from keras_transformers.layers.core import Dense
from keras_transformers.layers.feed_forward import FeedForward, activation_fn
from keras_transformers.layers.moe_dispatch import (
    dense_experts,
    expert_capacity,
    sparse_experts,
)
from keras_transformers.layers.moe_quantization import (
    dequantized_kernel,
    quantize_experts,
)
from keras_transformers.layers.nf4 import BLOCK_SIZE
from keras_transformers.layers.serializable import serializable

DISPATCH = ("sparse", "dense")


@serializable
class SparseMoE(keras.layers.Layer):
    """Top-k routed experts: router -> softmax -> top-k -> experts -> combine.

    The router (a bias-free linear map, float32 softmax) picks
    `num_experts_per_token` experts per token; their probabilities,
    renormalised to sum to one when `normalize_router_weights`, weight the
    experts' outputs. Experts are feed-forward networks (gated SiLU for
    Mixtral) with stacked weights: `expert_gate_up [E, D, 2F]` (gate then up
    halves; `[E, D, F]` when not gated) and `expert_down [E, F, D]`.

    Training adds, through `add_loss` and only when `training` is true:
    `router_aux_loss_coef * aux` with the Switch / Mixtral load-balancing
    loss `aux = E * sum_e f_e * P_e` (f_e: fraction of the tokens' top-k
    choices that go to expert e, summed over the k choices; P_e: mean router
    probability; both over non-padding tokens; minimum k for perfectly
    balanced routing, 1 for top-1), and `router_z_loss_coef * z` with the
    ST-MoE z-loss `z = mean(logsumexp(router_logits) ** 2)`. Router jitter
    multiplies the router's input by `U(1 - eps, 1 + eps)` in training.

    Each call with `training` given (fit / evaluate) also writes the router
    statistics to non-trainable variables: `aux_loss`, `z_loss`,
    `expert_load [E]` (fraction of routed assignments per expert; sums to
    one) and `dropped_fraction` (share of real tokens' assignments dropped
    by the capacity). Task models report them in `fit()` logs.

    Args:
        num_experts: E.
        num_experts_per_token: k (top-k).
        intermediate_dim: F, hidden size of each expert.
        activation: expert activation name ("silu" for Mixtral).
        gated: gated (GLU) experts. Defaults to True.
        normalize_router_weights: renormalise the top-k weights.
        router_aux_loss_coef: load-balancing loss coefficient.
        router_z_loss_coef: z-loss coefficient.
        router_jitter: jitter noise eps (0 = off).
        capacity_factor: C = ceil(capacity_factor * N * k / E) assignments
            per expert; the overflow is dropped. None = dropless.
        dispatch: "sparse" (grouped matmul; cost scales with k) or "dense"
            (every expert on every token; the reference).
        num_shared_experts: always-on experts (one feed-forward of width
            `num_shared_experts * S`, gated like the routed experts) added to
            the routed output.
        shared_expert_intermediate_dim: S, hidden size of each shared
            expert; None means F (Qwen2-MoE:
            `shared_expert_intermediate_size`).
        shared_expert_gate: multiply the shared output per token by
            `sigmoid(x @ w)` with `w [D, 1]`, no bias (Qwen2-MoE).
        router_bias: a learned `router_bias [E]` on the router logits.
            With `normalize_router_weights`, the top-k weights are then a
            softmax over the k chosen logits (gpt-oss).
        expert_bias: learned expert biases `expert_gate_up_bias [E, 2F]`
            (`[E, F]` when not gated) and `expert_down_bias [E, D]`.
        glu_limit: L, a clamped GLU (gpt-oss, gated experts only):
            `act(min(gate, L)) * (clip(up, -L, L) + 1)`; None: `act(gate) * up`.
        kernel_initializer: initializer of all kernels.
        seed: seed of the jitter noise.

    Call arguments:
        x: `[B, T, D]`.
        padding_mask: `[B, T]`, 1 for real tokens (losses and statistics
            ignore padding; under a capacity, padding is dropped first).
        training: enables jitter and the auxiliary losses.
        router_input: `[B, T, D]` the router reads instead of `x`.

    Returns:
        `[B, T, D]`.

    Examples:
        >>> moe = SparseMoE(num_experts=4, num_experts_per_token=2, intermediate_dim=32)
        >>> tuple(moe(keras.ops.ones((2, 5, 16))).shape)
        (2, 5, 16)
    """

    # Logical axes of each weight (see keras_transformers.distribution).
    # The gated experts' kernel is [gate | up] along its last axis: split by
    # experts only, so a device holds both halves of the experts it has.
    weight_axes = {
        "expert_gate_up": ("experts", "embed", "gate_up"),
        "expert_gate_up_bias": ("experts", "gate_up"),
        "expert_down": ("experts", "mlp", "embed"),
        "expert_down_bias": ("experts", "embed"),
        "router": None,
        "router_bias": None,
        "shared_expert_gate/kernel": None,
        **dict.fromkeys(("aux_loss", "z_loss", "dropped_fraction", "expert_load")),
    }

    accepts_padding_mask = True

    def __init__(
        self,
        num_experts,
        num_experts_per_token,
        intermediate_dim,
        activation="silu",
        gated=True,
        normalize_router_weights=True,
        router_aux_loss_coef=0.0,
        router_z_loss_coef=0.0,
        router_jitter=0.0,
        capacity_factor=None,
        dispatch="sparse",
        num_shared_experts=0,
        shared_expert_intermediate_dim=None,
        shared_expert_gate=False,
        router_bias=False,
        expert_bias=False,
        glu_limit=None,
        kernel_initializer="glorot_uniform",
        seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not 1 <= num_experts_per_token <= num_experts:
            raise ValueError(
                f"`num_experts_per_token` must be in [1, num_experts={num_experts}]. "
                f"Received: num_experts_per_token={num_experts_per_token}. Route each "
                "token to at most as many experts as there are."
            )
        if capacity_factor is not None and not capacity_factor > 0:
            raise ValueError(
                f"`capacity_factor` must be > 0 (or None for dropless routing). "
                f"Received: capacity_factor={capacity_factor}"
            )
        if not num_shared_experts and (
            shared_expert_intermediate_dim or shared_expert_gate
        ):
            raise ValueError(
                "`shared_expert_intermediate_dim` and `shared_expert_gate` describe "
                "shared experts: set `num_shared_experts` >= 1. Received: "
                f"num_shared_experts={num_shared_experts}, shared_expert_intermediate_dim="
                f"{shared_expert_intermediate_dim}, shared_expert_gate={shared_expert_gate}"
            )
        if glu_limit is not None and not gated:
            raise ValueError(
                "`glu_limit` clamps the gate and up halves of gated experts: set "
                f"gated=True or glu_limit=None. Received: glu_limit={glu_limit}"
            )
        if dispatch not in DISPATCH:
            raise ValueError(
                f"`dispatch` must be one of {DISPATCH}. Received: dispatch={dispatch!r}"
            )
        self.num_experts = num_experts
        self.num_experts_per_token = num_experts_per_token
        self.intermediate_dim = intermediate_dim
        self.activation = activation
        self.activation_fn = activation_fn(activation)
        self.gated = gated
        self.normalize_router_weights = normalize_router_weights
        self.router_aux_loss_coef = router_aux_loss_coef
        self.router_z_loss_coef = router_z_loss_coef
        self.router_jitter = router_jitter
        self.capacity_factor = capacity_factor
        self.dispatch = dispatch
        self.num_shared_experts = num_shared_experts
        self.shared_expert_intermediate_dim = shared_expert_intermediate_dim
        self.shared_expert_gate = shared_expert_gate
        self.router_bias = router_bias
        self.expert_bias = expert_bias
        self.glu_limit = glu_limit
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    def build(self, input_shape):
        d, e, f = input_shape[-1], self.num_experts, self.intermediate_dim
        init = self.kernel_initializer
        # Never autocast: the router multiplies in float32 (see `route`).
        self.router_kernel = self.add_weight(
            name="router", shape=(d, e), initializer=init, autocast=False
        )
        width = 2 * f if self.gated else f
        self.expert_gate_up = self.add_weight(
            name="expert_gate_up", shape=(e, d, width), initializer=init
        )
        self.expert_down = self.add_weight(
            name="expert_down", shape=(e, f, d), initializer=init
        )
        self.router_bias_weight = self.expert_gate_up_bias = None
        self.expert_down_bias = None
        if self.router_bias:
            self.router_bias_weight = self.add_weight(
                name="router_bias", shape=(e,), initializer="zeros", autocast=False
            )
        if self.expert_bias:
            self.expert_gate_up_bias = self.add_weight(
                name="expert_gate_up_bias", shape=(e, width), initializer="zeros"
            )
            self.expert_down_bias = self.add_weight(
                name="expert_down_bias", shape=(e, d), initializer="zeros"
            )
        self.shared_experts = self.shared_gate = None
        if self.num_shared_experts:
            shared = self.shared_expert_intermediate_dim or f
            self.shared_experts = FeedForward(
                self.num_shared_experts * shared,
                activation=self.activation,
                gated=self.gated,
                use_bias=False,
                kernel_initializer=init,
                dtype=self.dtype_policy,
                name="shared_experts",
            )
            self.shared_experts.build(input_shape)
        if self.shared_expert_gate:
            self.shared_gate = Dense(
                1,
                use_bias=False,
                kernel_initializer=init,
                dtype=self.dtype_policy,
                name="shared_expert_gate",
            )
            self.shared_gate.build(input_shape)
        stat = lambda name, shape=(): self.add_weight(  # noqa: E731
            name=name,
            shape=shape,
            initializer="zeros",
            trainable=False,
            dtype="float32",
        )
        self.aux_loss = stat("aux_loss")
        self.z_loss = stat("z_loss")
        self.expert_load = stat("expert_load", (e,))
        self.dropped_fraction = stat("dropped_fraction")
        self.built = True

    # ------------------------------------------------------------- routing
    def route(self, tokens, training=None):
        """`tokens [N, D]` -> `(logits [N, E] float32, probs [N, E] float32,
        expert_ids [N, k], weights [N, k] float32)`."""
        router_in = tokens
        if training and self.router_jitter > 0:
            eps = self.router_jitter
            router_in = ops.cast(tokens, "float32") * keras.random.uniform(
                ops.shape(tokens), 1.0 - eps, 1.0 + eps, seed=self.seed_generator
            )
        return moe_backend.route_top_k(
            router_in,
            self.router_kernel,
            self.num_experts_per_token,
            self.normalize_router_weights,
            self.router_bias_weight,
        )

    def apply_experts(self, x, matmul):
        """The expert network on rows `x [M, D]` with `matmul(x, kernels)`
        multiplying each row by its expert's kernel -> `[M, D]`."""
        hidden = self._project(x, matmul, "expert_gate_up")  # [M, 2F] or [M, F]
        if self.gated:
            gate, up = ops.split(hidden, 2, axis=-1)  # split: no zero-filled grads
            if self.glu_limit is not None:
                limit = self.glu_limit
                gate = ops.minimum(gate, limit)
                up = ops.clip(up, -limit, limit) + 1
            hidden = self.activation_fn(gate) * up
        else:
            hidden = self.activation_fn(hidden)
        return self._project(hidden, matmul, "expert_down")

    def _project(self, x, matmul, name):
        """Rows `x [M, in]` times their experts' kernel `name`, plus, with
        `expert_bias`, each row's expert's `[out]` bias: the same `matmul`
        of rows `[1, 0, ..., 0]` by kernels `[E, 8, out]` that hold the
        bias in their first row (8 wide: grouped matmuls want 16-byte
        strides), so every dispatch path adds it as it multiplies."""
        out = matmul(x, self.expert_kernel(name))
        if not self.expert_bias:
            return out
        bias = getattr(self, name + "_bias")  # [E, out], never quantised
        bias = ops.cast(backend.value(bias), self.compute_dtype)[:, None]
        bias = ops.pad(bias, [[0, 0], [0, 7], [0, 0]])  # [E, 8, out]
        unit = ops.pad(ops.ones((ops.shape(x)[0], 1), x.dtype), [[0, 0], [0, 7]])
        return out + matmul(unit, bias)

    def expert_kernel(self, name):
        """Stacked expert kernel `name` `[E, in, out]` in the compute dtype;
        quantized kernels are dequantized (`layers.moe_quantization`)."""
        if self.quantization_mode is not None:
            return dequantized_kernel(self, name, self.compute_dtype)
        variable = getattr(self, name)
        kernel = backend.value(variable)
        if variable.dtype != self.compute_dtype:
            kernel = ops.cast(kernel, self.compute_dtype)
        return kernel

    # --------------------------------------------------------- quantization
    def quantize(self, mode=None, type_check=True, config=None):
        """int8 or int4 experts (per-expert, per-output-channel abs-max;
        int4 packed two per byte; whatever the config's block size), see
        `keras_transformers.layers.moe_quantization`. The router stays
        float32. Other modes raise NotImplementedError (`Model.quantize`
        warns and keeps them float)."""
        if mode not in ("int8", "int4"):
            raise NotImplementedError(
                "SparseMoE experts support quantize('int8'), quantize('int4') and "
                f"NF4 (`quantize_nf4`); they stay float. Received: mode={mode!r}"
            )
        quantize_experts(self, mode)

    def quantize_nf4(self, block_size=BLOCK_SIZE):
        """NF4 experts in blocks of `block_size` inputs (QLoRA's format)."""
        quantize_experts(self, "nf4", block_size)

    def quantized_call(self, *args, **kwargs):
        return self.call(*args, **kwargs)  # `expert_kernel` dequantizes

    # ----------------------------------------------------------------- call
    def call(self, x, padding_mask=None, training=None, router_input=None):
        shape = ops.shape(x)
        tokens = ops.reshape(x, (-1, shape[-1]))  # [N, D]
        routed = (
            tokens
            if router_input is None
            else ops.reshape(router_input, (-1, shape[-1]))
        )
        n = ops.shape(tokens)[0]  # an int, or a tensor in a TF graph with a None batch

        def real():  # [N] bool, True for real tokens (only where needed)
            if padding_mask is None:
                return ops.ones((n,), "bool")
            return ops.reshape(ops.cast(padding_mask, "bool"), (-1,))

        logits, probs, expert_ids, weights = self.route(routed, training)
        e, k = self.num_experts, self.num_experts_per_token
        plan = None
        if self.dispatch == "dense":
            out = dense_experts(tokens, expert_ids, weights, self.apply_experts, e)
        else:
            capacity = None
            if self.capacity_factor is not None:
                capacity = expert_capacity(self.capacity_factor, n * k, e)
            out, plan = sparse_experts(
                tokens, expert_ids, weights, real, self.apply_experts, e, capacity
            )
        if self.shared_experts is not None:
            out = out + self._shared_output(tokens, training)
        if training is not None:
            real = real()
            aux, z = self._router_losses(logits, probs, expert_ids, real)
            if training:
                if self.router_aux_loss_coef:
                    self.add_loss(self.router_aux_loss_coef * aux)
                if self.router_z_loss_coef:
                    self.add_loss(self.router_z_loss_coef * z)
            dropped = 0.0 if plan is None else plan.dropped_fraction()
            self._record_statistics(aux, z, expert_ids, real, dropped)
        return ops.reshape(out, shape)

    def _shared_output(self, tokens, training):
        """The shared experts on `tokens [N, D]`, gated per token -> `[N, D]`."""
        shared = call_layer(self.shared_experts, tokens, training=training)
        if self.shared_gate is None:
            return shared
        return ops.sigmoid(call_layer(self.shared_gate, tokens)) * shared  # [N, 1]

    def _router_losses(self, logits, probs, expert_ids, real):
        """(load-balancing loss, z-loss), averaged over real tokens."""
        mask = ops.cast(real, "float32")[:, None]  # [N, 1]
        count = ops.maximum(ops.sum(mask), 1.0)
        chosen = ops.sum(ops.one_hot(expert_ids, self.num_experts), axis=1)  # [N, E]
        f = ops.sum(chosen * mask, axis=0) / count  # [E], sums to k
        p = ops.sum(probs * mask, axis=0) / count  # [E]
        aux = self.num_experts * ops.sum(f * p)
        z = ops.sum(ops.square(ops.logsumexp(logits, axis=-1)) * mask[:, 0]) / count
        return aux, z

    def _record_statistics(self, aux, z, expert_ids, real, dropped):
        mask = ops.cast(real, "float32")[:, None, None]
        chosen = ops.one_hot(expert_ids, self.num_experts) * mask  # [N, k, E]
        load = ops.sum(chosen, axis=(0, 1))
        load = load / ops.maximum(ops.sum(load), 1.0)
        for variable, value in (
            (self.aux_loss, aux),
            (self.z_loss, z),
            (self.expert_load, load),
            (self.dropped_fraction, dropped),
        ):
            variable.assign(ops.stop_gradient(ops.cast(value, "float32")))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            num_experts=self.num_experts,
            num_experts_per_token=self.num_experts_per_token,
            intermediate_dim=self.intermediate_dim,
            activation=self.activation,
            gated=self.gated,
            normalize_router_weights=self.normalize_router_weights,
            router_aux_loss_coef=self.router_aux_loss_coef,
            router_z_loss_coef=self.router_z_loss_coef,
            router_jitter=self.router_jitter,
            capacity_factor=self.capacity_factor,
            dispatch=self.dispatch,
            num_shared_experts=self.num_shared_experts,
            shared_expert_intermediate_dim=self.shared_expert_intermediate_dim,
            shared_expert_gate=self.shared_expert_gate,
            router_bias=self.router_bias,
            expert_bias=self.expert_bias,
            glu_limit=self.glu_limit,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            seed=self.seed,
        )
        return config
