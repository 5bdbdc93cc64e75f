"""Shared pieces of the benchmark scripts (``bench.py``, ``bench_precision.py``,
``bench_load.py``): the Keras optimizer and loss of every Keras contender,
the Keras contender base, the alternating-rounds timing harness, and the
text table and JSON file. Not a benchmark itself."""

from __future__ import annotations

import json
import os
import random
import resource
import statistics
import sys
import time

import numpy as np
from _machine import load

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # quieter TensorFlow/XLA start-up

LEARNING_RATE = 1e-4
_KERAS_ADAMW = [False]  # --keras-adamw: Keras' own AdamW for the Keras contenders
_KERAS_LOSS = [False]  # --keras-loss: Keras' own sparse cross-entropy
_HF_FUSED_ADAMW = [False]  # --hf-fused-adamw: torch.optim.AdamW(fused=True) for HF
WEIGHT_DECAY = 0.01

TORCH_THREADS_HELP = (
    "torch.set_num_threads for every torch user in the process (default: all "
    "the machine's cores, as JAX and TensorFlow use; a smaller number gives "
    "PyTorch and Hugging Face fewer cores than the other contenders)"
)


def setup_torch(threads):
    """Imports torch and fixes its intra-op thread count (shared by HF and,
    under KERAS_BACKEND=torch, by both Keras models)."""
    import torch

    torch.set_num_threads(threads)
    return torch


def seed(backend, value=0):
    """Seeds Python, NumPy and the Keras backend as
    `keras.utils.set_random_seed(value)` does at a process's start, without
    importing TensorFlow into a JAX or PyTorch process that has not loaded
    it: Keras' function seeds TensorFlow wherever it is installed, and that
    import costs such a process seconds and the memory of a runtime it does
    not use (a CPU row's `mem MiB` is the process's peak RSS). TensorFlow is
    seeded on its own backend or where it is loaded already; on JAX and
    PyTorch only KerasHub loads it (for its tokenizer layers), later, and
    computes nothing with it."""
    import keras

    if backend == "tensorflow" or "tensorflow" in sys.modules:
        keras.utils.set_random_seed(value)
        return
    random.seed(value)  # Keras' global seed generator draws its seed here
    np.random.seed(value)
    if backend == "torch":
        import torch

        torch.manual_seed(value)


# --------------------------------------------------------------- contenders
class Skip(Exception):
    """A contender that cannot run a row here (printed, not fatal)."""


class Contender:
    """A name, a parameter count, and the callables the harness times."""

    name = ""

    def params(self) -> int:
        raise NotImplementedError

    def train_step(self):
        raise NotImplementedError

    def generate(self, prompts):
        """Greedy `new_tokens` continuation; returns `[B, prompt + new]` ids."""
        raise NotImplementedError

    def notes(self) -> str:
        return ""


