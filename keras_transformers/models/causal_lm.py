"""The causal-LM task shared by decoder families (GPT, Mixtral)."""

from __future__ import annotations

from keras_transformers.backend import call_layer
from keras_transformers.models.base import TaskModel
from keras_transformers.training.router import RouterMetrics, moe_layers


class CausalLM(TaskModel):
    """A decoder backbone plus its LM head, with `generate()`.

    Args:
        backbone: a built backbone of `backbone_cls`; if None, one is made
            from `config` and the keyword config fields.
        config: a `TransformerConfig` or dict (when `backbone` is None).
        tokenizer: optional tokenizer, used by `generate()` for strings and
            saved with `save_to_preset`.

    Call arguments:
        inputs: `{"token_ids": [B, T], "padding_mask": [B, T]}` or `[B, T]` ids.

    Returns:
        Logits `[B, T, vocabulary_size]` (float32 under mixed precision is
        left to the loss, which computes in float32).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        layers = moe_layers(self.backbone)
        # Mean trackers of the MoE router statistics (see training/router.py).
        self._router = RouterMetrics(layers) if layers else None
        self.router_metrics = self._router.metrics if layers else []

    def compute_loss(self, *args, **kwargs):
        """The compiled loss plus `add_loss` terms; also feeds the router
        statistics of MoE layers to their metrics."""
        loss = super().compute_loss(*args, **kwargs)
        if self._router is not None:
            self._router.update()
        return loss

    def call(self, inputs, training=None):
        return self.backbone.logits(self.backbone(inputs, training=training))

    def call_with_cache(self, token_ids, cache, cache_index):
        """One decoding step: `[B, T]` ids at `cache_index` -> logits
        `[B, T, V]` and the updated cache. The same `call()` path as training."""
        hidden, cache = call_layer(
            self.backbone, token_ids, cache=cache, cache_index=cache_index
        )
        return self.backbone.logits(hidden), cache

    def generate(self, prompts, **kwargs):
        """Generates continuations; see `keras_transformers.generation.generate`."""
        from keras_transformers.generation import generate

        return generate(self, prompts, **kwargs)
