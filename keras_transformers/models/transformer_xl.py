"""Transformer-XL recurrence for the decoder backbones (`GPTBackbone` with
`position_embedding="transformer_xl"`): per-block relative attention terms
and the segment memory. No model class of its own: these functions are the
backbone's `call`, `call_with_memory` and `reset_memory`.

Shape letters: L layers, B batch, T segment, M memory slots, D width.
"""

from __future__ import annotations

import keras
from keras import ops

from keras_transformers import backend
from keras_transformers.backend import call_layer
from keras_transformers.layers.relative_xl import TransformerXLBias
from keras_transformers.layers.segment_memory import SegmentMemory, next_memory
from keras_transformers.models.base import initializer, unpack_token_inputs

RESET = "memory_reset"


def make_xl_layers(model):
    """One built `TransformerXLBias` per block, and the `SegmentMemory`."""
    c = model.config
    biases = []
    for i in range(c.num_layers):
        bias = TransformerXLBias(
            c.num_heads,
            c.resolved_head_dim,
            c.hidden_dim,
            num_kv_heads=c.resolved_num_kv_heads,
            clamp_len=c.clamp_len,
            attention_scale=c.attention_scale,
            kernel_initializer=initializer(c),
            dtype=model.dtype_policy,
            name=f"relative_bias_{i}",
        )
        bias.build()
        biases.append(bias)
    memory = SegmentMemory(c.num_layers, c.hidden_dim, name="segment_memory")
    return biases, memory


def memory_length(config, training):
    """Slots attended: `memory_length` in training, else `eval_memory_length`
    (None: the same)."""
    if training or config.eval_memory_length is None:
        return config.memory_length
    return config.eval_memory_length


def run_xl_blocks(model, x, padding_mask, memory, memory_mask, training, **cached):
    """`x [B, T, D]` through the blocks, each attending to its memory
    `[B, M, D]` (`memory [L, B, M, D]`, or None). Returns `(x, layer_inputs)`
    (each block's input `[B, T, D]`), or with `cache` / `cache_index` in
    `cached`, `(x, updated_cache)`."""
    cache, cache_index = cached.get("cache"), cached.get("cache_index")
    offset = None  # queries are the last keys, unless the cache is static
    if cache is not None:
        m = 0 if memory is None else ops.shape(memory)[2]
        offset = cache_index + m
    inputs, caches = [], []
    with backend.direct_calls(model.blocks):
        for i, block in enumerate(model.blocks):
            inputs.append(x)
            kwargs = dict(
                padding_mask=padding_mask,
                attention_bias=model.relative_biases[i].bias_fn(offset),
                training=training,
            )
            if memory is not None:
                kwargs.update(memory=memory[i], memory_mask=memory_mask)
            if cache is None:
                x = block(x, **kwargs)
                continue
            x, layer_cache = call_layer(
                block, x, cache=cache[i], cache_index=cache_index, **kwargs
            )
            caches.append(layer_cache)
    return x, (inputs if cache is None else tuple(caches))


def _final(model, x):
    return x if model.final_norm is None else call_layer(model.final_norm, x)


def xl_segment(model, inputs, memory, memory_mask, training):
    """`call_with_memory`: one segment with an explicit memory."""
    token_ids, padding_mask, reset = unpack_token_inputs(
        inputs, model.config, extra=(RESET,)
    )
    if memory is not None:
        memory = ops.stop_gradient(ops.convert_to_tensor(memory))
        if reset is not None:
            memory_mask = _reset(memory, memory_mask, reset)
    length = memory_length(model.config, training)
    length = length if memory is None else ops.shape(memory)[2]
    x = model.embed(token_ids, training=training)
    mask = backend.none_if_all_true(padding_mask)
    x, layer_inputs = run_xl_blocks(model, x, mask, memory, memory_mask, training)
    new, new_mask = next_memory(memory, memory_mask, layer_inputs, padding_mask, length)
    return _final(model, x), new, new_mask


def _reset(memory, memory_mask, reset):
    if memory_mask is None:
        memory_mask = ops.ones(ops.shape(memory)[1:3], "bool")
    keep = ops.logical_not(ops.cast(reset, "bool"))[:, None]
    return ops.logical_and(ops.cast(memory_mask, "bool"), keep)


