"""Reusable transformer layers; each serializes completely via `get_config()`."""

from keras_transformers.layers.attention import MultiHeadAttention
from keras_transformers.layers.block import TransformerBlock
from keras_transformers.layers.disentangled import DisentangledAttention
from keras_transformers.layers.embeddings import TokenEmbedding
from keras_transformers.layers.feed_forward import FeedForward, make_norm
from keras_transformers.layers.gated_deltanet import GatedDeltaNet
from keras_transformers.layers.heads import MaskedLMHead
from keras_transformers.layers.kv_sharing import SharedKeyValues
from keras_transformers.layers.masks import attention_mask
from keras_transformers.layers.moe import SparseMoE
from keras_transformers.layers.patches import PatchEmbedding
from keras_transformers.layers.per_layer_inputs import PerLayerInputGate, PerLayerInputs
from keras_transformers.layers.pooling import TokenPooling
from keras_transformers.layers.positions import (
    PositionEmbedding,
    RelativePositionBias,
    SinusoidalPositionEncoding,
)
from keras_transformers.layers.rotary import RotaryEmbedding

__all__ = [
    "DisentangledAttention",
    "FeedForward",
    "GatedDeltaNet",
    "MaskedLMHead",
    "MultiHeadAttention",
    "PatchEmbedding",
    "PerLayerInputGate",
    "PerLayerInputs",
    "PositionEmbedding",
    "RelativePositionBias",
    "RotaryEmbedding",
    "SharedKeyValues",
    "SinusoidalPositionEncoding",
    "SparseMoE",
    "TokenPooling",
    "TokenEmbedding",
    "TransformerBlock",
    "attention_mask",
    "make_norm",
]
