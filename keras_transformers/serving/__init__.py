"""Serving a causal LM to concurrent clients: the continuous-batching
`Engine` and the OpenAI-compatible HTTP server (`keras-transformers
serve`)."""

from keras_transformers.serving.engine import Engine, Request
from keras_transformers.serving.text import TextStream

__all__ = ["Engine", "Request", "TextStream"]
