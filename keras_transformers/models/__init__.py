"""Model classes of every family (all `keras.Model`s)."""

from keras_transformers.models.bert import (
    BertBackbone,
    BertClassifier,
    BertMaskedLM,
    BertTokenClassifier,
)
from keras_transformers.models.causal_lm import CausalLM
from keras_transformers.models.gpt import GPTBackbone, GPTCausalLM
from keras_transformers.models.mixtral import MixtralBackbone, MixtralCausalLM
from keras_transformers.models.seq2seq import Seq2SeqBackbone, Seq2SeqLM
from keras_transformers.models.vit import ViTBackbone, ViTClassifier

# family -> (backbone class, default class for `keras_transformers.from_preset`)
FAMILY_CLASSES = {
    "gpt": (GPTBackbone, GPTCausalLM),
    "bert": (BertBackbone, BertMaskedLM),
    "transformer": (Seq2SeqBackbone, Seq2SeqLM),
    "mixtral": (MixtralBackbone, MixtralCausalLM),
    "vit": (ViTBackbone, ViTClassifier),
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
        Seq2SeqBackbone,
        Seq2SeqLM,
        MixtralBackbone,
        MixtralCausalLM,
        ViTBackbone,
        ViTClassifier,
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
    "MixtralBackbone",
    "MixtralCausalLM",
    "Seq2SeqBackbone",
    "Seq2SeqLM",
    "ViTBackbone",
    "ViTClassifier",
]
