"""LoRA adapters in Hugging Face PEFT's format, both ways.

`save_adapter(model, directory)` writes PEFT's `adapter_config.json` and
`adapter_model.safetensors`, which `peft.PeftModel.from_pretrained` loads
onto the `transformers` model of the same checkpoint; `load_adapter(model,
directory_or_hf_handle)` reads such an adapter (one that `peft` made, of any
rank, alpha, rsLoRA, rank / alpha patterns, any subset of the projections)
onto our model.

Names. A PEFT tensor is named after the `torch.nn.Linear` it adapts, e.g.
`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`. Which of
our projections that Linear is comes from the converter of the model's
Hugging Face layout (`keras_transformers.convert`): its `export` writes each
kernel under its checkpoint name, and each `Dense` / `EinsumDense` kernel is
found there by value, as the rows of a `[out, in]` weight (a fused weight,
such as Phi-3's `qkv_proj`, holds several of our projections, one after the
other). So every layout a converter exports works, with no per-model code.

Factors. Our kernel `[d_1, ..., d_n]` is the matrix `[in, out]` with
`in = d_1 * ... * d_{n-1}` and `out = d_n`; its Linear weight is the
transpose `[out, in]`. Keras adds `(alpha / rank) * A @ B` with `A
[d_1, ..., d_{n-1}, rank]` and `B [rank, d_n]`; PEFT adds `scale * lora_B @
lora_A` with `lora_A [r, in]`, `lora_B [out, r]` and `scale = lora_alpha / r`
(rsLoRA: `lora_alpha / sqrt(r)`). Hence `lora_A = A.reshape(in, rank).T`,
`lora_B = B.T`, and equal scales. A fused Linear gets a block-diagonal
adapter of rank `k * rank` for its `k` adapted parts (`rank_pattern` and
`alpha_pattern` say so); loading one gives each part the rows of `lora_B`
it owns and the shared `lora_A`.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from pathlib import Path

import numpy as np
from keras import ops

from keras_transformers import hub, lora, registry
from keras_transformers._atomic import atomic_directory
from keras_transformers._json import read_json_object

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
FACTORS = ("lora_A", "lora_B")
# PEFT options that change what an adapter computes, and what we say of them.
UNSUPPORTED = {
    "use_dora": "DoRA (weight-decomposed LoRA)",
    "fan_in_fan_out": "fan_in_fan_out (Conv1D layouts such as GPT-2's)",
    "lora_bias": "lora_bias (a bias on lora_B)",
    "modules_to_save": "modules_to_save (fully trained extra modules)",
    "trainable_token_indices": "trainable_token_indices",
    "layer_replication": "layer_replication",
    "target_parameters": "target_parameters (LoRA on raw parameters, e.g. MoE experts)",
    "alora_invocation_tokens": "alora_invocation_tokens (activated LoRA)",
    "use_qalora": "use_qalora",
    "use_bdlora": "use_bdlora",
    "megatron_config": "megatron_config",
}


# ------------------------------------------------------------------ layout
class Site:
    """One Hugging Face Linear: `module` (its name, e.g.
    `model.layers.0.self_attn.q_proj`), `shape` (`[out, in]`) and `parts`:
    `(layer, start, stop)` for each of our projections whose kernel is rows
    `start:stop` of its weight."""

    def __init__(self, module: str, shape: tuple):
        self.module, self.shape, self.parts = module, shape, []


def _hf_weights(layer):
    """`layer`'s kernel `[d_1, ..., d_n]` (LoRA update included, as `export`
    writes it) as each Linear weight `[out, in]` it can be: `in = d_1 * ...
    * d_k` for `k = n - 1, ..., 1` (the query `[D, N, H]` is `[N * H, D]`)."""
    from keras_transformers.convert.common import fetch

    kernel = layer.kernel
    shape = tuple(int(d) for d in kernel.shape)
    for k in range(len(shape) - 1, 0, -1):
        width = int(np.prod(shape[:k]))
        yield fetch(kernel, shape=(width, -1), transpose=True)


def heads(layer, width: int) -> int:
    """`M`: how many times Keras' LoRA repeats its `B` across the output of
    `layer` whose Linear input is `width` wide. Keras' `A [..., r]` spans
    every kernel axis but the last, so axes between the Linear's input and
    the last (the heads of `[D, N, H]`) index separate `A`s that share `B`:
    the update is `M` blocks, of PEFT rank `M * r`."""
    return int(np.prod(layer.kernel.shape[:-1])) // width


def _row_starts(weight: np.ndarray, rows: np.ndarray) -> list[int]:
    """The offsets at which `rows` (`[n, in]`) are rows of `weight`."""
    n = rows.shape[0]
    starts = np.flatnonzero(weight[: weight.shape[0] - n + 1, 0] == rows[0, 0])
    return [int(s) for s in starts if np.array_equal(weight[s : s + n], rows)]


def _converter(model, model_type: str | None):
    backbone = getattr(model, "backbone", model)
    family = getattr(backbone, "family", None)
    if family not in registry.FAMILIES:
        raise ValueError(
            f"PEFT adapters need a model with a Hugging Face layout. Received: "
            f"{type(model).__name__}."
        )
    if model_type is None:
        return registry.export_converter(family, backbone.config)
    converter = registry.converter(model_type)
    if converter.family != family:
        raise ValueError(
            f"model_type={model_type!r} is not a layout of {type(model).__name__} "
            f"({family} family)."
        )
    return converter


def _names(model, converter) -> dict:
    """The converter's checkpoint names of `model` as PEFT names them: a
    backbone is the Hugging Face base model, without the causal LM's prefix."""
    _, tensors = converter.export(model, converter.model_type)
    if getattr(model, "backbone", None) is None:
        prefix = converter.prefixes[0]
        tensors = {k.removeprefix(prefix): v for k, v in tensors.items()}
    return tensors


