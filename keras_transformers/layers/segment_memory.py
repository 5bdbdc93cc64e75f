"""Transformer-XL segment memory: the attention keys of earlier segments,
and the per-row state that carries them from one batch to the next.

Shape letters: L layers, B batch, M memory slots, T segment length,
S keys of the segment (or cache), D model width, K key/value heads, H head size.
"""

from __future__ import annotations

import keras
from keras import ops

from keras_transformers.backend import call_layer
from keras_transformers.layers.serializable import serializable


def with_memory(layer, memory, memory_mask, k, v, key_padding_mask, cached):
    """Keys and values `[B, M + S, K, H]` over the memory then the segment,
    and their padding mask `[B, M + S]` (None when neither part has one).

    Without a cache (`cached=False`), `layer` (a `MultiHeadAttention`)
    already projected `concat(memory, x)`; with one, the memory's keys and
    values are projected here and prepended to the cache's.
    """
    m = ops.shape(memory)[1]
    s = ops.shape(k)[1] - (0 if cached else m)
    if cached:
        memory = ops.cast(memory, k.dtype)
        k_mem = layer._normed(layer.key_norm, call_layer(layer.key_dense, memory))
        v_mem = call_layer(layer.value_dense, memory)
        k = ops.concatenate([ops.cast(k_mem, k.dtype), k], axis=1)
        v = ops.concatenate([ops.cast(v_mem, v.dtype), v], axis=1)
    if memory_mask is None and key_padding_mask is None:
        return k, v, None
    b = ops.shape(k)[0]
    if memory_mask is None:
        memory_mask = ops.ones((b, m), "bool")
    if key_padding_mask is None:
        key_padding_mask = ops.ones((b, s), "bool")
    masks = [ops.cast(memory_mask, "bool"), ops.cast(key_padding_mask, "bool")]
    return k, v, ops.concatenate(masks, axis=1)


def next_memory(memory, memory_mask, layer_inputs, padding_mask, length):
    """The memory after a segment: per layer, the last `length` states of
    `concat(memory, inputs)`, without gradient.

    Args:
        memory: `[L, B, M, D]` or None (no earlier states).
        memory_mask: `[B, M]` bool or None (all valid).
        layer_inputs: L tensors `[B, T, D]`: each block's input.
        padding_mask: `[B, T]` bool or None (all real).
        length: slots kept.

    Returns:
        `(memory [L, B, length, D], memory_mask [B, length])`; slots before
        any state are zero and masked.
    """
    states = ops.stop_gradient(ops.stack(layer_inputs))  # [L, B, T, D]
    b, t = ops.shape(states)[1], ops.shape(states)[2]
    if padding_mask is None:
        padding_mask = ops.ones((b, t), "bool")
    if memory is None:
        pad = (len(layer_inputs), b, length, ops.shape(states)[3])
        memory = ops.zeros(pad, states.dtype)
        memory_mask = ops.zeros((b, length), "bool")
    elif memory_mask is None:
        memory_mask = ops.ones(ops.shape(memory)[1:3], "bool")
    joined = ops.concatenate([ops.cast(memory, states.dtype), states], axis=2)
    mask = ops.concatenate(
        [ops.cast(memory_mask, "bool"), ops.cast(padding_mask, "bool")], axis=1
    )
    return joined[:, :, -length:], mask[:, -length:]


@serializable
class SegmentMemory(keras.layers.Layer):
    """Memory of a stateful Transformer-XL: non-trainable variables that
    hold, for each of B rows, each block's input states of the last M
    positions seen (`states [L, B, M, D]`) and which slots are filled
    (`valid [B, M]`). Row i of a batch continues row i of the previous one,
    as a stateful RNN's. The state is never saved with the weights: a saved
    model loads with any memory length and batch size.

    Args:
        num_layers: L.
        hidden_dim: D.

    Examples:
        >>> memory = SegmentMemory(2, 8)
        >>> memory.allocate(batch_size=3, length=4)
        >>> tuple(memory.states.shape)
        (2, 3, 4, 8)
    """

    weight_axes = {"states": None, "valid": None}  # replicated

    def __init__(self, num_layers, hidden_dim, **kwargs):
        super().__init__(**kwargs)
        self.num_layers = num_layers
        self.hidden_dim = hidden_dim
        self.states = self.valid = None
        self.built = True

    @property
    def batch_size(self):
        return None if self.states is None else self.states.shape[1]

    @property
    def length(self):
        return None if self.states is None else self.states.shape[2]

    def allocate(self, batch_size, length):
        """Zero state for `batch_size` rows of `length` slots (new variables
        when the shape changes)."""
        shape = (self.num_layers, batch_size, length, self.hidden_dim)
        if self.states is not None and tuple(self.states.shape) == shape:
            self.states.assign(ops.zeros(shape, self.states.dtype))
            self.valid.assign(ops.zeros(shape[1:3], "int32"))
            return
        if self.states is not None:  # drop the old variables
            self._tracker.unlock()
            self._non_trainable_variables.clear()
        self.states = self.add_weight(
            shape=shape, initializer="zeros", trainable=False, name="states"
        )
        self.valid = self.add_weight(
            shape=shape[1:3],
            initializer="zeros",
            dtype="int32",
            trainable=False,
            name="valid",
        )

    def read(self, reset=None):
        """`(states [L, B, M, D], valid [B, M] bool)`; rows where `reset`
        (`[B]`, True where a new document starts) see no memory."""
        valid = ops.cast(self.valid, "bool")
        if reset is not None:
            keep = ops.logical_not(ops.cast(reset, "bool"))[:, None]
            valid = ops.logical_and(valid, keep)
        # A copy: `write` assigns in place (PyTorch's autograd keeps the read).
        return ops.copy(self.states), valid

    def write(self, states, valid):
        self.states.assign(ops.cast(states, self.states.dtype))
        self.valid.assign(ops.cast(valid, "int32"))

    def save_own_variables(self, store):
        """Nothing: the memory is run state, not a weight."""

    def load_own_variables(self, store):
        """Nothing: the memory is run state, not a weight."""

    def get_config(self):
        config = super().get_config()
        config.update(num_layers=self.num_layers, hidden_dim=self.hidden_dim)
        return config
