"""The encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et
al., 2017): post-norm blocks, sinusoidal positions, embeddings scaled by
sqrt(hidden_dim) and shared by the encoder, the decoder and the output layer.

Shape letters: B batch, S source length, T target length, D hidden_dim,
K key/value heads, H head size, V vocabulary size.
"""

from __future__ import annotations

from keras import ops

from keras_transformers.backend import call_layer
from keras_transformers.layers import PositionEmbedding, RelativePositionBias
from keras_transformers.layers.serializable import serializable
from keras_transformers.models.base import (
    TaskModel,
    check_padding_mask,
    check_token_ids,
    initializer,
    make_blocks,
    run_blocks,
)
from keras_transformers.models.text import TextBackbone
from keras_transformers.registry import register_model

INPUT_NAMES = (
    "encoder_token_ids",
    "encoder_padding_mask",
    "decoder_token_ids",
    "decoder_padding_mask",
)


def unpack_seq2seq_inputs(inputs, config, check_values=True):
    """Validates the four seq2seq inputs; returns
    `(encoder_ids, encoder_mask, decoder_ids, decoder_mask)`, masks bool and
    all-True where absent."""
    if not isinstance(inputs, dict):
        raise ValueError(
            "Seq2seq models take a dict with 'encoder_token_ids' and "
            "'decoder_token_ids' (and optional 'encoder_padding_mask', "
            f"'decoder_padding_mask'). Received: {type(inputs).__name__}"
        )
    missing = [k for k in ("encoder_token_ids", "decoder_token_ids") if k not in inputs]
    unknown = sorted(set(inputs) - set(INPUT_NAMES))
    if missing or unknown:
        raise ValueError(
            f"Seq2seq inputs are {list(INPUT_NAMES)} (the masks optional). "
            f"Missing: {missing}; unknown: {unknown}."
        )
    out = []
    for side in ("encoder", "decoder"):
        ids = check_token_ids(
            inputs[f"{side}_token_ids"], config, f"{side}_token_ids", check_values
        )
        mask = check_padding_mask(
            inputs.get(f"{side}_padding_mask"), ids, f"{side}_padding_mask"
        )
        out += [ids, mask]
    source_batch, target_batch = out[0].shape[0], out[2].shape[0]
    if None not in (source_batch, target_batch) and source_batch != target_batch:
        raise ValueError(
            f"`encoder_token_ids` has batch size {source_batch} but "
            f"`decoder_token_ids` has {target_batch}: every source sequence needs "
            "its target sequence."
        )
    return tuple(out)


