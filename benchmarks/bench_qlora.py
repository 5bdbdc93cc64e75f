"""Peak memory of LoRA fine-tuning: float32 base vs NF4 base (QLoRA), ours
vs Hugging Face transformers + peft.

    KERAS_BACKEND=torch python benchmarks/bench_qlora.py --model smollm2
    KERAS_BACKEND=torch python benchmarks/bench_qlora.py --model llama3.2_1b --steps 2

Contenders (`--contenders`), each in a fresh process of its own, one after
another, on the same cores with the same batch of random token ids:

- `ours_float`: `keras_transformers` float32 base, `enable_lora(rank)` on
  every projection, `compile()` + `train_on_batch` with
  `keras_transformers.training.AdamW`;
- `ours_nf4`: the same after `model.quantize("nf4")` (QLoRA's 4-bit
  NormalFloat base; embeddings and LM head float, as in QLoRA);
- `ours_int4`: after Keras' `quantize("int4")` (not in the default list);
- `hf_peft`: transformers `LlamaForCausalLM` float32 with peft's
  `LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=<the 7
  projections>)`, `torch.optim.AdamW`, eager PyTorch. bitsandbytes' NF4
  needs a CUDA GPU, so Hugging Face has no CPU QLoRA contender.

Models: `smollm2` (SmolLM2-135M-Instruct's real weights, the safetensors
directory `examples/real_checkpoints.py` builds, as the tests'
`smollm2_dir` fixture) or `llama3.2_1b` (the preset's shape, 1.24B, random
weights: no download).

Each process reports its resident memory after imports, the peak while
loading (and quantizing), the resident memory then, and the peak over the
training steps alone (Linux: the peak counter is reset after loading,
`/proc/self/clear_refs`), plus seconds per step after the first. The
table gives each contender's figures and its training peak over
`ours_float`'s. glibc keeps part of the memory a process frees, so a
step's freed temporaries (NF4's dequantized kernels, a float LoRA's merged
kernels) can stay resident; `--mmap-threshold 65536` gives every process
an allocator that returns them, whose peak follows the memory in use
(`--retain-memory`: keep it all, `keras_transformers.retain_freed_memory`,
ours only).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGETS = (
    "query",
    "key",
    "value",
    "attention_output",
    "gate",
    "intermediate",
    "output",
)
HF_TARGETS = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
]
CONTENDERS = ("ours_float", "ours_nf4", "ours_int4", "hf_peft")


def status_mib(field: str) -> float:
    """`VmRSS` (resident now) or `VmHWM` (peak) of this process, in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak() -> None:
    """Restarts the process's peak resident memory from the current one."""
    Path("/proc/self/clear_refs").write_text("5")


def nbytes(variable) -> int:
    import numpy as np

    return math.prod(variable.shape) * np.dtype(variable.dtype).itemsize


def batch(args, vocabulary_size):
    import numpy as np

    rng = np.random.default_rng(0)
    ids = rng.integers(3, vocabulary_size, size=(args.batch, args.length + 1))
    return ids.astype("int32")


def smollm2_dir() -> Path:
    sys.path.insert(0, str(ROOT / "examples"))
    import real_checkpoints

    return real_checkpoints.smollm2()


def run_ours(args, report):
    import keras_transformers as kt
    from keras_transformers.training import AdamW, MaskedSparseCategoricalCrossentropy

    if args.retain_memory:
        kt.retain_freed_memory()
    report["rss_after_imports_mib"] = status_mib("VmRSS")
    if args.model == "smollm2":
        lm = kt.from_preset(str(smollm2_dir()))
    else:
        lm = kt.from_preset(args.model)
    mode = {"ours_nf4": "nf4", "ours_int4": "int4"}.get(args.contender)
    if mode:
        lm.quantize(mode)
    lm.enable_lora(args.rank, target=TARGETS, alpha=2 * args.rank)
    lm.compile(
        optimizer=AdamW(1e-4),
        loss=MaskedSparseCategoricalCrossentropy(from_logits=True),
    )
    report["weight_mib"] = sum(nbytes(v) for v in lm.weights) / 2**20
    report["trainable_params"] = sum(math.prod(v.shape) for v in lm.trainable_weights)
    ids = batch(args, lm.config.vocabulary_size)
    x, y = ids[:, :-1], ids[:, 1:]
    return lambda: float(lm.train_on_batch(x, y))


def llama_config(preset: str):
    """transformers' `LlamaConfig` of built-in preset `preset`, read from its
    JSON file (this process imports no Keras)."""
    from transformers import LlamaConfig

    c = json.loads((ROOT / "presets" / "gpt" / f"{preset}.json").read_text())["config"]
    return LlamaConfig(
        vocab_size=c["vocabulary_size"],
        hidden_size=c["hidden_dim"],
        intermediate_size=c["intermediate_dim"],
        num_hidden_layers=c["num_layers"],
        num_attention_heads=c["num_heads"],
        num_key_value_heads=c["num_kv_heads"],
        head_dim=c["head_dim"],
        rms_norm_eps=c["norm_epsilon"],
        rope_theta=c["rope_max_wavelength"],
        tie_word_embeddings=c["tie_embeddings"],
        max_position_embeddings=c["max_sequence_length"],
    )


