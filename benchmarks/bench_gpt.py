"""GPT-2-layout benchmark: training step and greedy generation.

Contenders, all at the same configuration, in one process:

* ``ours``: ``keras_transformers.models.gpt.GPTCausalLM`` on the current
  Keras backend (``KERAS_BACKEND``).
* ``kerashub``: ``keras_hub.models.GPT2CausalLM`` (``preprocessor=None``) on
  the same Keras backend.
* ``hf``: Hugging Face ``GPT2LMHeadModel`` in eager PyTorch (always torch,
  whatever the Keras backend).

Measured:

* training: steady-state seconds per step (Keras: ``train_on_batch`` with
  AdamW(lr=1e-4, weight_decay=0.01) and SparseCategoricalCrossentropy
  (from_logits=True), ``jit_compile`` left at the backend default; HF: forward
  with labels, backward, ``torch.optim.AdamW`` step);
* generation: greedy decoding of ``new_tokens`` tokens after a
  ``prompt``-token prompt, no early stop, at batch 1 and ``batch``; tokens/s
  counts new tokens only (``batch * new_tokens / seconds``).

The first call of each contender (tracing/compilation included) is timed and
reported separately; then one more warm-up call is made, and the contenders
are timed in alternating rounds (A, B, C, A, B, C, ...). Each figure is the
median over rounds.

Usage::

    KERAS_BACKEND=jax python benchmarks/bench_gpt.py
    KERAS_BACKEND=torch python benchmarks/bench_gpt.py --repeats 3 --json out.json
    python benchmarks/bench_gpt.py --quick          # tiny smoke test
"""

from __future__ import annotations

import argparse
import datetime
import json
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
    run_rounds,
    setup_torch,
    timed,
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
    prompt: int = 32
    new_tokens: int = 64


QUICK = Sizes(
    vocabulary_size=512,
    num_layers=2,
    hidden_dim=64,
    num_heads=2,
    intermediate_dim=256,
    sequence_length=64,
    batch=2,
    prompt=8,
    new_tokens=8,
)


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
    p.add_argument("--skip-train", action="store_true", help="generation only")
    p.add_argument("--skip-generate", action="store_true", help="training only")
    p.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help=TORCH_THREADS_HELP,
    )
    p.add_argument("--json", metavar="PATH", help="write the results to this JSON file")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats = min(args.repeats, 2)
        args.steps = min(args.steps, 2)
    return args


# --------------------------------------------------------------- contenders
class Ours(Contender):
    name = "ours"

    def __init__(self, sizes: Sizes, x, y):
        from keras_transformers.models.gpt import GPTCausalLM

        self.sizes = sizes
        self.model = GPTCausalLM(
            vocabulary_size=sizes.vocabulary_size,
            num_layers=sizes.num_layers,
            hidden_dim=sizes.hidden_dim,
            num_heads=sizes.num_heads,
            intermediate_dim=sizes.intermediate_dim,
            max_sequence_length=sizes.sequence_length,
            activation="gelu_approximate",
            position_embedding="learned",
            norm_type="layer",
            norm_position="pre",
            tie_embeddings=True,
            dropout=0.0,
            attention_dropout=0.0,
        )
        self.model.compile(optimizer=keras_optimizer(), loss=keras_loss())
        self.x, self.y = x, y

    def params(self):
        return self.model.count_params()

    def train_step(self):
        return self.model.train_on_batch(self.x, self.y)

    def generate(self, prompts):
        return self.model.generate(
            prompts, max_new_tokens=self.sizes.new_tokens, stop_token_ids=None
        )

    def notes(self):
        return f"jit_compile={self.model.jit_compile}"