class KerasContender(Contender):
    """A compiled Keras model (`self.model`, built by the subclass) trained by
    `train_on_batch(x, y)`."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def params(self):
        return self.model.count_params()

    def train_step(self):
        return self.model.train_on_batch(self.x, self.y)

    def notes(self):
        return f"jit_compile={self.model.jit_compile}"


def kerashub_generate(model, prompts, new_tokens):
    """Greedy `generate` of a KerasHub causal LM built without a preprocessor:
    it generates into the padded buffer (`token_ids` = prompt + padding up to
    the final length, `padding_mask` marking the prompt) and fills every
    unmasked position. Returns the `[B, T + new_tokens]` ids."""
    batch, length = prompts.shape
    total = length + new_tokens
    token_ids = np.zeros((batch, total), "int32")
    token_ids[:, :length] = prompts
    padding_mask = np.zeros((batch, total), bool)
    padding_mask[:, :length] = True
    out = model.generate(
        {"token_ids": token_ids, "padding_mask": padding_mask}, stop_token_ids=None
    )
    return np.asarray(out["token_ids"])


def keras_optimizer():
    """The optimizer of every Keras contender (ours and KerasHub alike):
    `keras_transformers.training.AdamW`, Keras' AdamW with an in-place
    PyTorch update (same numbers; on JAX/TensorFlow it is Keras' update).
    Keras' own PyTorch AdamW allocates five temporaries per variable per
    step, about twice the optimizer time of `torch.optim.AdamW`, which the
    Hugging Face contenders use; `--keras-adamw` measures with it instead."""
    import keras

    from keras_transformers.training import AdamW

    optimizer = keras.optimizers.AdamW if _KERAS_ADAMW[0] else AdamW
    return optimizer(learning_rate=LEARNING_RATE, weight_decay=WEIGHT_DECAY)


def keras_loss():
    """The loss of every Keras contender (ours and KerasHub alike):
    `keras_transformers.training.MaskedSparseCategoricalCrossentropy(
    from_logits=True)` (nothing masked), the loss this library's recipes
    use. Keras' `SparseCategoricalCrossentropy` computes the same value but,
    on PyTorch, moves the class axis to position 1 for `cross_entropy`: a
    copy of the `[B, T, V]` logits and a log-softmax over a strided axis
    (~0.1 s per GPT benchmark step). `--keras-loss` measures with it."""
    import keras

    from keras_transformers.training import MaskedSparseCategoricalCrossentropy

    if _KERAS_LOSS[0]:
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return MaskedSparseCategoricalCrossentropy(from_logits=True)


# --------------------------------------------------------------- harness
def timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def cpu_times(since=None, per=1):
    """This process's CPU seconds `{"user", "system", "minor_faults"}`; with
    `since` (an earlier result), the difference divided by `per`. Kernel
    ("system") time is mostly first touches of fresh memory: a step that
    frees and re-allocates large buffers pays it every step (on a VM whose
    balloon reports free pages, each first touch is a host page fault)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    now = {"user": r.ru_utime, "system": r.ru_stime, "minor_faults": r.ru_minflt}
    if since is None:
        return now
    return {k: (now[k] - since[k]) / per for k in now}


def median_cpu(samples, prefix):
    """Medians of `cpu_times` differences: `{prefix}cpu_user_s_per_step`,
    `{prefix}cpu_system_s_per_step`, `{prefix}minor_faults_per_step`."""
    if not samples:
        return {}
    med = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
    return {
        f"{prefix}cpu_user_s_per_step": med["user"],
        f"{prefix}cpu_system_s_per_step": med["system"],
        f"{prefix}minor_faults_per_step": med["minor_faults"],
    }


def run_rounds(contenders, first_call, timed_call, repeats, label, errors=None):
    """Warm-up, then `repeats` alternating rounds.

    `first_call(c)` is run twice per contender (the first time is reported:
    tracing and compilation included); then `timed_call(c)` (returning
    seconds) runs once per contender per round, in turn. The order rotates
    every round (A B C, B C A, C A B, ...), so no contender always runs
    right after the same other one (e.g. after eager PyTorch left the caches
    cold, or a slow phase of a shared machine). With a dict `errors`, a
    contender whose first or warm-up call raises is left out of the rounds
    (and of the returned figures) and its error stored there by name.
    """
    first, kept = {}, []
    for c in contenders:
        try:
            first[c.name] = first_call(c)
            first_call(c)
        except Exception as e:
            if errors is None:
                raise
            errors[c.name] = f"{type(e).__name__}: {e}"
            print(f"  [{label}] {c.name}: ERROR {errors[c.name]}", flush=True)
            continue
        kept.append(c)
        print(f"  [{label}] {c.name}: first call {first[c.name]:.2f}s", flush=True)
    contenders = kept
    samples = {c.name: [] for c in contenders}
    for r in range(repeats):
        shift = r % len(contenders)
        for c in contenders[shift:] + contenders[:shift]:
            samples[c.name].append(timed_call(c))
        line = ", ".join(f"{c.name} {samples[c.name][-1]:.3f}s" for c in contenders)
        print(f"  [{label}] round {r + 1}/{repeats}: {line}", flush=True)
    return first, samples


def step_loss(output):
    """The loss of a `train_step()` result: a float (HF), or Keras'
    `train_on_batch` scalar or `[loss, *metrics]` list."""
    return float(np.ravel(output)[0])


def bench_train(contenders, steps, repeats, first_losses=None):
    """Seconds per training step; a round is `steps` steps. With a dict
    `first_losses`, each contender's first-step loss is stored in it."""

    def one_step(c):
        seconds, out = timed(c.train_step)
        if first_losses is not None:
            first_losses.setdefault(c.name, step_loss(out))
        return seconds

    def round_(c):
        start = time.perf_counter()
        for _ in range(steps):
            c.train_step()
        return (time.perf_counter() - start) / steps

    return run_rounds(contenders, one_step, round_, repeats, "train")


def record_train(contenders, results, args, final_loss=False, first_loss=False):
    """Runs `bench_train` and stores its figures in `results`; with
    `final_loss`, one more step's loss too (`loss after timing`); with
    `first_loss`, the loss of the first (untrained) step (`first_loss`)."""
    losses = {} if first_loss else None
    first, samples = bench_train(contenders, args.steps, args.repeats, losses)
    for c in contenders:
        r = results[c.name]
        r["train_first_step_s"] = first[c.name]
        r["train_samples_s_per_step"] = samples[c.name]
        r["train_s_per_step"] = statistics.median(samples[c.name])
        if first_loss:
            r["first_loss"] = losses[c.name]
        if final_loss:
            r["final_loss"] = step_loss(c.train_step())


def bench_calls(contenders, call, check, repeats, label, errors=None):
    """Seconds per `call(c)`; `check(c.name, output)` runs after each call,
    untimed. `errors`: as for `run_rounds`."""

    def one(c):
        seconds, out = timed(lambda: call(c))
        check(c.name, out)
        return seconds

    return run_rounds(contenders, one, one, repeats, label, errors)


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def print_table(lines, note="(speed ratio > 1: ours is faster)"):
    """Prints `lines` (header first) as an aligned text table, then `note`."""
    widths = [max(len(str(r[i])) for r in lines) for i in range(len(lines[0]))]
    print()
    for i, line in enumerate(lines):
        print(" | ".join(str(v).ljust(w) for v, w in zip(line, widths)))
        if i == 0:
            print("-+-".join("-" * w for w in widths))
    print(note)


# --------------------------------------------------------------- results
def finish(args, meta, t0, results, report):
    """Ends the run: wall time (since `t0`) and load into `meta`, the table
    (`report(results)`, which returns the speed ratios), then `--json`."""
    meta["wall_s"] = round(time.perf_counter() - t0, 1)
    meta["load_end"] = load()
    ratios = report(results)
    print(f"wall time {meta['wall_s']}s; load average at end: {meta['load_end']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": results, "ratios": ratios}, f, indent=2)
        print(f"wrote {args.json}")
    return results


def add_throughput(r, flops, peak):
    """A contender's TFLOP/s and share of the measured matmul peak, from
    its `train_s_per_step` and the row's FLOPs per step (where both exist)."""
    if flops and r.get("train_s_per_step"):
        r["train_tflops"] = flops / r["train_s_per_step"] / 1e12
        r["train_peak_fraction"] = r["train_tflops"] / peak["tflops"]
