"""The causal-LM task shared by decoder families (GPT, Mixtral)."""

from __future__ import annotations

from keras_transformers.models.base import ConfiguredModel


class CausalLM(ConfiguredModel):
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

    backbone_cls = None

    def __init__(
        self,
        backbone=None,
        *,
        config=None,
        tokenizer=None,
        dtype=None,
        name=None,
        **fields,
    ):
        if backbone is None:
            backbone = self.backbone_cls(config, dtype=dtype, **fields)
        elif config is not None or fields:
            raise ValueError(
                "Pass either `backbone` or `config`/config fields, not both."
            )
        elif not isinstance(backbone, self.backbone_cls):
            raise ValueError(
                f"{type(self).__name__} needs a {self.backbone_cls.__name__}. "
                f"Received: {type(backbone).__name__}"
            )
        super().__init__(dtype=backbone.dtype_policy, name=name)
        self.backbone = backbone
        self.config = backbone.config
        self.tokenizer = tokenizer
        self.built = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.backbone_cls is not None:
            cls.family = cls.backbone_cls.family

    def call(self, inputs, training=None):
        return self.backbone.logits(self.backbone(inputs, training=training))

    def call_with_cache(self, token_ids, cache, cache_index):
        """One decoding step: `[B, T]` ids at `cache_index` -> logits
        `[B, T, V]` and the updated cache. The same `call()` path as training."""
        hidden, cache = self.backbone(token_ids, cache=cache, cache_index=cache_index)
        return self.backbone.logits(hidden), cache

    def generate(self, prompts, **kwargs):
        """Generates continuations; see `keras_transformers.generation.generate`."""
        from keras_transformers.generation import generate

        return generate(self, prompts, **kwargs)
