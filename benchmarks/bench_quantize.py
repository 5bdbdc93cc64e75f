"""Accuracy cost of int8 weight quantisation on a briefly trained small GPT.

    KERAS_BACKEND=jax python benchmarks/bench_quantize.py [--steps 150]

Trains `--preset` (default `gpt_mini`, Llama layout) for `--steps` steps on
Python's own documentation (`keras_transformers.data.default_text`), then
evaluates the held-out tail in float32 and after `model.quantize("int8")`
(per-channel abs-max weights, per-token dynamic int8 activations, Keras'
scheme): loss, perplexity, next-token accuracy, the share of greedy
next-token predictions that agree, and the weights' size in bytes.
"""

import argparse
import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_transformers  # noqa: E402
from keras_transformers import data  # noqa: E402
from keras_transformers.models import GPTCausalLM  # noqa: E402
from keras_transformers.tokenizer import train_bpe  # noqa: E402
from keras_transformers.training import (  # noqa: E402
    MaskedAccuracy,
    MaskedSparseCategoricalCrossentropy,
    Perplexity,
)

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--preset", default="gpt_mini")
parser.add_argument("--steps", type=int, default=150)
parser.add_argument("--max-chars", type=int, default=400_000)
parser.add_argument("--sequence-length", type=int, default=128)
parser.add_argument("--batch-size", type=int, default=16)
args = parser.parse_args()
keras.utils.set_random_seed(0)

text = data.default_text()[: args.max_chars]
vocabulary_size = keras_transformers.load_config(args.preset).vocabulary_size
tokenizer = train_bpe([text], vocabulary_size=vocabulary_size)
train_ids, val_ids = data.split_tokens(tokenizer.encode(text), validation_fraction=0.1)
length, batch = args.sequence_length, args.batch_size
train = data.lm_dataset(train_ids, length, batch, shuffle=True, num_batches=args.steps)
validation = data.lm_dataset(val_ids, length, batch)
model = GPTCausalLM.from_preset(
    args.preset,
    vocabulary_size=tokenizer.vocabulary_size,
    pad_token_id=tokenizer.pad_token_id,
    bos_token_id=tokenizer.bos_token_id,
    eos_token_id=tokenizer.eos_token_id,
)
model.compile(
    optimizer=keras.optimizers.AdamW(2e-3, beta_2=0.95, global_clipnorm=1.0),
    loss=MaskedSparseCategoricalCrossentropy(from_logits=True),
    metrics=[Perplexity(from_logits=True), MaskedAccuracy(name="accuracy")],
)
model.fit(train, epochs=1, verbose=2)


def weight_bytes(model):
    return sum(
        int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in model.weights
    )


def predictions(model):
    return np.concatenate(
        [np.asarray(keras.ops.argmax(model(x), -1)) for x, _ in validation]
    )


rows = []
for name in ("float32", "int8"):
    if name == "int8":
        model.quantize("int8")
    metrics = model.evaluate(validation, return_dict=True, verbose=0)
    rows.append((name, metrics, weight_bytes(model), predictions(model)))
agree = float(np.mean(rows[0][3] == rows[1][3]))
print(
    f"\n{args.preset}, {args.steps} steps x {batch} x {length} tokens, "
    f"{keras.config.backend()}; validation {len(val_ids):,} tokens"
)
print("| weights | val loss | perplexity | next-token acc | weight bytes |")
print("|---|---|---|---|---|")
for name, m, size, _ in rows:
    print(
        f"| {name} | {m['loss']:.4f} | {m['perplexity']:.2f} | "
        f"{m['accuracy']:.4f} | {size:,} |"
    )
print(f"greedy next-token agreement float32 vs int8: {agree:.4f}")
