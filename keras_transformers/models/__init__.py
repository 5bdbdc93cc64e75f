"""Model classes of every family (all `keras.Model`s).

Each class registers itself under its family and task (see
`keras_transformers.registry`), which is how `keras_transformers.from_preset`
finds the class a preset names.
"""

from keras_transformers.models.bert import (
    BertBackbone,
    BertClassifier,
    BertMaskedLM,
    BertTokenClassifier,
    ElectraDiscriminator,
)
from keras_transformers.models.causal_lm import CausalLM
from keras_transformers.models.gpt import GPTBackbone, GPTCausalLM
from keras_transformers.models.gpt_classifier import GPTClassifier
from keras_transformers.models.mixtral import (
    MixtralBackbone,
    MixtralCausalLM,
    MixtralClassifier,
)
from keras_transformers.models.seq2seq import Seq2SeqBackbone, Seq2SeqLM
from keras_transformers.models.text_embedder import TextEmbedder
from keras_transformers.models.vit import ViTBackbone, ViTClassifier

__all__ = [
    "BertBackbone",
    "BertClassifier",
    "BertMaskedLM",
    "BertTokenClassifier",
    "CausalLM",
    "ElectraDiscriminator",
    "GPTBackbone",
    "GPTCausalLM",
    "GPTClassifier",
    "MixtralBackbone",
    "MixtralCausalLM",
    "MixtralClassifier",
    "Seq2SeqBackbone",
    "Seq2SeqLM",
    "TextEmbedder",
    "ViTBackbone",
    "ViTClassifier",
]
