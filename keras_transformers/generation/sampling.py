"""Choosing the next token from logits, identically on every backend.

Random choices use inverse-CDF sampling with uniforms drawn by NumPy before
decoding starts, so a seed gives the same tokens on JAX, TensorFlow and
PyTorch, and the compiled loop needs no random-state plumbing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from keras import ops

SAMPLERS = ("greedy", "random", "top_k", "top_p")


@dataclass(frozen=True)
class SamplerSpec:
    """How to pick tokens. `greedy` ignores the other fields.

    Attributes:
        name: "greedy", "random" (full distribution), "top_k" or "top_p".
        temperature: logits are divided by this (> 0).
        top_k: keep the k most likely tokens ("top_k"; with "top_p", the
            nucleus is taken among these k, Hugging Face's order).
        top_p: keep the smallest set whose probability reaches p ("top_p").
    """

    name: str = "greedy"
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self):
        if self.name not in SAMPLERS:
            raise ValueError(
                f"Unknown sampler {self.name!r}. Expected one of {SAMPLERS}."
            )
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(
                "`temperature` must be a finite number > 0. "
                f"Received: temperature={self.temperature}"
            )
        if self.name == "top_k" and (self.top_k is None or self.top_k < 1):
            raise ValueError(
                f"sampler='top_k' needs top_k >= 1. Received: top_k={self.top_k}"
            )
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"`top_k` must be >= 1. Received: top_k={self.top_k}")
        if self.name == "top_p" and not (
            self.top_p is not None and 0 < self.top_p <= 1
        ):
            raise ValueError(
                f"sampler='top_p' needs 0 < top_p <= 1. Received: top_p={self.top_p}"
            )

    @property
    def random(self) -> bool:
        return self.name != "greedy"


def _sample_from(probs, uniform):
    """Inverse-CDF draw: `probs [B, V]`, `uniform [B]` in [0, 1) -> `[B]` ids."""
    cdf = ops.cumsum(probs, axis=-1)
    target = uniform[:, None] * cdf[:, -1:]
    index = ops.sum(ops.cast(cdf <= target, "int32"), axis=-1)
    return ops.minimum(index, probs.shape[-1] - 1)


def next_token(logits, uniform, spec: SamplerSpec):
    """Picks one token per row.

    Args:
        logits: `[B, V]`.
        uniform: `[B]` uniforms in [0, 1) (ignored by greedy).
        spec: the sampler.

    Returns:
        `[B]` int32 token ids.
    """
    logits = ops.cast(logits, "float32")
    if spec.name == "greedy":
        return ops.cast(ops.argmax(logits, axis=-1), "int32")
    logits = logits / spec.temperature
    if spec.name == "top_k":
        k = min(spec.top_k, logits.shape[-1])
        kth = ops.top_k(logits, k)[0][:, -1:]
        logits = ops.where(logits < kth, -1e9, logits)
    if spec.name != "top_p":
        return ops.cast(_sample_from(ops.softmax(logits, axis=-1), uniform), "int32")
    k = logits.shape[-1] if spec.top_k is None else min(spec.top_k, logits.shape[-1])
    sorted_logits, sorted_ids = ops.top_k(logits, k)  # [B, k], descending
    probs = ops.softmax(sorted_logits, axis=-1)
    before = ops.cumsum(probs, axis=-1) - probs  # mass of more likely tokens
    probs = ops.where(before < spec.top_p, probs, 0.0)  # always keeps the first
    index = _sample_from(probs, uniform)
    return ops.cast(
        ops.take_along_axis(sorted_ids, index[:, None], axis=-1)[:, 0], "int32"
    )