def sites(model, converter) -> dict[str, Site]:
    """Module name -> `Site` of every projection of `model` that is (part
    of) a Linear weight in `converter`'s layout.

    Raises:
        ValueError: the layout cannot express the model (`export`'s error).
    """
    tensors = _names(model, converter)
    matrices = {
        k[: -len(".weight")]: v
        for k, v in tensors.items()
        if k.endswith(".weight") and v.ndim == 2
    }
    hits = {
        id(layer): _hits(layer, matrices) for layer in lora.projection_layers(model)
    }
    ambiguous = [
        layer for layer in lora.projection_layers(model) if len(hits[id(layer)]) > 1
    ]
    if ambiguous:  # equal kernels (e.g. a fresh model): tell them apart by a tag
        with _tagged(ambiguous):
            tagged = _names(model, converter)
            for layer in ambiguous:
                hits[id(layer)] = [
                    hit
                    for hit in _hits(layer, matrices, tagged)
                    if hit in hits[id(layer)]
                ]
    found: dict[str, Site] = {}
    for layer in lora.projection_layers(model):
        if len(hits[id(layer)]) != 1:  # absent (a head), or still ambiguous
            continue
        module, start, size = hits[id(layer)][0]
        site = found.setdefault(module, Site(module, matrices[module].shape))
        site.parts.append((layer, start, start + size))
    for site in found.values():
        site.parts.sort(key=lambda part: part[1])
    return found


def _hits(layer, matrices, tensors=None) -> list[tuple]:
    """`(module, first row, rows)` of each place `layer`'s kernel is in
    `matrices` (module -> `[out, in]`; values from `tensors` when given)."""
    return [
        (module, start, rows.shape[0])
        for rows in _hf_weights(layer)  # [out, in]
        for module, weight in matrices.items()
        if weight.shape[1] == rows.shape[1] and weight.shape[0] >= rows.shape[0]
        for start in _row_starts(
            weight if tensors is None else tensors[module + ".weight"], rows
        )
    ]


@contextlib.contextmanager
def _tagged(layers):
    """Adds `i + 1` to the kernel of the `i`-th of `layers` for the block,
    then restores each kernel exactly."""
    saved = [(layer._kernel, ops.convert_to_numpy(layer._kernel)) for layer in layers]
    try:
        for i, (variable, value) in enumerate(saved):
            tag = np.asarray(value, np.float32) + np.float32(i + 1)
            variable.assign(tag.astype(value.dtype))
        yield
    finally:
        for variable, value in saved:
            variable.assign(value)


def _layout_error(model, converter, layers) -> ValueError:
    return ValueError(
        f"Layer(s) {layers} of {type(model).__name__} have no Linear weight of "
        f"their own in the Hugging Face {converter.model_type!r} layout, so a PEFT "
        "adapter cannot name them. Adapt other projections, or pass `model_type=` "
        "for another layout of this model."
    )