def run_hf(args, report):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    report["rss_after_imports_mib"] = status_mib("VmRSS")
    torch.manual_seed(0)
    if args.model == "smollm2":
        model = LlamaForCausalLM.from_pretrained(smollm2_dir(), dtype=torch.float32)
    else:
        model = LlamaForCausalLM(llama_config(args.model))
    lora = LoraConfig(
        r=args.rank,
        lora_alpha=2 * args.rank,
        target_modules=HF_TARGETS,
        lora_dropout=0.0,
    )
    model = get_peft_model(model, lora)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01)
    report["weight_mib"] = (
        sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    )
    report["trainable_params"] = sum(p.numel() for p in params)
    ids = torch.from_numpy(batch(args, model.config.vocab_size).astype("int64"))

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = model(input_ids=ids[:, :-1], labels=ids[:, :-1]).loss
        loss.backward()
        optimizer.step()
        return float(loss)

    return step


def contender(args):
    """Runs one contender in this process; writes its report to `--json`."""
    report = {"contender": args.contender, "backend": os.environ.get("KERAS_BACKEND")}
    start = time.perf_counter()
    step = (run_hf if args.contender == "hf_peft" else run_ours)(args, report)
    report["load_s"] = time.perf_counter() - start
    report["load_peak_mib"] = status_mib("VmHWM")
    report["rss_loaded_mib"] = status_mib("VmRSS")
    reset_peak()
    losses, times = [], []
    for _ in range(args.steps):
        t = time.perf_counter()
        losses.append(step())
        times.append(time.perf_counter() - t)
    report["train_peak_mib"] = status_mib("VmHWM")
    report["losses"] = losses
    report["step_s"] = times
    Path(args.json).write_text(json.dumps(report, indent=2))


def without_json(argv):
    """`argv` less `--json PATH` / `--json=PATH` (each process writes its own)."""
    out, skip = [], False
    for arg in argv:
        if skip or arg.startswith("--json="):
            skip = False
            continue
        skip = arg == "--json"
        if not skip:
            out.append(arg)
    return out


def main(args):
    sys.path.insert(0, str(Path(__file__).parent))
    from _machine import all_cores, cpu_model, git_revision, load, versions

    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "cpu": cpu_model(),
        "cores": all_cores(),
        "load_start": load(),
        "versions": versions(),
        "git": git_revision(),
        "argv": sys.argv[1:],
    }
    print(f"{meta['date']}  {meta['cpu']} x{meta['cores']}  load {meta['load_start']}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()))
    results = {}
    for name in args.contenders.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "report.json")
            argv = without_json(sys.argv[1:])
            cmd = [sys.executable, __file__, *argv, "--contender", name, "--json", out]
            env = dict(os.environ)
            if args.mmap_threshold:
                env["MALLOC_MMAP_THRESHOLD_"] = str(args.mmap_threshold)
            if name == "hf_peft":
                env["KERAS_BACKEND"] = "torch"
            proc = subprocess.run(cmd, env=env, check=False)
            if proc.returncode or not os.path.exists(out):
                print(f"{name}: process exited {proc.returncode}")
                continue
            results[name] = json.loads(Path(out).read_text())
    print_table(args, results)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"meta": meta, "results": results}, indent=2)
        )


def print_table(args, results):
    base = results.get("ours_float", {}).get("train_peak_mib")
    print(
        f"\n{args.model}, batch {args.batch} x {args.length} tokens, LoRA rank "
        f"{args.rank} on every projection, {args.steps} steps, Keras backend "
        f"{os.environ.get('KERAS_BACKEND')}"
    )
    print(
        "| contender | weights MiB | RSS after imports | load peak | RSS loaded "
        "| training peak | / ours_float | s/step | trainable |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        ratio = f"{r['train_peak_mib'] / base:.2f}" if base else "-"
        steps = r["step_s"][1:] or r["step_s"]
        print(
            f"| {name} | {r['weight_mib']:,.0f} | {r['rss_after_imports_mib']:,.0f} | "
            f"{r['load_peak_mib']:,.0f} | {r['rss_loaded_mib']:,.0f} | "
            f"{r['train_peak_mib']:,.0f} | {ratio} | {sorted(steps)[len(steps) // 2]:.2f} | "
            f"{r['trainable_params']:,} |"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default="smollm2", choices=["smollm2", "llama3.2_1b"]
    )
    parser.add_argument("--contenders", default="ours_float,ours_nf4,hf_peft")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--retain-memory", action="store_true")
    parser.add_argument(
        "--mmap-threshold",
        type=int,
        help="glibc's MALLOC_MMAP_THRESHOLD_ in every contender's process (e.g. "
        "65536: freed buffers of 64 KiB or more go back to the system at once, "
        "so peak RSS follows the memory in use; by default glibc keeps some)",
    )
    parser.add_argument("--json")
    parser.add_argument("--contender", choices=CONTENDERS, help=argparse.SUPPRESS)
    parsed = parser.parse_args()
    contender(parsed) if parsed.contender else main(parsed)
