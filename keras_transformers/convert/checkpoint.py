"""Reading and writing Hugging Face safetensors checkpoints.

Each safetensors file is memory-mapped once and its tensors are NumPy
views of the mapping (no copy; bfloat16 as `ml_dtypes.bfloat16`): the only
copy of a weight is the one into its variable, and on PyTorch, whose
variables may share the mapping, none (the file is then mapped
copy-on-write: the views are writable, the file never changes). Nothing is
ever unpickled.
"""

from __future__ import annotations

import json
import mmap
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from keras_transformers.backend.loading import shares_file

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")
# Buffers some checkpoints carry that are not weights (GPT-2's and
# GPT-NeoX's causal masks, rotary frequencies).
IGNORED_SUFFIXES = (
    ".attn.bias",
    ".attn.masked_bias",
    ".attention.bias",
    ".attention.masked_bias",
    "rotary_emb.inv_freq",
)
DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


def _tensor_names(path: Path) -> list[str]:
    """The tensor names of safetensors file `path`, whose header and size
    `safetensors` validates.

    Raises:
        ValueError: the file is truncated or not a safetensors file.
    """
    try:
        with safe_open(str(path), framework="numpy") as f:
            return list(f.keys())
    except SafetensorError as error:
        raise ValueError(
            f"{path} is not a valid safetensors file ({error}; {path.stat().st_size} "
            "bytes): it is truncated or corrupt, e.g. by an interrupted download. "
            "Download or save it again."
        ) from None


def _read_index(index: Path) -> dict[str, str]:
    """The `weight_map` (tensor name -> shard file name) of an index file.

    Raises:
        ValueError: the file is not JSON with a `weight_map` of file names.
    """
    try:
        weight_map = json.loads(index.read_text()).get("weight_map")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as error:
        weight_map, detail = None, f" ({error})"
    else:
        detail = ""
    valid = isinstance(weight_map, dict) and weight_map
    if not valid or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError(
            f"{index} is not a valid safetensors index{detail}: it needs a JSON "
            '"weight_map" from tensor names to shard files. Download it again.'
        )
    return weight_map


class _File:
    """One memory-mapped safetensors file: its header, and its tensors as
    views of the mapping (read-only, or copy-on-write where variables may
    keep them: `backend.loading.shares_file`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        access = mmap.ACCESS_COPY if shares_file() else mmap.ACCESS_READ
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
            self.map = mmap.mmap(f.fileno(), 0, access=access)
        header.pop("__metadata__", None)
        self.start, self.header, self.touched = 8 + size, header, False

    def tensor(self, name: str) -> np.ndarray:
        info = self.header[name]
        dtype = np.dtype(DTYPES.get(info["dtype"], np.uint8))
        begin, end = (self.start + int(x) for x in info["data_offsets"])
        count = int(np.prod(info["shape"], dtype=np.int64))
        if info["dtype"] not in DTYPES or end - begin != count * dtype.itemsize:
            raise ValueError(
                f"Tensor {name!r} in {self.path} has dtype {info['dtype']} and shape "
                f"{info['shape']}, which do not fit its {end - begin} bytes "
                f"(supported dtypes: {sorted(DTYPES)})."
            )
        self.touched = True
        array = np.frombuffer(self.map, dtype, count, begin)
        return array.reshape(info["shape"])

    def release(self) -> None:
        """Unmaps the pages read so far from this process (they stay in the
        page cache; a view still in use faults them back in): a loaded
        checkpoint then never counts twice, as file pages and variables."""
        if self.touched and hasattr(self.map, "madvise"):
            self.map.madvise(mmap.MADV_DONTNEED)
        self.touched = False


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
            self.source = single
            self.files = dict.fromkeys(_tensor_names(single), single)
        elif index.exists():
            self.source = index
            self.files = {
                name: self.directory / shard
                for name, shard in _read_index(index).items()
            }
            self._check_shards(index)
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
        self.reading: str | None = None  # the tensor `get` returned last
        self._open: dict[Path, _File] = {}

    def _check_shards(self, index: Path) -> None:
        """Every shard the index names exists, is a valid safetensors file
        and holds the tensors the index puts there."""
        shards = sorted(set(self.files.values()))
        missing = [p.name for p in shards if not p.is_file()]
        if missing:
            raise FileNotFoundError(
                f"{index} names shard(s) {missing} that are missing from "
                f"{self.directory}. Download the complete checkpoint."
            )
        for shard in shards:
            stored = set(_tensor_names(shard))
            absent = sorted(
                n for n, p in self.files.items() if p == shard and n not in stored
            )
            if absent:
                raise ValueError(
                    f"{index} puts tensor(s) {absent[:5]} in {shard}, which does not "
                    "hold them: the index and the shards come from different saves. "
                    "Download the checkpoint again."
                )

    def where(self, name: str) -> Path | None:
        """The file that holds tensor `name` (None: not in the checkpoint)."""
        return self.files.get(name)

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
            f"{tried} is in {self.source.name} (it holds e.g. {sorted(self.files)[:3]}). "
            "config.json's `model_type` disagrees with the weights: fix config.json."
        )

    def get(self, name: str) -> np.ndarray:
        """The tensor `name`: a view of the memory-mapped file, in its stored
        dtype (bfloat16 as `ml_dtypes.bfloat16`), writable only the first
        time it is returned and only where the file is mapped copy-on-write.
        The pages of the tensors returned before are unmapped first (see
        `_File.release`)."""
        if name not in self.files:
            raise ValueError(
                f"Weight {name!r} is missing from {self.source}. config.json describes a model the weights do not match (e.g. more "
                "layers, or an untied LM head): fix config.json or the overrides."
            )
        again = name in self.used
        self.used.add(name)
        self.reading = name
        path = self.files[name]
        for file in self._open.values():
            file.release()
        if path not in self._open:
            self._open[path] = _File(path)
        array = self._open[path].tensor(name)
        if again:  # one variable at most may share a tensor's memory (tied weights)
            array.flags.writeable = False
        return array

    def located(self, error: ValueError) -> ValueError:
        """`error` (raised while loading) with the file of the tensor read
        last added, when the message does not name a file yet."""
        path = self.where(self.reading) if self.reading else None
        if path is None or str(self.directory) in str(error):
            return error
        return ValueError(f"{error} (Tensor {self.reading!r} is stored in {path}.)")

    def close(self) -> None:
        """Releases the mapped files (views already handed out stay valid)."""
        for file in self._open.values():
            file.release()
        self._open = {}

    def warn_unused(self) -> None:
        """Warns about checkpoint tensors that were not loaded."""
        unused = sorted(
            n for n in set(self.files) - self.used if not n.endswith(IGNORED_SUFFIXES)
        )
        if unused:
            shown = 20
            more = f" and {len(unused) - shown} more" if len(unused) > shown else ""
            files = sorted({self.files[n].name for n in unused})
            warnings.warn(
                f"{len(unused)} tensor(s) of {files} in {self.directory} were not "
                f"used (the model has no place for them): {unused[:shown]}{more}.",
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
