"""Host (Python) overhead of one eager PyTorch training step, ours against
Hugging Face on the same row, in one process.

Per contender: CPU seconds per step (`time.process_time`, user + system) and wall
seconds, alternating between contenders; then, under `cProfile`, Python
function calls per step and Keras `Layer.__call__` / `nn.Module.__call__`
invocations per step (and per layer); then, under `torch.profiler`, the CPU
self time of `aten::` operators over the step's total (the rest is Python,
autograd bookkeeping and the profiler's own cost). `--quick` rows (width
64, batch 2) make the compute negligible, so a step's time there is almost
all host overhead, which is what a GPU step that launches small kernels
pays.

Usage::

    KERAS_BACKEND=torch python benchmarks/bench_host.py --rows gpt2_tiny,llama_tiny
    KERAS_BACKEND=torch python benchmarks/bench_host.py --rows llama_tiny --quick
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import json
import os
import pstats
import statistics
import time

import _common
import _rows
from _contenders import CONTENDERS, Env

import keras_transformers.backend  # noqa: F401  (as a user's script)


def cpu_seconds():
    return time.process_time()  # user + system of every thread, ns resolution


def timing(contenders, steps, repeats):
    """Median wall and CPU seconds per step, contenders alternating."""
    wall = {c.name: [] for c in contenders}
    cpu = {c.name: [] for c in contenders}
    for r in range(repeats):
        for c in contenders[r % len(contenders) :] + contenders[: r % len(contenders)]:
            c0, w0 = cpu_seconds(), time.perf_counter()
            for _ in range(steps):
                c.train_step()
            wall[c.name].append((time.perf_counter() - w0) / steps)
            cpu[c.name].append((cpu_seconds() - c0) / steps)
    return {
        c.name: {
            "wall_s": statistics.median(wall[c.name]),
            "cpu_s": statistics.median(cpu[c.name]),
        }
        for c in contenders
    }


def python_profile(c, steps, top, sort="tottime"):
    """cProfile of `steps` steps: calls per step, layer calls, top self times."""
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(steps):
        c.train_step()
    profile.disable()
    stats = pstats.Stats(profile)
    layer_calls = module_calls = 0
    for (file, _, name), (_, ncalls, *_rest) in stats.stats.items():
        if name == "__call__" and file.endswith(
            os.path.join("keras", "src", "layers", "layer.py")
        ):
            layer_calls += ncalls
        if name == "_call_impl" and file.endswith(
            os.path.join("torch", "nn", "modules", "module.py")
        ):
            module_calls += ncalls
    out = io.StringIO()
    stats.stream = out
    stats.sort_stats(sort).print_stats(top)
    return {
        "python_calls_per_step": stats.total_calls / steps,
        "layer_calls_per_step": layer_calls / steps,
        "module_calls_per_step": module_calls / steps,
        "profiled_s_per_step": stats.total_tt / steps,
        "top": out.getvalue(),
    }


def torch_profile(c, steps, torch):
    """Self CPU time of aten operators over the profiled steps' wall time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            c.train_step()
        total = time.perf_counter() - start
    aten = sum(
        e.self_cpu_time_total for e in prof.key_averages() if e.key.startswith("aten::")
    )
    ops = sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))
    return {
        "profiled_wall_s_per_step": total / steps,
        "aten_self_s_per_step": aten / 1e6 / steps,
        "aten_ops_per_step": ops / steps,
        "outside_aten_share": 1 - aten / 1e6 / total,
    }


def layers_of(c):
    if c.name.startswith("hf"):
        return sum(1 for _ in c.model.modules())
    return len(list(c.model._flatten_layers(include_self=True)))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="gpt2_tiny,llama_tiny")
    p.add_argument("--contenders", default="ours,hf")
    p.add_argument(
        "--quick", action="store_true", help="rows shrunk (bench.py --quick)"
    )
    p.add_argument("--batch", type=int, default=0)
    p.add_argument("--layers", type=int, default=0, help="override every row's depth")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="intra-op threads (default 1: on more, the profiler's aten self "
        "time adds up the threads' and exceeds the step's wall time)",
    )
    p.add_argument("--top", type=int, default=0, help="print the top N self times")
    p.add_argument("--sort", default="tottime", help="cProfile order of --top")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import keras

    torch = _common.setup_torch(args.torch_threads)
    _common.seed(keras.config.backend())
    env = Env(keras.config.backend(), torch, "float32")
    results = {"meta": {"load_start": os.getloadavg(), "args": vars(args)}}
    for row in _rows.select(args.rows.split(",")):
        if args.quick:
            row = _rows.quick(row)
        if args.batch:
            row = dataclasses.replace(row, batch=args.batch)
        if args.layers:
            overrides = {**row.overrides, "num_layers": args.layers}
            row = dataclasses.replace(row, overrides=overrides)
        cfg = row.config()
        batch = _rows.make_batch(row, cfg)
        contenders = [
            CONTENDERS[n](row, cfg, batch, env) for n in args.contenders.split(",")
        ]
        for c in contenders:
            c.train_step()
            c.train_step()
        out = timing(contenders, args.steps, args.repeats)
        for c in contenders:
            out[c.name].update(layers=layers_of(c))
            out[c.name].update(python_profile(c, args.steps, args.top, args.sort))
            out[c.name].update(torch_profile(c, args.steps, torch))
        print(
            f"\n== {row.name} batch {row.batch} x {row.seq} (load {os.getloadavg()[0]:.2f})"
        )
        print(
            f"{'contender':10s} {'wall s':>8s} {'cpu s':>8s} {'py calls':>9s} "
            f"{'layer/mod':>9s} {'layers':>6s} {'aten ops':>8s} {'aten s':>8s} {'outside':>7s}"
        )
        for c in contenders:
            r = out[c.name]
            calls = (
                r["module_calls_per_step"]
                if c.name.startswith("hf")
                else r["layer_calls_per_step"]
            )
            print(
                f"{c.name:10s} {r['wall_s']:8.4f} {r['cpu_s']:8.4f} "
                f"{r['python_calls_per_step']:9.0f} {calls:9.0f} {r['layers']:6d} "
                f"{r['aten_ops_per_step']:8.0f} {r['aten_self_s_per_step']:8.4f} "
                f"{r['outside_aten_share']:7.1%}"
            )
            if args.top:
                print(r["top"])
            r.pop("top")
        base = out[contenders[0].name]
        for c in contenders[1:]:
            r = out[c.name]
            print(
                f"{contenders[0].name}/{c.name}: wall {base['wall_s'] / r['wall_s']:.2f}x, "
                f"cpu {base['cpu_s'] / r['cpu_s']:.2f}x, python calls "
                f"{base['python_calls_per_step'] / r['python_calls_per_step']:.2f}x "
                "(> 1: ours costs more)"
            )
        results[row.name] = out
        del contenders
    results["meta"]["load_end"] = os.getloadavg()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
