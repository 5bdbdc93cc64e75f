"""GPT-like decoders: the GPT-2 layout and the Llama layout are values of one
config (learned vs rotary positions, LayerNorm vs RMSNorm, GELU vs SwiGLU,
MHA vs GQA, tied vs untied head)."""

from __future__ import annotations

from keras import ops

from keras_transformers.backend import call_layer
from keras_transformers.layers import row_cache
from keras_transformers.layers.serializable import serializable
from keras_transformers.models.base import (
    run_blocks,
    unpack_token_inputs,
)
from keras_transformers.models.causal_lm import CausalLM
from keras_transformers.models.packing import packed_arguments
from keras_transformers.models.text import TextBackbone
from keras_transformers.models.transformer_xl import (
    check_memory_batches,
    forget_compiled,
    make_xl_layers,
    reset_xl_memory,
    xl_call,
    xl_segment,
)
from keras_transformers.registry import register_model


@register_model("backbone")
@serializable
class GPTBackbone(TextBackbone):
    """Decoder-only transformer: embeddings, causal blocks, final norm.

    Args:
        config: a `TransformerConfig` (or dict); keyword fields override it,
            so `GPTBackbone(vocabulary_size=..., num_layers=..., ...)` works too.

    With `position_embedding="transformer_xl"` the blocks attend with
    Transformer-XL's relative terms (one `TransformerXLBias` per block), and
    once `reset_memory(batch_size)` has allocated the memory, each call
    also attends to (and updates) the memory of earlier segments;
    `call_with_memory` is the stateless form.

    Call arguments:
        inputs: `{"token_ids": [B, T] int, "padding_mask": [B, T] bool}` or
            the `[B, T]` ids alone; optionally `"document_ids": [B, T] int`
            for packed rows (several examples per row: each token attends to
            its own example only and its positions restart there; see
            `keras_transformers.models.packing`); with Transformer-XL memory,
            optionally `"memory_reset": [B] bool` (True where a row starts a
            document).
        cache: KV cache for decoding (see `init_cache`).
        cache_index: position of the first token of `inputs` in the cache.

    Returns:
        Hidden states `[B, T, D]`, or `(hidden, cache)` when `cache` is given.

    Examples:
        >>> model = GPTBackbone.from_preset("gpt2_tiny")
        >>> tuple(model({"token_ids": keras.ops.ones((1, 8), "int32")}).shape)
        (1, 8, 64)
    """

    family = "gpt"
    stacks = "decoder"
    causal = True

    def _build_extras(self):
        self.relative_biases = self.segment_memory = None
        if self.config.position_embedding == "transformer_xl":
            self.relative_biases, self.segment_memory = make_xl_layers(self)

    def call(self, inputs, cache=None, cache_index=None, training=None):
        if self.segment_memory is not None:  # Transformer-XL
            if row_cache.is_row_index(cache_index):
                raise ValueError(
                    "Transformer-XL memory decodes every row at one position; "
                    "a `cache_index` per row (continuous batching) needs a "
                    "model without `memory_length`."
                )
            if isinstance(inputs, dict) and inputs.get("document_ids") is not None:
                packed_arguments(self, inputs["token_ids"], inputs["document_ids"])
            return xl_call(self, inputs, cache, cache_index, training)
        # Decoding steps skip the value check: `generate` checks the prompt once.
        token_ids, padding_mask, document_ids = unpack_token_inputs(
            inputs, self.config, ("document_ids",), check_values=cache is None
        )
        packed = {}
        if document_ids is not None and cache is None:
            packed = packed_arguments(self, token_ids, document_ids)
        if cache is not None and row_cache.is_row_index(cache_index):
            # Rows at different positions (continuous batching): per row.
            packed = {"positions": row_cache.row_positions(cache_index, 1)}
            cache_index = ops.cast(cache_index, "int32")
        start = 0 if cache_index is None or packed else cache_index
        x = self.embed(
            token_ids,
            start_index=start,
            training=training,
            token_positions=packed.get("positions"),
        )  # [B, T, D]
        extra = {**self.layer_extras(token_ids, x), **packed}
        if cache is not None:
            # While decoding, every cached position before the query is real.
            x, cache = run_blocks(
                self.blocks, x, None, cache, cache_index, training, **extra
            )
        else:
            x = run_blocks(self.blocks, x, padding_mask, training=training, **extra)
        if self.final_norm is not None:
            x = call_layer(self.final_norm, x)
        return x if cache is None else (x, cache)

    def init_cache(self, batch_size, max_length):
        """A zero cache for decoding up to `max_length` positions: each
        block's own, in the compute dtype (self-attention: a `(key, value)`
        pair, each `[B, S, K, H]` with `S = max_length`, or for a sliding
        layer `min(max_length, window)`: a ring cache of the most recent
        positions; see `MultiHeadAttention`)."""
        dtype = self.compute_dtype
        return tuple(b.init_cache(batch_size, max_length, dtype) for b in self.blocks)

    def call_with_memory(self, inputs, memory=None, memory_mask=None, training=None):
        """One Transformer-XL segment, without state: `inputs` as for `call`,
        `memory` `[L, B, M, D]` (each block's input states of the M earlier
        positions; None: none) and `memory_mask` `[B, M]` (True where valid;
        None: all). Returns `(hidden [B, T, D], memory, memory_mask)`, the
        memory now ending with this segment (M slots, or the config's
        memory length when `memory` is None; no gradient)."""
        return xl_segment(self, inputs, memory, memory_mask, training)

    def reset_memory(self, batch_size=None):
        """Clears the Transformer-XL memory (see `config.memory_length`).
        With `batch_size`, (re)allocates it for that many rows: from then
        on each call (and `fit()` / `evaluate()` / `predict()`, whose
        batches must then all have `batch_size` rows, in order: row i
        continuing row i of the previous batch) attends to the memory and
        updates it, and `generate()` attends to it. Inputs may add
        `"memory_reset"` `[B]` (True where a row starts a new document: that
        row sees no memory; see `keras_transformers.data.segment_batches`).
        Without a memory length, or before any allocation, raises ValueError."""
        reset_xl_memory(self, batch_size)


