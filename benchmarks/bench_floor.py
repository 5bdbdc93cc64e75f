"""The matrix-product floor of a training step: how fast could it be?

A transformer's training step is mostly matrix products. This script lists
every product one step of a ``bench.py`` row computes (forward, and the two
of the backward pass for each: the input's gradient and the weight's, or
both operands' for attention's batched products), times each distinct
shape alone on all cores through PyTorch and NumPy, keeps the faster, and
sums them: the **floor**, the step's time if nothing but its products ran,
each at the speed this machine gives that shape.

The floor's throughput is also given as a share of the machine's matmul
peak (float32 4096^3, measured in the same run): a step's ``% peak`` from
``bench.py`` over that share is its multiple of the floor, comparable across
runs taken at different moments of a machine whose speed drifts.

Given a ``bench.py`` JSON (``--results``), it then reports each contender's
step as a multiple of the floor, and the ratio against Hugging Face that a
step at the floor would reach (``hf s/step / floor``): where that is under a
target ratio, no implementation of the same products can meet it here.

What the floor leaves out, so a real step stays above it: everything that
is not a product (softmax, normalisation, activations, the optimizer update,
the loss, dropout), the time a library spends moving operands into a
product's layout, and products that share the cores with other work. What
it counts that a library might avoid: nothing; every listed product is in
every contender's step (the same model, the same batch).

Counted per layer (M = tokens of the batch): the attention projections
``[M, d] x [d, heads x head_dim]`` (query, output) and ``[M, d] x [d, kv
heads x head_dim]`` (key, value), the scores and the mix as batched
products over batch x heads, the feed-forward (two or three products, MoE:
each routed expert on its share ``M x k / E`` of the rows, balanced), and
the output logits over the vocabulary where the row has them; ViT adds its
patch projection, encoder-decoders count each stack on its own tokens plus
cross-attention. A causal model's scores are counted in full (no causal
discount), as the libraries compute them.

Usage::

    python benchmarks/bench_floor.py --rows gpt2_small --batch 2
    python benchmarks/bench_floor.py --rows gpt2_small --batch 2 --results run.json
    python benchmarks/bench_floor.py --quick              # tiny smoke test
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter

import _rows
import numpy as np
from _common import fmt, print_table, setup_torch, timed
from _machine import all_cores


def products(row, cfg):
    """Forward products of one step: `Counter{(batch, m, k, n): count}` for
    `[batch, m, k] x [batch, k, n]` (batch 1: a plain product)."""
    d, f, h = cfg.hidden_dim, cfg.intermediate_dim, cfg.num_heads
    hd = cfg.head_dim or d // h
    kv = (cfg.num_kv_heads or h) * hd
    out = Counter()

    def layer(b, t, cross=None):
        """One block on `b x t` tokens (self-attention over `t`); `cross`:
        source length for a decoder's cross-attention."""
        m = b * t
        out[1, m, d, h * hd] += 1  # query
        out[1, m, h * hd, d] += 1  # output
        out[1, m, d, kv] += 2  # key, value
        out[b * h, t, hd, t] += 1  # scores
        out[b * h, t, t, hd] += 1  # mix
        if cross:
            out[1, m, d, h * hd] += 1
            out[1, m, h * hd, d] += 1
            out[1, b * cross, d, kv] += 2
            out[b * h, t, hd, cross] += 1
            out[b * h, t, cross, hd] += 1
        if cfg.moe is not None:
            e, k = cfg.moe.num_experts, cfg.moe.num_experts_per_token
            ff = cfg.moe.expert_intermediate_dim or f
            rows = max(1, m * k // e)
            out[1, rows, d, ff] += 2 * e  # gate, up per expert
            out[1, rows, ff, d] += e
        else:
            out[1, m, d, f] += 2 if cfg.gated_feed_forward else 1
            out[1, m, f, d] += 1

    b = row.batch
    if row.kind == "vit":
        v = cfg.vision
        patches = (v.image_size // v.patch_size) ** 2
        out[1, b * patches, v.num_channels * v.patch_size**2, d] += 1
        for _ in range(cfg.num_layers):
            layer(b, patches + 1)
        return out
    if row.kind == "seq2seq":
        for _ in range(cfg.num_layers):
            layer(b, row.seq)
        for _ in range(cfg.num_decoder_layers or cfg.num_layers):
            layer(b, row.target, cross=row.seq)
        out[1, b * row.target, d, cfg.vocabulary_size] += 1
        return out
    for _ in range(cfg.num_layers):
        layer(b, row.seq)
    if row.kind in ("causal", "moe", "mlm"):
        out[1, b * row.seq, d, cfg.vocabulary_size] += 1
    return out


def with_backward(forward):
    """Each forward product `[m, k] x [k, n]` and its two backward ones:
    the input's gradient `[m, n] x [n, k]` and the weight's `[k, m] x [m, n]`
    (for batched products, the second operand's gradient)."""
    out = Counter()
    for (b, m, k, n), count in forward.items():
        for shape in ((b, m, k, n), (b, m, n, k), (b, k, m, n)):
            out[shape] += count
    return out


def time_shape(shape, torch, repeats):
    """Best seconds of one `shape` product through each library; returns
    `{library: s}`, each the median of `repeats` after a warm-up."""
    b, m, k, n = shape
    rng = np.random.default_rng(0)
    a = rng.standard_normal((b, m, k) if b > 1 else (m, k), "float32")
    w = rng.standard_normal((b, k, n) if b > 1 else (k, n), "float32")
    runs = {"numpy": lambda: np.matmul(a, w)}
    if torch is not None:
        ta, tw = torch.from_numpy(a), torch.from_numpy(w)
        runs["torch"] = lambda: torch.matmul(ta, tw)
    times = {}
    for lib, run in runs.items():
        run()
        times[lib] = statistics.median(timed(run)[0] for _ in range(repeats))
    return times


def floor(row, torch, repeats):
    """The row's floor: total seconds, FLOPs and per-shape detail."""
    shapes = with_backward(products(row, row.config()))
    total, flops, detail = 0.0, 0.0, []
    for shape, count in sorted(shapes.items(), key=lambda kv: -np.prod(kv[0]) * kv[1]):
        times = time_shape(shape, torch, repeats)
        best = min(times.values())
        total += count * best
        flops += count * 2 * float(np.prod(shape))
        detail.append({"shape": list(shape), "count": count, "s": times})
    return {
        "floor_s": total,
        "flops": flops,
        "tflops": flops / total / 1e12,
        "shapes": detail,
    }


def compare(name, result, runs):
    """Table lines: the floor, then each contender's s/step in `runs`
    (bench.py JSON results) as a multiple of it."""
    lines = [[name, "floor", fmt(result["floor_s"], ".3f"), "1.00", "-"]]
    for label, data in runs:
        row = data.get("rows", {}).get(name)
        if not row:
            continue
        hf = row["contenders"].get("hf", {}).get("train_s_per_step")
        for contender, r in row["contenders"].items():
            s = r.get("train_s_per_step")
            if s is None:
                continue
            reach = hf / result["floor_s"] if hf and contender == "hf" else None
            result.setdefault("steps", {})[f"{label}/{contender}"] = s
            lines.append(
                [
                    name,
                    f"{label} {contender}",
                    fmt(s, ".3f"),
                    fmt(s / result["floor_s"], ".2f"),
                    fmt(reach, ".2f"),
                ]
            )
    return lines


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default=None, help="comma-separated bench.py rows")
    p.add_argument("--batch", type=int, help="override every row's batch size")
    p.add_argument("--repeats", type=int, default=5, help="timings per shape (median)")
    p.add_argument(
        "--results",
        action="append",
        default=[],
        help="a bench.py JSON (LABEL=PATH or PATH; repeatable) to compare with",
    )
    p.add_argument("--quick", action="store_true", help="tiny rows, 2 repeats")
    p.add_argument("--json", help="write the results to this JSON file")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    rows = _rows.select(args.rows.split(",") if args.rows else None)
    if args.quick:
        rows, args.repeats = [_rows.quick(r) for r in _rows.select(["gpt2_tiny"])], 2
    if args.batch:
        import dataclasses

        rows = [dataclasses.replace(r, batch=args.batch) for r in rows]
    try:
        torch = setup_torch(all_cores())
    except ImportError:
        torch = None
    runs = []
    for spec in args.results:
        label, _, path = spec.rpartition("=")
        with open(path) as f:
            data = json.load(f)
        runs.append((label or data["meta"].get("backend", "run"), data))
    n = 1024 if args.quick else 4096
    peak = 2 * n**3 / min(time_shape((1, n, n, n), torch, args.repeats).values()) / 1e12
    print(
        f"cores {all_cores()}; libraries numpy"
        + (", torch" if torch else "")
        + f"; matmul peak {peak:.3f} TFLOP/s (float32 {n}^3)"
    )
    results, lines = {}, [["row", "step", "s/step", "x floor", "hf at floor: vs HF"]]
    for row in rows:
        results[row.name] = r = floor(row, torch, args.repeats)
        r["peak_fraction"] = r["tflops"] / peak
        print(
            f"{row.name} batch {row.batch}: floor {r['floor_s']:.3f} s "
            f"({len(r['shapes'])} shapes, {r['tflops']:.3f} TFLOP/s, "
            f"{100 * r['peak_fraction']:.0f}% of the peak)",
            flush=True,
        )
        lines += compare(row.name, r, runs)
    print_table(
        lines,
        "(x floor: s/step over the floor; last column: HF's s/step over the floor,"
        " the most a step at the floor could gain on HF)",
    )
    if args.json:
        with open(args.json, "w") as f:
            meta = {"cores": all_cores(), "matmul_peak_tflops": peak}
            json.dump({"meta": meta, "rows": results}, f, indent=2)
        print(f"wrote {args.json}")
    return results


if __name__ == "__main__":
    main()
