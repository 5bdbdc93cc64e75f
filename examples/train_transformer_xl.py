"""Transformer-XL segment memory on real text: the same small decoder
trained with and without memory, at equal segment length.

    KERAS_BACKEND=jax python examples/train_transformer_xl.py
    KERAS_BACKEND=torch python examples/train_transformer_xl.py --epochs 4

The King James Bible (`apt-get install bible-kjv`; without it, Python's own
documentation) is tokenized with a small byte-level BPE and laid out as
`--batch-size` contiguous streams of consecutive segments
(`keras_transformers.data.segment_batches`): row i of each batch continues
row i of the previous one. Two models with Transformer-XL relative
positions are trained with `fit()` on the same batches from the same
initial weights: one with a memory of `--memory` positions, one without.
The script prints

1. the validation perplexity of each;
2. the memory model's validation perplexity with longer evaluation memories
   (the weights are the same: only `eval_memory_length` changes);
3. evaluation speed: segments with memory against recomputing, for every
   segment, a sliding window over the same context (memory + segment).

The defaults take about 7 minutes on two busy CPU cores.
"""

import argparse
import os
import tempfile
import time

os.environ.setdefault("KERAS_BACKEND", "jax")  # pick the backend before Keras loads

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_transformers import data  # noqa: E402
from keras_transformers.models import GPTCausalLM  # noqa: E402
from keras_transformers.tokenizer import train_bpe  # noqa: E402
from keras_transformers.training import (  # noqa: E402
    AdamW,
    MaskedSparseCategoricalCrossentropy,
    Perplexity,
)

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--max-chars", type=int, default=400_000)
parser.add_argument("--vocabulary-size", type=int, default=512)
parser.add_argument("--segment", type=int, default=16, help="segment length T")
parser.add_argument("--memory", type=int, default=48, help="training memory M")
parser.add_argument("--eval-memories", default="96,192", help="longer eval memories")
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()

# 1. Text, tokens, and consecutive segments (95% train, 5% validation).
text = (data.kjv_text() or data.default_text())[: args.max_chars]
tokenizer = train_bpe([text], vocabulary_size=args.vocabulary_size)
ids = np.asarray(tokenizer.encode(text), "int32")
split = int(len(ids) * 0.95)
train = data.segment_batches(ids[:split], args.batch_size, args.segment)
valid = data.segment_batches(ids[split:], 4, args.segment)
print(
    f"{len(text):,} characters, {len(ids):,} tokens; {len(train)} training "
    f"batches of {args.batch_size} x {args.segment}, {valid.num_tokens:,} "
    "validation tokens"
)

CONFIG = dict(
    vocabulary_size=tokenizer.vocabulary_size,
    num_layers=3,
    hidden_dim=96,
    num_heads=4,
    intermediate_dim=256,
    max_sequence_length=512,
    position_embedding="transformer_xl",
    dropout=0.1,
    pad_token_id=0,
)


def build(memory, eval_memory=None, weights=None):
    keras.utils.set_random_seed(0)  # the same initial weights for every model
    model = GPTCausalLM(**CONFIG, memory_length=memory, eval_memory_length=eval_memory)
    if weights is not None:
        model.load_weights(weights)
    model.compile(
        optimizer=AdamW(2e-3, global_clipnorm=1.0),
        loss=MaskedSparseCategoricalCrossentropy(from_logits=True),
        metrics=[Perplexity(from_logits=True)],
    )
    return model


def perplexity(model, batches, batch_size):
    if model.config.memory_length or model.config.eval_memory_length:
        model.reset_memory(batch_size)  # stateful: rows continue across batches
    return model.evaluate(batches, verbose=0, return_dict=True)["perplexity"]


# 2. Train both models on the same batches.
results = {}
for name, memory in (("no memory", 0), (f"memory {args.memory}", args.memory)):
    model = build(memory)
    if memory:
        model.reset_memory(args.batch_size)
    start = time.perf_counter()
    model.fit(train, epochs=args.epochs, verbose=0)
    seconds = time.perf_counter() - start
    results[name] = model
    print(
        f"{name:>12}: validation perplexity {perplexity(model, valid, 4):7.2f} "
        f"(training {seconds:.0f} s)"
    )

# 3. The memory model with longer evaluation memories (same weights).
trained = results[f"memory {args.memory}"]
weights = os.path.join(tempfile.mkdtemp(), "xl.weights.h5")
trained.save_weights(weights)  # the memory state is not part of the weights
for eval_memory in [int(m) for m in args.eval_memories.split(",") if m]:
    model = build(args.memory, eval_memory, weights)
    ppl = perplexity(model, valid, 4)
    print(f"memory {args.memory} model, eval memory {eval_memory:>4}: {ppl:7.2f}")

# 4. Evaluation speed at one context C = M + T, 4 rows per batch: segments
#    with memory (each token sees the M + up to T tokens before it) against a
#    model without memory that recomputes a window of the C tokens before
#    each scored position: every T tokens (the same cost per token as a
#    segment without memory), and every token (the vanilla evaluation the
#    paper compares with).
m, t = args.memory, args.segment
context = m + t
model = build(m, m, weights)
model.reset_memory(4)
model.predict(valid, verbose=0)  # compile
model.reset_memory(4)
start = time.perf_counter()
model.predict(valid, verbose=0)
memory_speed = valid.num_tokens / (time.perf_counter() - start)
stream = ids[split:]
plain = build(0, None, weights)
speeds = {}
for stride, scored in ((t, t), (1, 1)):
    ends = np.arange(context, len(stream), stride)[:256]
    ends = ends[: max(4, len(ends) // 4 * 4)]  # full batches: one program
    windows = np.stack([stream[e - context : e] for e in ends])  # [W, C]
    plain.predict(windows[:8], batch_size=4, verbose=0)  # compile
    start = time.perf_counter()
    plain.predict(windows, batch_size=4, verbose=0)
    speeds[stride] = len(windows) * scored / (time.perf_counter() - start)
print(
    f"evaluation speed, context {context}: with memory {memory_speed:,.0f} "
    f"tokens/s; recomputed window every {t} tokens {speeds[t]:,.0f} tokens/s, "
    f"every token {speeds[1]:,.0f} tokens/s "
    f"(memory {memory_speed / speeds[1]:.0f}x faster than the latter)"
)
