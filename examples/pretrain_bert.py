"""Pretrain a small BERT with masked-LM (dynamic masking): a tutorial.

    KERAS_BACKEND=jax python examples/pretrain_bert.py          # KJV or Python docs
    KERAS_BACKEND=torch python examples/pretrain_bert.py --preset bert_mini

The same job as `keras-transformers train bert_tiny`, spelled out: text ->
WordPiece vocabulary -> `[CLS] ... [SEP]` windows -> masks drawn afresh for
every batch (15% of tokens; 80% `[MASK]`, 10% random, 10% kept) ->
`BertMaskedLM` -> fit -> held-out masked-token accuracy -> `save_to_preset`.
The saved directory (model + preprocessor) is what
`examples/finetune_classifier.py --pretrained DIR` starts from. With the
King James Bible (`apt-get install bible-kjv`) the defaults take about five
minutes on two CPU cores; without it the script uses Python's documentation.
"""

import argparse
import os
import time
import warnings

os.environ.setdefault("KERAS_BACKEND", "jax")  # pick the backend before Keras loads

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_transformers import data  # noqa: E402
from keras_transformers.cli.bert import RepeatBatches, pack_windows  # noqa: E402
from keras_transformers.models import BertMaskedLM  # noqa: E402
from keras_transformers.preprocessing import (  # noqa: E402
    BertPreprocessor,
    MaskedLMDataset,
    MaskedLMMasker,
    train_wordpiece,
)
from keras_transformers.training import (  # noqa: E402
    AdamW,
    MaskedAccuracy,
    MaskedSparseCategoricalCrossentropy,
    WarmupCosineDecay,
)

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--data", help="a UTF-8 text file (default: KJV, else Python docs)")
parser.add_argument("--preset", default="bert_tiny", help="bert_tiny or bert_mini")
parser.add_argument("--max-chars", type=int, default=2_000_000)
parser.add_argument("--vocabulary-size", type=int, default=8000)
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--steps-per-epoch", type=int, default=100)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--sequence-length", type=int, default=128)
parser.add_argument("--learning-rate", type=float, default=2e-3)
parser.add_argument("--output", default="runs/example_bert")
args = parser.parse_args()
keras.utils.set_random_seed(0)
start = time.perf_counter()

# 1. Text, one verse (or paragraph line) per line.
if args.data:
    text = data.read_text(args.data, max_chars=args.max_chars)
else:
    text = (data.kjv_text() or data.default_text())[: args.max_chars]
lines = [line for line in text.splitlines() if line.strip()]
print(f"{len(text):,} characters, {len(lines):,} lines: {lines[0][:60]!r}...")

# 2. A WordPiece vocabulary (uncased) learned from the same text.
tokenizer = train_wordpiece(lines, vocabulary_size=args.vocabulary_size)
stream = np.concatenate([np.asarray(r, "int32") for r in tokenizer.encode(lines)])
print(f"{len(stream):,} tokens, vocabulary {tokenizer.vocabulary_size}")

# 3. The stream cut into full `[CLS] ... [SEP]` rows; the last 5% held out.
train_ids, val_ids = data.split_tokens(stream, validation_fraction=0.05)
train_x = pack_windows(train_ids, tokenizer, args.sequence_length)
val_x = pack_windows(val_ids, tokenizer, args.sequence_length)

# 4. Dynamic masking: `MaskedLMDataset` masks each batch afresh every epoch
#    (`RepeatBatches` makes an epoch `--steps-per-epoch` batches). The
#    held-out rows are masked once, so every epoch is scored on the same task.
masker = MaskedLMMasker.from_tokenizer(tokenizer, seed=0)
train_data = RepeatBatches(
    MaskedLMDataset(train_x, masker, args.batch_size, seed=0), args.steps_per_epoch
)
m = masker(val_x["token_ids"], rng=np.random.default_rng(1))
val_inputs = {
    **val_x,
    "token_ids": m["token_ids"],
    "mask_positions": m["mask_positions"],
}
print(f"{len(train_x['token_ids']):,} training rows, {len(m['labels']):,} held out")

# 5. The preset's architecture with our vocabulary; the output head is tied
#    to the token embedding. Unused prediction slots have sample weight 0.
model = BertMaskedLM.from_preset(
    args.preset,
    vocabulary_size=tokenizer.vocabulary_size,
    pad_token_id=tokenizer.pad_token_id,
)
total_steps = args.epochs * args.steps_per_epoch
schedule = WarmupCosineDecay(
    peak_learning_rate=args.learning_rate,
    warmup_steps=max(total_steps // 10, 1),
    decay_steps=total_steps,
    min_learning_rate=args.learning_rate / 10,
)
model.compile(
    optimizer=AdamW(schedule, weight_decay=0.01, global_clipnorm=1.0),
    loss=MaskedSparseCategoricalCrossentropy(from_logits=True),
    weighted_metrics=[MaskedAccuracy(name="masked_accuracy")],
)
print(f"{args.preset}: {model.count_params():,} parameters")
warnings.filterwarnings("ignore", "Gradients do not exist.*pooler")  # unused by MLM
fit_start = time.perf_counter()
history = model.fit(
    train_data,
    validation_data=(val_inputs, m["labels"], m["sample_weight"]),
    epochs=args.epochs,
    verbose=2,
).history
fit_seconds = time.perf_counter() - fit_start

# 6. Held-out masked-token accuracy, against always guessing the most
#    frequent training token.
counts = np.bincount(train_ids, minlength=tokenizer.vocabulary_size)
weights = m["sample_weight"] > 0
baseline = np.mean(m["labels"][weights] == counts.argmax())
accuracy = history["val_masked_accuracy"][-1]
print(
    f"Held-out masked-token accuracy: {accuracy:.3f} (most frequent token "
    f"{tokenizer.id_to_token(int(counts.argmax()))!r}: {baseline:.3f}); "
    f"fit {fit_seconds:.0f} s, total {time.perf_counter() - start:.0f} s, "
    f"backend {keras.config.backend()}."
)

# 7. Fill in a mask, then save the model with its preprocessor.
preprocessor = BertPreprocessor(tokenizer, sequence_length=args.sequence_length)
sentence = "and god said , let there be [MASK] : and there was light ."
x = preprocessor([sentence])
position = int(np.argmax(x["token_ids"][0] == tokenizer.mask_token_id))
x["mask_positions"] = np.array([[position]], "int32")
best = np.argsort(model.predict(x, verbose=0)[0, 0])[::-1][:5]
print(f"{sentence!r} -> {[tokenizer.id_to_token(int(i)) for i in best]}")
model.tokenizer = preprocessor
model.save_to_preset(args.output)
print(f"Saved to {args.output}")
