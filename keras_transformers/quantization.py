"""Quantizing a model (int8, int4, NF4) and saving it quantized.

`model.quantize(mode)` (or `quantize(model, mode)`) replaces the float
weights of every `Dense` / `EinsumDense` projection and `SparseMoE` experts
(and, in int8 / int4, of the `TokenEmbedding` and LM head):

- `"int8"`: Keras' `Model.quantize` (per-output-channel abs-max int8
  weights, per-token dynamic int8 activations);
- `"int4"`: Keras' int4 (weights only, two per byte; by default blocks of
  128 inputs with a scale and a zero point each,
  `keras.quantizers.Int4QuantizationConfig(block_size=...)`;
  `block_size=None`: per-output-channel abs-max);
- `"nf4"`: QLoRA's 4-bit NormalFloat (`keras_transformers.layers.nf4`),
  blocks of 64 inputs with an abs-max scale each
  (`NF4QuantizationConfig(block_size=...)`). As in QLoRA, the token
  embedding and LM head stay float.

Routers, norms, biases and position tables stay float. After quantizing,
`enable_lora(...)` adds float LoRA adapters on the frozen quantized
projections (QLoRA).

Saving: `spec(model)` records each quantized layer's path and mode (e.g.
`{"layers": {"block_0/self_attention/query": "nf4/64"}}`); presets keep
it in `config.json` and Keras' `get_config()` under `"quantization"`, and
`restore(model, spec)` quantizes a freshly built model the same way before
its saved weights load, so a loaded model computes exactly what the saved
one did.
"""

from __future__ import annotations

import re
import warnings

import keras
import numpy as np

from keras_transformers import deferred
from keras_transformers.backend.loading import own_memory
from keras_transformers.layers.nf4 import (
    BLOCK_SIZE,
    NF4_LEVELS,
    check_block_size,
    nf4_codes,
    nf4_dequantize,
    nf4_quantize,
)
from keras_transformers.lora import PROJECTIONS, few_collections, reset_compiled

MODES = ("int8", "int4", "nf4")


class NF4QuantizationConfig(keras.quantizers.QuantizationConfig):
    """The config of `quantize("nf4")`: `block_size` inputs share one
    abs-max scale (QLoRA: 64; a positive even integer).

    Examples:
        >>> NF4QuantizationConfig(block_size=32).mode
        'nf4'
    """

    def __init__(self, block_size: int = BLOCK_SIZE):
        super().__init__(weight_quantizer=None, activation_quantizer=None)
        self.block_size = check_block_size(block_size)

    @property
    def mode(self):
        return "nf4"

    def get_config(self):
        return {"block_size": self.block_size}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def _resolve(mode, config):
    """`(mode, config)` from either or both; a ValueError names the modes."""
    if isinstance(config, keras.quantizers.QuantizationConfig):
        if mode is not None and mode != config.mode:
            raise ValueError(
                f"`mode`={mode!r} contradicts the config's mode {config.mode!r}."
            )
        mode = config.mode
    elif config is not None:
        raise ValueError(
            "`config` must be a `keras.quantizers.QuantizationConfig` (e.g. "
            "`NF4QuantizationConfig(block_size=64)`) or None. "
            f"Received: {type(config).__name__}"
        )
    if mode not in MODES:
        raise ValueError(
            f"Unknown quantization mode {mode!r}. Valid modes: 'int8', 'int4' "
            "(Keras' own) and 'nf4' (QLoRA's 4-bit NormalFloat)."
        )
    if mode == "nf4" and config is None:
        config = NF4QuantizationConfig()
    return mode, config


def is_quantized(model) -> bool:
    """Whether any layer of `model` is quantized."""
    return any(
        layer.quantization_mode is not None
        for layer in model._flatten_layers(include_self=False)
    )


def _selected(layer, filters) -> bool:
    """Keras' `filters` of `Model.quantize`: a regex (or list of them)
    searched in the layer's name, or a callable of the layer."""
    if filters is None:
        return True
    if isinstance(filters, str):
        return re.search(filters, layer.name) is not None
    if isinstance(filters, (list, tuple)):
        return any(re.search(f, layer.name) for f in filters)
    return bool(filters(layer))


def quantize(model, mode=None, config=None, filters=None, **kwargs):
    """Quantizes `model` in place (see the module docstring).

    Args:
        model: a `keras_transformers` model (any `keras.Model` works).
        mode: "int8", "int4" or "nf4" (or None with `config`).
        config: a `keras.quantizers.Int8QuantizationConfig`,
            `Int4QuantizationConfig` or `NF4QuantizationConfig`.
        filters: which layers: a regex or list of regexes searched in layer
            names, or a callable of the layer (Keras' `filters`).

    Raises:
        ValueError: an unknown mode, or LoRA enabled (merge it first).
    """
    if getattr(model, "_lora_state", None) is not None:
        raise ValueError(
            "Call `merge_lora()` before `quantize()`: the LoRA weights would stay "
            "float and unmerged. For QLoRA, quantize first, then `enable_lora()`."
        )
    mode, config = _resolve(mode, config)
    from keras_transformers.layers import SparseMoE

    with warnings.catch_warnings(), few_collections():
        # Keras warns once per norm, dropout or position layer.
        warnings.filterwarnings("ignore", "Layer .* does not have a `quantize`")
        if mode == "nf4":
            for layer in model._flatten_layers(include_self=False):
                nf4 = isinstance(layer, (*PROJECTIONS, SparseMoE))
                if (
                    nf4
                    and layer.quantization_mode is None
                    and _selected(layer, filters)
                ):
                    _quantize_nf4(layer, config.block_size)
        else:
            keras.Model.quantize(model, mode, config=config, filters=filters, **kwargs)
            for layer in model._flatten_layers(include_self=False):
                # `Model.quantize` skips layers that hold sublayers.
                missed = (
                    isinstance(layer, SparseMoE) and layer.quantization_mode is None
                )
                if missed and filters is None and layer._layers:
                    layer.quantize(mode, config=config)
    _finish(model, mode)