def _state(model, training, batch, reset=None):
    """`(memory, mask)` read from the allocated state (the last slots
    attended), or `(None, None)` without state or memory length."""
    state, length = model.segment_memory, memory_length(model.config, training)
    if state.states is None or not length:
        if training and model.config.memory_length:
            raise ValueError(
                f"Training with memory_length={model.config.memory_length} needs "
                "the memory state: call `model.reset_memory(batch_size)` before "
                "`fit()` (batches then keep that size and their order), or "
                "build the model with memory_length=0."
            )
        return None, None
    if batch is not None:
        _state_batch_check(state, batch)
    memory, mask = state.read(reset)
    return memory[:, :, -length:], mask[:, -length:]


def _state_batch_check(state, batch):
    if batch != state.batch_size:
        raise ValueError(
            f"The Transformer-XL memory holds {state.batch_size} rows, but the "
            f"batch has {batch}. Every batch must have the same number of rows "
            "(row i continuing row i of the previous batch): call "
            f"`reset_memory(batch_size={batch})`, or drop the last partial batch "
            "(`keras_transformers.data.segment_batches` makes full batches)."
        )


def xl_call(model, inputs, cache, cache_index, training):
    """The backbone's `call`: stateful segments (reading and writing the
    allocated memory), or cached decoding attending to the memory."""
    token_ids, padding_mask, reset = unpack_token_inputs(
        inputs, model.config, extra=(RESET,), check_values=cache is None
    )
    batch = token_ids.shape[0]
    memory, memory_mask = _state(model, training, batch, reset)
    x = model.embed(token_ids, training=training)
    if cache is not None:  # every cached position before the query is real
        x, cache = run_xl_blocks(
            model,
            x,
            None,
            memory,
            memory_mask,
            training,
            cache=cache,
            cache_index=cache_index,
        )
        return _final(model, x), cache
    mask = backend.none_if_all_true(padding_mask)
    x, layer_inputs = run_xl_blocks(model, x, mask, memory, memory_mask, training)
    if memory is not None:
        state = model.segment_memory
        full, full_mask = state.read(reset)
        new, new_mask = next_memory(
            full, full_mask, layer_inputs, padding_mask, state.length
        )
        state.write(new, new_mask)
    return _final(model, x)


def reset_xl_memory(model, batch_size=None):
    """`reset_memory`: zero (and with `batch_size`, allocate) the state of
    `max(memory_length, eval_memory_length)` slots."""
    c = model.config
    length = max(c.memory_length, c.eval_memory_length or 0)
    if not length:
        raise ValueError(
            "This model has no Transformer-XL memory (memory_length=0 and "
            "eval_memory_length unset). Build it with e.g. memory_length=128."
        )
    state = model.segment_memory
    if batch_size is None:
        if state.states is None:
            raise ValueError(
                "The memory is not allocated yet: call `reset_memory(batch_size)`."
            )
        batch_size = state.batch_size
    if state.states is None or state.batch_size != batch_size:
        forget_compiled(model)  # their programs read the old variables
    state.allocate(int(batch_size), length)


def forget_compiled(model):
    """Drops `model`'s traced train / test / predict / generate functions."""
    model.train_function = model.test_function = model.predict_function = None
    model.__dict__.pop("_generate_functions", None)


def check_memory_batches(model, x, batch_size=None, training=False):
    """Before `fit` / `evaluate` / `predict` of a model whose memory is
    allocated: every batch must have the memory's rows (a compiled step may
    not see the batch size). Checks a `keras.utils.PyDataset`'s first and
    last batch, and arrays against `batch_size`. With `training` (`fit`), a
    model with a training memory must have its state allocated."""
    state = getattr(model.backbone, "segment_memory", None)
    if state is None or state.states is None:
        if state is not None and training:
            _state(model.backbone, True, None)  # raises: no state to train with
        return
    rows = []
    if isinstance(x, keras.utils.PyDataset) and len(x):
        for index in {0, len(x) - 1}:
            inputs = x[index][0] if isinstance(x[index], tuple) else x[index]
            ids = inputs["token_ids"] if isinstance(inputs, dict) else inputs
            rows.append(len(ids))
    elif hasattr(x, "shape") or isinstance(x, dict):
        ids = x["token_ids"] if isinstance(x, dict) else x
        size = len(ids)
        batch = batch_size or 32  # Keras' default
        rows = [min(batch, size), (size % batch) or batch]
    for count in rows:
        _state_batch_check(state, count)
