"""Checks on model inputs shared by every family, made before a backend
sees them: Python lists and text become arrays or clear errors, integer
arrays must fit the int32 ids the models compute with, batches must not be
empty, and images outside training must be finite.

`ConfiguredModel.__call__` runs `host_inputs` on every call; the
families' input checks (`check_token_ids`, `check_images`) call
`check_not_empty`, `check_id_range` and `check_finite`; `ChecksDataIds`
checks the token ids that `fit` / `evaluate` / `predict` get as NumPy
arrays, which their compiled steps cannot read.
"""

from __future__ import annotations

import numpy as np
from keras import ops

from keras_transformers.backend import concrete_numpy

INT32 = np.iinfo(np.int32)


def _host_array(value, name: str):
    """`value` as a NumPy array when it is a Python list, number, None or a
    NumPy array; tensors pass unchanged.

    Raises:
        ValueError: text, a ragged nested list, non-numeric values, or
            integers beyond the int32 range.
    """
    if isinstance(value, (str, bytes)):
        raise ValueError(
            f"`{name}` is text ({value!r:.40}). Models take token ids: encode the "
            "text first (e.g. `model.tokenizer.encode(text)`), or pass strings to "
            "`generate()`."
        )
    if value is None or isinstance(value, (list, tuple, int, float)):
        try:
            value = np.asarray(value)
        except ValueError:
            raise ValueError(
                f"`{name}` is a ragged nested list: pad every sequence to one length "
                "(and pass a padding mask), or give an array."
            ) from None
    if not isinstance(value, np.ndarray):
        return value
    if value.dtype.kind not in "biuf":
        raise ValueError(
            f"`{name}` must hold numbers. Received dtype {value.dtype}: "
            "tokenize text into ids first."
        )
    if value.dtype.kind in "iu" and value.size:
        low, high = int(value.min()), int(value.max())
        if low < INT32.min or high > INT32.max:
            bad = low if low < INT32.min else high
            raise ValueError(
                f"`{name}` holds {bad}, outside the int32 range of token ids: the "
                "ids do not come from this model's tokenizer."
            )
    return value


# Hugging Face's input names -> this library's (a model would ignore them).
HF_NAMES = {
    "input_ids": "`token_ids` (`encoder_token_ids` for a seq2seq source)",
    "attention_mask": "`padding_mask` (`encoder_padding_mask` for a seq2seq source)",
    "token_type_ids": "`segment_ids`",
    "decoder_input_ids": "`decoder_token_ids`",
    "decoder_attention_mask": "`decoder_padding_mask`",
    "pixel_values": "`images` (channels last)",
}


def host_inputs(inputs):
    """Model inputs (a dict, or one value) with Python lists made arrays
    and host values checked (see `_host_array`); Hugging Face's input names
    raise a ValueError naming ours."""
    if isinstance(inputs, dict):
        for key in inputs:
            if key in HF_NAMES:
                raise ValueError(
                    f"`{key}` is Hugging Face's name for this input; here it is "
                    f"{HF_NAMES[key]}. Rename the key (the model would not read "
                    f"`{key}`). Received keys: {sorted(map(str, inputs))}"
                )
        return {k: _host_array(v, str(k)) for k, v in inputs.items()}
    return _host_array(inputs, "inputs")


def check_not_empty(name: str, shape) -> None:
    """Raises ValueError when a known dimension of `shape` is 0."""
    if any(size == 0 for size in shape):
        raise ValueError(
            f"`{name}` is empty (shape {tuple(shape)}): pass at least one "
            "sequence (or image) with at least one element."
        )


def check_finite(name: str, values) -> None:
    """Raises ValueError when `values` hold NaN or infinity, which every
    output would inherit. Checked where the values are known now (NumPy
    inputs, eager calls: one reduction and a scalar read), not while
    tracing."""
    if isinstance(values, np.ndarray):
        finite = np.isfinite(values).all()
    else:
        finite = concrete_numpy(ops.all(ops.isfinite(values)))
    if finite is not None and not finite:
        raise ValueError(
            f"`{name}` contains NaN or infinite values. Check the data pipeline "
            "(e.g. a division by zero in preprocessing)."
        )


def check_id_range(values, name: str, limit_name: str, limit: int, hint: str) -> None:
    """Raises ValueError when integer `values` (NumPy) hold an id outside
    `[0, limit)`; `hint` says what to do."""
    if values is None or not values.size:
        return
    low, high = int(values.min()), int(values.max())
    if low < 0 or high >= limit:
        bad = high if high >= limit else low
        raise ValueError(
            f"`{name}` contains id {bad}, outside [0, {limit_name}={limit}). {hint}"
        )


class ChecksDataIds:
    """Mixin for the models: token ids given to `fit`, `evaluate` or
    `predict` as NumPy arrays (bare, or under a `*token_ids` key of a dict)
    are checked on the host first (one min / max per array); a compiled
    step cannot read them, and an id past the vocabulary would give NaN
    logits without a word. Datasets and generators pass unchecked."""

    def fit(self, *args, **kwargs):
        self._check_data_ids(args, kwargs)
        return super().fit(*args, **kwargs)

    def evaluate(self, *args, **kwargs):
        self._check_data_ids(args, kwargs)
        return super().evaluate(*args, **kwargs)

    def predict(self, *args, **kwargs):
        self._check_data_ids(args, kwargs)
        return super().predict(*args, **kwargs)

    def _check_data_ids(self, args, kwargs) -> None:
        if not self.config.vocabulary_size:  # an image model
            return
        x = args[0] if args else kwargs.get("x")
        items = x.items() if isinstance(x, dict) else (("token_ids", x),)
        for name, value in items:
            ids = str(name).endswith("token_ids") and isinstance(value, np.ndarray)
            if ids and value.dtype.kind in "iu":
                check_not_empty(str(name), value.shape)
                hint = "Check that the tokenizer matches the model."
                vocabulary = self.config.vocabulary_size
                check_id_range(value, str(name), "vocabulary_size", vocabulary, hint)
