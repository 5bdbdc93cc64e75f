"""Reading and writing Hugging Face safetensors checkpoints.

Only `safetensors` (plus a small reader for bfloat16, which NumPy lacks)
touches the files; nothing is ever unpickled.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")
# Buffers some checkpoints carry that are not weights.
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq")


def _read_bfloat16(path: Path, name: str) -> np.ndarray:
    """Reads one bfloat16 tensor (which NumPy cannot hold) as float32."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        info = json.loads(f.read(size))[name]
        start, end = info["data_offsets"]
        f.seek(8 + size + start)
        raw = np.frombuffer(f.read(end - start), dtype="<u2")
    return (raw.astype(np.uint32) << 16).view(np.float32).reshape(info["shape"])


class Checkpoint:
    """The tensors of a Hugging Face model directory, read on demand.

    Args:
        directory: holds `model.safetensors`, or `model.safetensors.index.json`
            and the shards it names.

    Raises:
        FileNotFoundError: no safetensors weights (with the fix when only a
            pickled `pytorch_model.bin` is there).
    """

    def __init__(self, directory) -> None:
        self.directory = Path(directory)
        self.files: dict[str, Path] = {}
        single, index = self.directory / SAFETENSORS, self.directory / SAFETENSORS_INDEX
        if single.exists():
            with safe_open(str(single), framework="numpy") as f:
                self.files = dict.fromkeys(f.keys(), single)
        elif index.exists():
            weight_map = json.loads(index.read_text()).get("weight_map", {})
            self.files = {
                name: self.directory / shard for name, shard in weight_map.items()
            }
            missing = sorted(
                {str(p.name) for p in self.files.values() if not p.exists()}
            )
            if missing:
                raise FileNotFoundError(
                    f"{index} names shard(s) {missing} that are missing from {self.directory}. "
                    "Download the complete checkpoint."
                )
        elif any((self.directory / name).exists() for name in PICKLE_FILES):
            raise FileNotFoundError(
                f"{self.directory} only has PyTorch pickle weights (pytorch_model.bin), which "
                "keras_transformers never unpickles. Re-save them as safetensors, e.g. "
                "`AutoModelForCausalLM.from_pretrained(path).save_pretrained(path, "
                "safe_serialization=True)`, or pass `load_weights=False`."
            )
        else:
            raise FileNotFoundError(
                f"{self.directory} has no {SAFETENSORS} or {SAFETENSORS_INDEX}. Add the "
                "safetensors weights, or pass `load_weights=False` for a random init."
            )
        self.used: set[str] = set()

    def __contains__(self, name: str) -> bool:
        return name in self.files

    def prefix(self, candidates: tuple[str, ...], probe: str, model_type: str) -> str:
        """The first of `candidates` under which `probe` is stored."""
        for prefix in candidates:
            if prefix + probe in self.files:
                return prefix
        tried = [prefix + probe for prefix in candidates]
        raise ValueError(
            f"{self.directory} does not look like a {model_type} checkpoint: none of "
            f"{tried} is in its weights. Check `model_type` in config.json."
        )

    def get(self, name: str) -> np.ndarray:
        """The tensor `name` as a NumPy array (bfloat16 is read as float32)."""
        if name not in self.files:
            raise ValueError(
                f"Weight {name!r} is missing from the checkpoint in {self.directory}. "
                "config.json describes a model the weights do not match (e.g. more "
                "layers, or an untied LM head): fix config.json or the overrides."
            )
        self.used.add(name)
        path = self.files[name]
        with safe_open(str(path), framework="numpy") as f:
            if f.get_slice(name).get_dtype() == "BF16":
                return _read_bfloat16(path, name)
            return f.get_tensor(name)

    def warn_unused(self) -> None:
        """Warns about checkpoint tensors that were not loaded."""
        unused = sorted(
            n for n in set(self.files) - self.used if not n.endswith(IGNORED_SUFFIXES)
        )
        if unused:
            more = f" and {len(unused) - 5} more" if len(unused) > 5 else ""
            warnings.warn(
                f"{len(unused)} checkpoint weight(s) were not used: {unused[:5]}{more}.",
                stacklevel=3,
            )


def write_checkpoint(
    directory, hf_config: dict, tensors: dict[str, np.ndarray]
) -> None:
    """Writes `config.json` and `model.safetensors` to `directory`."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(
        json.dumps(hf_config, indent=2, sort_keys=True) + "\n"
    )
    tensors = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()}
    save_file(tensors, str(path / SAFETENSORS), metadata={"format": "pt"})
