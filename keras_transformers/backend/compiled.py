"""Compiled training on PyTorch (`compile(jit_compile=True)`, Keras'
`torch.compile` path): the state every compiled step must start from.

`torch.compile` guards a compiled program on the Python-visible state it
read. Keras' PyTorch train step begins with `zero_grad()`, which reads
whether each weight has a gradient: none before the first step, one after
every later step. Without help the second step recompiles the whole train
step (as long again as the first, on CPU tens of seconds).
"""

from __future__ import annotations

import keras


def prepare_train_function(model) -> None:
    """Before `model`'s train function is made (or reused): where PyTorch
    compiles it, gives every trainable weight a zero gradient, the state
    each later step starts from, so the first compilation serves them all.
    The gradients would exist from the first step on anyway; nothing
    changes elsewhere."""
    if keras.config.backend() != "torch" or not model.jit_compile:
        return
    import torch

    with torch.no_grad():
        for variable in model.trainable_variables:
            value = variable.value
            if value.grad is None and value.requires_grad:
                value.grad = torch.zeros_like(value)
