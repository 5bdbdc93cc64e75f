"""LoRA adapters for `ConfiguredModel`s, on float or quantized weights.

LoRA (Hu et al., 2021, https://arxiv.org/abs/2106.09685) uses the
`enable_lora` of Keras' `Dense` and `EinsumDense`: a targeted layer's kernel
`W` becomes `W + (alpha / rank) * A @ B` with trainable float32 `A` (Keras'
He-uniform init) and `B` (zeros, so a fresh adapter changes nothing). For an
`EinsumDense` kernel `[d_1, ..., d_n]`, `A` is `[d_1, ..., d_{n-1}, rank]` and
`B` is `[rank, d_n]` (Keras' and KerasHub's layout): the query projection
`[D, N, H]` gets `A [D, N, r]` and `B [r, H]`, the attention output
`[N, H, D]` gets `A [N, H, r]` and `B [r, D]`.

Trainability after `enable_lora`: only the LoRA kernels, plus a task model's
fresh classification head (`classifier` of `BertClassifier`,
`BertTokenClassifier`, `ViTClassifier`; `score` of `GPTClassifier`),
following the `modules_to_save` convention of Hugging Face PEFT. Everything else, biases, norms, embeddings
and LM / masked-LM heads included, is frozen. `save_lora_weights` writes
those trainable weights (and nothing else) to an `.npz` file (no pickle).

`save_to_preset` / `save_weights` of a LoRA model write merged kernels
(Keras merges on save), so the preset loads as a plain model with the same
outputs; keep the adapter apart with `save_lora_weights`.

QLoRA: on a quantized model (`quantize("int8" | "int4" | "nf4")`, see
`keras_transformers.quantization`), `enable_lora` adds the same float32
adapters beside the frozen quantized kernels; the layer computes
`x @ dequantized(W) + (alpha / rank) * (x @ A) @ B`. `merge_lora` needs
float kernels (merging into 4-bit weights would re-quantize them): merge
an adapter into the float model, then quantize.
"""

from __future__ import annotations

import contextlib
import gc

import keras
import numpy as np
from keras import ops

from keras_transformers._atomic import atomic_file

PROJECTIONS = (keras.layers.Dense, keras.layers.EinsumDense)
HEADS = ("classifier", "score")  # a task model's fresh head: stays trainable
FORMAT = "keras_transformers.lora/1"


class LoraState:
    """What `enable_lora` did: its arguments, the layers it changed, the
    variables it froze (thawed again by `merge_lora`) and the head weights
    left trainable."""

    def __init__(self, rank, alpha, target, layers, frozen, head):
        self.rank, self.alpha, self.target = rank, alpha, target
        self.layers, self.frozen, self.head = layers, frozen, head


def projection_layers(model):
    """The `Dense` / `EinsumDense` layers of `model`, in a fixed order."""
    return [
        layer
        for layer in model._flatten_layers(include_self=False)
        if isinstance(layer, PROJECTIONS)
    ]


def kernel_shape(layer) -> tuple:
    """The float shape of a projection's kernel, quantized (packed) or not."""
    shape = getattr(layer, "kernel_shape", None)  # layers.core's projections
    return tuple(shape) if shape is not None else tuple(layer.kernel.shape)


def _check_rank_alpha(rank, alpha):
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(
            f"`rank` must be a positive integer (e.g. 8). Received: rank={rank!r}"
        )
    if alpha is not None and (
        isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha <= 0
    ):
        raise ValueError(
            f"`alpha` must be a positive number or None (= rank). Received: alpha={alpha!r}"
        )


def enable_lora(model, rank, target=("query", "value"), alpha=None):
    """Adds rank-`rank` LoRA adapters to the projections named in `target`
    and freezes every other weight (see the module docstring)."""
    _check_rank_alpha(rank, alpha)
    if getattr(model, "_lora_state", None) is not None:
        raise ValueError(
            f"LoRA is already enabled on this model (rank={model._lora_state.rank}). "
            "Call `merge_lora()` first to fold it in, then enable a new adapter."
        )
    targets = (target,) if isinstance(target, str) else tuple(target)
    layers = projection_layers(model)
    available = sorted({layer.name for layer in layers})
    unknown = [name for name in targets if name not in available]
    if not targets or unknown:
        raise ValueError(
            f"Unknown LoRA target(s) {unknown or list(targets)}. This model's "
            f"projection layers are {available}; pass `target=` some of those names, "
            "e.g. target=('query', 'value')."
        )
    chosen = [layer for layer in layers if layer.name in targets]
    for layer in chosen:
        shape = kernel_shape(layer)
        limit = min(int(np.prod(shape[:-1])), shape[-1])
        if rank > limit:
            raise ValueError(
                f"`rank`={rank} is larger than layer {layer.name!r} can use: its "
                f"kernel {shape} factors as [{int(np.prod(shape[:-1]))}, {shape[-1]}]"
                f" (A [..., rank] @ B [rank, {shape[-1]}]). Use rank <= {limit}."
            )
    heads = [getattr(model, name, None) for name in HEADS]
    head = next((h for h in heads if isinstance(h, keras.Layer)), None)
    head_vars = list(head.trainable_weights) if head is not None else []
    keep = {id(v) for v in head_vars}
    frozen = [v for v in model.trainable_weights if id(v) not in keep]
    for variable in frozen:
        variable.trainable = False
    for layer in chosen:
        layer.enable_lora(rank, lora_alpha=alpha)
    model._lora_state = LoraState(
        rank, alpha if alpha is not None else rank, targets, chosen, frozen, head_vars
    )
    reset_compiled(model)


