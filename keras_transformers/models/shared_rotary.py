"""The rotary angles of a stack of blocks, computed once per forward pass
for each rotary setting among them (see `keras_transformers.layers.rotary`)."""

from __future__ import annotations

from keras import ops

from keras_transformers.layers.attention import MultiHeadAttention


def _rotary(block):
    """The `RotaryEmbedding` that `block`'s self-attention applies in
    `MultiHeadAttention.process_heads`, or None (no rotary positions, a
    token mixer of another kind, or one that positions its heads itself)."""
    mixer = getattr(block, "self_attention", None)
    rotary = getattr(mixer, "rotary", None)
    if rotary is None or not isinstance(mixer, MultiHeadAttention):
        return None
    if type(mixer).process_heads is not MultiHeadAttention.process_heads:
        return None
    return rotary


def shared_rotary_angles(blocks, x, positions=None, cache_index=None):
    """One `RotaryAngles` per block with default rotary self-attention, the
    same object for the blocks of one rotary setting; None for the others.

    Args:
        blocks: the `TransformerBlock`s of a stack.
        x: `[B, T, D]`, the stack's input (for `T`).
        positions: `[T]` or `[B, T]` int positions of the tokens; None:
            `cache_index + arange(T)`, as each layer would take.
        cache_index: position of the first token (int, scalar or `[B]`
            per row); None: 0.

    Returns:
        A list with an entry per block, or None when no block has rotary
        positions.
    """
    shared, out = {}, []
    for block in blocks:
        rotary = _rotary(block)
        if rotary is None:
            out.append(None)
            continue
        head_dim = block.self_attention.head_dim
        setting = rotary.setting(head_dim)
        if setting not in shared:
            if positions is None:
                offset = 0 if cache_index is None else cache_index
                positions = MultiHeadAttention._positions(ops.shape(x)[1], offset)
            shared[setting] = rotary.angles(positions, head_dim)
        out.append(shared[setting])
    return out if shared else None


__all__ = ["shared_rotary_angles"]
