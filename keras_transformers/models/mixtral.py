"""Mixtral-like sparse mixture-of-experts decoders: the GPT family's decoder
(GQA, RoPE, RMSNorm, optional sliding window) with `SparseMoE` feed-forward
layers. Only config values differ; the blocks and the task heads are the
shared ones."""

from __future__ import annotations

from keras_transformers.layers.serializable import serializable
from keras_transformers.models.causal_lm import CausalLM
from keras_transformers.models.gpt import GPTBackbone
from keras_transformers.models.gpt_classifier import GPTClassifier
from keras_transformers.registry import register_model
from keras_transformers.training.router import track_routers, update_routers


@register_model("backbone")
@serializable
class MixtralBackbone(GPTBackbone):
    """Decoder-only transformer whose feed-forward layers are `SparseMoE`.

    Args:
        config: a `TransformerConfig` (or dict) with a `moe` group; keyword
            fields override it.

    Call arguments:
        inputs: `{"token_ids": [B, T] int, "padding_mask": [B, T] bool}` or
            the `[B, T]` ids alone.
        cache: KV cache for decoding (see `init_cache`; with a sliding
            window it holds at most `sliding_window` positions).
        cache_index: position of the first token of `inputs` in the cache.

    Returns:
        Hidden states `[B, T, D]`, or `(hidden, cache)` when `cache` is given.

    Examples:
        >>> model = MixtralBackbone.from_preset("mixtral_tiny")
        >>> tuple(model({"token_ids": keras.ops.ones((1, 8), "int32")}).shape)
        (1, 8, 64)
    """

    family = "mixtral"

    def __init__(self, config=None, **kwargs):
        super().__init__(config, **kwargs)
        if self.config.moe is None:
            raise ValueError(
                "MixtralBackbone needs a config with a `moe` group, e.g. "
                "moe=MoEConfig(num_experts=8, num_experts_per_token=2). For a "
                "dense decoder use GPTBackbone."
            )


@register_model("causal_lm", default=True)
@serializable
class MixtralCausalLM(CausalLM):
    """Mixtral-like causal LM: `MixtralBackbone` + LM head, with `generate()`.

    Training adds the routers' load-balancing and z-losses (coefficients in
    `config.moe`) and logs router statistics (`router_aux_loss`,
    `router_z_loss`, `dropped_tokens`, `expert_load_<e>`).

    Examples:
        >>> lm = MixtralCausalLM.from_preset("mixtral_tiny")
        >>> lm.generate([[1, 2, 3]], max_new_tokens=4, stop_token_ids=None).shape
        (1, 7)
    """

    backbone_cls = MixtralBackbone


@register_model("classifier")
@serializable
class MixtralClassifier(GPTClassifier):
    """Sequence classification on a sparse-MoE decoder: `GPTClassifier`'s
    head (the hidden state of each row's last real token, optional dropout,
    a bias-free linear `score`) on a `MixtralBackbone`, as Hugging Face's
    `MixtralForSequenceClassification`, `Qwen2MoeForSequenceClassification`,
    `Qwen3MoeForSequenceClassification` and `GptOssForSequenceClassification`.

    Args, call arguments, returns, padding and `compile()`: as
    `GPTClassifier`.

    Training adds the routers' load-balancing and z-losses (coefficients in
    `config.moe`) to the classification loss and logs router statistics
    (`router_aux_loss`, `router_z_loss`, `dropped_tokens`,
    `expert_load_<e>`), as `MixtralCausalLM` does; inference is unaffected.
    Set `moe={"router_aux_loss_coef": 0.0}` when building the model to train
    without the load-balancing term.

    Examples:
        >>> model = MixtralClassifier.from_preset("mixtral_tiny", num_classes=3)
        >>> ids = np.array([[5, 6, 7, 0], [5, 6, 7, 8]], "int32")
        >>> tuple(model({"token_ids": ids, "padding_mask": ids != 0}).shape)
        (2, 3)
    """

    backbone_cls = MixtralBackbone

    def __init__(self, backbone=None, **kwargs):
        super().__init__(backbone, **kwargs)
        track_routers(self)  # MoE router statistics in the logs

    def compute_loss(
        self, x=None, y=None, y_pred=None, sample_weight=None, training=True
    ):
        """The compiled loss plus the routers' `add_loss` terms; also feeds
        the router statistics to their metrics."""
        loss = super().compute_loss(x, y, y_pred, sample_weight, training)
        update_routers(self)
        return loss