def _quantize_nf4(layer, block_size):
    try:
        layer.quantize_nf4(block_size)
    except NotImplementedError as error:  # keeps the layer float, as Keras does
        warnings.warn(str(error), stacklevel=3)


def _finish(model, mode):
    for layer in model._flatten_layers(include_self=False):
        if isinstance(layer, PROJECTIONS) and layer.quantization_mode is not None:
            # `call_layer` may run `layer.call` directly (PyTorch decoding);
            # Keras computes a quantized layer in `quantized_call`.
            layer.call = layer.quantized_call
    model._post_quantize(mode)
    # PyTorch: the float weights left (embeddings, norms) stop holding the
    # checkpoint's file mapping, whose quantized kernels' pages go with it.
    own_memory(model.weights)
    reset_compiled(model)


# ---------------------------------------------------------------- saving
def _mode_name(layer) -> str:
    """`"int8"`, `"int4/<block size>"` or `"nf4/<block size>"` of `layer`."""
    name = layer.dtype_policy.name.partition("_from_")[0]
    mode = layer.quantization_mode
    config = getattr(layer, "quantization_config", None)
    custom = config is not None and (
        config.weight_quantizer is not None
        or (mode == "int8" and not _default_activations(config))
        or (mode == "int4" and config.activation_quantizer is not None)
    )
    if mode not in MODES or custom:
        raise ValueError(
            f"Layer {layer.path!r} is quantized as {layer.dtype_policy.name!r}"
            f"{' with custom quantizers' if custom else ''}: presets save the "
            "modes 'int8', 'int4' (any block_size) and 'nf4' with their default "
            "quantizers. Save the float model and quantize after loading."
        )
    return name


def _default_activations(config) -> bool:
    quantizer = config.activation_quantizer
    return isinstance(quantizer, keras.quantizers.AbsMaxQuantizer) and (
        quantizer.get_config() == keras.quantizers.AbsMaxQuantizer().get_config()
    )


def spec(model) -> dict | None:
    """`{"layers": {path: mode}}` of the quantized layers of `model`, or
    None for a float model (see the module docstring).

    Raises:
        ValueError: a mode or quantizer presets cannot record.
    """
    layers = {}
    for layer in model._flatten_layers(include_self=False):
        if layer.quantization_mode is not None:
            if layer.path in layers:
                raise ValueError(f"Two quantized layers share the path {layer.path!r}.")
            layers[layer.path] = _mode_name(layer)
    return {"layers": layers} if layers else None


def restore(model, saved: dict | None) -> None:
    """Quantizes `model` (freshly built, before its weights load) as
    `spec` recorded; nothing for None.

    Raises:
        ValueError: `saved` names layers this model does not have.
    """
    if not saved:
        return
    layers = {layer.path: layer for layer in model._flatten_layers(include_self=False)}
    wanted = saved.get("layers", {})
    missing = sorted(set(wanted) - set(layers))
    if missing:
        raise ValueError(
            f"The saved quantization names layers this model lacks: {missing[:3]}. "
            "Load the preset with the class and config it was saved with."
        )
    with warnings.catch_warnings(), few_collections(), np.errstate(all="ignore"):
        # Inside `deferred_initialization` these weights are uninitialised
        # storage: quantizing them gives throwaway values (NumPy's warnings
        # about NaNs silenced) that the saved weights overwrite, and no
        # initializer runs for them.
        warnings.simplefilter("ignore", RuntimeWarning)
        for path, name in wanted.items():
            layer = layers[path]
            for variable in layer.weights:
                deferred.loaded(variable)
            mode, _, size = name.partition("/")
            if mode == "nf4":
                layer.quantize_nf4(int(size))
            elif mode == "int4":
                block = None if size == "-1" else int(size)
                config = keras.quantizers.Int4QuantizationConfig(block_size=block)
                layer.quantize("int4", config=config)
            else:
                layer.quantize(mode)
    _finish(model, name.partition("/")[0])


def check_savable(model) -> None:
    """`save_to_preset` writes quantized models (see `spec`), but not with
    LoRA adapters on quantized weights.

    Raises:
        ValueError: LoRA enabled on a quantized model, or a quantization
            presets cannot record.
    """
    if getattr(model, "_lora_state", None) is not None and is_quantized(model):
        raise ValueError(
            "`save_to_preset` cannot save a quantized model with LoRA adapters: "
            "merging them would re-quantize the base weights. Save the adapter "
            "(`save_adapter(directory)` or `save_lora_weights(path)`) and, once, "
            "the quantized base before `enable_lora()`; or load the float model, "
            "`load_adapter(...)`, `merge_lora()` and quantize."
        )
    spec(model)


__all__ = [
    "MODES",
    "NF4_LEVELS",
    "NF4QuantizationConfig",
    "check_savable",
    "is_quantized",
    "nf4_codes",
    "nf4_dequantize",
    "nf4_quantize",
    "quantize",
    "restore",
    "spec",
]
