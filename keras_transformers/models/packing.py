"""Packed rows: several examples in one row of a decoder's batch.

A row that holds several examples (documents) one after another carries
`document_ids` `[B, T]` beside its `token_ids`: tokens with equal ids
belong to one document. Each token attends (causally) only to earlier
tokens of its document, and its position (rotary or learned) counts from
its document's first token, so a packed batch computes what the same
examples would compute alone (`keras_transformers.data.sft_dataset` with
`pack=True` builds such rows).
"""

from __future__ import annotations

from keras import ops

from keras_transformers.config.layer_types import RECURRENT_TYPES


def packed_arguments(backbone, token_ids, document_ids) -> dict:
    """The blocks' keyword arguments for packed rows: `document_ids` `[B, T]`
    int32 (for the attention masks) and `positions` `[B, T]` int32, the
    number of earlier tokens of each token's document.

    Raises:
        ValueError: a shape other than `token_ids`' `[B, T]`, or a model
            whose layers cannot keep documents apart (linear attention,
            Transformer-XL memory, relative position biases).
    """
    config = backbone.config
    unsupported = sorted(set(config.layer_types or ()) & set(RECURRENT_TYPES))
    if unsupported or config.position_embedding not in ("rotary", "learned", "none"):
        what = unsupported or [f"position_embedding={config.position_embedding!r}"]
        raise ValueError(
            f"Packed rows (`document_ids`) need attention layers with rotary, "
            f"learned or no positions; this model has {', '.join(what)}. "
            "Train it on unpacked rows (one example per row, padded)."
        )
    if tuple(document_ids.shape) != tuple(token_ids.shape):
        raise ValueError(
            f"`document_ids` shape {tuple(document_ids.shape)} does not match "
            f"`token_ids` shape {tuple(token_ids.shape)}: give each token the "
            "id of the example it belongs to."
        )
    document_ids = ops.cast(document_ids, "int32")
    same = ops.equal(document_ids[:, :, None], document_ids[:, None, :])  # [B, T, T]
    length = ops.shape(token_ids)[1]
    index = ops.arange(length)
    earlier = (index[None, :] <= index[:, None])[None]  # [1, T, T]
    count = ops.sum(ops.cast(ops.logical_and(same, earlier), "int32"), axis=-1)
    return {"document_ids": document_ids, "positions": count - 1}
