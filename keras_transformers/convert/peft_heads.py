"""The trained head of a sequence classifier's PEFT adapter.

A classifier's adapter (`task_type` `SEQ_CLS`) holds, beside the LoRA
factors, the head that trained whole, as PEFT's `modules_to_save` writes
it: one Linear under the converter's name for it, `score` (a decoder's,
`[num_classes, D]`) or `classifier` (BERT's, with its bias), e.g.
`base_model.model.score.weight`. Our head is the layer that LoRA leaves
trainable (`keras_transformers.lora.HEADS`).
"""

from __future__ import annotations

import keras
import numpy as np

from keras_transformers import lora
from keras_transformers.convert.common import assign
from keras_transformers.convert.peft_files import SEQ_CLS

# The PEFT task of each model class whose trained head an adapter holds.
HEAD_TASKS = {"GPTClassifier": SEQ_CLS, "BertClassifier": SEQ_CLS}


def task_head(model):
    """`(name, layer)` of the model's task head that LoRA leaves trainable
    (`lora.HEADS`: `score` or `classifier`), or None."""
    for name in lora.HEADS:
        layer = getattr(model, name, None)
        if isinstance(layer, keras.Layer):
            return name, layer
    return None


def _head_names(name: str, layer) -> list[str]:
    """A Linear head's tensor names: `{name}.weight` (and `.bias`)."""
    return [f"{name}.weight"] + ([f"{name}.bias"] if layer.bias is not None else [])


def _supported(model, name: str) -> None:
    cls = type(model).__name__
    if cls not in HEAD_TASKS:
        raise ValueError(
            f"PEFT adapters hold a trained head for sequence classifiers only "
            f"({', '.join(HEAD_TASKS)}); {cls}'s `{name}` head is not supported. "
            "Use `save_lora_weights()` / `load_lora_weights()` for its adapter."
        )


def head_tensors(model, tensors: dict) -> dict[str, np.ndarray]:
    """The model's trained head in `tensors` (its `exported` tensors), as
    PEFT's `modules_to_save` writes it, e.g. `{"score.weight": [C, D]}`.

    Raises:
        ValueError: a model class without a PEFT task for its head, or a
            layout whose head is not one Linear of the head's name.
    """
    name, layer = task_head(model)
    _supported(model, name)
    found = {k: v for k, v in tensors.items() if k.split(".")[0] == name}
    if set(found) != set(_head_names(name, layer)):
        raise ValueError(
            f"This Hugging Face layout names {type(model).__name__}'s head "
            f"{sorted(found)}, not one Linear `{name}`: PEFT adapters of it are "
            "not supported. Pass `model_type=` for another layout, or use "
            "`save_lora_weights()`."
        )
    return found


def check_head(model, task, saved: dict, directory) -> None:
    """Checks that the adapter's trained head `saved` (name -> array, see
    `peft_files.read_tensors`; `task`: its `task_type`) fits `model`: a
    classifier's adapter onto a classifier with as many classes, any other
    adapter onto a model without a head.

    Raises:
        ValueError: they do not fit; the message says what to load it onto.
    """
    found, cls = task_head(model), type(model).__name__
    if found is None:
        if saved or task == SEQ_CLS:
            weights = [v for k, v in saved.items() if k.endswith(".weight")]
            classes = weights[0].shape[0] if weights else "N"
            raise ValueError(
                f"{directory} is a sequence-classification adapter (task_type "
                f"{task!r}, trained head {sorted(saved)}), but {cls} has no "
                "classification head. Load it onto a classifier of the same base "
                f"model, e.g. GPTClassifier.from_preset(base, num_classes={classes}) "
                "(BertClassifier for BERT)."
            )
        return
    name, layer = found
    _supported(model, name)
    if not saved:
        raise ValueError(
            f"{directory} holds no trained `{name}` head (task_type {task!r}): it "
            f"adapts a model without {cls}'s head, such as a causal LM. Load it "
            "onto that model (e.g. GPTCausalLM.from_preset(base)); a classifier "
            "loads adapters trained with PEFT's task_type='SEQ_CLS'."
        )
    expected = _head_names(name, layer)
    if set(saved) != set(expected):
        raise ValueError(
            f"{directory} holds head tensors {sorted(saved)}, but {cls}'s head is "
            f"{expected}: the adapter was trained on another kind of model."
        )
    weight, (width, classes) = saved[expected[0]], layer.kernel.shape
    if weight.ndim != 2 or weight.shape[1] != width:
        raise ValueError(
            f"Adapter tensor {expected[0]} has shape {list(weight.shape)}, but this "
            f"model's head is [num_classes, hidden] = [{classes}, {width}]: the "
            "adapter was trained on another model."
        )
    if weight.shape[0] != classes:
        raise ValueError(
            f"The adapter's `{name}` head has {weight.shape[0]} classes, but this "
            f"{cls} has num_classes={classes}. Build the model with num_classes="
            f"{weight.shape[0]}, e.g. {cls}.from_preset(base, "
            f"num_classes={weight.shape[0]})."
        )


def assign_head(model, saved: dict) -> None:
    """Copies the adapter's head (checked by `check_head`) into `model`'s."""
    name, layer = task_head(model)
    assign(layer.kernel, saved[f"{name}.weight"], f"{name}.weight", transpose=True)
    if layer.bias is not None:
        assign(layer.bias, saved[f"{name}.bias"], f"{name}.bias")
