"""Mixed-precision benchmark: training-step time of float32, mixed_bfloat16
and mixed_float16 on one backend.

Contenders, all ``keras_transformers.models.GPTCausalLM`` at the same
configuration, in one process, on the current Keras backend
(``KERAS_BACKEND``):

* ``float32``: the float32 policy (the baseline);
* ``mixed_bfloat16``: ``dtype="mixed_bfloat16"`` (bfloat16 compute, float32
  variables);
* ``mixed_float16``: ``dtype="mixed_float16"`` (float16 compute, float32
  variables; ``compile()`` wraps the optimizer in a ``LossScaleOptimizer``).

Layouts (``--layouts``, comma-separated): ``gpt2`` (learned positions,
pre-LayerNorm, tanh-approximate GELU, tied embeddings; the configuration of
``bench.py``'s ``gpt2_tiny`` row at a smaller size) and ``llama`` (rotary positions, RMSNorm,
SwiGLU, grouped-query attention with half as many KV heads, untied head).

Measured: steady-state seconds per training step on one fixed batch (the
same tokens for every contender): ``train_on_batch(x, y)`` with AdamW(lr=1e-4,
weight_decay=0.01) and SparseCategoricalCrossentropy(from_logits=True), no
metrics, ``jit_compile`` left at the backend default (XLA on JAX; eager on
PyTorch; on TensorFlow, Keras picks XLA only when a GPU or TPU is present, so
a CPU-only machine runs a ``tf.function`` graph with oneDNN kernels; the
``notes`` printed at start-up say which). The speed-up is float32 seconds / policy
seconds (> 1: the mixed policy is faster). The first step (tracing and
compilation included) is reported apart, and the loss after timing is
printed as a sanity check (same data, same initial weights for all three).

Procedure: build the three models (same seed, so the same initial weights),
first step and one warm-up step each, then ``--repeats`` alternating rounds
(float32, bf16, f16, float32, ...) of ``--steps`` steps; each figure is the
median over rounds. One process per backend.

Whether a mixed policy is faster depends on the backend's CPU kernels: oneDNN
(PyTorch, TensorFlow graphs) has bfloat16 matmuls that use the AVX512-BF16 /
AMX units; XLA:CPU (JAX) largely computes bfloat16 and float16 through
float32; no CPU backend has fast float16 matmuls, and float16 adds loss
scaling (a finiteness check of every gradient per step).

Usage::

    KERAS_BACKEND=torch python benchmarks/bench_precision.py
    KERAS_BACKEND=jax python benchmarks/bench_precision.py --layouts gpt2,llama
    python benchmarks/bench_precision.py --quick          # tiny smoke test
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass

import numpy as np
from _common import (
    TORCH_THREADS_HELP,
    KerasContender,
    finish,
    fmt,
    keras_loss,
    keras_optimizer,
    print_table,
    record_train,
    setup_torch,
)
from _machine import all_cores, print_meta, run_meta

POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")
LAYOUTS = {
    "gpt2": dict(
        activation="gelu_approximate",
        position_embedding="learned",
        norm_type="layer",
        tie_embeddings=True,
    ),
    "llama": dict(
        activation="silu",
        gated_feed_forward=True,
        position_embedding="rotary",
        norm_type="rms",
        use_bias=False,
        tie_embeddings=False,
    ),
}


@dataclass(frozen=True)
class Sizes:
    vocabulary_size: int = 4096
    num_layers: int = 2
    hidden_dim: int = 256
    num_heads: int = 4
    intermediate_dim: int = 1024
    sequence_length: int = 128
    batch: int = 8


QUICK = Sizes(
    vocabulary_size=512,
    num_layers=1,
    hidden_dim=64,
    num_heads=2,
    intermediate_dim=128,
    sequence_length=32,
    batch=2,
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
    p.add_argument(
        "--layouts", default="gpt2", help=f"comma-separated, of {sorted(LAYOUTS)}"
    )
    p.add_argument(
        "--torch-threads", type=int, default=all_cores(), help=TORCH_THREADS_HELP
    )
    p.add_argument("--json", metavar="PATH", help="write the results to this JSON file")
    args = p.parse_args(argv)
    args.layouts = [name.strip() for name in args.layouts.split(",") if name.strip()]
    unknown = sorted(set(args.layouts) - set(LAYOUTS))
    if unknown or not args.layouts:
        p.error(f"--layouts must name some of {sorted(LAYOUTS)}. Received: {unknown}")
    if args.quick:
        args.repeats = min(args.repeats, 2)
        args.steps = min(args.steps, 2)
    return args


class Policy(KerasContender):
    """Our GPT causal LM of `layout` under the dtype policy `policy`."""

    def __init__(self, layout, policy, sizes: Sizes, x, y):
        import keras

        from keras_transformers.models import GPTCausalLM

        super().__init__(x, y)
        self.name = f"{layout} {policy}"
        self.policy = policy
        keras.utils.set_random_seed(0)  # the same initial weights for every policy
        extra = LAYOUTS[layout]
        if layout == "llama":
            extra = dict(extra, num_kv_heads=max(1, sizes.num_heads // 2))
        self.model = GPTCausalLM(
            vocabulary_size=sizes.vocabulary_size,
            num_layers=sizes.num_layers,
            hidden_dim=sizes.hidden_dim,
            num_heads=sizes.num_heads,
            intermediate_dim=sizes.intermediate_dim,
            max_sequence_length=sizes.sequence_length,
            dropout=0.0,
            attention_dropout=0.0,
            dtype=policy,
            **extra,
        )
        self.model.compile(optimizer=keras_optimizer(), loss=keras_loss())

    def notes(self):
        optimizer = type(self.model.optimizer).__name__
        return f"{super().notes()}, optimizer={optimizer}"


def report(results, layouts):
    """Seconds per step and the speed-up of each mixed policy over float32."""
    lines = [["layout", "policy", "train s/step", "speed-up", "1st step s", "loss"]]
    speedups = {}
    for layout in layouts:
        base = results[f"{layout} float32"]["train_s_per_step"]
        for policy in POLICIES:
            r = results[f"{layout} {policy}"]
            speedup = base / r["train_s_per_step"]
            speedups[f"{layout} {policy}"] = speedup
            lines.append(
                [
                    layout,
                    policy,
                    fmt(r["train_s_per_step"], ".4f"),
                    fmt(speedup, ".2f"),
                    fmt(r["train_first_step_s"], ".2f"),
                    fmt(r.get("final_loss"), ".3f"),
                ]
            )
    print_table(
        lines, "(speed-up = float32 s/step / policy s/step; > 1: the policy is faster)"
    )
    return speedups


def main(argv=None):
    args = parse_args(argv)
    sizes = QUICK if args.quick else Sizes()
    import keras

    backend = keras.config.backend()
    torch = setup_torch(args.torch_threads) if backend == "torch" else None
    rng = np.random.default_rng(0)
    tokens = rng.integers(
        1, sizes.vocabulary_size, (sizes.batch, sizes.sequence_length + 1)
    ).astype("int32")
    x = {
        "token_ids": tokens[:, :-1],
        "padding_mask": np.ones((sizes.batch, sizes.sequence_length), bool),
    }
    y = tokens[:, 1:]
    meta = run_meta(backend, torch, asdict(sizes), args, argv)
    meta["layouts"] = args.layouts
    print_meta(meta)

    t0 = time.perf_counter()
    contenders = [
        Policy(layout, policy, sizes, x, y)
        for layout in args.layouts
        for policy in POLICIES
    ]
    results = {}
    for c in contenders:
        results[c.name] = {"params": c.params(), "notes": c.notes()}
        print(f"{c.name:24s} params={c.params():,}  {c.notes()}")
    record_train(contenders, results, args, final_loss=True)
    return finish(args, meta, t0, results, lambda r: report(r, args.layouts))


if __name__ == "__main__":
    main()
