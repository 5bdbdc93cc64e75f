"""Layouts for `keras.distribution`: data, tensor and expert parallelism.

Every family is built from the same layers, so one table says how each kind
of weight splits: a weight's *logical* axes (`"heads"`, `"mlp"`,
`"vocab"`, `"experts"`, ...) come from its layer and variable name, and
`MESH_AXES` maps logical axes to mesh axes. A logical axis is split only
when the config's size for it divides the mesh axis (GQA's two K/V heads on a
four-way `model` axis are replicated, not padded); everything not in the
table (norms, biases of the output projections, positions, classifier
heads) is replicated.

The mesh has axes `batch` (data parallel), `model` (tensor parallel:
attention heads, feed-forward width and vocabulary, the Megatron split: the
input projections by columns, the output projections by rows) and, for MoE
configs, `expert` (each device holds `num_experts / expert` experts).

Keras runs these layouts on the JAX backend. On TensorFlow use
`tf.distribute.MirroredStrategy` (data parallel; see the README, "Scaling
up"); the torch backend has no Keras distribution support.

Example (8 devices, a tiny model):

    dist = make_distribution(load_config("gpt2_tiny"), "auto")
    # ModelParallel over a (batch=2, model=4) mesh
    model = GPTCausalLM.from_preset("gpt2_tiny", distribution=dist)
"""

from __future__ import annotations

import math
import re

import keras

from keras_transformers.config import TransformerConfig

# (layer name, variable name) -> logical axes of the variable.
WEIGHT_AXES = {
    ("query", "kernel"): ("embed", "heads", "head_dim"),
    ("query", "bias"): ("heads", "head_dim"),
    ("key", "kernel"): ("embed", "kv_heads", "head_dim"),
    ("key", "bias"): ("kv_heads", "head_dim"),
    ("value", "kernel"): ("embed", "kv_heads", "head_dim"),
    ("value", "bias"): ("kv_heads", "head_dim"),
    ("attention_output", "kernel"): ("heads", "head_dim", "embed"),
    ("intermediate", "kernel"): ("embed", "mlp"),
    ("intermediate", "bias"): ("mlp",),
    ("gate", "kernel"): ("embed", "mlp"),
    ("gate", "bias"): ("mlp",),
    ("output", "kernel"): ("mlp", "embed"),
    ("token_embedding", "embeddings"): ("vocab", "embed"),
    ("token_embedding", "reverse_embeddings"): ("embed", "vocab"),
    ("masked_lm_head", "bias"): ("vocab",),
    # The gated experts' kernel is [gate | up] along its last axis: split by
    # experts only, so a device holds both halves of the experts it has.
    ("moe", "expert_gate_up"): ("experts", "embed", "gate_up"),
    ("moe", "expert_down"): ("experts", "mlp", "embed"),
}

# Logical axis -> mesh axis it is split over (absent: replicated).
MESH_AXES = {
    "heads": "model",
    "kv_heads": "model",
    "mlp": "model",
    "vocab": "model",
    "experts": "expert",
}

KINDS = ("auto", "data", "model")


def axis_sizes(config: TransformerConfig) -> dict:
    """The size of each logical axis in `config`."""
    moe = config.moe
    mlp = config.intermediate_dim
    if moe is not None:  # dense layers (if any) and experts share the rule
        expert = moe.expert_intermediate_dim or mlp
        mlp = math.gcd(mlp, expert, moe.shared_expert_intermediate_dim or expert)
    # Layer types with their own key/value heads (Gemma 4's full layers)
    # share the split: the largest that divides every type's count.
    kv_heads = math.gcd(
        config.num_kv_heads or config.num_heads,
        *(own.get("num_kv_heads", 0) for own in (config.layer_settings or {}).values()),
    )
    return {
        "heads": config.num_heads,
        "kv_heads": kv_heads,
        "mlp": mlp,
        "vocab": config.vocabulary_size,
        "experts": moe.num_experts if moe else 1,
    }


def _variable_pattern(layer: str, variable: str) -> str:
    """Regex fully matching any path ending in `layer/variable`."""
    return f"(.*/)?{re.escape(layer)}/{re.escape(variable)}"


