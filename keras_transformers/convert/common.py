"""Helpers shared by the Hugging Face converters: copying tensors between
checkpoint layout and Keras variables with shape checks, and config checks."""

from __future__ import annotations

import warnings

import numpy as np
from keras import ops

from keras_transformers.backend.loading import assign_array
from keras_transformers.deferred import initialize, loaded


def assign(
    variable, value: np.ndarray, name: str, *, shape=None, transpose=False
) -> None:
    """Copies checkpoint tensor `value` (called `name`) into `variable`.

    Args:
        variable: the Keras variable.
        value: the checkpoint tensor.
        name: its checkpoint name, for error messages.
        shape: the shape of `value` in our layout before it is reshaped to
            `variable.shape` (e.g. `[D, N * H]` for a `[D, N, H]` kernel).
            Defaults to `variable.shape`.
        transpose: the checkpoint stores the transpose of `shape` (PyTorch
            `Linear` weights are `[out, in]`).

    Raises:
        ValueError: the shapes differ; the message names the weight.
    """
    ours = tuple(shape or variable.shape)
    check_shape(value, ours[::-1] if transpose else ours, name, variable.path)
    write(variable, value.T if transpose else value)


def write(variable, value: np.ndarray) -> None:
    """Copies `value` (our layout: its C-order reshape is the variable; any
    strides and dtype) into `variable` and marks it loaded (see
    `keras_transformers.deferred`)."""
    assign_array(variable, value)
    loaded(variable)


def check_shape(value: np.ndarray, expected, name: str, target: str) -> None:
    """Raises a ValueError naming weight `name` unless `value.shape ==
    expected` and `value` is floating point."""
    check_dtype(value, name)
    if tuple(value.shape) != tuple(expected):
        raise ValueError(
            f"Checkpoint weight {name!r} has shape {list(value.shape)}, but the model "
            f"built from config.json expects {list(expected)} (for {target}). "
            "config.json (or an override) does not describe these weights: fix it to "
            "match the checkpoint."
        )


FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


def check_dtype(value: np.ndarray, name: str) -> None:
    """Raises a ValueError naming weight `name` unless it is floating point."""
    if value.dtype.name not in FLOAT_DTYPES:
        raise ValueError(
            f"Checkpoint weight {name!r} has dtype {value.dtype.name}, but model "
            f"weights are floating point ({', '.join(FLOAT_DTYPES)}). The checkpoint "
            "is quantized or corrupt: load a floating-point checkpoint."
        )


def fetch(variable, *, shape=None, transpose=False) -> np.ndarray:
    """`variable` as a float32 array in checkpoint layout (inverse of `assign`)."""
    initialize(variable)  # a deferred initializer runs before it is read
    value = np.asarray(ops.convert_to_numpy(ops.cast(variable, "float32")))
    value = value.reshape(shape or value.shape)
    return np.ascontiguousarray(value.T if transpose else value)


def _params(layer):
    """(weight, bias) of a Dense / EinsumDense / LayerNorm / RMSNorm layer."""
    if hasattr(layer, "kernel"):
        return layer.kernel, layer.bias
    if hasattr(layer, "gamma"):  # LayerNormalization (`scale` is its flag)
        return layer.gamma, layer.beta
    return layer.scale, None  # RMSNormalization


def load_layer(layer, get, name: str, *, shape=None, transpose=False) -> None:
    """Loads `{name}.weight` (and `{name}.bias` when `layer` has a bias);
    `shape` / `transpose` describe the weight as in `assign`."""
    weight, bias = _params(layer)
    assign(
        weight,
        get(name + ".weight"),
        name + ".weight",
        shape=shape,
        transpose=transpose,
    )
    if bias is not None:
        size = int(np.prod(bias.shape))
        assign(bias, get(name + ".bias"), name + ".bias", shape=(size,))


def export_layer(
    out: dict, layer, name: str, *, shape=None, transpose=False, zero_bias=False
):
    """Inverse of `load_layer`: adds the layer's tensors to `out`; with
    `zero_bias`, a layer without bias gets a zero one (for formats that
    always have biases)."""
    weight, bias = _params(layer)
    out[name + ".weight"] = fetch(weight, shape=shape, transpose=transpose)
    if bias is not None:
        out[name + ".bias"] = fetch(bias).reshape(-1)
    elif zero_bias:
        out[name + ".bias"] = np.zeros(out[name + ".weight"].shape[-1], np.float32)


def attention_parts(attention) -> dict[str, tuple]:
    """Role -> (layer, 2-D kernel shape `[in, out]`) of a `MultiHeadAttention`."""
    d = attention.query_dense.kernel.shape[0]
    q = attention.num_heads * attention.head_dim
    kv = attention.num_kv_heads * attention.head_dim
    return {
        "query": (attention.query_dense, (d, q)),
        "key": (attention.key_dense, (d, kv)),
        "value": (attention.value_dense, (d, kv)),
        "output": (attention.output_dense, (q, d)),
    }


def load_head(embedding, checkpoint, required: bool) -> None:
    """An untied LM head from `lm_head.weight` (`[V, D]`)."""
    if not embedding.tie_weights and (required or "lm_head.weight" in checkpoint):
        value = checkpoint.get("lm_head.weight")
        assign(embedding.reverse_embeddings, value, "lm_head.weight", transpose=True)


def export_head(out: dict, embedding) -> None:
    if not embedding.tie_weights:
        out["lm_head.weight"] = fetch(embedding.reverse_embeddings, transpose=True)


