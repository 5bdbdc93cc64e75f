"""What a benchmark run records about its machine: the cores, threads per
library, load average, accelerator, library versions, CPU model and git
revision (`run_meta`, printed by `print_meta` and written to the JSON file).
Shared by the benchmark scripts; not a benchmark itself."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import subprocess
import sys


def all_cores() -> int:
    """The cores this process may run on (every contender gets all of them)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def versions():
    out = {"python": platform.python_version()}
    for name in (
        "keras",
        "keras-hub",
        "jax",
        "tensorflow",
        "torch",
        "transformers",
        "numpy",
    ):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def cpu_model():
    try:
        text = subprocess.run(
            ["lscpu"], capture_output=True, text=True, check=False
        ).stdout
        for line in text.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_revision():
    """`HEAD` of the repository, with "+dirty" when library files are modified."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*args):
        return subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, check=False
        ).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--", "keras_transformers")
    except OSError:
        return None
    return (head + ("+dirty" if dirty else "")) or None


def load():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def run_meta(backend, torch, sizes, args, argv=None):
    """The facts printed at start-up and written to the JSON file."""
    return {
        "date": datetime.date.today().isoformat(),
        "backend": backend,
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "accelerator": accelerator(backend, torch),
        "torch_threads": torch.get_num_threads() if torch is not None else None,
        "threads": threads(torch),
        "versions": versions(),
        "git": git_revision(),
        "load_start": load(),
        "sizes": sizes,
        "repeats": args.repeats,
        "steps": args.steps,
        "keras_optimizer": "keras.optimizers.AdamW"
        if args.keras_adamw
        else "keras_transformers.training.AdamW",
        "hf_optimizer": "torch.optim.AdamW(fused=True)"
        if args.hf_fused_adamw
        else "torch.optim.AdamW",
        "keras_loss": "keras.losses.SparseCategoricalCrossentropy"
        if args.keras_loss
        else "keras_transformers.training.MaskedSparseCategoricalCrossentropy",
        "argv": sys.argv[1:] if argv is None else list(argv),
    }


def threads(torch):
    """Threads each library computes with. JAX (XLA:CPU) and TensorFlow use
    every core unless told otherwise (TensorFlow's 0 means "all");
    PyTorch's count is set by `--torch-threads`."""
    out = {"cores": all_cores(), "jax": "all cores (XLA:CPU default)"}
    tf = sys.modules.get("tensorflow")  # only where something imported it
    if tf is not None:
        intra = tf.config.threading.get_intra_op_parallelism_threads()
        out["tensorflow"] = intra or "all cores"
    if torch is not None:
        out["torch"] = torch.get_num_threads()
    return out


def accelerator(backend, torch):
    """The GPU the Keras backend computes on (e.g. "NVIDIA H100 80GB HBM3"),
    or None on a CPU-only run. Hugging Face contenders run on the same
    device (`bench.py`: `_contenders.HF`)."""
    if backend == "jax":
        import jax

        device = jax.devices()[0]
        return None if device.platform == "cpu" else device.device_kind
    if backend == "tensorflow":
        import tensorflow as tf

        gpus = tf.config.list_logical_devices("GPU")
        return gpus[0].name if gpus else None
    if torch is not None and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return None


def print_meta(meta):
    print(
        f"backend={meta['backend']}  cpu={meta['cpu']} x{meta['cpu_count']}  "
        f"threads={meta['threads']}  "
        f"accelerator={meta['accelerator'] or 'none (CPU)'}"
    )
    print("versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()))
    print(f"git: {meta['git']}")
    print(f"load average at start: {meta['load_start']}")
    print(f"sizes: {meta['sizes']}  repeats={meta['repeats']} steps={meta['steps']}")
