"""Text generation: KV-cached, compiled decode loops, samplers, logits
processors, stop strings, beam search (`seq2seq.generate` for
encoder-decoder models), generation defaults (`GenerationConfig`) and chat
templates (`apply_chat_template`, `chat`, `check_messages`)."""

from keras_transformers.generation.beam_search import BeamSpec, beam_search
from keras_transformers.generation.chat import (
    apply_chat_template,
    chat,
    check_messages,
)
from keras_transformers.generation.config import GenerationConfig
from keras_transformers.generation.generate import generate
from keras_transformers.generation.sampling import SamplerSpec, next_token

__all__ = [
    "BeamSpec",
    "GenerationConfig",
    "SamplerSpec",
    "apply_chat_template",
    "beam_search",
    "chat",
    "check_messages",
    "generate",
    "next_token",
]
