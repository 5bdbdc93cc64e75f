"""The models and data the multi-device cases train: one tiny preset per
family (built with one layer where every layer has the same layout; with
each kind of layer of the mixed ones: linear and full attention, a dense
block and a sparse one with a shared expert), with a batch of 8 and the
variable each checks the sharding of."""

import keras
import numpy as np

from keras_transformers import models
from keras_transformers.training import MaskedSparseCategoricalCrossentropy

RNG = np.random.default_rng(0)
IDS = RNG.integers(3, 500, (8, 12)).astype("int32")
# 0/1 integer masks: under tf.distribute, Keras' TF trainer averages a first
# batch over the replicas to build the model, which fails on bool tensors.
MASK = np.ones_like(IDS)
MASK[1, 9:] = 0  # one padded row: masks must shard too


def _text_lm():
    return (
        {"token_ids": IDS, "padding_mask": MASK},
        IDS,
        MaskedSparseCategoricalCrossentropy(),
    )


def _bert():
    x = {"token_ids": IDS, "segment_ids": np.zeros_like(IDS), "padding_mask": MASK}
    return (
        x,
        np.arange(8) % 3,
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )


def _seq2seq():
    x = {
        "encoder_token_ids": IDS,
        "encoder_padding_mask": MASK,
        "decoder_token_ids": IDS[:, ::-1].copy(),
        "decoder_padding_mask": np.ones_like(MASK),
    }
    return x, IDS, MaskedSparseCategoricalCrossentropy()


def _vit():
    images = RNG.uniform(0, 1, (8, 28, 28, 1)).astype("float32")
    return (
        images,
        np.arange(8) % 3,
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )


# A Qwen3.5 layout shrunk to test size: a Gated DeltaNet (linear attention)
# block, then a gated full-attention one.
QWEN3_5_TINY = dict(
    vocabulary_size=512,
    num_layers=2,
    hidden_dim=32,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    intermediate_dim=48,
    max_sequence_length=128,
    layer_types=["linear_attention", "full_attention"],
    linear_attention=dict(
        num_key_heads=2, num_value_heads=4, key_head_dim=8, value_head_dim=6
    ),
)

# (model class, preset, extra arguments (default: one layer, as every layer
# has the same layout), data, a variable path suffix that the `model` axis
# splits, its expected mesh axes)
FAMILIES = {
    "gpt2": (models.GPTCausalLM, "gpt2_tiny", {}, _text_lm, "query/kernel", (None, "model", None)),
    "llama": (models.GPTCausalLM, "gpt_llama_tiny", {}, _text_lm, "gate/kernel", (None, "model")),
    "mixtral": (
        models.MixtralCausalLM, "mixtral_tiny", {}, _text_lm, "expert_down", ("expert", "model", None),
    ),
    "qwen3_5": (
        models.GPTCausalLM, "qwen3.5_9b", QWEN3_5_TINY, _text_lm, "beta/kernel", (None, "model"),
    ),
    # A dense block, then 4 experts and a gated shared expert.
    "qwen_moe": (
        models.MixtralCausalLM, "qwen_moe_tiny", {"num_layers": 2}, _text_lm,
        "shared_experts/gate/kernel", (None, "model"),
    ),
    "bert": (
        models.BertClassifier, "bert_tiny", {"num_classes": 3, "classifier_dropout": 0.0}, _bert,
        "attention_output/kernel", ("model", None, None),
    ),
    "seq2seq": (
        models.Seq2SeqLM, "transformer_tiny", {}, _seq2seq, "token_embedding/embeddings", ("model", None),
    ),
    "vit": (
        models.ViTClassifier, "vit_tiny_28", {"num_classes": 3, "classifier_dropout": 0.0}, _vit,
        "intermediate/kernel", (None, "model"),
    ),
}  # fmt: skip