def reset_compiled(model):
    """Drops functions compiled for the old set of variables (fit / predict
    and `generate`); call `compile()` again before `fit()`."""
    model.train_function = model.test_function = model.predict_function = None
    model.__dict__.pop("_generate_functions", None)


def _state(model, action) -> LoraState:
    state = getattr(model, "_lora_state", None)
    if state is None:
        raise ValueError(
            f"`{action}` needs LoRA enabled on this model. Call "
            "`enable_lora(rank, target=...)` first."
        )
    return state


@contextlib.contextmanager
def few_collections():
    """Keras runs `gc.collect()` for every variable a layer deletes (about
    0.5 s each with JAX, TensorFlow and PyTorch loaded: minutes for a 7B
    model); freezing the existing heap makes those collections cheap. One
    full collection runs at the end."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.collect()


def merge_lora(model):
    """Folds `W + (alpha / rank) * A @ B` into each kernel, removes the LoRA
    weights and makes the frozen weights trainable again: a plain model."""
    state = _state(model, "merge_lora()")
    quantized = [layer for layer in state.layers if layer.quantization_mode]
    if quantized:
        raise ValueError(
            f"`merge_lora()` needs float kernels; {quantized[0].name!r} and others "
            f"are quantized ({quantized[0].quantization_mode}): merging would re-quantize "
            "them. Save the adapter (`save_adapter` / `save_lora_weights`), load "
            "it onto the float model, merge there, then quantize."
        )
    with few_collections():
        _merge(state)
    for variable in state.frozen:
        variable.trainable = True
    model._lora_state = None
    reset_compiled(model)


def _merge(state):
    for layer in state.layers:
        a, b = layer.lora_kernel_a, layer.lora_kernel_b
        delta = (layer.lora_alpha / layer.lora_rank) * ops.matmul(a, b)
        kernel = layer._kernel
        kernel.assign(ops.cast(ops.cast(kernel, "float32") + delta, kernel.dtype))
        del layer.lora_kernel_a
        del layer.lora_kernel_b
        layer.lora_enabled = False
        layer.lora_rank = layer.lora_alpha = None


def adapter_weights(model) -> dict:
    """`{key: variable}` of what `save_lora_weights` writes: each LoRA layer's
    `A` and `B` (keyed by the layer's kernel path) and the trainable head."""
    state = _state(model, "save_lora_weights()")
    weights = {}
    for layer in state.layers:
        prefix = layer._kernel.path.rpartition("/")[0]
        weights[f"{prefix}/lora_kernel_a"] = layer.lora_kernel_a
        weights[f"{prefix}/lora_kernel_b"] = layer.lora_kernel_b
    for variable in state.head:
        weights[f"head/{variable.path}"] = variable
    if len(weights) != 2 * len(state.layers) + len(state.head):
        raise ValueError("LoRA weight paths are not unique; cannot save them by name.")
    return weights


def _check_path(path) -> str:
    path = str(path)
    if not path.endswith(".npz"):
        raise ValueError(
            f"LoRA weights are an .npz file; use a name like 'adapter.lora.npz'. "
            f"Received: {path!r}"
        )
    return path


def save_lora_weights(model, path):
    """Writes only the adapter (see `adapter_weights`) plus its rank, alpha
    and targets to `path` (`.npz`, loadable without pickle). The write is
    atomic: a temporary sibling file replaces `path` once complete, so a
    killed save leaves the previous file or the new one, whole."""
    path = _check_path(path)
    state = _state(model, "save_lora_weights()")
    arrays = {
        key: ops.convert_to_numpy(ops.cast(v, "float32"))
        for key, v in adapter_weights(model).items()
    }
    meta = dict(
        __format__=np.array(FORMAT),
        __rank__=np.array(state.rank),
        __alpha__=np.array(float(state.alpha)),
        __target__=np.array(list(state.target)),
    )
    with atomic_file(path) as partial, open(partial, "wb") as file:
        np.savez(file, **arrays, **meta)


def load_lora_weights(model, path):
    """Loads `save_lora_weights` output onto `model` (same config, LoRA
    enabled with the same rank, alpha and targets); mismatches raise."""
    path = _check_path(path)
    state = _state(model, "load_lora_weights()")
    with np.load(path, allow_pickle=False) as data:
        if "__format__" not in data or str(data["__format__"]) != FORMAT:
            raise ValueError(f"{path} is not a LoRA file written by save_lora_weights.")
        saved = (int(data["__rank__"]), float(data["__alpha__"]))
        target = tuple(str(t) for t in data["__target__"])
        if saved != (state.rank, float(state.alpha)) or target != state.target:
            raise ValueError(
                f"{path} holds a LoRA adapter with rank={saved[0]}, alpha={saved[1]:g}"
                f", target={target}, but this model has rank={state.rank}, alpha="
                f"{state.alpha:g}, target={state.target}. Call enable_lora(rank="
                f"{saved[0]}, target={target}, alpha={saved[1]:g}) on a fresh model."
            )
        weights = adapter_weights(model)
        keys = sorted(k for k in data.files if not k.startswith("__"))
        if keys != sorted(weights):
            missing = sorted(set(weights) - set(keys))[:3]
            extra = sorted(set(keys) - set(weights))[:3]
            raise ValueError(
                f"{path} does not match this model's adapter (missing {missing}, "
                f"unexpected {extra}). Load it onto a model with the same config."
            )
        for key, variable in weights.items():
            value = data[key]
            if tuple(value.shape) != tuple(variable.shape):
                raise ValueError(
                    f"LoRA weight {key} has shape {tuple(value.shape)} in {path} but "
                    f"{tuple(variable.shape)} in this model. Use the same config."
                )
            variable.assign(value)
