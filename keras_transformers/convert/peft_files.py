"""Hugging Face PEFT adapter directories: `adapter_config.json` and
`adapter_model.safetensors`, read and written.

A directory holds one LoRA adapter: its config (`r`, `lora_alpha`,
`use_rslora`, `target_modules`, and `rank_pattern` / `alpha_pattern` for
modules of another rank or alpha) and, for each adapted Linear `module`,
the float factors `base_model.model.{module}.lora_A.weight` `[r, in]` and
`...lora_B.weight` `[out, r]`. A classifier's adapter (`task_type`
`SEQ_CLS`) also holds its trained head whole, as PEFT's `modules_to_save`
writes it: `base_model.model.score.weight` (a decoder's) or
`base_model.model.classifier.weight` and `.bias` (BERT's). An adapter comes from a local directory or
from the Hugging Face hub (`hf://org/name[@revision]`, through its cache).
Nothing is ever unpickled.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np

from keras_transformers import hub
from keras_transformers._atomic import atomic_directory
from keras_transformers._json import read_json_object
from keras_transformers.convert.checkpoint import _File, _tensor_names

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
FACTORS = ("lora_A", "lora_B")
# PEFT's `modules_to_save` of a sequence classifier: its head, trained whole.
HEAD_MODULES = ("classifier", "score")
# The names PEFT (0.22 and later) lists in every classifier's
# `modules_to_save`: a name holds tensors only where the model has that
# module, and DistilBERT's `pre_classifier` is not part of our heads.
LISTED_HEAD_MODULES = (*HEAD_MODULES, "pre_classifier")
SEQ_CLS = "SEQ_CLS"
# PEFT options that change what an adapter computes, and what we say of them.
UNSUPPORTED = {
    "use_dora": "DoRA (weight-decomposed LoRA)",
    "fan_in_fan_out": "fan_in_fan_out (Conv1D layouts such as GPT-2's)",
    "lora_bias": "lora_bias (a bias on lora_B)",
    "trainable_token_indices": "trainable_token_indices",
    "layer_replication": "layer_replication",
    "target_parameters": "target_parameters (LoRA on raw parameters, e.g. MoE experts)",
    "alora_invocation_tokens": "alora_invocation_tokens (activated LoRA)",
    "use_qalora": "use_qalora",
    "use_bdlora": "use_bdlora",
    "megatron_config": "megatron_config",
}


def peft_scale(alpha: float, rank: int, rslora: bool) -> float:
    """PEFT's scale of a rank-`rank` update: `alpha / rank` (rsLoRA:
    `alpha / sqrt(rank)`)."""
    return alpha / (math.sqrt(rank) if rslora else rank)


# ------------------------------------------------------------------ writing
def write(directory, config: dict, tensors: dict) -> None:
    """Writes `config` and `tensors` (PEFT name -> float32 array) as an
    adapter directory, atomically."""
    from safetensors.numpy import save_file

    with atomic_directory(directory, markers=(CONFIG_FILE,)) as path:
        text = json.dumps(config, indent=2, sort_keys=True) + "\n"
        (path / CONFIG_FILE).write_text(text)
        save_file(tensors, str(path / WEIGHTS_FILE), metadata={"format": "pt"})


def lora_config(
    *,
    rank: int,
    alpha: float,
    scale: float,
    rslora: bool,
    ranks: dict,
    task: str,
    linears=(),
) -> dict:
    """A PEFT `LoraConfig` as `adapter_config.json` holds it.

    Args:
        rank: `r`, the rank of most modules.
        alpha: `lora_alpha`.
        scale: every module's scale (`peft_scale(alpha, rank, rslora)`).
        rslora: `use_rslora`.
        ranks: full module name -> rank, for every adapted module (their
            last names, e.g. `q_proj`, are `target_modules`); those of
            another rank than `rank` go to `rank_pattern`, with the alpha
            that gives them `scale` in `alpha_pattern`.
        linears: the full names of the model's Linear modules: a module
            whose last name also names one left out (BERT's `dense`) is a
            target by its full name.
        task: `task_type`: `CAUSAL_LM`, `FEATURE_EXTRACTION` or `SEQ_CLS`
            (then `modules_to_save` is PEFT's default, `HEAD_MODULES`).
    """
    rank_pattern = _patterns(ranks, rank)
    alphas = {
        k: scale * (math.sqrt(r) if rslora else r) for k, r in rank_pattern.items()
    }
    return {
        "peft_type": "LORA",
        "task_type": task,
        "r": rank,
        "lora_alpha": _plain(alpha),
        "target_modules": _targets(ranks, linears),
        "use_rslora": rslora,
        "rank_pattern": rank_pattern,
        "alpha_pattern": {k: _plain(v) for k, v in alphas.items()},
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_dora": False,
        "modules_to_save": list(HEAD_MODULES) if task == SEQ_CLS else None,
        "layers_to_transform": None,
        "layers_pattern": None,
        "init_lora_weights": True,
        "inference_mode": True,
        "base_model_name_or_path": None,
        "revision": None,
    }


def _targets(adapted, linears) -> list[str]:
    """PEFT's `target_modules`: each adapted module's last name, or its
    full name where a Linear left out has that last name too."""
    left_out = {m.rpartition(".")[2] for m in linears if m not in adapted}
    short = {m: m.rpartition(".")[2] for m in adapted}
    return sorted({s if s not in left_out else m for m, s in short.items()})


def _patterns(ranks: dict[str, int], rank: int) -> dict[str, int]:
    """PEFT's `rank_pattern` for module ranks other than `rank`: keyed by
    the module's last name (`q_proj`) where all its modules agree, else by
    full name."""
    by_name: dict[str, set] = {}
    for module, r in ranks.items():
        by_name.setdefault(module.rpartition(".")[2], set()).add(r)
    out = {}
    for module, r in ranks.items():
        short = module.rpartition(".")[2]
        if by_name[short] == {rank}:
            continue
        if len(by_name[short]) == 1:
            out[short] = r
        else:
            out[module] = r
    return out


def _plain(value: float):
    """An integral float as an int (PEFT's `lora_alpha` is typed int)."""
    return int(value) if float(value).is_integer() else float(value)


# ------------------------------------------------------------------ reading
def resolve(handle) -> Path:
    """The local directory of an adapter: `handle` itself, or the snapshot
    of an `hf://org/name[@revision]` handle in the Hugging Face cache
    (offline: the cached snapshot).

    Raises:
        FileNotFoundError: a file of the adapter is missing (or
            `keras_transformers.hub.HubAccessError`: the hub cannot be
            reached and nothing is cached).
    """
    directory = _fetch(handle) if hub.is_hub_handle(handle) else Path(handle)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (directory / name).is_file():
            pickled = (directory / "adapter_model.bin").is_file()
            hint = (
                " It holds only adapter_model.bin (a PyTorch pickle), which is "
                "never unpickled: save the adapter again with `save_pretrained()` "
                "(safetensors)."
                if pickled and name == WEIGHTS_FILE
                else ""
            )
            raise FileNotFoundError(
                f"{handle} is not a PEFT adapter: {name} is missing from "
                f"{directory}.{hint}"
            )
    return directory


def _fetch(handle) -> Path:
    """The snapshot of an adapter repository (`adapter_config.json` and
    `adapter_model.safetensors` only), through `keras_transformers.hub`."""
    import huggingface_hub

    repo_id, revision = hub.parse_handle(handle)
    reason = "HF_HUB_OFFLINE is set"
    if not huggingface_hub.is_offline_mode():
        with hub._translated(handle, repo_id, revision):
            try:
                folder = huggingface_hub.snapshot_download(
                    repo_id,
                    revision=revision,
                    allow_patterns=[CONFIG_FILE, WEIGHTS_FILE],
                )
                return Path(folder)
            except hub._unreachable_errors() as error:
                if hub._is_http_error(error, below=500):
                    raise
                reason = "the hub could not be reached"
    cached = huggingface_hub.try_to_load_from_cache(
        repo_id, CONFIG_FILE, revision=revision
    )
    if not isinstance(cached, str):
        raise hub.HubAccessError(
            f"{handle}: offline ({reason}) and the adapter {repo_id} (revision "
            f"{revision or 'main'}) is not in the hub cache at {hub.cache_dir()}. "
            "Download it once with network access (HF_HUB_OFFLINE unset)."
        )
    return Path(cached).parent


def read_config(directory: Path) -> dict:
    """The adapter's `adapter_config.json`, checked: a LoRA adapter whose
    options we reproduce.

    Raises:
        ValueError: another PEFT method, or an option we lack (named).
    """
    config = read_json_object(
        directory / CONFIG_FILE, "Adapter config", fix="Save the adapter again."
    )
    kind = config.get("peft_type")
    if kind != "LORA":
        raise ValueError(
            f"{directory} holds a {kind} adapter (peft_type={kind!r}); only LoRA "
            "adapters (peft_type 'LORA') load."
        )
    unsupported = [text for key, text in UNSUPPORTED.items() if config.get(key)]
    listed = config.get("modules_to_save") or ()
    extra = [m for m in listed if m not in LISTED_HEAD_MODULES]
    if extra:
        unsupported.append(
            f"modules_to_save {extra} (fully trained modules other than a "
            f"classifier's head, {list(HEAD_MODULES)})"
        )
    if config.get("bias", "none") != "none":
        unsupported.append(f"bias={config['bias']!r} (trained biases)")
    if unsupported:
        raise ValueError(
            f"The LoRA adapter in {directory} uses {', '.join(unsupported)}, which "
            "keras_transformers does not support. Train it without those options."
        )
    return config


def read_factors(directory: Path) -> dict[str, dict[str, np.ndarray]]:
    """The LoRA factors of `read_tensors` (a trained head's tensors left
    out)."""
    return read_tensors(directory)[0]


def read_tensors(directory: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """`(factors, head)`: module name -> `{"lora_A": [r, in], "lora_B":
    [out, r]}`, and the trained head's tensors by name without PEFT's
    prefix (e.g. `score.weight`; empty for an adapter without one), all
    float32.

    Raises:
        ValueError: a tensor that is neither a LoRA factor of a Linear nor
            part of a classifier's head, or a module with one factor only
            (named).
    """
    path = directory / WEIGHTS_FILE
    file, factors, head = _File(path), {}, {}
    heads = "|".join(HEAD_MODULES)
    for name in _tensor_names(path):
        value = np.array(file.tensor(name), dtype=np.float32)
        match = re.fullmatch(r"(?:base_model\.model\.)?(.+)\.(lora_[AB])\.weight", name)
        if match is not None:
            factors.setdefault(match.group(1), {})[match.group(2)] = value
        elif re.fullmatch(rf"(?:base_model\.model\.)?(?:{heads})\..+", name):
            head[name.removeprefix(PEFT_PREFIX)] = value
        elif name.removeprefix(PEFT_PREFIX).split(".")[0] in LISTED_HEAD_MODULES:
            raise ValueError(
                f"Adapter {path} holds {name!r}, a module trained whole beside "
                f"the classifier's head ({' / '.join(HEAD_MODULES)}): not "
                "supported. Train the adapter with modules_to_save naming the "
                "head only."
            )
        else:
            raise ValueError(
                f"Adapter tensor {name!r} in {path} is not a LoRA factor of a "
                "Linear layer (lora_A / lora_B), e.g. of an embedding: not supported."
            )
    file.release()
    for module, pair in factors.items():
        if set(pair) != set(FACTORS):
            raise ValueError(f"Adapter {path} lacks {module}'s lora_A or lora_B.")
    return factors, head


def pattern(patterns: dict | None, module: str, default):
    """PEFT's `rank_pattern` / `alpha_pattern` lookup for `module`: the
    value of the first key that matches its name's end, else `default`."""
    for key, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default