@register_model("causal_lm", default=True)
@serializable
class GPTCausalLM(CausalLM):
    """GPT-like causal language model: `GPTBackbone` + (tied or untied) LM head.

    Call arguments:
        inputs: as for `GPTBackbone`.

    Returns:
        Logits `[B, T, vocabulary_size]`.

    Examples:
        >>> lm = GPTCausalLM.from_preset("gpt2_tiny")
        >>> lm.generate([[1, 2, 3]], max_new_tokens=4, stop_token_ids=None).shape
        (1, 7)
    """

    backbone_cls = GPTBackbone

    # Transformer-XL memory (`position_embedding="transformer_xl"`): the
    # memory checks of fit / evaluate, generation through the memory, and
    # `reset_memory`. Without memory these are `CausalLM`'s.
    def fit(self, x=None, y=None, batch_size=None, **kwargs):
        """`keras.Model.fit`; with a Transformer-XL training memory, first
        checks that its state is allocated and that every batch has its rows
        (see `reset_memory`)."""
        check_memory_batches(self, x, batch_size, training=True)
        return super().fit(x, y, batch_size=batch_size, **kwargs)

    def evaluate(self, x=None, y=None, batch_size=None, **kwargs):
        """`keras.Model.evaluate`, with the memory check of `fit`."""
        check_memory_batches(self, x, batch_size)
        return super().evaluate(x, y, batch_size=batch_size, **kwargs)

    def generate(self, prompts, **kwargs):
        """`CausalLM.generate`; with Transformer-XL memory, a long prompt is
        read into the memory segment by segment first (`xl_generate`)."""
        if self.backbone.segment_memory is not None:
            from keras_transformers.models.xl_generate import generate_with_memory

            return generate_with_memory(self, prompts, **kwargs)
        return super().generate(prompts, **kwargs)

    def reset_memory(self, batch_size=None):
        """The backbone's Transformer-XL `reset_memory` (see `GPTBackbone`)."""
        if batch_size is not None and batch_size != getattr(
            self.backbone.segment_memory, "batch_size", None
        ):
            forget_compiled(self)
        self.backbone.reset_memory(batch_size)
