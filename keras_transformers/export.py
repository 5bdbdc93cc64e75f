"""Exports for other runtimes: TensorFlow SavedModel, LiteRT and ONNX.

`export_model(model, path, format=...)` writes the model's forward pass
(`call()`, inference mode) through Keras' own exporters
(`keras.Model.export`) with a fixed input signature built from the model's
input names, so that the artifact runs without this library:

| family | inputs (name: dtype [shape]) |
|---|---|
| gpt, mixtral, bert | `token_ids`, `padding_mask` (+ `segment_ids` for bert configs with segments): int32 `[B, T]` |
| transformer (seq2seq) | `encoder_token_ids`, `encoder_padding_mask`: int32 `[B, S]`; `decoder_token_ids`, `decoder_padding_mask`: int32 `[B, T]` |
| vit | `images`: float32 `[B, H, W, C]` (channels last, the config's size) |

Which backend writes which format (Keras 3.15):

| format | tensorflow | jax | torch |
|---|---|---|---|
| `"tf_saved_model"` | yes | yes (through `jax2tf`) | no: Keras' exporter needs `torch_xla` and single-tensor inputs, not a dict |
| `"onnx"` | yes (`tf2onnx`) | yes (`jax2onnx`) | yes (`torch.onnx`, `onnxscript`) |
| `"litert"` | yes | no: Keras converts from TensorFlow or PyTorch only | only with the `litert-torch` package |

A pair that cannot export, a missing converter package, or a conversion
that fails raises `ExportError` (an `ImportError` for a missing package)
saying why and which pairs work instead, never the converter's traceback.
The weights load on every backend (`save_to_preset` / `from_preset`), so
a model trained on one backend can be exported from another.

Example:

```python
import numpy as np
import keras_transformers as kt
from keras_transformers.export import export_model

model = kt.models.GPTCausalLM.from_preset("gpt_llama_tiny")
export_model(model, "gpt.onnx", format="onnx", batch_size=1, sequence_length=16)

import onnxruntime
runner = onnxruntime.InferenceSession("gpt.onnx")
ids = np.ones((1, 16), "int32")
(logits,) = runner.run(None, {"token_ids": ids, "padding_mask": np.ones_like(ids)})
```
"""

from __future__ import annotations

import importlib.util
import os

import keras

from keras_transformers.backend.export import (
    onnx_friendly_arange,
    tensorflow_readable_stablehlo,
)

FORMATS = ("tf_saved_model", "litert", "onnx")

# (format, backend) -> why Keras cannot export it; every other pair can.
UNSUPPORTED = {
    ("tf_saved_model", "torch"): (
        "Keras' PyTorch SavedModel exporter needs torch_xla (built for the "
        "installed torch) and reads each input as one tensor, so the models' "
        "dict of inputs fails"
    ),
    ("litert", "jax"): (
        "Keras converts to LiteRT from TensorFlow or PyTorch models only"
    ),
}

# (format, backend) -> the Python modules the conversion needs.
REQUIRED = {
    ("tf_saved_model", "tensorflow"): ("tensorflow",),
    ("tf_saved_model", "jax"): ("tensorflow",),
    ("onnx", "tensorflow"): ("tf2onnx", "onnx"),
    ("onnx", "jax"): ("jax2onnx", "onnx"),
    ("onnx", "torch"): ("onnx",),
    ("litert", "tensorflow"): ("tensorflow",),
    ("litert", "torch"): ("litert_torch",),
}

# Pip distribution of each module, for the install hint.
_PIP_NAMES = {"litert_torch": "litert-torch"}


class ExportError(ValueError):
    """A model that cannot be exported in the asked format on this backend."""


def supported_backends(format: str) -> list[str]:
    """The backends on which Keras writes `format`."""
    check_format(format)
    return [
        backend
        for backend in ("tensorflow", "jax", "torch")
        if (format, backend) not in UNSUPPORTED
    ]


def check_format(format: str) -> None:
    if format not in FORMATS:
        raise ExportError(
            f"Unknown export format. Received: format={format!r}. "
            f"Supported formats: {', '.join(FORMATS)}."
        )


