"""The results table of ``bench.py``: one line per (row, contender), with
speed ratios ours/contender (> 1: ours is faster)."""

from __future__ import annotations

import re

from _common import fmt, print_table


def ratio(ours, other, higher_is_better):
    """Speed ratio ours/other of a figure (None where either is missing)."""
    if ours is None or other is None or not ours or not other:
        return None
    return ours / other if higher_is_better else other / ours


def kernel_percent(r):
    """The share of a step's CPU time spent in the kernel (first touches of
    fresh memory, mostly), or None."""
    user, system = (
        r.get("train_cpu_user_s_per_step"),
        r.get("train_cpu_system_s_per_step"),
    )
    if user is None or system is None or user + system <= 0:
        return None
    return 100 * system / (user + system)


def table(results, args):
    """Prints the training table, then the generation table; stores the
    ratios in each row's `ratios`."""
    train = [
        [
            "row",
            "contender",
            "params",
            "s/step",
            "tok/s|img/s",
            "1st step s",
            "TFLOP/s",
            "% peak",
            "mem MiB",
            "kernel %",
            "ours/x speed",
        ]
    ]
    gen = [
        [
            "row",
            "contender",
            "batch",
            "prefill s",
            "decode tok/s",
            "call tok/s",
            "ours/x prefill",
            "ours/x decode",
        ]
    ]
    problems = []
    beam = [["row", "contender", "batch", "s/call", "tok/s", "ours/x speed"]]
    for name, row in results.items():
        row["ratios"] = {}
        cs = row["contenders"]
        ours = cs.get("ours", {})
        for cname, r in cs.items():
            speed = ratio(
                ours.get("train_s_per_step"), r.get("train_s_per_step"), False
            )
            if cname != "ours" and speed is not None:
                row["ratios"][f"train:ours/{cname}"] = speed
            if "train_s_per_step" in r:
                frac = r.get("train_peak_fraction")
                train.append(
                    [
                        name,
                        cname,
                        f"{r['params']:,}",
                        fmt(r["train_s_per_step"], ".4f"),
                        fmt(r["train_items_per_s"], ",.0f"),
                        fmt(r["train_first_step_s"], ".2f"),
                        fmt(r.get("train_tflops"), ".2f"),
                        fmt(frac and 100 * frac, ".1f"),
                        fmt(r.get("memory_mib"), ",.0f"),
                        fmt(kernel_percent(r), ".0f"),
                        "" if cname == "ours" else fmt(speed, ".2f"),
                    ]
                )
            for b in sorted({1, row["batch"]}):
                prefill = f"gen_b{b}_prefill_s"
                if prefill not in r:
                    continue
                key = f"gen_b{b}_decode_tokens_per_s"
                speeds = []
                for label, k, higher in (
                    ("prefill", prefill, False),
                    ("decode", key, True),
                ):
                    speed = ratio(ours.get(k), r.get(k), higher)
                    if cname != "ours" and speed is not None:
                        row["ratios"][f"gen_b{b}_{label}:ours/{cname}"] = speed
                    speeds.append("" if cname == "ours" else fmt(speed, ".2f"))
                gen.append(
                    [
                        name,
                        cname,
                        str(b),
                        fmt(r[prefill], ".4f"),
                        fmt(r.get(key), ",.1f"),
                        fmt(r.get(f"gen_b{b}_tokens_per_s"), ",.1f"),
                        *speeds,
                    ]
                )
        for cname, r in cs.items():
            for key in sorted(k for k in r if re.fullmatch(r"beam_b\d+_s", k)):
                b = key[len("beam_b") : -len("_s")]
                tps = f"beam_b{b}_tokens_per_s"
                speed = ratio(ours.get(tps), r.get(tps), True)
                if cname != "ours" and speed is not None:
                    row["ratios"][f"beam_b{b}:ours/{cname}"] = speed
                beam.append(
                    [
                        name,
                        cname,
                        b,
                        fmt(r[key], ".4f"),
                        fmt(r[tps], ",.1f"),
                        "" if cname == "ours" else fmt(speed, ".2f"),
                    ]
                )
        for cname, r in cs.items():
            for key, error in r.items():
                if key.endswith("_error"):
                    problems.append(f"{name}: {cname} {key[: -len('_error')]}: {error}")
        for cname, why in row.get("skipped", {}).items():
            problems.append(f"{name}: {cname} skipped: {why}")
        if "error" in row:
            problems.append(f"{name}: ERROR {row['error']}")
        for cname, error in row.get("errors", {}).items():
            problems.append(f"{name}: {cname} process: {error}")
    if len(train) > 1:
        print_table(
            train,
            f"(training, {args.dtype}; % peak: share of the measured matmul peak; "
            "kernel %: share of the step's CPU time in the kernel; "
            "speed ratio > 1: ours is faster)",
        )
    if len(gen) > 1:
        print_table(
            gen,
            "(greedy generation, no early stop; prefill: a 1-token call; decode "
            "tok/s: batch / s per further token; call tok/s: new tokens / call s)",
        )
    if len(beam) > 1:
        print_table(
            beam,
            "(beam search: 4 beams, length penalty 0.6, no early stop; tok/s: "
            "new tokens of the returned sequences / call s)",
        )
    twins(results)
    for line in problems:
        print(line)


def twins(results):
    """For each MoE row run beside its dense twin (`<row>_dense`: the same
    active parameters), prints and stores (`ratios["train:<contender>/dense
    twin"]`) the twin's step time over the MoE step's, per contender: 1
    means the MoE step is as fast as a dense step of the same FLOPs."""
    for name, row in results.items():
        twin = results.get(f"{name}_dense")
        if row.get("kind") != "moe" or not twin:
            continue
        shown = []
        for cname, r in row["contenders"].items():
            moe = r.get("train_s_per_step")
            dense = twin["contenders"].get(cname, {}).get("train_s_per_step")
            if moe and dense:
                row["ratios"][f"train:{cname}/dense twin"] = dense / moe
                shown.append(f"{cname} {dense / moe:.2f}")
        if shown:
            print(
                f"{name} vs {name}_dense (twin s/step over MoE s/step; 1 = the "
                f"MoE step runs as fast as the same active FLOPs): {', '.join(shown)}"
            )
