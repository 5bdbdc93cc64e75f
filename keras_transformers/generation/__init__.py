"""Text generation: KV-cached, compiled decode loops, samplers and beam
search (`seq2seq.generate` for encoder-decoder models)."""

from keras_transformers.generation.beam_search import BeamSpec, beam_search
from keras_transformers.generation.generate import generate
from keras_transformers.generation.sampling import SamplerSpec, next_token

__all__ = ["BeamSpec", "SamplerSpec", "beam_search", "generate", "next_token"]