def _installed(format: str, backend: str) -> bool:
    return all(
        importlib.util.find_spec(name) is not None
        for name in REQUIRED.get((format, backend), ())
    )


def _alternatives(format: str, backend: str) -> str:
    """What works instead: other backends for `format`, other formats on
    `backend` (those whose converters are installed, if any are)."""
    backends = [b for b in supported_backends(format) if b != backend]
    formats = [f for f in FORMATS if f != format and (f, backend) not in UNSUPPORTED]
    other_backends = [b for b in backends if _installed(format, b)] or backends
    other_formats = [f for f in formats if _installed(f, backend)] or formats
    hints = []
    if other_backends:
        hints.append(
            f"export {format!r} under KERAS_BACKEND="
            + " or ".join(other_backends)
            + " (the weights load on every backend: save_to_preset, then "
            "from_preset there)"
        )
    if other_formats:
        hints.append(
            f"export {' or '.join(repr(f) for f in other_formats)} on {backend}"
        )
    return "; or ".join(hints)


def check_supported(format: str, backend: str | None = None) -> None:
    """Raises `ExportError` when Keras cannot write `format` on `backend`
    (default: the current one), and `ImportError` naming the package to
    install when a converter is missing."""
    backend = backend or keras.config.backend()
    _check_pair(format, backend)
    _check_packages(format, backend)


def _check_pair(format: str, backend: str) -> None:
    check_format(format)
    if (format, backend) in UNSUPPORTED:
        raise ExportError(
            f"Cannot export format={format!r} on the {backend} backend: "
            f"{UNSUPPORTED[format, backend]}. Instead, "
            f"{_alternatives(format, backend)}."
        )


def _check_packages(format: str, backend: str) -> None:
    missing = [
        name
        for name in REQUIRED.get((format, backend), ())
        if importlib.util.find_spec(name) is None
    ]
    if missing:
        packages = " ".join(_PIP_NAMES.get(name, name) for name in missing)
        hint = _alternatives(format, backend)
        raise ImportError(
            f"Exporting format={format!r} on the {backend} backend needs "
            f"{', '.join(missing)}: `pip install {packages}` "
            "(the `export` extra: `pip install keras-transformers[export]`)"
            + (f", or {hint}." if hint else ".")
        )


def input_names(model) -> list[str]:
    """The names of `model`'s inputs, in its family's vocabulary."""
    family = getattr(model, "family", "")
    config = getattr(model, "config", None)
    if family == "vit":
        return ["images"]
    if family == "transformer":
        return [
            "encoder_token_ids",
            "encoder_padding_mask",
            "decoder_token_ids",
            "decoder_padding_mask",
        ]
    if family in ("gpt", "mixtral", "bert"):
        names = ["token_ids", "padding_mask"]
        if family == "bert" and config.num_segments > 0:
            names.append("segment_ids")
        return names
    raise ExportError(
        "Only keras_transformers models (the gpt, mixtral, bert, transformer "
        "and vit families) have a known input signature. Received: "
        f"{type(model).__name__}. Pass `input_signature=` yourself."
    )


