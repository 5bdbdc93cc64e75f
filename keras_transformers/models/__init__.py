"""Model classes of every family (all `keras.Model`s)."""

from keras_transformers.models.causal_lm import CausalLM
from keras_transformers.models.gpt import GPTBackbone, GPTCausalLM

# family -> (backbone class, default class for `keras_transformers.from_preset`)
FAMILY_CLASSES = {
    "gpt": (GPTBackbone, GPTCausalLM),
}
CLASSES = {cls.__name__: cls for pair in FAMILY_CLASSES.values() for cls in pair}

__all__ = ["CausalLM", "GPTBackbone", "GPTCausalLM"]
