"""Compiled training on PyTorch (`compile(jit_compile=True)`, Keras'
`torch.compile` path): the state every compiled step must start from.

`torch.compile` guards a compiled program on the Python-visible state it
read, and recompiles whenever a guard fails. Two pieces of Keras state
change between steps unless prepared:

* Keras' PyTorch train step begins with `zero_grad()`, which reads whether
  each weight has a gradient: none before the first step, one after every
  later step. Without help the second step recompiles the whole train step
  (as long again as the first, on CPU tens of seconds).
* Layers that call `add_loss` (the MoE router's load-balancing and z-losses)
  keep the loss tensors in their `_losses` lists until the next call clears
  them. A step then starts with an empty list (step 1), the previous step's
  tensors (step 2), then other tensors (step 3, the guarded ones freed): a
  new graph at each of the first steps. Compiled steps clear the lists when
  they end, so every step starts with them empty.
"""

from __future__ import annotations

import keras


def prepare_train_function(model) -> None:
    """Before `model`'s train function is made (or reused): where PyTorch
    compiles it, gives every trainable weight a zero gradient, the state
    each later step starts from, and makes each train step clear the
    `add_loss` losses of every layer when it ends (`model.losses` is empty
    between compiled steps), so the first compilation serves them all.
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
    model._clear_losses()
    if "train_step" not in model.__dict__:
        model.train_step = _clearing_losses(model, model.train_step)


def _clearing_losses(model, train_step):
    """`train_step` followed by clearing every layer's `add_loss` losses
    (traced by `torch.compile` as part of the step: no graph break)."""

    def step(data):
        logs = train_step(data)
        model._clear_losses()
        return logs

    return step


def compiled_decoding(model) -> bool:
    """Whether `generate` decodes with one compiled step per token: PyTorch
    with `model.compile(jit_compile=True)`. (JAX and TensorFlow always
    compile the whole decoding loop; eager PyTorch runs it as Python.)"""
    return keras.config.backend() == "torch" and bool(model.jit_compile)


def compile_step(fn):
    """`fn(*tensors)`, one decoding step, through `torch.compile` without
    autograd. Its position is a 0-d tensor and its KV cache a fixed-size
    buffer written in place (`update_cache`), so every step runs the same
    compiled program: one compilation per input shape (batch size and
    buffer length), never one per token. The weights are read as graph
    inputs (no per-call snapshot, see `backend.compile_function`)."""
    import torch

    from keras_transformers import backend

    compiled = torch.compile(fn)

    def run(*args):
        previous = backend._VALUES[0], backend._MEMO[0]
        backend._VALUES[0] = backend._MEMO[0] = None
        try:
            with torch.no_grad():
                return compiled(*args)
        finally:
            backend._VALUES[0], backend._MEMO[0] = previous

    return run


def slice_rows(x, start, length: int):
    """`x[start : start + length]` along the first axis, `start` an int or
    a scalar int tensor: `keras.ops.slice`, except under `torch.compile`
    with a tensor `start` (a compiled decoding step's position), where the
    rows are gathered (`index_select`, traced) rather than `start` read on
    the host (Keras' PyTorch slice: a graph break)."""
    from keras_transformers.backend import _torch_tensor, torch_compiling

    if torch_compiling() and not isinstance(start, int):
        import torch

        x, start = _torch_tensor(x), _torch_tensor(start)
        rows = start.long() + torch.arange(length, device=start.device)
        return torch.index_select(x, 0, rows)
    starts = (start,) + (0,) * (len(x.shape) - 1)
    return keras.ops.slice(x, starts, (length, *x.shape[1:]))