def input_specs(
    model,
    batch_size: int = 1,
    sequence_length: int | None = None,
    decoder_sequence_length: int | None = None,
    image_size: int | None = None,
) -> dict:
    """`{name: keras.InputSpec}` of fixed shapes for `model`'s inputs.

    Args:
        model: a keras_transformers model.
        batch_size: the fixed batch size `B`.
        sequence_length: the fixed length `T` of text inputs (the encoder's
            for seq2seq); required for text models, at most the config's
            `max_sequence_length`. Pad inputs to it (`padding_mask` 0).
        decoder_sequence_length: seq2seq only: the decoder's length
            (default `sequence_length`).
        image_size: vit only: the square image size (default the config's).

    Returns:
        A dict of `keras.InputSpec` with `name`, `shape` and `dtype` (int32
        ids and masks, float32 images).
    """
    names = input_names(model)
    batch_size = _positive("batch_size", batch_size)
    config = model.config
    if names == ["images"]:
        vision = config.vision
        size = _positive("image_size", image_size or vision.image_size)
        shape = (batch_size, size, size, vision.num_channels)
        return {"images": keras.InputSpec(shape=shape, dtype="float32", name="images")}
    if sequence_length is None:
        raise ExportError(
            f"Exporting {type(model).__name__} needs a fixed `sequence_length` "
            "(the artifact takes [batch_size, sequence_length] inputs; pad "
            "shorter inputs and set their padding_mask to 0). Received: "
            "sequence_length=None."
        )
    lengths = {"": _length("sequence_length", sequence_length, config)}
    lengths["decoder_"] = _length(
        "decoder_sequence_length",
        decoder_sequence_length or sequence_length,
        config,
    )
    specs = {}
    for name in names:
        prefix = "decoder_" if name.startswith("decoder_") else ""
        shape = (batch_size, lengths[prefix])
        specs[name] = keras.InputSpec(shape=shape, dtype="int32", name=name)
    return specs


def _positive(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ExportError(
            f"`{name}` must be a positive int. Received: {name}={value!r}"
        )
    return value


def _length(name, value, config):
    value = _positive(name, value)
    if value > config.max_sequence_length:
        raise ExportError(
            f"`{name}` must be at most max_sequence_length="
            f"{config.max_sequence_length}. Received: {name}={value}."
        )
    return value


def export_model(
    model,
    path,
    format: str = "tf_saved_model",
    batch_size: int = 1,
    sequence_length: int | None = None,
    decoder_sequence_length: int | None = None,
    image_size: int | None = None,
    input_signature=None,
    verbose: bool = False,
    **kwargs,
):
    """Exports `model`'s inference forward pass to `path` in `format`.

    Args:
        model: a keras_transformers model (float32 for ONNX).
        path: a SavedModel directory, a `.tflite` file (LiteRT) or an
            `.onnx` file.
        format: `"tf_saved_model"`, `"litert"` or `"onnx"`.
        batch_size, sequence_length, decoder_sequence_length, image_size:
            the fixed input shapes (see `input_specs`).
        input_signature: a structure of `keras.InputSpec` to use instead
            (as `keras.Model.export` takes it: a list with one dict).
        verbose: Keras' export messages.
        **kwargs: passed to `keras.Model.export` (e.g. `opset_version`).

    Returns:
        `path`.

    Raises:
        ExportError: the format cannot be written on this backend, or the
            conversion failed (the message names the cause and what works).
        ImportError: a converter package is missing.
    """
    backend = keras.config.backend()
    _check_pair(format, backend)
    path = os.fspath(path)
    if format == "litert" and not path.endswith(".tflite"):
        raise ExportError(
            f"A LiteRT artifact's path must end with '.tflite'. Received: {path!r}"
        )
    if format == "onnx" and model.dtype_policy.name != "float32":
        raise ExportError(
            "Keras exports ONNX from float32 models only. Received a model "
            f"with dtype policy {model.dtype_policy.name!r}: load it with "
            "dtype='float32' to export."
        )
    if input_signature is None:
        specs = input_specs(
            model, batch_size, sequence_length, decoder_sequence_length, image_size
        )
        input_signature = [specs]
    _check_packages(format, backend)
    shim = {"onnx": onnx_friendly_arange}.get(format, tensorflow_readable_stablehlo)
    try:
        with shim():
            keras.Model.export(
                model,
                path,
                format=format,
                verbose=verbose,
                input_signature=input_signature,
                **kwargs,
            )
    except ExportError:
        raise
    except ImportError as error:  # a converter's own dependency
        raise ImportError(
            f"Exporting format={format!r} on the {backend} backend: {error}"
        ) from None
    except Exception as error:
        message = str(error).strip().splitlines()
        first = message[0] if message else ""
        raise ExportError(
            f"Exporting {type(model).__name__} to format={format!r} on the "
            f"{backend} backend failed ({type(error).__name__}: {first[:300]})."
            + (f" Instead, {hint}." if (hint := _alternatives(format, backend)) else "")
        ) from None
    return path
