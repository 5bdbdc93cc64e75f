"""Where a model's LoRA projections sit in a Hugging Face layout.

A PEFT tensor is named after the `torch.nn.Linear` it adapts, e.g.
`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`. Which of
our projections that Linear is comes from the converter of the model's
Hugging Face layout (`keras_transformers.convert`): its `export` writes each
kernel under its checkpoint name, and each `Dense` / `EinsumDense` kernel is
found there by value, as the rows of a `[out, in]` weight (a fused weight,
such as Phi-3's `qkv_proj`, holds several of our projections, one after the
other). So every layout a converter exports works, with no per-model code.
A classifier's trained head: `keras_transformers.convert.peft_heads`.
"""

from __future__ import annotations

import contextlib

import numpy as np
from keras import ops

from keras_transformers import lora, registry
from keras_transformers.convert.common import fetch


class Site:
    """One Hugging Face Linear: `module` (its name, e.g.
    `model.layers.0.self_attn.q_proj`), `shape` (`[out, in]`) and `parts`:
    `(layer, start, stop)` for each of our projections whose kernel is rows
    `start:stop` of its weight."""

    def __init__(self, module: str, shape: tuple):
        self.module, self.shape, self.parts = module, shape, []


def heads(layer, width: int) -> int:
    """`M`: how many times Keras' LoRA repeats its `B` across the output of
    `layer` whose Linear input is `width` wide. Keras' `A [..., r]` spans
    every kernel axis but the last, so axes between the Linear's input and
    the last (the heads of `[D, N, H]`) index separate `A`s that share `B`:
    the update is `M` blocks, of PEFT rank `M * r`."""
    return int(np.prod(layer.kernel.shape[:-1])) // width


def converter_for(model, model_type: str | None):
    """The converter of `model_type` (default: the layout `export_hf`
    writes for `model`).

    Raises:
        ValueError: `model` has no Hugging Face layout, or `model_type` is
            not a layout of its family.
    """
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


def sites(model, converter, tensors=None) -> dict[str, Site]:
    """Module name -> `Site` of every projection of `model` that is (part
    of) a Linear weight in `converter`'s layout (`tensors`: the model's
    `exported` tensors, when already at hand).

    Raises:
        ValueError: the layout cannot express the model (`export`'s error).
    """
    tensors = exported(model, converter) if tensors is None else tensors
    matrices = {
        k[: -len(".weight")]: v
        for k, v in tensors.items()
        if k.endswith(".weight") and v.ndim == 2
    }
    layers = lora.projection_layers(model)
    hits = {id(layer): _hits(layer, matrices) for layer in layers}
    ambiguous = [layer for layer in layers if len(hits[id(layer)]) > 1]
    if ambiguous:  # equal kernels (e.g. a fresh model): tell them apart by a tag
        with _tagged(ambiguous):
            tagged = exported(model, converter)
            for layer in ambiguous:
                hits[id(layer)] = [
                    hit
                    for hit in _hits(layer, matrices, tagged)
                    if hit in hits[id(layer)]
                ]
    found: dict[str, Site] = {}
    for layer in layers:
        if len(hits[id(layer)]) != 1:  # absent (a head), or still ambiguous
            continue
        module, start, size = hits[id(layer)][0]
        site = found.setdefault(module, Site(module, matrices[module].shape))
        site.parts.append((layer, start, start + size))
    for site in found.values():
        site.parts.sort(key=lambda part: part[1])
    return found


def matching_layout(model, modules) -> dict[str, Site]:
    """The sites of the first layout of the model's family (the default
    export first) that names every module of `modules`.

    Raises:
        ValueError: no layout names them all (the modules missing named).
    """
    backbone = getattr(model, "backbone", model)
    first = converter_for(model, None)
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


def layout_error(model, converter, layers) -> ValueError:
    """The error for projections `layers` (paths) that no Linear of
    `converter`'s layout holds on its own."""
    return ValueError(
        f"Layer(s) {layers} of {type(model).__name__} have no Linear weight of "
        f"their own in the Hugging Face {converter.model_type!r} layout, so a PEFT "
        "adapter cannot name them. Adapt other projections, or pass `model_type=` "
        "for another layout of this model."
    )


def exported(model, converter) -> dict:
    """The converter's checkpoint names of `model` as PEFT names them: a
    backbone is the Hugging Face base model, without the causal LM's prefix."""
    _, tensors = converter.export(model, converter.model_type)
    if getattr(model, "backbone", None) is None:
        prefix = converter.prefixes[0]
        tensors = {k.removeprefix(prefix): v for k, v in tensors.items()}
    return tensors


def _hf_weights(layer):
    """`layer`'s kernel `[d_1, ..., d_n]` (LoRA update included, as `export`
    writes it) as each Linear weight `[out, in]` it can be: `in = d_1 * ...
    * d_k` for `k = n - 1, ..., 1` (the query `[D, N, H]` is `[N * H, D]`)."""
    kernel = layer.kernel
    shape = tuple(int(d) for d in kernel.shape)
    for k in range(len(shape) - 1, 0, -1):
        width = int(np.prod(shape[:k]))
        yield fetch(kernel, shape=(width, -1), transpose=True)


def _row_starts(weight: np.ndarray, rows: np.ndarray) -> list[int]:
    """The offsets at which `rows` (`[n, in]`) are rows of `weight`
    (`[out, in]`)."""
    n = rows.shape[0]
    starts = np.flatnonzero(weight[: weight.shape[0] - n + 1, 0] == rows[0, 0])
    return [int(s) for s in starts if np.array_equal(weight[s : s + n], rows)]


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
