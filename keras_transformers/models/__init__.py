"""Model classes of every family (all `keras.Model`s)."""

from keras_transformers.models.bert import (
    BertBackbone,
    BertClassifier,
    BertMaskedLM,
    BertTokenClassifier,
)
from keras_transformers.models.causal_lm import CausalLM
from keras_transformers.models.gpt import GPTBackbone, GPTCausalLM

# family -> (backbone class, default class for `keras_transformers.from_preset`)
FAMILY_CLASSES = {
    "gpt": (GPTBackbone, GPTCausalLM),
    "bert": (BertBackbone, BertMaskedLM),
}
CLASSES = {
    cls.__name__: cls
    for cls in [
        GPTBackbone,
        GPTCausalLM,
        BertBackbone,
        BertMaskedLM,
        BertClassifier,
        BertTokenClassifier,
    ]
}

__all__ = [
    "BertBackbone",
    "BertClassifier",
    "BertMaskedLM",
    "BertTokenClassifier",
    "CausalLM",
    "GPTBackbone",
    "GPTCausalLM",
]
