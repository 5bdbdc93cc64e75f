"""Train a small GPT from scratch with `compile()` / `fit()`: a tutorial.

    KERAS_BACKEND=jax python examples/train_gpt.py            # KJV or Python docs
    KERAS_BACKEND=torch python examples/train_gpt.py --data my_corpus.txt

The same job as `keras-transformers train`, spelled out step by step:
text -> tokenizer -> token windows -> model -> compile -> fit -> generate ->
save. It runs on JAX, TensorFlow and PyTorch; on two CPU cores the defaults
take a few minutes. For the King James Bible, `apt-get install bible-kjv`;
without it the script uses Python's own documentation, which every Python has.
"""

import argparse
import os

os.environ.setdefault("KERAS_BACKEND", "jax")  # pick the backend before Keras loads

import keras  # noqa: E402

import keras_transformers  # noqa: E402
from keras_transformers import data  # noqa: E402
from keras_transformers.models import GPTCausalLM  # noqa: E402
from keras_transformers.tokenizer import train_bpe  # noqa: E402
from keras_transformers.training import (  # noqa: E402
    AdamW,
    MaskedAccuracy,
    MaskedSparseCategoricalCrossentropy,
    Perplexity,
    WarmupCosineDecay,
)

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--data", help="a UTF-8 text file (default: KJV, else Python docs)")
parser.add_argument("--preset", default="gpt_mini")
parser.add_argument("--max-chars", type=int, default=1_000_000)
parser.add_argument("--epochs", type=int, default=6)
parser.add_argument("--steps-per-epoch", type=int, default=60)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--sequence-length", type=int, default=128)
parser.add_argument("--output", default="runs/example_gpt")
args = parser.parse_args()
keras.utils.set_random_seed(0)

# 1. Text. Any UTF-8 file works; two sources are always at hand here.
if args.data:
    text = data.read_text(args.data, max_chars=args.max_chars)
else:
    text = (data.kjv_text() or data.default_text())[: args.max_chars]
print(f"{len(text):,} characters: {text[:60]!r}...")

# 2. A byte-level BPE tokenizer (GPT-2 style) trained on the same text, with
#    as many tokens as the preset's embedding table has rows.
vocabulary_size = keras_transformers.load_config(args.preset).vocabulary_size
tokenizer = train_bpe([text], vocabulary_size=vocabulary_size)
token_ids = tokenizer.encode(text)  # one long 1-D stream of ids
print(f"{len(token_ids):,} tokens, vocabulary {tokenizer.vocabulary_size}")

# 3. Next-token prediction: inputs are windows of the stream, labels the same
#    windows shifted by one. The last 5% of the stream is held out.
train_ids, validation_ids = data.split_tokens(token_ids, validation_fraction=0.05)
train_data = data.lm_dataset(
    train_ids,
    args.sequence_length,
    args.batch_size,
    shuffle=True,  # new order and window boundaries every epoch
    num_batches=args.steps_per_epoch,  # an "epoch" of this many steps
)
validation_data = data.lm_dataset(validation_ids, args.sequence_length, args.batch_size)

# 4. The model: a preset is an architecture (random weights). Override the
#    fields that must match the tokenizer.
model = GPTCausalLM.from_preset(
    args.preset,
    vocabulary_size=tokenizer.vocabulary_size,
    pad_token_id=tokenizer.pad_token_id,
    bos_token_id=tokenizer.bos_token_id,
    eos_token_id=tokenizer.eos_token_id,
)
print(f"{args.preset}: {model.count_params():,} parameters")

# 5. compile(): AdamW with linear warmup then cosine decay; cross-entropy on
#    logits; perplexity = exp(mean token loss) over the whole epoch.
total_steps = args.epochs * args.steps_per_epoch
schedule = WarmupCosineDecay(
    peak_learning_rate=2e-3,
    warmup_steps=total_steps // 10,
    decay_steps=total_steps,
    min_learning_rate=2e-4,
)
model.compile(
    optimizer=AdamW(schedule, beta_2=0.95, global_clipnorm=1.0),
    loss=MaskedSparseCategoricalCrossentropy(from_logits=True),
    metrics=[Perplexity(from_logits=True), MaskedAccuracy(name="accuracy")],
)

# 6. fit(): the usual Keras loop; validation loss and perplexity every epoch.
model.fit(train_data, validation_data=validation_data, epochs=args.epochs)

# 7. Evaluate once more on the held-out text.
results = model.evaluate(validation_data, return_dict=True, verbose=0)
print(f"validation loss {results['loss']:.3f}, perplexity {results['perplexity']:.1f}")

# 8. Generate: with a tokenizer attached, generate() takes and returns text.
model.tokenizer = tokenizer
prompt = "And God said" if "God" in text[:1000] else "The Python"
print(model.generate(prompt, max_new_tokens=40, sampler="top_k", top_k=40, seed=0))

# 9. Save config, weights and tokenizer; from_preset() restores all three.
model.save_to_preset(args.output)
restored = keras_transformers.from_preset(args.output)
print(
    f"saved to {args.output}; reloaded: {restored.generate(prompt, max_new_tokens=8)!r}"
)
