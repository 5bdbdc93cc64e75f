"""Token classification with BERT: truecasing lowercased English text.

    KERAS_BACKEND=jax python examples/finetune_token_classifier.py
    KERAS_BACKEND=jax python examples/finetune_token_classifier.py --pretrained runs/example_bert

The task, derived from text that is available offline: the model reads a
line (a KJV verse, or a line of Python's documentation) with every word
lowercased, and tags each word with how it was written: 0 `lower`, 1
`Capitalized`, 2 `ALL CAPS` (two letters or more, e.g. "LORD"). Words are
runs of letters; punctuation and digits are fed to the model but not
scored. Labels are aligned to WordPiece sub-tokens: a word's label sits on
its first sub-token, and its other sub-tokens, `[CLS]`, `[SEP]` and
padding get -100, which the loss and the metric ignore. Held-out lines are
disjoint from the training lines.

The model is `BertTokenClassifier` (a dense layer on every token state):
from scratch on `--preset` with a WordPiece vocabulary learned from the
training lines, or from `--pretrained DIR` (e.g. `examples/pretrain_bert.py`)
with that preset's own vocabulary. It reports held-out word accuracy against
the majority baseline (every word lowercase), and the accuracy on words
that do not start a line (line-initial words are always capitalized).
"""

import argparse
import os
import re
import time

os.environ.setdefault("KERAS_BACKEND", "jax")  # pick the backend before Keras loads

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_transformers import data  # noqa: E402
from keras_transformers.models import BertTokenClassifier  # noqa: E402
from keras_transformers.preprocessing import train_wordpiece  # noqa: E402
from keras_transformers.training import (  # noqa: E402
    AdamW,
    MaskedAccuracy,
    MaskedSparseCategoricalCrossentropy,
    WarmupCosineDecay,
)

IGNORE = -100
CLASSES = ("lower", "Capitalized", "ALL CAPS")
WORD = re.compile(r"[A-Za-z]+|[^\sA-Za-z]")

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--pretrained", help="a BERT preset directory with its vocabulary")
parser.add_argument("--preset", default="bert_tiny")
parser.add_argument("--train-lines", type=int, default=8000)
parser.add_argument("--test-lines", type=int, default=1000)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--sequence-length", type=int, default=64)
parser.add_argument("--learning-rate", type=float, default=1e-3)
parser.add_argument("--vocabulary-size", type=int, default=4000)
args = parser.parse_args()
keras.utils.set_random_seed(0)
start = time.perf_counter()


def case_of(word):
    """0 lower, 1 Capitalized, 2 ALL CAPS; None for punctuation and digits."""
    if not word.isalpha():
        return None
    if len(word) > 1 and word.isupper():
        return 2
    return 1 if word[0].isupper() else 0


def encode(lines, tokenizer, length):
    """Lowercased word ids with labels on each word's first sub-token."""
    words = [WORD.findall(line) for line in lines]
    unique = sorted({w.lower() for ws in words for w in ws})
    pieces = dict(zip(unique, tokenizer.encode(unique)))
    shape = (len(lines), length)
    ids = np.full(shape, tokenizer.pad_token_id, "int32")
    labels = np.full(shape, IGNORE, "int32")
    first = np.zeros(shape, bool)  # the line's first word
    for row, ws in enumerate(words):
        tokens, tags = [tokenizer.cls_token_id], [IGNORE]
        for k, word in enumerate(ws):
            sub = list(pieces[word.lower()]) or [tokenizer.token_to_id("[UNK]")]
            if len(tokens) + len(sub) > length - 1:
                break
            tag = case_of(word)
            first[row, len(tokens)] = k == 0
            tokens += sub
            tags += [IGNORE if tag is None else tag] + [IGNORE] * (len(sub) - 1)
        tokens.append(tokenizer.sep_token_id)
        ids[row, : len(tokens)], labels[row, : len(tags)] = tokens, tags
    x = {
        "token_ids": ids,
        "segment_ids": np.zeros_like(ids),
        "padding_mask": (ids != tokenizer.pad_token_id).astype("int32"),
    }
    return x, labels, first


# 1. Lines of text, shuffled, split into training and held-out lines.
text = data.kjv_text() or data.default_text()
lines = [line for line in text.splitlines() if len(WORD.findall(line)) > 3]
order = np.random.default_rng(0).permutation(len(lines))
test_lines = [lines[i] for i in order[: args.test_lines]]
train_lines = [lines[i] for i in order[args.test_lines :][: args.train_lines]]
print(f"{len(train_lines):,} training and {len(test_lines):,} held-out lines")

# 2. The model and its vocabulary.
if args.pretrained:
    model = BertTokenClassifier.from_preset(args.pretrained, num_classes=3)
    tokenizer = model.tokenizer.tokenizer
    source = args.pretrained
else:
    lowered = [line.lower() for line in train_lines]
    tokenizer = train_wordpiece(lowered, vocabulary_size=args.vocabulary_size)
    model = BertTokenClassifier.from_preset(
        args.preset,
        num_classes=3,
        vocabulary_size=tokenizer.vocabulary_size,
        pad_token_id=tokenizer.pad_token_id,
    )
    source = f"{args.preset} from scratch"
length = min(args.sequence_length, model.config.max_sequence_length)
x_train, y_train, _ = encode(train_lines, tokenizer, length)
x_test, y_test, first = encode(test_lines, tokenizer, length)
scored = y_test != IGNORE
counts = np.bincount(y_test[scored], minlength=3)
print("Held-out words: " + ", ".join(f"{c} {n:,}" for c, n in zip(CLASSES, counts)))

# 3. Fit with a loss and a metric that skip the -100 positions.
steps = args.epochs * -(-len(train_lines) // args.batch_size)
schedule = WarmupCosineDecay(
    peak_learning_rate=args.learning_rate,
    warmup_steps=max(steps // 10, 1),
    decay_steps=steps,
    min_learning_rate=args.learning_rate / 10,
)
model.compile(
    optimizer=AdamW(schedule, weight_decay=0.01),
    loss=MaskedSparseCategoricalCrossentropy(from_logits=True, ignore_class=IGNORE),
    metrics=[MaskedAccuracy(ignore_class=IGNORE, name="accuracy")],
)
model.fit(
    x_train,
    y_train,
    batch_size=args.batch_size,
    epochs=args.epochs,
    validation_data=(x_test, y_test),
    verbose=2,
)

# 4. Held-out word accuracy against the majority class (lowercase).
predicted = np.argmax(model.predict(x_test, batch_size=256, verbose=0), axis=-1)
correct = predicted == y_test
inner = scored & ~first
majority = counts.argmax()
print(
    f"{source}: held-out word accuracy {correct[scored].mean():.3f} "
    f"(majority {CLASSES[majority]!r}: {np.mean(y_test[scored] == majority):.3f}); "
    f"words not starting a line: {correct[inner].mean():.3f} "
    f"(majority {np.mean(y_test[inner] == majority):.3f}); "
    f"total {time.perf_counter() - start:.0f} s, backend {keras.config.backend()}."
)