class KerasHub(Contender):
    name = "kerashub"

    def __init__(self, sizes: Sizes, x, y):
        import keras_hub

        self.sizes = sizes
        backbone = keras_hub.models.GPT2Backbone(
            vocabulary_size=sizes.vocabulary_size,
            num_layers=sizes.num_layers,
            num_heads=sizes.num_heads,
            hidden_dim=sizes.hidden_dim,
            intermediate_dim=sizes.intermediate_dim,
            dropout=0.0,
            max_sequence_length=sizes.sequence_length,
        )
        self.model = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
        # No metrics on either side (KerasHub's default adds an accuracy metric).
        self.model.compile(
            optimizer=keras_optimizer(),
            loss=keras_loss(),
            weighted_metrics=None,
            sampler="greedy",
        )
        self.x, self.y = x, y

    def params(self):
        return self.model.count_params()

    def train_step(self):
        return self.model.train_on_batch(self.x, self.y)

    def generate(self, prompts):
        # Without a preprocessor, KerasHub generates into the padded buffer:
        # `token_ids` is prompt + padding up to the final length and
        # `padding_mask` marks the prompt; it fills every False position.
        batch, length = prompts.shape
        total = length + self.sizes.new_tokens
        token_ids = np.zeros((batch, total), "int32")
        token_ids[:, :length] = prompts
        padding_mask = np.zeros((batch, total), bool)
        padding_mask[:, :length] = True
        out = self.model.generate(
            {"token_ids": token_ids, "padding_mask": padding_mask}, stop_token_ids=None
        )
        return np.asarray(out["token_ids"])

    def notes(self):
        return f"jit_compile={self.model.jit_compile}"


class HuggingFace(Contender):
    name = "hf"

    def __init__(self, sizes: Sizes, x, torch):
        from transformers import GPT2Config, GPT2LMHeadModel

        self.sizes = sizes
        self.torch = torch
        config = GPT2Config(
            vocab_size=sizes.vocabulary_size,
            n_positions=sizes.sequence_length,
            n_embd=sizes.hidden_dim,
            n_layer=sizes.num_layers,
            n_head=sizes.num_heads,
            n_inner=sizes.intermediate_dim,
            activation_function="gelu_new",
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            layer_norm_epsilon=1e-5,
            tie_word_embeddings=True,
            bos_token_id=0,
            eos_token_id=sizes.vocabulary_size - 1,
            pad_token_id=0,
        )
        self.model = GPT2LMHeadModel(config)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY
        )
        self.x = torch.as_tensor(np.asarray(x["token_ids"]), dtype=torch.long)

    def params(self):
        return sum(p.numel() for p in self.model.parameters())  # tied: counted once

    def train_step(self):
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.model(input_ids=self.x, labels=self.x).loss
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())

    def generate(self, prompts):
        torch = self.torch
        self.model.eval()
        ids = torch.as_tensor(prompts, dtype=torch.long)
        out = self.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=self.sizes.new_tokens,
            min_new_tokens=self.sizes.new_tokens,
            do_sample=False,
            use_cache=True,
            pad_token_id=0,
        )
        return out.numpy()

    def notes(self):
        return f"attn={self.model.config._attn_implementation}, threads={self.torch.get_num_threads()}"


# --------------------------------------------------------------- harness
def check_generated(name, out, prompts, new_tokens):
    expected = (prompts.shape[0], prompts.shape[1] + new_tokens)
    if tuple(out.shape) != expected:
        raise RuntimeError(
            f"{name}: generate returned shape {tuple(out.shape)}, expected {expected}"
        )
    if not np.array_equal(out[:, : prompts.shape[1]], prompts):
        raise RuntimeError(f"{name}: generate did not keep the prompt")


def bench_generate(contenders, prompts, new_tokens, repeats, label):
    """Seconds per `generate` call on `prompts`."""

    def call(c):
        seconds, out = timed(lambda: c.generate(prompts))
        check_generated(c.name, out, prompts, new_tokens)
        return seconds

    return run_rounds(contenders, call, call, repeats, label)