# ------------------------------------------------------------------ saving
def save_adapter(model, directory, base_model_name_or_path=None, model_type=None):
    """Writes `model`'s LoRA adapter as a PEFT directory (see the module
    docstring). `model_type` picks the Hugging Face layout to name the
    tensors after (default: the one `export_hf` writes)."""
    state = getattr(model, "_lora_state", None)
    if state is None:
        merged = getattr(model, "_lora_merged", False)
        raise ValueError(
            "`save_adapter()` needs LoRA enabled on this model. "
            + (
                "`merge_lora()` folded the adapter into the weights and removed "
                "it: call `save_adapter()` before `merge_lora()`."
                if merged
                else "Call `enable_lora(rank, target=...)` or `load_adapter()` first."
            )
        )
    if state.head:
        raise ValueError(
            "`save_adapter()` writes LoRA factors only; this model also trains a "
            "new `classifier` head, which PEFT adapters of causal LMs do not hold. "
            "Use `save_lora_weights()` for it."
        )
    converter = _converter(model, model_type)
    layout = sites(model, converter)
    owner = {id(layer): site for site in layout.values() for layer, *_ in site.parts}
    unnamed = [layer.path for layer in state.layers if id(layer) not in owner]
    if unnamed:
        raise _layout_error(model, converter, unnamed)
    peft = getattr(state, "peft", {})
    rslora = bool(peft.get("use_rslora", False))
    scale = state.alpha / state.rank
    adapted = {id(layer) for layer in state.layers}
    tensors, ranks = {}, {}
    for site in layout.values():
        parts = [p for p in site.parts if id(p[0]) in adapted]
        if not parts:
            continue
        a, b = _site_factors(site, parts, state.rank)
        name = PEFT_PREFIX + site.module
        tensors[name + ".lora_A.weight"] = a
        tensors[name + ".lora_B.weight"] = b
        ranks[site.module] = a.shape[0]
    ranks = _patterns(ranks, state.rank)
    alphas = {k: scale * (math.sqrt(r) if rslora else r) for k, r in ranks.items()}
    alpha = peft.get("lora_alpha")
    if alpha is None or not math.isclose(_scale(alpha, state.rank, rslora), scale):
        alpha = scale * (math.sqrt(state.rank) if rslora else state.rank)
    config = _peft_config(model, state, layout, alpha, rslora, ranks, alphas)
    config["base_model_name_or_path"] = base_model_name_or_path or peft.get(
        "base_model_name_or_path"
    )
    _write(directory, config, tensors)


def _site_factors(site: Site, parts, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """`(lora_A [R, in], lora_B [out, R])` of a Linear whose adapted parts
    are `parts`: for each part (`M` blocks, see `heads`) `M * rank` rows of
    `lora_A` and a block-diagonal `lora_B` (rows of other parts stay zero).
    A plain projection has `R = rank` and the factors `A.T`, `B.T`."""
    from keras_transformers.convert.common import fetch

    out, width = site.shape
    blocks = [heads(layer, width) for layer, *_ in parts]
    total = sum(blocks) * rank
    a = np.zeros((total, width), np.float32)
    b = np.zeros((out, total), np.float32)
    col = 0
    for m, (layer, start, stop) in zip(blocks, parts):
        a_imr = fetch(layer.lora_kernel_a).reshape(width, m, rank)
        cols = slice(col, col + m * rank)
        a[cols] = a_imr.transpose(1, 2, 0).reshape(m * rank, width)
        b_ro = fetch(layer.lora_kernel_b)  # [rank, O]; rows (m, o) <- B.T
        b[start:stop, cols] = np.kron(np.eye(m, dtype=np.float32), b_ro.T)
        col += m * rank
    return a, b


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


def _peft_config(model, state, layout, alpha, rslora, ranks, alphas) -> dict:
    adapted = {id(layer) for layer in state.layers}
    modules = sorted(
        {
            site.module.rpartition(".")[2]
            for site in layout.values()
            if any(id(p[0]) in adapted for p in site.parts)
        }
    )
    causal = getattr(model, "backbone", None) is not None
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM" if causal else "FEATURE_EXTRACTION",
        "r": state.rank,
        "lora_alpha": _plain(alpha),
        "target_modules": modules,
        "use_rslora": rslora,
        "rank_pattern": ranks,
        "alpha_pattern": {k: _plain(v) for k, v in alphas.items()},
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_dora": False,
        "modules_to_save": None,
        "layers_to_transform": None,
        "layers_pattern": None,
        "init_lora_weights": True,
        "inference_mode": True,
        "base_model_name_or_path": None,
        "revision": None,
    }


