"""Attention masks, built in one place for every layer.

Masks are boolean and True where attention is allowed, shaped so that they
broadcast against attention logits `[B, N, T, S]`:
B batch, N heads, T query length, S key length.
"""

from __future__ import annotations

from keras import ops


def attention_mask(
    query_length: int,
    key_length: int,
    key_padding_mask=None,
    causal: bool = False,
    sliding_window: int | None = None,
    query_offset=0,
    key_positions=None,
    documents=None,
):
    """Builds a boolean attention mask.

    Args:
        query_length: T, number of query positions.
        key_length: S, number of key positions.
        key_padding_mask: optional `[B, S]`, True/1 where the key is a real token.
        causal: queries attend only to keys at the same or earlier positions.
        sliding_window: if set, with `causal`, queries attend only to the
            `sliding_window` most recent positions (including their own);
            without (an encoder's sliding layers), to the keys at most
            `sliding_window // 2` positions away on either side.
        query_offset: absolute position of the first query (an int or a
            scalar tensor; the KV-cache index when decoding).
        key_positions: `[S]` int, the absolute position of each key, for a
            ring KV cache whose slots are out of order; keys at negative
            positions (empty slots) are masked (with `causal`). None: keys
            are at positions `0 .. S - 1`.
        documents: optional `[B, T]` int, the document of each position of
            a packed row (self-attention, `T == S`): a query sees only keys
            of its own document.

    Returns:
        None when nothing is masked, else a bool tensor of shape `[1, 1, T, S]`
        or `[B, 1, T, S]`.
    """
    mask = None
    if causal or sliding_window is not None:
        q_pos = ops.arange(query_length, dtype="int32") + ops.cast(
            query_offset, "int32"
        )
        k_pos = ops.arange(key_length, dtype="int32")
        if key_positions is not None:
            k_pos = ops.cast(key_positions, "int32")
        q_pos, k_pos = q_pos[:, None], k_pos[None, :]
        if causal:
            mask = k_pos <= q_pos
            if sliding_window is not None:
                mask = ops.logical_and(mask, k_pos > q_pos - sliding_window)
        else:  # a symmetric window
            mask = ops.abs(k_pos - q_pos) <= sliding_window // 2
        if key_positions is not None:
            mask = ops.logical_and(mask, k_pos >= 0)
        mask = mask[None, None, :, :]
    if key_padding_mask is not None:
        padding = ops.cast(key_padding_mask, "bool")[:, None, None, :]
        mask = padding if mask is None else ops.logical_and(mask, padding)
    if documents is not None:  # [B, 1, T, S]: within each packed document
        same = ops.equal(documents[:, None, :, None], documents[:, None, None, :])
        mask = same if mask is None else ops.logical_and(mask, same)
    return mask


def sliceable_bias(bias) -> bool:
    """An attention bias tensor with a key axis to cut (not a callable, not
    broadcast over keys)."""
    return bias is not None and not callable(bias) and bias.shape[-1] != 1