@register_model("backbone")
@serializable
class Seq2SeqBackbone(TextBackbone):
    """Encoder-decoder transformer: an encoder stack and a causal decoder
    stack whose blocks add cross-attention over the encoder output.

    Args:
        config: a `TransformerConfig` (or dict) with `stacks="encoder_decoder"`;
            keyword fields override it. `num_layers` is the encoder depth,
            `num_decoder_layers` the decoder depth.

    Call arguments:
        inputs: `{"encoder_token_ids": [B, S], "encoder_padding_mask": [B, S],
            "decoder_token_ids": [B, T], "decoder_padding_mask": [B, T]}`;
            masks are True for real tokens and may be left out (all real).
            The encoder mask reaches the encoder self-attention and every
            cross-attention; the decoder self-attention is causal and masks
            padded keys. With `position_embedding="relative"` (T5) each
            stack's self-attention logits get its `RelativePositionBias`
            (`encoder_position_bias`: bidirectional buckets,
            `decoder_position_bias`: causal ones), computed once per call.

    Returns:
        Decoder hidden states `[B, T, D]`. `encode()` and `decode()` expose
        the two halves; `logits()` is the tied output projection.

    Examples:
        >>> model = Seq2SeqBackbone.from_preset("transformer_tiny")
        >>> ids = keras.ops.ones((2, 7), "int32")
        >>> out = model({"encoder_token_ids": ids, "decoder_token_ids": ids[:, :5]})
        >>> tuple(out.shape)
        (2, 5, 64)
    """

    family = "transformer"
    stacks = "encoder_decoder"
    causal = False  # `blocks` is the encoder stack

    def _build_extras(self):
        c = self.config
        self.decoder_blocks = make_blocks(
            c,
            c.resolved_num_decoder_layers,
            "decoder_block",
            self.dtype_policy,
            causal=True,
            cross_attention=True,
        )
        self.decoder_embedding_norm = (
            self._norm("decoder_embedding_norm") if c.embedding_norm else None
        )
        self.decoder_final_norm = (
            self._norm("decoder_final_norm") if c.final_norm else None
        )
        self.decoder_position_embedding = None
        if c.separate_decoder_positions:  # BART: the decoder's own table
            self.decoder_position_embedding = PositionEmbedding(
                c.max_sequence_length,
                initializer(c),
                dtype=self.dtype_policy,
                name="decoder_position_embedding",
            )
            self.decoder_position_embedding.build((None, None, c.hidden_dim))

        self.encoder_position_bias = self.decoder_position_bias = None
        if c.position_embedding == "relative":  # T5: one table per stack
            self.encoder_position_bias = self._relative_bias("encoder", True)
            self.decoder_position_bias = self._relative_bias("decoder", False)

    def _relative_bias(self, stack, bidirectional):
        c = self.config
        layer = RelativePositionBias(
            c.num_heads,
            c.relative_attention_buckets,
            c.relative_attention_max_distance,
            bidirectional=bidirectional,
            embeddings_initializer=initializer(c),
            dtype=self.dtype_policy,
            name=f"{stack}_position_bias",
        )
        layer.build()
        return layer

    @staticmethod
    def _attention_bias(layer, length, start=0, key_length=None):
        """`{"attention_bias": [1, N, T, S]}` of relative position bias
        `layer` for `length` queries from position `start` over the first
        `key_length` positions (default `length`); `{}` without one."""
        if layer is None:
            return {}
        queries = ops.arange(length) + start
        keys = ops.arange(length if key_length is None else key_length)
        return {"attention_bias": call_layer(layer, queries, keys)}

    def call(self, inputs, training=None):
        source, source_mask, target, target_mask = unpack_seq2seq_inputs(
            inputs, self.config
        )
        encoded = self.encode(source, source_mask, training=training)
        return self.decode(target, encoded, source_mask, target_mask, training=training)

    def encode(self, token_ids, padding_mask=None, training=None):
        """Encoder: `[B, S]` ids (and `[B, S]` mask) -> `[B, S, D]`."""
        x = self.embed(token_ids, training=training)
        bias = self._attention_bias(self.encoder_position_bias, ops.shape(x)[1])
        x = run_blocks(self.blocks, x, padding_mask, training=training, **bias)
        if self.final_norm is not None:
            x = call_layer(self.final_norm, x)
        return x

    def decode(
        self,
        token_ids,
        encoder_outputs=None,
        encoder_padding_mask=None,
        padding_mask=None,
        cache=None,
        cache_index=None,
        training=None,
    ):
        """Decoder: `[B, T]` ids -> `[B, T, D]` hidden states.

        Without `cache`, attends to `encoder_outputs [B, S, D]`. With `cache`
        (from `init_cache`), attends to the projected encoder states in it,
        writes this step's keys and values at `cache_index` and returns
        `(hidden, cache)`; `encoder_outputs` is then not needed.
        """
        start = 0 if cache_index is None else cache_index
        x = self.embed(
            token_ids,
            start_index=start,
            training=training,
            norm=self.decoder_embedding_norm,
            positions=self.decoder_position_embedding,
        )
        kwargs = dict(encoder_padding_mask=encoder_padding_mask, training=training)
        length = ops.shape(x)[1]
        if cache is None:
            kwargs.update(self._attention_bias(self.decoder_position_bias, length))
            x = run_blocks(
                self.decoder_blocks,
                x,
                padding_mask,
                encoder_outputs=encoder_outputs,
                **kwargs,
            )
        else:
            self_cache, cross_cache = cache
            keys = ops.shape(self_cache[0][0])[1]  # the whole cache, S_max
            bias = self._attention_bias(self.decoder_position_bias, length, start, keys)
            kwargs.update(bias)
            # While decoding, every cached target position is real.
            x, self_cache = run_blocks(
                self.decoder_blocks,
                x,
                None,
                self_cache,
                cache_index,
                cross_cache=cross_cache,
                **kwargs,
            )
            cache = (self_cache, cross_cache)
        if self.decoder_final_norm is not None:
            x = call_layer(self.decoder_final_norm, x)
        return x if cache is None else (x, cache)

    def init_cache(self, encoder_outputs, max_length):
        """The decoding cache: `(self_cache, cross_cache)`, each one
        `(key, value)` pair per decoder block. Self-attention pairs are zeros
        `[B, max_length, K, H]`; cross-attention pairs are the encoder output
        `[B, S, D]` projected once, `[B, S, K, H]`."""
        c = self.config
        batch = ops.shape(encoder_outputs)[0]
        shape = (batch, max_length, c.resolved_num_kv_heads, c.resolved_head_dim)
        self_cache = tuple(
            (
                ops.zeros(shape, dtype=self.compute_dtype),
                ops.zeros(shape, dtype=self.compute_dtype),
            )
            for _ in self.decoder_blocks
        )
        cross_cache = tuple(
            block.cross_attention_layer.project_key_value(encoder_outputs)
            for block in self.decoder_blocks
        )
        return self_cache, cross_cache


@register_model("seq2seq_lm", default=True)
@serializable
class Seq2SeqLM(TaskModel):
    """Sequence-to-sequence LM: `Seq2SeqBackbone` + the tied output layer.

    Call arguments:
        inputs: as for `Seq2SeqBackbone`; `decoder_token_ids` are the target
            shifted right (starting with `bos_token_id`).

    Returns:
        Logits `[B, T, vocabulary_size]`; train with
        `MaskedSparseCategoricalCrossentropy(ignore_class=pad, label_smoothing=0.1)`.

    Examples:
        >>> lm = Seq2SeqLM.from_preset("transformer_tiny")
        >>> lm.generate([[5, 6, 7]], max_new_tokens=4, num_beams=2).shape[0]
        1
    """

    backbone_cls = Seq2SeqBackbone

    def call(self, inputs, training=None):
        return self.backbone.logits(self.backbone(inputs, training=training))

    def call_with_cache(self, token_ids, cache, cache_index, encoder_padding_mask):
        """One decoding step: `[B, T]` target ids at `cache_index` -> logits
        `[B, T, V]` and the updated cache. The same `call()` path as training."""
        hidden, cache = self.backbone.decode(
            token_ids,
            encoder_padding_mask=encoder_padding_mask,
            cache=cache,
            cache_index=cache_index,
        )
        return self.backbone.logits(hidden), cache

    def generate(self, inputs, **kwargs):
        """Translates `inputs`; see `keras_transformers.generation.seq2seq.generate`."""
        from keras_transformers.generation.seq2seq import generate

        return generate(self, inputs, **kwargs)
