"""Layouts for `keras.distribution`: data, tensor and expert parallelism.

Every layer that owns weights declares their *logical* axes next to where
it creates them, in a `weight_axes` attribute (or method) mapping each
weight's path below the layer to one name per dimension:

    class FeedForward(keras.layers.Layer):
        weight_axes = {
            "intermediate/kernel": ("embed", "mlp"),
            "output/kernel": ("mlp", "embed"),
            "output/bias": None,  # replicated
        }

`layout_map` builds the model abstractly (no weight is allocated), reads
every layer's declarations (a layer or model can re-declare the weights of
the layers it holds: the outermost declaration wins), and turns each weight
into a rule of a `LayoutMap`: `MESH_AXES` maps the logical axes to mesh
axes, and a dimension is split only when the mesh axis divides its size
(GQA's two K/V heads on a four-way `model` axis are replicated, not
padded). A weight that no layer declares is an error, and so is a rule that
matches no weight, including one added to the map afterwards.

The mesh has axes `batch` (data parallel), `model` (tensor parallelism
over attention and linear-attention heads, feed-forward width and
vocabulary: Megatron's split, the input projections by columns, the output
projections by rows) and, for MoE configs, `expert` (each device holds
`num_experts / expert` experts).

Keras runs these layouts on the JAX backend. On TensorFlow use
`tf.distribute.MirroredStrategy` (data parallel; see the README, "Scaling
up"); the torch backend has no Keras distribution support.

Example (8 devices, a tiny model):

    dist = make_distribution(load_config("gpt2_tiny"), "auto")
    # ModelParallel over a (batch=2, model=4) mesh
    model = GPTCausalLM.from_preset("gpt2_tiny", distribution=dist)
"""

from __future__ import annotations

import difflib
import math
import random
import re

import keras

from keras_transformers.config import TransformerConfig
from keras_transformers.multiprocess import process_count

# Logical axis -> the mesh axis it is split over.
MESH_AXES = {
    "heads": "model",
    "kv_heads": "model",
    "linear_heads": "model",  # linear attention's value heads
    "mlp": "model",
    "vocab": "model",
    "experts": "expert",
}
# Logical axes that are named for clarity but always kept whole.
WHOLE_AXES = ("embed", "head_dim", "gate_up", "linear_qkv", "positions")

KINDS = ("auto", "data", "model")


def axis_sizes(config: TransformerConfig) -> dict:
    """The size of the logical axes of `config` that `mesh_shape` divides:
    the largest that every layer's heads and feed-forward widths share."""
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


# ------------------------------------------------------------ declarations
def _declared(layer) -> dict:
    """`layer`'s `weight_axes` (a dict, or a method returning one)."""
    axes = getattr(layer, "weight_axes", None)
    return (axes() if callable(axes) else axes) or {}


def _check_axes(layer, key: str, axes, variable) -> None:
    if axes is None:
        return
    where = f"{type(layer).__name__}.weight_axes[{key!r}]"
    if len(axes) != len(variable.shape):
        raise ValueError(
            f"{where} gives {len(axes)} axes {tuple(axes)} for the weight "
            f"{variable.path!r} of shape {tuple(variable.shape)}."
        )
    unknown = [
        a
        for a in axes
        if a is not None and a not in MESH_AXES | dict.fromkeys(WHOLE_AXES)
    ]
    if unknown:
        raise ValueError(
            f"{where} names unknown logical axes {unknown}; use None for an axis "
            f"kept whole, or one of {sorted(MESH_AXES)} (split) or {list(WHOLE_AXES)}."
        )


def weight_axes(model) -> dict:
    """`{weight path: logical axes}` of every weight of a built `model`, from
    the `weight_axes` its layers declare (None: replicated).

    Raises:
        ValueError: a weight that no layer declares (naming the layer that
            holds it), or a declaration of the wrong rank or with an unknown
            logical axis.
    """
    layers = list(model._flatten_layers(include_self=True, recursive=True))
    declared, holder = {}, {}
    for layer in layers:  # outer layers first: the outermost declaration wins
        weights = layer.weights
        for variable in weights:
            holder[id(variable)] = layer  # ends as the innermost holder
        declarations = _declared(layer)
        if not declarations:
            continue
        for variable in weights:
            key = _relative(layer, variable.path)
            if key in declarations and id(variable) not in declared:
                _check_axes(layer, key, declarations[key], variable)
                declared[id(variable)] = declarations[key]
    missing = [v for v in model.weights if id(v) not in declared]
    if missing:
        listed = ", ".join(
            f"{v.path!r} (in a {type(holder[id(v)]).__name__})" for v in missing[:5]
        )
        raise ValueError(
            f"No layer declares the layout of {len(missing)} weight(s): {listed}. "
            "Add each to the `weight_axes` of the layer that creates it (its path "
            "below that layer -> one logical axis per dimension, or None to "
            "replicate it); see keras_transformers.distribution."
        )
    return {v.path: declared[id(v)] for v in model.weights}


