"""LoRA adapters in Hugging Face PEFT's format, both ways.

`save_adapter(model, directory)` writes PEFT's `adapter_config.json` and
`adapter_model.safetensors`, which `peft.PeftModel.from_pretrained` loads
onto the `transformers` model of the same checkpoint; `load_adapter(model,
directory_or_hf_handle)` reads such an adapter (one that `peft` made, of any
rank, alpha, rsLoRA, rank / alpha patterns, any subset of the projections)
onto our model. A sequence classifier's adapter (`GPTClassifier`,
`BertClassifier`) is PEFT's `task_type` `SEQ_CLS`: the LoRA factors plus
the trained head, whole (`modules_to_save`), as `PeftModel` loads onto the
`transformers` `*ForSequenceClassification` of the base checkpoint.

Names. A PEFT tensor is named after the `torch.nn.Linear` it adapts; which
of our projections that Linear is comes from the converter of the model's
Hugging Face layout (`keras_transformers.convert.peft_layout`). The files
themselves are read and written by `keras_transformers.convert.peft_files`,
and a classifier's head by `keras_transformers.convert.peft_heads`.

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

import math

import numpy as np

from keras_transformers import lora
from keras_transformers.convert.common import fetch
from keras_transformers.convert.peft_files import (
    CONFIG_FILE,
    PEFT_PREFIX,
    SEQ_CLS,
    WEIGHTS_FILE,
    lora_config,
    pattern,
    peft_scale,
    read_config,
    read_factors,
    read_tensors,
    resolve,
    write,
)
from keras_transformers.convert.peft_heads import (
    assign_head,
    check_head,
    head_tensors,
    task_head,
)
from keras_transformers.convert.peft_layout import (
    Site,
    converter_for,
    exported,
    heads,
    layout_error,
    matching_layout,
    sites,
)

__all__ = [
    "CONFIG_FILE",
    "WEIGHTS_FILE",
    "Site",
    "heads",
    "load_adapter",
    "read_config",
    "read_factors",
    "read_tensors",
    "resolve",
    "save_adapter",
    "sites",
]


# ------------------------------------------------------------------ saving
def save_adapter(model, directory, base_model_name_or_path=None, model_type=None):
    """Writes `model`'s LoRA adapter as a PEFT directory (see the module
    docstring), with a classifier's trained head. `model_type` picks the
    Hugging Face layout to name the tensors after (default: the one
    `export_hf` writes)."""
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
    converter = converter_for(model, model_type)
    exported_tensors = exported(model, converter)
    layout = sites(model, converter, exported_tensors)
    owner = {id(layer): site for site in layout.values() for layer, *_ in site.parts}
    unnamed = [layer.path for layer in state.layers if id(layer) not in owner]
    if unnamed:
        raise layout_error(model, converter, unnamed)
    peft = getattr(state, "peft", {})
    rslora = bool(peft.get("use_rslora", False))
    scale = state.alpha / state.rank
    adapted = {id(layer) for layer in state.layers}
    task = "CAUSAL_LM" if getattr(model, "backbone", None) is not None else None
    tensors, ranks = {}, {}
    if task_head(model) is not None:  # a classifier: its head, whole
        head = head_tensors(model, exported_tensors)
        tensors.update({PEFT_PREFIX + k: v for k, v in head.items()})
        task = SEQ_CLS
    for site in layout.values():
        parts = [p for p in site.parts if id(p[0]) in adapted]
        if not parts:
            continue
        a, b = _site_factors(site, parts, state.rank)
        name = PEFT_PREFIX + site.module
        tensors[name + ".lora_A.weight"] = a
        tensors[name + ".lora_B.weight"] = b
        ranks[site.module] = a.shape[0]
    alpha = peft.get("lora_alpha")
    if alpha is None or not math.isclose(peft_scale(alpha, state.rank, rslora), scale):
        alpha = scale * (math.sqrt(state.rank) if rslora else state.rank)
    config = lora_config(
        rank=state.rank,
        alpha=alpha,
        scale=scale,
        rslora=rslora,
        ranks=ranks,
        task=task or "FEATURE_EXTRACTION",
        linears=layout,
    )
    config["base_model_name_or_path"] = base_model_name_or_path or peft.get(
        "base_model_name_or_path"
    )
    write(directory, config, tensors)


def _site_factors(site: Site, parts, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """`(lora_A [R, in], lora_B [out, R])` of a Linear whose adapted parts
    are `parts`: for each part (`M` blocks, see `heads`) `M * rank` rows of
    `lora_A` and a block-diagonal `lora_B` (rows of other parts stay zero).
    A plain projection has `R = rank` and the factors `A.T`, `B.T`."""
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


# ----------------------------------------------------------------- loading
def load_adapter(model, handle) -> None:
    """Loads a PEFT LoRA adapter (directory or `hf://` handle) onto `model`,
    enabling LoRA first where needed (see the module docstring); a
    classifier's adapter also sets its head."""
    directory = resolve(handle)
    config = read_config(directory)
    factors, head = read_tensors(directory)
    check_head(model, config.get("task_type"), head, directory)
    layout = matching_layout(model, factors)
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
        peft_alpha = float(pattern(config.get("alpha_pattern"), module, alpha))
        plan.append((site, a, b, peft_scale(peft_alpha, r, rslora)))
    # Our alpha: PEFT's scale times our rank (its own alpha where that is exact).
    ours = max(rank, _needed(plan))
    scale = peft_scale(alpha, rank, rslora)
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
    if head:
        assign_head(model, head)
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