def _write(directory, config: dict, tensors: dict) -> None:
    from safetensors.numpy import save_file

    with atomic_directory(directory, markers=(CONFIG_FILE,)) as path:
        text = json.dumps(config, indent=2, sort_keys=True) + "\n"
        (path / CONFIG_FILE).write_text(text)
        save_file(tensors, str(path / WEIGHTS_FILE), metadata={"format": "pt"})


def _scale(alpha: float, rank: int, rslora: bool) -> float:
    return alpha / (math.sqrt(rank) if rslora else rank)


# ----------------------------------------------------------------- loading
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
    if config.get("bias", "none") != "none":
        unsupported.append(f"bias={config['bias']!r} (trained biases)")
    if unsupported:
        raise ValueError(
            f"The LoRA adapter in {directory} uses {', '.join(unsupported)}, which "
            "keras_transformers does not support. Train it without those options."
        )
    return config


def read_factors(directory: Path) -> dict[str, dict[str, np.ndarray]]:
    """Module name -> `{"lora_A": [r, in], "lora_B": [out, r]}` (float32).

    Raises:
        ValueError: a tensor that is not a LoRA factor of a Linear, or a
            module with one factor only (named).
    """
    from keras_transformers.convert.checkpoint import _File, _tensor_names

    path = directory / WEIGHTS_FILE
    file, factors = _File(path), {}
    for name in _tensor_names(path):
        match = re.fullmatch(r"(?:base_model\.model\.)?(.+)\.(lora_[AB])\.weight", name)
        if match is None:
            raise ValueError(
                f"Adapter tensor {name!r} in {path} is not a LoRA factor of a "
                "Linear layer (lora_A / lora_B), e.g. of an embedding: not supported."
            )
        value = np.array(file.tensor(name), dtype=np.float32)
        factors.setdefault(match.group(1), {})[match.group(2)] = value
    file.release()
    for module, pair in factors.items():
        if set(pair) != set(FACTORS):
            raise ValueError(f"Adapter {path} lacks {module}'s lora_A or lora_B.")
    return factors


def _matching_layout(model, modules) -> dict[str, Site]:
    """The sites of the first layout of the model's family (the default
    export first) that names every module of `modules`."""
    backbone = getattr(model, "backbone", model)
    first = _converter(model, None)
    others = sorted(
        (c for c in registry.converters().values() if c.family == backbone.family),
        key=lambda c: c.export_order,
    )
    best, seen = None, set()
    for converter in [first, *others]:
        if converter.model_type in seen:
            continue
        seen.add(converter.model_type)
        try:
            layout = sites(model, converter)
        except ValueError:  # the layout cannot express this model
            continue
        if all(m in layout for m in modules):
            return layout
        best = best or layout
    missing = sorted({m.rpartition(".")[2] for m in modules if m not in (best or {})})
    have = sorted({m.rpartition(".")[2] for m in best or {}})
    raise ValueError(
        f"The adapter adapts module(s) {missing}, which {type(model).__name__} has "
        f"no LoRA place for (its Linear layers are {have})."
    )


