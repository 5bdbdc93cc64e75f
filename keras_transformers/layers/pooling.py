"""Pooling of token states into one vector per sequence (sentence embeddings)."""

from __future__ import annotations

import keras
from keras import ops

from keras_transformers.layers.serializable import serializable

# sentence-transformers' pooling modes, in the order it concatenates them.
POOLING_MODES = (
    "cls",
    "max",
    "mean",
    "mean_sqrt_len_tokens",
    "weightedmean",
    "lasttoken",
)


def check_pooling(pooling) -> tuple[str, ...]:
    """`pooling` (a mode name or a sequence of them) as a tuple of modes.

    Raises:
        ValueError: an empty or unknown mode, naming the valid ones.
    """
    modes = (pooling,) if isinstance(pooling, str) else tuple(pooling or ())
    unknown = [mode for mode in modes if mode not in POOLING_MODES]
    if unknown or not modes:
        raise ValueError(
            f"Unknown pooling mode {unknown[0] if unknown else pooling!r}. Valid "
            f"modes: {POOLING_MODES} (a sequence of them concatenates the results)."
        )
    return modes


def l2_normalize(x, epsilon=1e-12):
    """`x [B, D] / max(||x||, epsilon)`, as `torch.nn.functional.normalize`."""
    norm = ops.sqrt(ops.sum(ops.square(x), axis=-1, keepdims=True))
    return x / ops.maximum(norm, epsilon)


@serializable
class TokenPooling(keras.layers.Layer):
    """Pools `[B, T, D]` token states over the real tokens into `[B, D]`.

    The modes are sentence-transformers' `Pooling`: "mean" (over the
    padding mask), "cls" (the first real token), "lasttoken" (the last real
    token), "max" (per feature, over the real tokens), "mean_sqrt_len_tokens"
    (the sum over `sqrt(number of real tokens)`), "weightedmean" (token
    `i` of the sequence weighted by `i + 1`). Several modes concatenate, in
    the order given. Pooling runs in float32 whatever the dtype policy.

    Args:
        pooling: a mode or a sequence of modes (default "mean").
        normalize: L2-normalise the result (sentence-transformers'
            `Normalize` module).

    Call arguments:
        hidden: `[B, T, D]` token states.
        padding_mask: `[B, T]`, 1/True on real tokens (None: all real).

    Returns:
        `[B, len(modes) * D]` float32 embeddings.

    Examples:
        >>> pool = TokenPooling("mean", normalize=True)
        >>> tuple(pool(np.ones((2, 5, 8)), np.ones((2, 5))).shape)
        (2, 8)
    """

    def __init__(self, pooling="mean", normalize=False, **kwargs):
        super().__init__(**kwargs)
        modes = check_pooling(pooling)
        self.pooling = modes[0] if len(modes) == 1 else list(modes)
        self.modes = modes
        self.normalize = bool(normalize)

    def call(self, hidden, padding_mask=None):
        x = ops.cast(hidden, "float32")  # [B, T, D]
        length = ops.shape(x)[1]
        if padding_mask is None:
            padding_mask = ops.ones(ops.shape(x)[:2], dtype="bool")
        mask = ops.cast(padding_mask, "float32")[:, :, None]  # [B, T, 1]
        count = ops.maximum(ops.sum(mask, axis=1), 1e-9)  # [B, 1]
        first = ops.argmax(ops.cast(padding_mask, "int32"), axis=1)  # [B]
        out = []
        for mode in self.modes:
            if mode == "cls":
                out.append(_take(x, first))
            elif mode == "lasttoken":  # masked: an empty row gives zeros
                last = length - 1 - ops.argmax(ops.flip(mask[:, :, 0], axis=1), axis=1)
                out.append(_take(x * mask, last))
            elif mode == "max":
                out.append(ops.max(ops.where(mask > 0, x, float("-inf")), axis=1))
            elif mode == "weightedmean":  # weights 1, 2, ... from the first real token
                positions = ops.arange(1, length + 1, dtype="float32")[None, :]
                offset = ops.cast(first, "float32")[:, None]
                weights = mask * (positions - offset)[:, :, None]  # [B, T, 1]
                total = ops.maximum(ops.sum(weights, axis=1), 1e-9)
                out.append(ops.sum(x * weights, axis=1) / total)
            else:  # mean, mean_sqrt_len_tokens
                total = ops.sum(x * mask, axis=1)  # [B, D]
                out.append(total / (count if mode == "mean" else ops.sqrt(count)))
        pooled = out[0] if len(out) == 1 else ops.concatenate(out, axis=-1)
        return l2_normalize(pooled) if self.normalize else pooled

    def compute_output_shape(self, hidden_shape, padding_mask_shape=None):
        width = None if hidden_shape[-1] is None else hidden_shape[-1] * len(self.modes)
        return (hidden_shape[0], width)

    def get_config(self):
        return {
            **super().get_config(),
            "pooling": self.pooling,
            "normalize": self.normalize,
        }


def _take(x, index):
    """Row `index[b]` of each `x[b]`: `[B, T, D]`, `[B]` -> `[B, D]`."""
    index = ops.cast(index, "int32")[:, None, None]  # [B, 1, 1]
    return ops.take_along_axis(x, index, axis=1)[:, 0, :]