def _relative(layer, path: str) -> str:
    """`path` below `layer`: after the layer's own path (a model has none:
    its own weights are under its name, the layers it holds under theirs)."""
    prefix = (getattr(layer, "path", None) or layer.name) + "/"
    return path[len(prefix) :] if path.startswith(prefix) else path


# ----------------------------------------------------------- abstract models
def _never() -> None:
    """An abstract variable's initializer: it is never given a value."""


def _abstract(build):
    """The model `build()` returns, built without allocating its weights."""
    from keras_transformers.deferred import deferred_initialization

    # Layers draw their seeds from Python's `random` when they are made: the
    # model built next gets the seeds it would get without this one.
    state = random.getstate()
    with deferred_initialization() as created:  # every `add_weight`'s variable
        try:
            with keras.StatelessScope(initialize_variables=False):
                model = build()
        finally:  # also when `build` fails after creating weights
            random.setstate(state)
            # Keras initialises pending variables when a later stateless
            # scope ends; these stay shapes only.
            for variable, _ in created.values():
                variable._deferred_initialize = _never
            created.clear()
    for variable in model.variables:  # with the seed generators' states
        variable._deferred_initialize = _never
    return model


def _models(config: TransformerConfig, model) -> list:
    """The models whose weights `layout_map` lays out: `model` itself (built),
    `model(config=config)` (a class, with a config), `model()`, or by default
    every registered model class of the families whose backbone builds
    `config`."""
    if isinstance(model, keras.Layer):
        return [model]
    if isinstance(model, type) and config is not None:
        return [_abstract(lambda: model(config=config))]
    if model is not None:
        return [_abstract(model)]
    from keras_transformers import registry

    built = []
    for family, (backbone_cls, _) in registry.families().items():
        try:
            backbone = _abstract(lambda b=backbone_cls: b(config=config))
        except ValueError:  # a config of another family
            continue
        built.append(backbone)
        for cls in registry.model_classes().values():
            if cls.family == family and cls is not backbone_cls:
                built.append(_abstract(lambda c=cls, b=backbone: c(backbone=b)))
    if not built:
        raise ValueError("No registered model class builds this config.")
    return built


# ----------------------------------------------------------------- layouts
class DeclaredLayoutMap(keras.distribution.LayoutMap):
    """A `LayoutMap` made from the layers' `weight_axes` (see `layout_map`)
    that knows the model's weight paths: a rule added to it must match one
    of them and no weight another rule already matches.

    Attributes:
        weight_paths: the path of every weight of the model(s) it lays out.
    """

    def __init__(self, device_mesh=None, weight_paths=()):
        super().__init__(device_mesh)
        self.weight_paths = tuple(weight_paths)

    def __setitem__(self, key, layout):
        matched = [p for p in self.weight_paths if re.fullmatch(key, p)]
        if not matched:
            near = difflib.get_close_matches(key, self.weight_paths, n=3, cutoff=0.3)
            raise ValueError(
                f"The layout rule {key!r} matches no weight of the model. "
                f"Nearest weight paths: {near or list(self.weight_paths[:3])}."
            )
        for path in matched:
            other = [k for k in self if re.fullmatch(k, path)]
            if other:
                raise ValueError(
                    f"The layout rule {key!r} and the rule {other[0]!r} both match "
                    f"{path!r}; remove that rule first (`del layout_map[{other[0]!r}]`)."
                )
        super().__setitem__(key, layout)


def _mesh_axes(axes, shape, sizes: dict):
    """The mesh axis of each dimension (None: kept whole), or None when the
    weight is replicated."""
    if axes is None:
        return None
    result, used = [], set()
    for axis, size in zip(axes, shape):
        mesh_axis = MESH_AXES.get(axis)
        count = sizes.get(mesh_axis, 1)
        split = count > 1 and mesh_axis not in used and size % count == 0
        result.append(mesh_axis if split else None)
        used.add(result[-1])
    return tuple(result) if any(result) else None


def _rules(layouts: dict, model_names: set) -> dict:
    """`{regex: mesh axes}` for the split weights in `layouts`: one rule per
    weight path, except that the blocks (`block_3/...`) with the same layout
    share one; a model's name may carry Keras' `_N` suffix."""

    def component(part: str) -> str:
        base = re.sub(r"_\d+$", "", part)
        return (
            re.escape(base) + r"(?:_\d+)?" if part in model_names else re.escape(part)
        )

    groups: dict = {}
    for path, axes in layouts.items():
        if axes is None:
            continue
        head, *rest = path.split("/")
        found = re.fullmatch(r"(.+)_(\d+)", head)
        if found and rest and head not in model_names:
            group = (re.escape(found[1]) + "_{}", tuple(rest), axes)
            groups.setdefault(group, []).append(found[2])
        else:
            groups.setdefault(("{}", tuple(path.split("/")), axes), []).append(None)
    rules = {}
    for (head, rest, axes), indices in groups.items():
        tail = "/".join(component(part) for part in rest)
        if indices == [None]:
            rules[tail] = axes
            continue
        number = indices[0] if len(indices) == 1 else f"(?:{'|'.join(indices)})"
        rules[head.format(number) + "/" + tail] = axes
    return rules


