"""One benchmark harness: rows (model family x size) against contenders
(ours, KerasHub, Hugging Face), training step and greedy generation, on
equal cores, in float32 or bfloat16, on the CPU or a GPU.

Rows (``--rows``, see ``_rows.py``): "tiny" sizes (the host-overhead check)
``gpt2_tiny, llama_tiny, bert_tiny, vit_tiny, transformer_tiny, t5_tiny,
moe_tiny, moe_tiny_dense`` and "published" sizes ``gpt2_small,
smollm2_135m, bert_base, vit_b16, transformer_base, t5_small, moe_smollm2,
moe_smollm2_dense``; "long" (one sequence of 2,048 or 4,096 tokens,
generation: the prompt's prefill) ``smollm2_2k, smollm2_4k,
gemma3_270m_2k, gemma3_270m_4k``. Contenders (``--contenders``): ``ours``
(keras_transformers on ``KERAS_BACKEND``), ``ours_compiled`` (the same
with ``jit_compile=True``), ``ours_explicit`` (without memory-efficient
attention and chunked loss), ``ours_remat`` (each block rematerialised),
``ours_remat_matmuls`` (rematerialised keeping the weight products),
``ours_dense_dispatch`` (MoE rows: every expert
on every token), ``kerashub`` (same backend), ``hf`` (transformers in eager
PyTorch, on CUDA when present), ``hf_compiled`` (its training forward
through ``torch.compile``).

Per row and contender: seconds per training step (median of alternating
rounds), tokens/s (images/s for ViT), the first step's time (tracing and
compilation) apart, the fraction of the matmul peak measured in the same
run (float32 4096^3 on the CPU, bfloat16 8192^3 on a GPU) that the step's
FLOPs reach, peak memory, and the speed ratio ours/contender; for causal
rows with ``--mode generate``, prefill time and per-token decode speed at
batch 1 and the row's batch.

Usage::

    KERAS_BACKEND=jax python benchmarks/bench.py --rows gpt2_small --json out.json
    KERAS_BACKEND=torch python benchmarks/bench.py --dtype bfloat16 --contenders ours,hf
    python benchmarks/bench.py --quick --rows gpt2_tiny    # smoke test
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX + torch on a GPU

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import _common  # noqa: E402
import _generate  # noqa: E402
import _machine  # noqa: E402
import _processes  # noqa: E402
import _report  # noqa: E402
import _rows  # noqa: E402
from _common import Skip  # noqa: E402
from _contenders import CONTENDERS, Env  # noqa: E402

# As a user's script: the package is imported before any computation, so its
# backend settings (XLA:CPU's scheduler on JAX) apply to every contender.
import keras_transformers.backend  # noqa: E402, F401


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--rows",
        default=None,
        help="comma-separated rows, or tiny / published / long / all (default: published;"
        " with --quick: tiny)",
    )
    p.add_argument("--contenders", default="ours,kerashub,hf")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--mode", default="train,generate", help="train, generate or both")
    p.add_argument("--repeats", type=int, default=5, help="timed rounds (median)")
    p.add_argument("--steps", type=int, default=3, help="training steps per round")
    p.add_argument("--batch", type=int, help="override every row's batch size")
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: tiny rows shrunk further, 2 rounds of 1 step",
    )
    p.add_argument(
        "--torch-threads",
        type=int,
        default=_machine.all_cores(),
        help=_common.TORCH_THREADS_HELP,
    )
    p.add_argument("--peak-size", type=int, help="matmul size of the peak measurement")
    p.add_argument("--json", metavar="PATH", help="write the results to this JSON file")
    p.add_argument(
        "--row-processes",
        action="store_true",
        help="run each row in a fresh process (rows of large models, e.g. the MoE "
        "rows' three models with their optimizer states, then never share one "
        "process's memory)",
    )
    p.add_argument(
        "--contender-processes",
        action="store_true",
        help="run each contender of each row in a fresh process, one after "
        "another (no contender inherits another's memory state; peak memory "
        "is then each contender's own)",
    )
    p.add_argument(
        "--process-rounds",
        type=int,
        default=1,
        help="with --contender-processes: run each contender's process this "
        "many times, contenders in turn, and pool their timed rounds (a slow "
        "phase of the machine then falls on every contender)",
    )
    p.add_argument(
        "--retain-memory",
        action="store_true",
        help="keep freed memory in each process for its reuse (glibc malloc; "
        "keras_transformers.retain_freed_memory), set before any computation, "
        "for every contender alike",
    )
    p.add_argument("--keras-adamw", action="store_true", help="keras.optimizers.AdamW")
    p.add_argument(
        "--keras-loss",
        action="store_true",
        help="keras.losses.SparseCategoricalCrossentropy for the Keras contenders",
    )
    p.add_argument(
        "--hf-fused-adamw",
        action="store_true",
        help="torch.optim.AdamW(fused=True) for Hugging Face (default: PyTorch's "
        "choice, a per-tensor loop on a CPU)",
    )
    args = p.parse_args(argv)
    _common._KERAS_ADAMW[0], _common._KERAS_LOSS[0] = args.keras_adamw, args.keras_loss
    _common._HF_FUSED_ADAMW[0] = args.hf_fused_adamw
    args.contenders = [c for c in args.contenders.split(",") if c]
    for name in args.contenders:
        if name not in CONTENDERS:
            p.error(f"unknown contender {name!r}; contenders: {', '.join(CONTENDERS)}")
    args.mode = set(args.mode.split(","))
    if not args.mode or not args.mode <= {"train", "generate"}:
        p.error(f"--mode takes train, generate or train,generate; got {args.mode}")
    if args.quick:
        args.repeats, args.steps = min(args.repeats, 2), 1
    names = args.rows.split(",") if args.rows else None
    args.rows = _rows.select(names, "tiny" if args.quick else "published")
    if args.quick:
        args.rows = [_rows.quick(r) for r in args.rows]
    if args.batch:
        args.rows = [dataclasses.replace(r, batch=args.batch) for r in args.rows]
    return args


def start(args):
    """Keras (with the dtype policy), torch on all cores (or
    `--torch-threads`), seeds; returns the `Env`."""
    import keras

    backend = keras.config.backend()
    keras.config.set_dtype_policy(args.dtype)
    torch = None
    if backend == "torch" or "hf" in args.contenders:
        try:
            torch = _common.setup_torch(args.torch_threads)
        except ImportError:
            print("torch is not installed: the hf contender is skipped")
    _common.seed(backend)
    return Env(backend, torch, args.dtype)


def matmul_peak(env, size=None):
    """Measured matmul throughput of this machine: bfloat16 `size`^3 (8192)
    on a GPU; float32 (4096) on the CPU, through NumPy in every process and
    also through torch where it is loaded, the faster of the two (so every
    process's denominator comes from the same library at least). Best of 5
    after a warm-up; `by_library` has each library's TFLOP/s."""
    import numpy as np

    torch = env.torch
    runs = {}
    if env.gpu:
        n, dtype = size or 8192, "bfloat16"
        if env.torch_cuda:
            a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
            runs["torch"] = lambda: (a @ a).sum().item()
        else:  # a GPU seen by JAX only
            import jax
            import jax.numpy as jnp

            b = jnp.ones((n, n), jnp.bfloat16)
            f = jax.jit(lambda b: b @ b)
            runs["jax"] = lambda: f(b).block_until_ready()
    else:
        n, dtype = size or 4096, "float32"
        c = np.random.default_rng(0).standard_normal((n, n), "float32")
        runs["numpy"] = lambda: c @ c
        if torch is not None:
            t = torch.randn(n, n)
            runs["torch"] = lambda: torch.mm(t, t)
    by_library = {}
    for lib, run in runs.items():
        run()
        best = min(_common.timed(run)[0] for _ in range(5))
        by_library[lib] = 2 * n**3 / best / 1e12
    lib = max(by_library, key=by_library.get)
    return {
        "size": n,
        "dtype": dtype,
        "library": lib,
        "tflops": by_library[lib],
        "by_library": by_library,
    }


def build(row, cfg, batch, env, names):
    """The row's contenders (ours first); a contender that fails to build is
    reported and left out."""
    out, skipped = [], {}
    for name in names:
        try:
            c = CONTENDERS[name](row, cfg, batch, env)
        except Skip as e:
            skipped[name] = str(e)
        except Exception as e:  # keep the other rows and contenders going
            skipped[name] = f"{type(e).__name__}: {e}"
        else:
            out.append(c)
            print(f"  {c.name:9s} params={c.params():,}  {c.notes()}", flush=True)
    for name, why in skipped.items():
        print(f"  {name:9s} skipped: {why}", flush=True)
    return out, skipped


def bench_row(row, args, env, peak):
    """Builds, times and frees one row's contenders; returns its results."""
    print(f"\n== {row.name} ({row.size}; {row.kind}) batch {row.batch}", flush=True)
    try:
        cfg = row.config()
        batch = _rows.make_batch(row, cfg)
    except Exception as e:
        print(f"  ERROR {type(e).__name__}: {e}", flush=True)
        return {
            "kind": row.kind,
            "size": row.size,
            "batch": row.batch,
            "contenders": {},
            "error": f"{type(e).__name__}: {e}",
        }
    contenders, skipped = build(row, cfg, batch, env, args.contenders)
    ours = next((c for c in contenders if c.name == "ours"), None)
    params = ours.params() if ours else None
    flops = _rows.step_flops(row, cfg, params) if params else None
    out = {
        "kind": row.kind,
        "size": row.size,
        "batch": row.batch,
        "process": os.getpid(),
        "seq": row.seq,
        "target": row.target,
        "note": row.note,
        "preset": row.preset,
        "overrides": row.overrides,
        "flops_per_step": flops,
        "skipped": skipped,
        "contenders": {
            c.name: {"params": c.params(), "notes": c.notes()} for c in contenders
        },
    }
    try:
        if "train" in args.mode and contenders:
            record_train(contenders, out, args, env, flops, peak, row)
        if "generate" in args.mode and row.generates and contenders:
            if row.kind == "seq2seq":
                start_id = cfg.bos_token_id or 0
                _generate.record_beam(contenders, out, batch, row, start_id, args)
            else:
                _generate.record(contenders, out, batch, row, args)
    except Exception as e:  # one failing row must not lose the others
        out["error"] = f"{type(e).__name__}: {e}"
        print(f"  ERROR {out['error']}", flush=True)
    del contenders, ours
    free(env)
    return out


def record_train(contenders, out, args, env, flops, peak, row):
    """Alternating rounds of `--steps` training steps; medians, first step,
    throughput, fraction of the matmul peak and memory per contender."""
    peaks = {}

    def first(c):
        if c.name not in peaks:
            env.reset_memory(c.uses_torch)
        seconds, loss = _common.timed(c.train_step)
        out["contenders"][c.name].setdefault("first_loss", loss)
        peaks[c.name] = env.memory(c.uses_torch)
        return seconds

    cpu = {c.name: [] for c in contenders}

    def round_(c):
        before = _common.cpu_times()
        start = time.perf_counter()
        for _ in range(args.steps):
            c.train_step()
        seconds = (time.perf_counter() - start) / args.steps
        cpu[c.name].append(_common.cpu_times(since=before, per=args.steps))
        return seconds

    errors = {}
    firsts, samples = _common.run_rounds(
        contenders, first, round_, args.repeats, "train", errors
    )
    for name, error in errors.items():
        out["contenders"][name]["train_error"] = error
    for c in contenders:
        if c.name in errors:
            continue
        r = out["contenders"][c.name]
        s = statistics.median(samples[c.name])
        r.update(
            train_first_step_s=firsts[c.name],
            train_samples_s_per_step=samples[c.name],
            train_s_per_step=s,
            train_items_per_s=row.tokens_per_step() / s,
            memory_kind=peaks[c.name][0],
            memory_mib=peaks[c.name][1],
            **_common.median_cpu(cpu[c.name], "train_"),
        )
        _common.add_throughput(r, flops, peak)


def free(env):
    """Drops the row's models before the next one."""
    import keras

    gc.collect()
    keras.backend.clear_session()
    if env.torch_cuda:
        env.torch.cuda.empty_cache()


def main(argv=None):
    args = parse_args(argv)
    if args.retain_memory:  # before the first computation starts a thread pool
        from keras_transformers.backend.host_memory import retain_freed_memory

        args.retain_memory = retain_freed_memory()
    env = start(args)
    meta = _machine.run_meta(env.backend, env.torch, None, args, argv)
    meta.update(
        rows=[r.name for r in args.rows],
        contenders=args.contenders,
        dtype=args.dtype,
        mode=sorted(args.mode),
        quick=args.quick,
        retain_memory=args.retain_memory,
        gpu=env.gpu,
        process=os.getpid(),
    )
    for key in ("sizes",):
        meta.pop(key, None)
    _machine.print_meta({**meta, "sizes": "rows " + ",".join(meta["rows"])})
    print(f"dtype={args.dtype}  contenders={','.join(args.contenders)}", flush=True)
    t0 = time.perf_counter()
    peak = matmul_peak(env, args.peak_size or (1024 if args.quick else None))
    meta["matmul_peak"] = peak
    print(
        f"measured matmul peak: {peak['tflops']:.2f} TFLOP/s "
        f"({peak['dtype']} {peak['size']}^3; "
        + ", ".join(f"{k} {v:.2f}" for k, v in peak["by_library"].items())
        + ")",
        flush=True,
    )
    if args.contender_processes and len(args.contenders) > 1:
        results = {
            row.name: _processes.contenders_in_processes(
                __file__, row, argv, args.contenders, peak, args.process_rounds
            )
            for row in args.rows
        }
    elif args.row_processes and len(args.rows) > 1:
        results = {
            row.name: _processes.row_in_process(__file__, row, argv)
            for row in args.rows
        }
    else:
        results = {row.name: bench_row(row, args, env, peak) for row in args.rows}
    meta["wall_s"] = round(time.perf_counter() - t0, 1)
    meta["load_end"] = _machine.load()
    _report.table(results, args)
    print(
        f"wall time {meta['wall_s']}s; load average at start {meta['load_start']}, "
        f"at end {meta['load_end']}; threads {meta['threads']}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": results}, f, indent=2, default=str)
        print(f"wrote {args.json}")
    return results


if __name__ == "__main__":
    main()