def layout_map(config: TransformerConfig, mesh) -> keras.distribution.LayoutMap:
    """The `LayoutMap` of every weight of a `config` model over `mesh`.

    Args:
        config: the model's `TransformerConfig`.
        mesh: a `keras.distribution.DeviceMesh` whose axis names are among
            `batch`, `model` and `expert`.

    Returns:
        A `LayoutMap` (regex of the variable path -> `TensorLayout`); add
        your own entries to it before building a `ModelParallel`.
    """
    sizes = dict(zip(mesh.axis_names, mesh.shape))
    unknown = set(sizes) - {"batch", "model", "expert"}
    if unknown:
        raise ValueError(
            f"Unknown mesh axis names {sorted(unknown)}; use 'batch', 'model' and "
            "(for MoE) 'expert'."
        )
    lengths = axis_sizes(config)
    result = keras.distribution.LayoutMap(mesh)
    for (layer, variable), axes in WEIGHT_AXES.items():
        layout = []
        for axis in axes:
            mesh_axis = MESH_AXES.get(axis)
            split = mesh_axis in sizes and lengths[axis] % sizes[mesh_axis] == 0
            layout.append(mesh_axis if split and sizes[mesh_axis] > 1 else None)
        if any(layout):
            result[_variable_pattern(layer, variable)] = tuple(layout)
    return result


def _largest_divisor(n: int, *sizes: int) -> int:
    """The largest divisor of `n` that divides every one of `sizes`."""
    return math.gcd(n, *sizes)


def mesh_shape(config: TransformerConfig, num_devices: int, kind: str = "auto") -> dict:
    """The mesh axes `make_distribution` picks for `num_devices`.

    `"data"`: every device on `batch`. `"model"`: experts over `expert` (as
    many as divide both), then the largest `model` axis dividing the heads
    and the feed-forward width, the rest on `batch`. `"auto"`: like
    `"model"`, but the `model` axis is at most 8 (one host's accelerators:
    tensor parallelism across hosts is slow), so larger meshes get data
    parallelism over hosts.
    """
    if kind not in KINDS:
        raise ValueError(f"distribution kind must be one of {KINDS}; got {kind!r}.")
    if kind == "data":
        return {"batch": num_devices}
    lengths = axis_sizes(config)
    expert = math.gcd(num_devices, lengths["experts"]) if config.moe else 1
    rest = num_devices // expert
    model = _largest_divisor(rest, lengths["heads"], lengths["mlp"])
    if kind == "auto":
        model = max(d for d in range(1, min(model, 8) + 1) if model % d == 0)
    shape = {"batch": rest // model, "model": model}
    if config.moe:
        shape = {"batch": shape["batch"], "expert": expert, "model": model}
    return shape


def make_distribution(config: TransformerConfig, kind="auto", devices=None):
    """A `keras.distribution` for a `config` model.

    Args:
        config: the model's `TransformerConfig`.
        kind: `"data"` (`DataParallel`), `"model"` or `"auto"` (`ModelParallel`
            with `layout_map`; see `mesh_shape`), or a dict of mesh axis sizes,
            e.g. `{"batch": 2, "model": 4}`, whose product is the device count.
        devices: devices to use (default: all of `keras.distribution.list_devices()`).

    Returns:
        A `keras.distribution.Distribution`; activate it with
        `keras.distribution.set_distribution` (or pass it to `from_preset`,
        which does) before building the model, and keep it active for `fit()`.
    """
    if keras.config.backend() != "jax":
        raise ValueError(
            "keras.distribution layouts run on the JAX backend only "
            f"(KERAS_BACKEND is {keras.config.backend()!r}). On TensorFlow, build and "
            "compile the model under `tf.distribute.MirroredStrategy().scope()` instead."
        )
    devices = list(devices or keras.distribution.list_devices())
    if isinstance(kind, dict):
        shape = dict(kind)
    elif kind == "data":
        return keras.distribution.DataParallel(devices=devices)
    else:
        shape = mesh_shape(config, len(devices), kind)
    if math.prod(shape.values()) != len(devices):
        raise ValueError(
            f"The mesh {shape} needs {math.prod(shape.values())} devices, but "
            f"{len(devices)} are given; make the axis sizes multiply to the device count."
        )
    mesh = keras.distribution.DeviceMesh(
        shape=tuple(shape.values()), axis_names=tuple(shape), devices=devices
    )
    return keras.distribution.ModelParallel(
        layout_map=layout_map(config, mesh), batch_dim_name="batch"
    )


def variable_layouts(model) -> dict:
    """`{variable path: mesh axes}` of a model built under a distribution
    (`None` per axis where it is replicated); for checking and logging."""
    result = {}
    for variable in model.variables:
        layout = getattr(variable, "_layout", None)
        axes = getattr(layout, "axes", None)
        result[variable.path] = tuple(axes) if axes else (None,) * len(variable.shape)
    return result