def _pattern(patterns: dict, module: str, default):
    """PEFT's `rank_pattern` / `alpha_pattern` lookup for `module`."""
    for key, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def load_adapter(model, handle) -> None:
    """Loads a PEFT LoRA adapter (directory or `hf://` handle) onto `model`,
    enabling LoRA first where needed (see the module docstring)."""
    directory = resolve(handle)
    config = read_config(directory)
    factors = read_factors(directory)
    layout = _matching_layout(model, factors)
    rslora = bool(config.get("use_rslora", False))
    alpha, rank = float(config.get("lora_alpha", 8)), int(config.get("r", 8))
    plan = []  # (site, lora_A [r, in], lora_B [out, r], PEFT scale)
    for module, pair in factors.items():
        site, a, b = layout[module], pair["lora_A"], pair["lora_B"]
        name = PEFT_PREFIX + module
        r = a.shape[0]
        if a.ndim != 2 or b.ndim != 2 or b.shape[1] != r:
            raise ValueError(
                f"Adapter tensors {name}.lora_A / lora_B have shapes "
                f"{list(a.shape)} / {list(b.shape)}: not a LoRA pair [r, in], [out, r]."
            )
        for factor, size, axis, what in ((a, 1, 1, "in"), (b, 0, 0, "out")):
            if factor.shape[axis] != site.shape[size]:
                kind = "lora_A" if factor is a else "lora_B"
                raise ValueError(
                    f"Adapter tensor {name}.{kind}.weight has shape "
                    f"{list(factor.shape)}, but this model's {module} is "
                    f"[out, in] = {list(site.shape)} ({what} differs): the adapter "
                    "was trained on another model."
                )
        peft_alpha = float(_pattern(config.get("alpha_pattern"), module, alpha))
        plan.append((site, a, b, _scale(peft_alpha, r, rslora)))
    # Our alpha: PEFT's scale times our rank (its own alpha where that is exact).
    ours = max(rank, _needed(plan))
    scale = _scale(alpha, rank, rslora)
    state = _enabled(
        model, plan, ours, alpha if ours == rank and not rslora else scale * ours
    )
    for layer in state.layers:  # layers the adapter leaves out: no update
        layer.lora_kernel_b.assign(np.zeros(layer.lora_kernel_b.shape, np.float32))
    for site, a, b, scale in plan:
        for layer, start, stop in site.parts:
            _assign(
                layer, a, b[start:stop], scale / (layer.lora_alpha / layer.lora_rank)
            )
    state.peft = {
        "use_rslora": rslora,
        "lora_alpha": alpha if state.rank == rank else None,
        "base_model_name_or_path": config.get("base_model_name_or_path"),
    }


def _enabled(model, plan, rank: int, alpha: float):
    """The model's LoRA state, after `enable_lora(rank, alpha=alpha)` on the
    adapted projections when LoRA is off."""
    layers = [layer for site, *_ in plan for layer, *_ in site.parts]
    needed = _needed(plan)
    state = getattr(model, "_lora_state", None)
    if state is None:
        targets = sorted({layer.name for layer in layers})
        lora.enable_lora(model, rank, targets, alpha)
        return model._lora_state
    chosen = {id(layer) for layer in state.layers}
    absent = sorted({layer.name for layer in layers if id(layer) not in chosen})
    if absent or state.rank < needed:
        raise ValueError(
            f"LoRA is already enabled on this model (rank={state.rank}, target="
            f"{state.target}), but the adapter needs rank >= {needed} on "
            f"{sorted({layer.name for layer in layers})}. Load it onto a model "
            "without LoRA (or call `merge_lora()` first)."
        )
    return state


def _rank_for(layer, width: int, r: int) -> int:
    """Our rank that holds a PEFT rank-`r` update of `layer` (Linear input
    `width`): `M * r` for `M` blocks (see `heads`), at most the output width
    `O` (then `B` is the identity and `A` the update itself)."""
    return min(heads(layer, width) * r, int(layer.kernel.shape[-1]))


def _needed(plan) -> int:
    return max(
        _rank_for(layer, site.shape[1], a.shape[0])
        for site, a, _, _ in plan
        for layer, *_ in site.parts
    )


def _assign(layer, a: np.ndarray, b: np.ndarray, ratio: float) -> None:
    """Writes PEFT factors `a [r, in]` and `b [M * O, r]` (this layer's rows,
    times `ratio`: PEFT's scale over ours) into `layer`'s `A [..., rank]`
    (`[in, M, rank]` as a matrix per block) and `B [rank, O]`: block `m`
    gets `a.T` in columns `m * r:(m + 1) * r` of `A` and `B` those rows of
    `b`'s block `m`, transposed; zero elsewhere. When `M * r > O`, `B` is the
    identity and `A` block `m` the update `a.T @ b_m.T` itself."""
    r, rank, width = a.shape[0], layer.lora_rank, a.shape[1]
    m = heads(layer, width)
    out = int(layer.kernel.shape[-1])
    b_mor = b.reshape(m, out, r) * np.float32(ratio)
    a_ours = np.zeros((width, m, rank), np.float32)
    b_ours = np.zeros((rank, out), np.float32)
    if m * r <= rank:
        for i in range(m):
            a_ours[:, i, i * r : (i + 1) * r] = a.T
            b_ours[i * r : (i + 1) * r] = b_mor[i].T
    else:
        for i in range(m):
            a_ours[:, i, :out] = a.T @ b_mor[i].T
        b_ours[:out] = np.eye(out, dtype=np.float32)
    layer.lora_kernel_a.assign(a_ours.reshape(layer.lora_kernel_a.shape))
    layer.lora_kernel_b.assign(b_ours)
