"""Running `bench.py`'s rows in fresh processes: one process per row
(`--row-processes`) or per contender (`--contender-processes`, optionally
several rounds of processes, `--process-rounds`), each a run of `bench.py`
itself whose results come back by a JSON file and are merged here."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

from _common import add_throughput
from _contenders import CONTENDERS


def row_in_process(script, row, argv, contender=None):
    """`script`'s `bench_row` for one row (and only `contender`, if given)
    in a fresh process with the same options; its output streams through,
    its result comes back by a JSON file, with the process's measured
    matmul peak. A
    contender that runs on PyTorch alone (Hugging Face) gets a process with
    the PyTorch Keras backend: no TensorFlow or JAX runtime beside it, as
    in its users' programs."""
    argv = list(sys.argv[1:] if argv is None else argv)
    flags = ("--rows", "--json", "--process-rounds")
    flags += ("--contenders",) if contender else ()
    for flag in flags:  # drop these flags and their values
        while flag in argv:
            i = argv.index(flag)
            del argv[i : i + 2]
        argv = [a for a in argv if not a.startswith(flag + "=")]
    argv = [a for a in argv if a not in ("--row-processes", "--contender-processes")]
    if contender:
        argv += ["--contenders", contender]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "row.json")
        cmd = [sys.executable, os.path.abspath(script), *argv, "--rows", row.name]
        env = dict(os.environ)
        if contender and CONTENDERS[contender].uses_torch:
            env["KERAS_BACKEND"] = "torch"
        proc = subprocess.run([*cmd, "--json", out], check=False, env=env)
        if proc.returncode != 0 or not os.path.exists(out):
            return {
                "kind": row.kind,
                "size": row.size,
                "batch": row.batch,
                "contenders": {},
                "error": f"row process exited {proc.returncode}",
            }
        with open(out) as f:
            data = json.load(f)
    meta = data["meta"]
    return {
        **data["rows"][row.name],
        "matmul_peak": meta["matmul_peak"],
        "keras_backend": meta["backend"],
    }


def contenders_in_processes(script, row, argv, names, peak, rounds=1):
    """`row_in_process` once per contender, `rounds` times in turn (A B C,
    A B C, ...); the results merged into one row (ours first, as
    `bench_row` orders them; a contender's timed rounds from all its
    processes pooled, see `pool_processes`). Throughput against the peak
    uses ours' FLOP count and the best matmul peak measured in this run
    (here and in every contender's process) for every one."""
    merged, parts = None, {name: [] for name in names}
    for _ in range(rounds):
        for name in names:
            part = row_in_process(script, row, argv, contender=name)
            if merged is None:
                merged = {**part, "contenders": {}, "skipped": {}}
                merged.update(processes={}, process_backends={})
            parts[name].append(part.get("contenders", {}).get(name))
            merged["skipped"].update(part.get("skipped", {}))
            merged["processes"].setdefault(name, []).append(part.get("process"))
            merged["process_backends"][name] = part.get("keras_backend")
            if part.get("error"):
                merged.setdefault("errors", {})[name] = part["error"]
            if part.get("flops_per_step"):
                merged["flops_per_step"] = part["flops_per_step"]
            peaks = (
                peak,
                merged.get("matmul_peak") or peak,
                part.get("matmul_peak") or peak,
            )
            merged["matmul_peak"] = max(peaks, key=lambda p: p["tflops"])
    merged.pop("process", None)
    merged.pop("keras_backend", None)
    for name in names:
        results = [r for r in parts[name] if r]
        if results:
            merged["contenders"][name] = pool_processes(results)
    for r in merged["contenders"].values():
        add_throughput(r, merged.get("flops_per_step"), merged["matmul_peak"])
    return merged


def pool_processes(results):
    """One contender's results from several processes as one: every timed
    round pooled (median s/step over all), the first process's first step
    and generation figures, the largest peak memory, CPU-time medians over
    the processes."""
    if len(results) == 1:
        return results[0]
    out = dict(results[0])
    samples = [s for r in results for s in r.get("train_samples_s_per_step", [])]
    if samples:
        s = statistics.median(samples)
        ratio = s / out["train_s_per_step"]
        out.update(
            train_samples_s_per_step=samples,
            train_s_per_step=s,
            train_items_per_s=out["train_items_per_s"] / ratio,
        )
    memory = [r["memory_mib"] for r in results if r.get("memory_mib")]
    if memory:
        out["memory_mib"] = max(memory)
    for key in [k for k in out if k.startswith("train_cpu_") or "faults" in k]:
        out[key] = statistics.median(r[key] for r in results if key in r)
    return out
