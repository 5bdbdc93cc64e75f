"""The causal-LM task shared by decoder families (GPT, Mixtral)."""

from __future__ import annotations

from keras_transformers.backend import call_layer
from keras_transformers.models.base import TaskModel
from keras_transformers.training import head_loss
from keras_transformers.training.router import track_routers, update_routers


class CausalLM(TaskModel):
    """A decoder backbone plus its LM head, with `generate()`.

    Args:
        backbone: a built backbone of `backbone_cls`; if None, one is made
            from `config` and the keyword config fields.
        config: a `TransformerConfig` or dict (when `backbone` is None).
        tokenizer: optional tokenizer, used by `generate()` for strings
            and by `chat()` (with its `chat_template`), and saved with
            `save_to_preset`.

    A model loaded from a Hugging Face checkpoint with a
    `generation_config.json` carries it as `generation_config` (a
    `keras_transformers.generation.GenerationConfig`): the defaults of
    `generate()` and `chat()`.

    Call arguments:
        inputs: `{"token_ids": [B, T], "padding_mask": [B, T]}` or `[B, T]` ids.

    Returns:
        Logits `[B, T, vocabulary_size]` (float32 under mixed precision is
        left to the loss, which computes in float32).

    In `fit()`, a `MaskedSparseCategoricalCrossentropy` loss is computed
    chunk by chunk with the head (`keras_transformers.training.head_loss`):
    the `[B, T, V]` logits never exist at once. `chunked_loss` decides:
    None (default) where it pays, True whenever it applies, False never.
    """

    chunked_loss = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        track_routers(self)  # MoE router statistics in the logs

    def make_train_function(self, force=False):
        """Keras' train function, run in the state where `call` may return
        hidden states for the chunked loss (`head_loss`)."""
        super().make_train_function(force)  # Keras sets `train_function`
        return head_loss.wrap_train_function(self, self.train_function)

    def compute_loss(
        self, x=None, y=None, y_pred=None, sample_weight=None, training=True
    ):
        """The compiled loss plus `add_loss` terms (chunked from hidden
        states in a training step, see `head_loss`); also feeds the router
        statistics of MoE layers to their metrics."""
        if getattr(self, "_hidden_returned", False):
            loss = head_loss.compute_loss(self, y, y_pred, sample_weight)
        else:
            loss = super().compute_loss(x, y, y_pred, sample_weight, training)
        update_routers(self)
        return loss

    def call(self, inputs, training=None):
        hidden = self.backbone(inputs, training=training)
        if head_loss.returns_hidden(self, hidden):
            return hidden
        return self.backbone.logits(hidden)

    def call_with_cache(self, token_ids, cache, cache_index):
        """One decoding step: `[B, T]` ids at `cache_index` -> logits
        `[B, T, V]` and the updated cache. The same `call()` path as training."""
        hidden, cache = call_layer(
            self.backbone, token_ids, cache=cache, cache_index=cache_index
        )
        return self.backbone.logits(hidden), cache

    def generate(self, prompts, **kwargs):
        """Generates continuations; see `keras_transformers.generation.generate`.

        Examples:
            >>> lm = keras_transformers.from_preset("path/to/SmolLM2-135M-Instruct")  # doctest: +SKIP
            >>> lm.generate("The capital of France is", max_new_tokens=8)  # doctest: +SKIP
            'The capital of France is Paris.'
        """
        from keras_transformers.generation import generate

        return generate(self, prompts, **kwargs)

    def chat(self, messages, **kwargs):
        """Answers a conversation with the tokenizer's chat template and
        returns the reply text; see `keras_transformers.generation.chat.chat`.

        Examples:
            >>> messages = [{"role": "user", "content": "Hi!"}]  # doctest: +SKIP
            >>> reply = lm.chat(messages, max_new_tokens=32)  # doctest: +SKIP
            >>> messages.append({"role": "assistant", "content": reply})  # doctest: +SKIP
        """
        from keras_transformers.generation.chat import chat

        return chat(self, messages, **kwargs)
