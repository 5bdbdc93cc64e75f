"""Keys and values shared across the attention layers of one stack.

In a stack with KV sharing (Gemma 4's `num_kv_shared_layers`), a
*producer* layer stores the keys and values it attends to (after its
cache update, with the mask it built), and later *consumer* layers of the
same kind attend to them with their own queries: a consumer has no key or
value projection and no cache of its own. The stack hands one
`SharedKeyValues` to every block of a forward pass (or decoding step), so
the sharing is explicit in the call, not hidden in layer state.

Examples:
    >>> shared = SharedKeyValues()
    >>> shared.store("full_attention", ("k", "v", None, True))
    >>> shared.get("full_attention")
    ('k', 'v', None, True)
"""

from __future__ import annotations

from keras import ops

from keras_transformers.backend import call_layer
from keras_transformers.layers.attention_scores import attend


class SharedKeyValues:
    """The keys and values of one forward pass, by name (a layer type).

    Each entry is `(key [B, S, K, H], value [B, S, K, H], mask, is_causal)`:
    what a producer attended to, and its attention mask (`[B|1, T, S]` or
    None) or the fused causal flag, which a consumer of the same kind
    (window, positions) reuses as is.
    """

    def __init__(self):
        self._entries = {}

    def store(self, name: str, entry: tuple) -> None:
        self._entries[name] = entry

    def get(self, name: str) -> tuple:
        if name not in self._entries:
            raise ValueError(
                f"No keys and values were stored under {name!r} before a layer "
                "that reuses them: the stack must run a producer layer of that "
                "kind first (see `key_value_store`)."
            )
        return self._entries[name]


def reuse(layer, query, shared_key_values, cache_index, positions, training):
    """A consumer layer's attention (`layer`, a `MultiHeadAttention` with
    `key_value_reuse`): `query` `[B, T, D]` attends to the keys, values and
    mask stored under its `key_value_reuse` (their positions are this
    call's). Returns `[B, T, D]`."""
    k, v, mask, is_causal = shared_key_values.get(layer.key_value_reuse)
    q = layer._normed(layer.query_norm, call_layer(layer.query_dense, query))
    if layer.rotary is not None:
        if positions is None:
            offset = 0 if cache_index is None else cache_index
            positions = layer._positions(ops.shape(query)[1], offset)
        (q,) = layer.rotary.rotate((q,), positions)
    out = attend(layer, q, k, v, mask, is_causal, training)
    return call_layer(layer.output_dense, out)  # [B, T, D]


def scale_free_rms(x, epsilon: float):
    """`x / sqrt(mean(x**2) + epsilon)` over the last axis, in float32
    (a value norm without learned scales), cast back to `x`'s dtype."""
    x32 = ops.cast(x, "float32")
    mean = ops.mean(ops.square(x32), axis=-1, keepdims=True)
    return ops.cast(x32 * ops.power(mean + epsilon, -0.5), x.dtype)


__all__ = ["SharedKeyValues", "reuse", "scale_free_rms"]