def num_labels(hf: dict) -> int:
    """Classifier width: `id2label` (transformers 5 saves no `num_labels`)."""
    return len(hf["id2label"]) if hf.get("id2label") else int(hf.get("num_labels") or 2)


def special_ids(hf: dict, vocabulary_size: int) -> dict:
    """bos / eos / pad ids of an HF config; pad defaults to eos (then 0).

    A list of eos ids keeps its first; ids outside the vocabulary are
    dropped with a warning (random-init configs often carry GPT-2's 50256).
    """
    ids = {}
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = hf.get(key)
        if isinstance(value, (list, tuple)):
            value = value[0] if value else None
        if value is not None and not 0 <= int(value) < vocabulary_size:
            warnings.warn(
                f"config.json {key}={value} is outside the vocabulary "
                f"(size {vocabulary_size}); ignoring it.",
                stacklevel=3,
            )
            value = None
        ids[key] = None if value is None else int(value)
    if ids["pad_token_id"] is None:
        ids["pad_token_id"] = (
            ids["eos_token_id"] if ids["eos_token_id"] is not None else 0
        )
    return ids


# What every exported decoder needs besides its own layout.
DECODER = dict(
    stacks="decoder",
    norm_position="pre",
    final_norm=True,
    embedding_norm=False,
    scale_embeddings=False,
    num_segments=0,
    sliding_window=None,
    rotary_fraction=1.0,
    layer_types=None,
    layer_settings=None,
    attention_scale=None,
    attention_softcap=None,
    attention_sinks=False,
    attention_output_gate=False,
    linear_attention=None,
    logit_softcap=None,
    qkv_bias=False,
    qk_norm=False,
    moe=None,
    vision=None,
    value_norm=False,
    num_kv_shared_layers=0,
    kv_shared_intermediate_dim=None,
    per_layer_input_dim=None,
    layer_output_scale=False,
)


def check_exportable(config, required: dict, model_type: str) -> None:
    """Raises ValueError naming every field of `config` that `model_type`
    cannot represent (`required` maps field -> needed value)."""
    bad = {
        k: getattr(config, k) for k, v in required.items() if getattr(config, k) != v
    }
    if bad:
        needed = {k: required[k] for k in bad}
        raise ValueError(
            f"This model cannot be exported as Hugging Face {model_type!r}: it has "
            f"{bad}, but {model_type} needs {needed}."
        )


# Hugging Face activation name -> ours (GPT-2, BERT).
ACTIVATIONS = {
    "gelu_new": "gelu_approximate",
    "gelu_pytorch_tanh": "gelu_approximate",
    "gelu": "gelu",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}


def load_positions(variable, value: np.ndarray, name: str) -> None:
    """Learned positions; a smaller `max_sequence_length` keeps the first
    rows, a larger one keeps the initialised rows past the checkpoint's."""
    rows, width = variable.shape
    if value.ndim == 2 and value.shape[1] == width and value.shape[0] != rows:
        table = np.array(fetch(variable))
        n = min(rows, value.shape[0])
        table[:n] = value[:n]
        value = table
    assign(variable, value, name)


# A row of a two-way name map: `(HF name, [(variable, our shape)], transposed)`,
# the HF tensor being the parts (each in `our shape`, one -1 allowed,
# transposed when asked) stacked along its first axis (a fused projection:
# ModernBERT's `Wqkv`).


def linear_rows(layers, name: str) -> list[tuple]:
    """Rows of a PyTorch `Linear` `name` whose `[out, in]` weight stacks the
    kernels of `layers` (each `[in, ...]`) along `out`, and its bias alike."""
    rows = [
        (name + ".weight", [(x.kernel, (x.kernel.shape[0], -1)) for x in layers], True)
    ]
    if layers[0].bias is not None:
        rows.append((name + ".bias", [(x.bias, (-1,)) for x in layers], False))
    return rows


def norm_rows(layer, name: str) -> list[tuple]:
    """Rows of a LayerNorm (its bias only when it has one)."""
    rows = [(name + ".weight", [(layer.gamma, (-1,))], False)]
    if layer.beta is not None:
        rows.append((name + ".bias", [(layer.beta, (-1,))], False))
    return rows


def _full_shape(variable, shape) -> tuple:
    """`shape` with its -1 resolved for `variable`."""
    size = int(np.prod(variable.shape))
    known = int(np.prod([d for d in shape if d != -1]))
    return tuple(size // known if d == -1 else d for d in shape)


def load_rows(rows, get) -> None:
    """Copies each row's checkpoint tensor (`get(name)`) into its variables.

    Raises:
        ValueError: a tensor whose shape the config does not describe (named).
    """
    for name, parts, transposed in rows:
        value = get(name)
        shapes = [_full_shape(v, s) for v, s in parts]
        sizes = [s[-1] if transposed else s[0] for s in shapes]
        if value.ndim == 0 or sum(sizes) != value.shape[0]:
            raise ValueError(
                f"Checkpoint weight {name!r} has shape {list(value.shape)}, but the "
                f"model built from config.json expects {sum(sizes)} rows: config.json "
                "does not describe these weights."
            )
        pieces = np.split(value, np.cumsum(sizes)[:-1])
        for (variable, _), shape, piece in zip(parts, shapes, pieces):
            assign(variable, piece, name, shape=shape, transpose=transposed)


def export_rows(rows) -> dict[str, np.ndarray]:
    """The checkpoint tensors of `rows` (inverse of `load_rows`)."""
    return {
        name: np.concatenate(
            [fetch(v, shape=_full_shape(v, s), transpose=t) for v, s in parts]
        )
        for name, parts, t in rows
    }