def layout_map(
    config: TransformerConfig, mesh, model=None
) -> keras.distribution.LayoutMap:
    """The `LayoutMap` of every weight of a `config` model over `mesh`, from
    the `weight_axes` its layers declare.

    Args:
        config: the model's `TransformerConfig` (None when `model` builds
            a model without one).
        mesh: a `keras.distribution.DeviceMesh` whose axis names are among
            `batch`, `model` and `expert`.
        model: what to lay out: None (every registered model class that
            builds `config`, e.g. a BERT config's backbone, masked LM and
            classifiers), a model class (built from `config`, or with no
            arguments when `config` is None), a function returning a model
            (your own layers, with their `weight_axes`), or a built model.
            Classes and functions are built abstractly: no weight is
            allocated.

    Returns:
        A `DeclaredLayoutMap` (regex of the weight path -> `TensorLayout`)
        with a rule for each split weight; add your own rules to it before
        building a `ModelParallel` (each must match a weight no other rule
        matches).

    Raises:
        ValueError: an unknown mesh axis name, or a weight that no layer
            declares.
    """
    sizes = dict(zip(mesh.axis_names, mesh.shape))
    unknown = set(sizes) - {"batch", "model", "expert"}
    if unknown:
        raise ValueError(
            f"Unknown mesh axis names {sorted(unknown)}; use 'batch', 'model' and "
            "(for MoE) 'expert'."
        )
    layouts, names = {}, set()
    for built in _models(config, model):
        names.update(
            layer.name
            for layer in built._flatten_layers(include_self=True)
            if isinstance(layer, keras.Model)
        )
        weights = {v.path: tuple(v.shape) for v in built.weights}
        for path, axes in weight_axes(built).items():
            axes = _mesh_axes(axes, weights[path], sizes)
            if layouts.setdefault(path, axes) != axes:
                raise ValueError(
                    f"Two models lay out {path!r} differently: {layouts[path]} and {axes}."
                )
    rules = _rules(layouts, names)
    for path, axes in layouts.items():  # each weight gets its own layout
        got = [rules[key] for key in rules if re.fullmatch(key, path)]
        if got != ([axes] if axes else []):
            raise AssertionError(f"Layout rules {got} for {path!r}, not {axes}.")
    result = DeclaredLayoutMap(mesh, layouts)
    for key, axes in rules.items():
        keras.distribution.LayoutMap.__setitem__(result, key, axes)
    return result


def _largest_divisor(n: int, *sizes: int) -> int:
    """The largest divisor of `n` that divides every one of `sizes`."""
    return math.gcd(n, *sizes)


def mesh_shape(
    config: TransformerConfig, num_devices: int, kind: str = "auto", per_host: int = 8
) -> dict:
    """The mesh axes `make_distribution` picks for `num_devices`.

    `"data"`: every device on `batch`. `"model"`: experts over `expert` (as
    many as divide both), then the largest `model` axis dividing the heads
    and the feed-forward width, the rest on `batch`. `"auto"`: like
    `"model"`, but the `model` axis is at most `per_host` (one host's
    accelerators, 8 by default; `make_distribution` passes the devices of
    one process when several run: tensor parallelism across hosts is slow),
    so larger meshes get data parallelism over hosts.
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
        cap = max(1, min(model, per_host))
        model = max(d for d in range(1, cap + 1) if model % d == 0)
    shape = {"batch": rest // model, "model": model}
    if config.moe:
        shape = {"batch": shape["batch"], "expert": expert, "model": model}
    return shape


def make_distribution(config: TransformerConfig, kind="auto", devices=None, model=None):
    """A `keras.distribution` for a `config` model.

    Args:
        config: the model's `TransformerConfig`.
        kind: `"data"` (`DataParallel`), `"model"` or `"auto"` (`ModelParallel`
            with `layout_map`; see `mesh_shape`), or a dict of mesh axis sizes,
            e.g. `{"batch": 2, "model": 4}`, whose product is the device count.
        devices: devices to use (default: all of `keras.distribution.list_devices()`).
        model: what `layout_map` lays out (default: the registered model
            classes that build `config`); see there.

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
        per_host = min(8, max(1, len(devices) // process_count()))
        shape = mesh_shape(config, len(devices), kind, per_host)
    if math.prod(shape.values()) != len(devices):
        raise ValueError(
            f"The mesh {shape} needs {math.prod(shape.values())} devices, but "
            f"{len(devices)} are given; make the axis sizes multiply to the device count."
        )
    mesh = keras.distribution.DeviceMesh(
        shape=tuple(shape.values()), axis_names=tuple(shape), devices=devices
    )
    return keras.distribution.ModelParallel(
        layout_map=layout_map(config, mesh, model), batch_dim_name="batch"
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