def main(argv=None):
    args = parse_args(argv)
    sizes = QUICK if args.quick else Sizes()
    import keras

    backend = keras.config.backend()
    need_torch = backend == "torch" or not args.skip_hf
    torch = setup_torch(args.torch_threads) if need_torch else None

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    tokens = rng.integers(
        1, sizes.vocabulary_size, (sizes.batch, sizes.sequence_length + 1)
    ).astype("int32")
    x = {
        "token_ids": tokens[:, :-1],
        "padding_mask": np.ones((sizes.batch, sizes.sequence_length), bool),
    }
    y = tokens[:, 1:]
    prompts = {
        1: tokens[:1, : sizes.prompt].copy(),
        sizes.batch: tokens[:, : sizes.prompt].copy(),
    }

    meta = {
        "date": datetime.date.today().isoformat(),
        "backend": backend,
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads() if torch is not None else None,
        "versions": versions(),
        "git": git_revision(),
        "load_start": load(),
        "sizes": asdict(sizes),
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
    print(f"sizes: {asdict(sizes)}  repeats={args.repeats} steps={args.steps}")

    t0 = time.perf_counter()
    contenders = [Ours(sizes, x, y)]
    if not args.skip_kerashub:
        contenders.append(KerasHub(sizes, x, y))
    if not args.skip_hf:
        contenders.append(HuggingFace(sizes, x, torch))
    results = {c.name: {"params": c.params(), "notes": c.notes()} for c in contenders}
    for c in contenders:
        print(f"{c.name:9s} params={results[c.name]['params']:,}  {c.notes()}")

    if not args.skip_train:
        first, samples = bench_train(contenders, args.steps, args.repeats)
        for c in contenders:
            results[c.name]["train_first_step_s"] = first[c.name]
            results[c.name]["train_samples_s_per_step"] = samples[c.name]
            results[c.name]["train_s_per_step"] = statistics.median(samples[c.name])
    if not args.skip_generate:
        for batch, p in prompts.items():
            label = f"gen b={batch}"
            first, samples = bench_generate(
                contenders, p, sizes.new_tokens, args.repeats, label
            )
            for c in contenders:
                med = statistics.median(samples[c.name])
                results[c.name][f"gen_b{batch}_first_call_s"] = first[c.name]
                results[c.name][f"gen_b{batch}_samples_s"] = samples[c.name]
                results[c.name][f"gen_b{batch}_s"] = med
                results[c.name][f"gen_b{batch}_tokens_per_s"] = (
                    batch * sizes.new_tokens / med
                )
    meta["wall_s"] = round(time.perf_counter() - t0, 1)
    meta["load_end"] = load()

    ratios = report(results, sizes, args)
    print(f"wall time {meta['wall_s']}s; load average at end: {meta['load_end']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": results, "ratios": ratios}, f, indent=2)
        print(f"wrote {args.json}")
    return results


def report(results, sizes, args):
    names = list(results)
    rows = []  # (label, key, higher_is_better, format)
    if not args.skip_train:
        rows.append(("train s/step", "train_s_per_step", False, ".3f"))
    if not args.skip_generate:
        for batch in (1, sizes.batch):
            rows.append(
                (f"gen b={batch} tok/s", f"gen_b{batch}_tokens_per_s", True, ".1f")
            )
    firsts = []
    if not args.skip_train:
        firsts.append(("train 1st step s", "train_first_step_s"))
    if not args.skip_generate:
        for batch in (1, sizes.batch):
            firsts.append((f"gen b={batch} 1st call s", f"gen_b{batch}_first_call_s"))

    others = [n for n in ("kerashub", "hf") if n in results]
    header = ["metric (median)"] + names + [f"ours/{n} speed" for n in others]
    lines = [header]
    ratios = {}
    for label, key, higher, spec in rows:
        values = [results[n].get(key) for n in names]
        line = [label] + [fmt(v, spec) for v in values]
        for n in others:
            a, b = results["ours"].get(key), results[n].get(key)
            r = (a / b if b else None) if higher else ratio(a, b)
            ratios[f"{key}:ours/{n}"] = r
            line.append(fmt(r, ".2f"))
        lines.append(line)
    for label, key in firsts:
        lines.append(
            [label]
            + [fmt(results[n].get(key), ".2f") for n in names]
            + [""] * len(others)
        )
    lines.append(
        ["params"] + [f"{results[n]['params']:,}" for n in names] + [""] * len(others)
    )
    print_table(lines)
    return ratios


if __name__ == "__main__":
    main()
