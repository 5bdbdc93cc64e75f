"""Text generation: KV-cached, compiled decode loop and samplers."""

from keras_transformers.generation.generate import generate
from keras_transformers.generation.sampling import SamplerSpec, next_token

__all__ = ["SamplerSpec", "generate", "next_token"]
