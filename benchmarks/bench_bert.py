"""BERT-layout benchmark: masked-LM training step.

Contenders, all at the same configuration, in one process:

* ``ours``: ``keras_transformers.models.bert.BertMaskedLM`` on the current
  Keras backend (``KERAS_BACKEND``).
* ``kerashub``: ``keras_hub.models.BertMaskedLM(BertBackbone(...),
  preprocessor=None)`` on the same Keras backend.
* ``hf``: Hugging Face ``BertForMaskedLM`` in eager PyTorch (always torch,
  whatever the Keras backend).

Measured: steady-state seconds per masked-LM training step on a batch of
``batch`` sequences of ``sequence_length`` tokens, 15% of the positions masked
(the same positions, the same inputs and labels for every contender). Keras:
``train_on_batch(x, y)`` with ``x = {token_ids, segment_ids, padding_mask,
mask_positions [B, P]}``, ``y = [B, P]`` original ids, AdamW(lr=1e-4,
weight_decay=0.01), SparseCategoricalCrossentropy(from_logits=True), no
metrics, ``jit_compile`` left at the backend default; both Keras models
compute logits at the ``P`` masked positions only. HF: its standard API,
``model(input_ids, token_type_ids, attention_mask, labels).loss`` with labels
-100 except at the masked positions (logits at all ``T`` positions, loss over
the masked ones), backward, ``torch.optim.AdamW`` step. Dropout is 0 for all.

The first step of each contender (tracing/compilation included) is timed and
reported separately; then one more warm-up step is made, and the contenders
are timed in alternating rounds (A, B, C, A, B, C, ...). Each figure is the
median over rounds.

Usage::

    KERAS_BACKEND=jax python benchmarks/bench_bert.py
    KERAS_BACKEND=torch python benchmarks/bench_bert.py --repeats 3 --json out.json
    python benchmarks/bench_bert.py --quick          # tiny smoke test
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np
from _common import (
    LEARNING_RATE,
    TORCH_THREADS_HELP,
    WEIGHT_DECAY,
    Contender,
    bench_train,
    cpu_model,
    fmt,
    git_revision,
    keras_loss,
    keras_optimizer,
    load,
    print_table,
    ratio,
    setup_torch,
    versions,
)


@dataclass(frozen=True)
class Sizes:
    vocabulary_size: int = 8192
    num_layers: int = 4
    hidden_dim: int = 256
    num_heads: int = 4
    intermediate_dim: int = 1024
    sequence_length: int = 256
    batch: int = 8
    mask_rate: float = 0.15

    @property
    def num_masked(self) -> int:
        """P: masked positions per sequence (ceil(15% of T); 39 at T=256)."""
        return math.ceil(self.mask_rate * self.sequence_length)


QUICK = Sizes(
    vocabulary_size=512,
    num_layers=2,
    hidden_dim=64,
    num_heads=2,
    intermediate_dim=256,
    sequence_length=64,
    batch=2,
)

MASK_TOKEN_ID = 3  # any id > 0; the same for every contender
PAD_TOKEN_ID = 0


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="timed rounds (median taken)")
    p.add_argument(
        "--steps", type=int, default=3, help="training steps per timed round"
    )
    p.add_argument(
        "--quick", action="store_true", help="tiny sizes, 2 rounds: a smoke test"
    )
    p.add_argument("--skip-hf", action="store_true", help="leave out Hugging Face")
    p.add_argument("--skip-kerashub", action="store_true", help="leave out KerasHub")
    p.add_argument("--torch-threads", type=int, default=1, help=TORCH_THREADS_HELP)
    p.add_argument("--json", metavar="PATH", help="write the results to this JSON file")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats = min(args.repeats, 2)
        args.steps = min(args.steps, 2)
    return args


def make_batch(sizes: Sizes, seed=0):
    """Masked-LM inputs shared by all contenders.

    Returns `(x, y, labels_full)`: `x` the Keras inputs (`token_ids` with the
    masked positions replaced by `MASK_TOKEN_ID`, `segment_ids` 0 for the first
    half and 1 for the second, `padding_mask` all ones, `mask_positions`
    `[B, P]` sorted, never position 0), `y` `[B, P]` the original ids there,
    and `labels_full` `[B, T]` the same labels in HF's layout (-100 elsewhere).
    """
    rng = np.random.default_rng(seed)
    b, t, p = sizes.batch, sizes.sequence_length, sizes.num_masked
    tokens = rng.integers(4, sizes.vocabulary_size, (b, t)).astype("int32")
    tokens[:, 0] = 2  # a [CLS]-like first token
    positions = np.stack(
        [np.sort(rng.choice(np.arange(1, t), p, replace=False)) for _ in range(b)]
    ).astype("int32")
    rows = np.arange(b)[:, None]
    y = tokens[rows, positions]
    token_ids = tokens.copy()
    token_ids[rows, positions] = MASK_TOKEN_ID
    segment_ids = np.zeros((b, t), "int32")
    segment_ids[:, t // 2 :] = 1
    x = {
        "token_ids": token_ids,
        "segment_ids": segment_ids,
        "padding_mask": np.ones((b, t), "int32"),
        "mask_positions": positions,
    }
    labels_full = np.full((b, t), -100, "int64")
    labels_full[rows, positions] = y
    return x, y, labels_full


# --------------------------------------------------------------- contenders
class KerasContender(Contender):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def params(self):
        return self.model.count_params()

    def train_step(self):
        return self.model.train_on_batch(self.x, self.y)

    def notes(self):
        return f"jit_compile={self.model.jit_compile}"


class Ours(KerasContender):
    name = "ours"

    def __init__(self, sizes: Sizes, x, y):
        from keras_transformers.models.bert import BertMaskedLM

        super().__init__(x, y)
        self.model = BertMaskedLM(
            vocabulary_size=sizes.vocabulary_size,
            num_layers=sizes.num_layers,
            hidden_dim=sizes.hidden_dim,
            num_heads=sizes.num_heads,
            intermediate_dim=sizes.intermediate_dim,
            max_sequence_length=sizes.sequence_length,
            stacks="encoder",
            norm_position="post",
            norm_epsilon=1e-12,
            final_norm=False,
            embedding_norm=True,
            pooler=True,
            num_segments=2,
            activation="gelu",
            dropout=0.0,
            attention_dropout=0.0,
            pad_token_id=PAD_TOKEN_ID,
        )
        self.model.compile(optimizer=keras_optimizer(), loss=keras_loss())


class KerasHub(KerasContender):
    name = "kerashub"

    def __init__(self, sizes: Sizes, x, y):
        import keras_hub

        super().__init__(x, y)
        backbone = keras_hub.models.BertBackbone(
            vocabulary_size=sizes.vocabulary_size,
            num_layers=sizes.num_layers,
            num_heads=sizes.num_heads,
            hidden_dim=sizes.hidden_dim,
            intermediate_dim=sizes.intermediate_dim,
            dropout=0.0,
            max_sequence_length=sizes.sequence_length,
            num_segments=2,
        )
        self.model = keras_hub.models.BertMaskedLM(backbone, preprocessor=None)
        # No metrics on either side (KerasHub's default adds an accuracy metric).
        self.model.compile(
            optimizer=keras_optimizer(), loss=keras_loss(), weighted_metrics=None
        )


class HuggingFace(Contender):
    name = "hf"

    def __init__(self, sizes: Sizes, x, labels_full, torch):
        from transformers import BertConfig, BertForMaskedLM

        self.torch = torch
        config = BertConfig(
            vocab_size=sizes.vocabulary_size,
            hidden_size=sizes.hidden_dim,
            num_hidden_layers=sizes.num_layers,
            num_attention_heads=sizes.num_heads,
            intermediate_size=sizes.intermediate_dim,
            hidden_act="gelu",
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            max_position_embeddings=sizes.sequence_length,
            type_vocab_size=2,
            layer_norm_eps=1e-12,
            pad_token_id=PAD_TOKEN_ID,
            tie_word_embeddings=True,
        )
        self.model = BertForMaskedLM(config)  # no pooler (add_pooling_layer=False)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY
        )

        def long(a):
            return torch.as_tensor(np.asarray(a), dtype=torch.long)

        self.inputs = {
            "input_ids": long(x["token_ids"]),
            "token_type_ids": long(x["segment_ids"]),
            "attention_mask": long(x["padding_mask"]),
            "labels": long(labels_full),
        }

    def params(self):
        return sum(p.numel() for p in self.model.parameters())  # tied: counted once

    def train_step(self):
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.model(**self.inputs).loss
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())

    def notes(self):
        return f"attn={self.model.config._attn_implementation}, threads={self.torch.get_num_threads()}"


# --------------------------------------------------------------- main
def main(argv=None):
    args = parse_args(argv)
    sizes = QUICK if args.quick else Sizes()
    import keras

    backend = keras.config.backend()
    need_torch = backend == "torch" or not args.skip_hf
    torch = setup_torch(args.torch_threads) if need_torch else None

    keras.utils.set_random_seed(0)
    x, y, labels_full = make_batch(sizes)

    meta = {
        "date": datetime.date.today().isoformat(),
        "backend": backend,
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads() if torch is not None else None,
        "versions": versions(),
        "git": git_revision(),
        "load_start": load(),
        "sizes": {**asdict(sizes), "num_masked": sizes.num_masked},
        "repeats": args.repeats,
        "steps": args.steps,
        "argv": sys.argv[1:] if argv is None else list(argv),
    }
    print(
        f"backend={backend}  cpu={meta['cpu']} x{meta['cpu_count']}  torch_threads={meta['torch_threads']}"
    )
    print("versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()))
    print(f"git: {meta['git']}")
    print(f"load average at start: {meta['load_start']}")
    print(f"sizes: {meta['sizes']}  repeats={args.repeats} steps={args.steps}")

    t0 = time.perf_counter()
    contenders = [Ours(sizes, x, y)]
    if not args.skip_kerashub:
        contenders.append(KerasHub(sizes, x, y))
    if not args.skip_hf:
        contenders.append(HuggingFace(sizes, x, labels_full, torch))
    results = {c.name: {"params": c.params(), "notes": c.notes()} for c in contenders}
    for c in contenders:
        print(f"{c.name:9s} params={results[c.name]['params']:,}  {c.notes()}")

    first, samples = bench_train(contenders, args.steps, args.repeats)
    for c in contenders:
        results[c.name]["train_first_step_s"] = first[c.name]
        results[c.name]["train_samples_s_per_step"] = samples[c.name]
        results[c.name]["train_s_per_step"] = statistics.median(samples[c.name])
        results[c.name]["final_loss"] = float(np.ravel(c.train_step())[0])
    meta["wall_s"] = round(time.perf_counter() - t0, 1)
    meta["load_end"] = load()

    ratios = report(results)
    print(f"wall time {meta['wall_s']}s; load average at end: {meta['load_end']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": results, "ratios": ratios}, f, indent=2)
        print(f"wrote {args.json}")
    return results


def report(results):
    names = list(results)
    others = [n for n in ("kerashub", "hf") if n in results]
    header = ["metric (median)"] + names + [f"ours/{n} speed" for n in others]
    key = "train_s_per_step"
    line = ["train s/step"] + [fmt(results[n].get(key), ".3f") for n in names]
    ratios = {}
    for n in others:
        r = ratio(results["ours"].get(key), results[n].get(key))
        ratios[f"{key}:ours/{n}"] = r
        line.append(fmt(r, ".2f"))
    blank = [""] * len(others)
    lines = [
        header,
        line,
        ["train 1st step s"]
        + [fmt(results[n].get("train_first_step_s"), ".2f") for n in names]
        + blank,
        ["loss after timing"]
        + [fmt(results[n].get("final_loss"), ".3f") for n in names]
        + blank,
        ["params"] + [f"{results[n]['params']:,}" for n in names] + blank,
    ]
    print_table(lines)
    return ratios


if __name__ == "__main__":
    main()
