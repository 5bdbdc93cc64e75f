"""Compiled training on PyTorch (`compile(jit_compile=True)`, Keras'
`torch.compile` path): the train function, which compiles the forward pass
and the loss and runs the rest of the step eagerly, compiled decoding
steps, and `run_eagerly` for work left out of a graph; on TensorFlow,
`BuildsBeforeTracing` and `prepare_tensorflow_step`, so that a train or
test step is traced once and its trace is freed with its model.

`torch.compile` guards a compiled program on the Python-visible state it
read, and recompiles whenever a guard fails. Keras state that changes
between steps therefore stays outside the compiled function:

* Keras' PyTorch train step calls `zero_grad()`, whose result (a gradient
  or none per weight) differs between the first step and later ones: it
  runs eagerly, with `backward()` and the optimizer update.
* Layers that call `add_loss` (the MoE router's load-balancing and z-losses)
  keep the loss tensors in their `_losses` lists until the next call clears
  them. A step would start with an empty list (step 1), the previous step's
  tensors (step 2), then other tensors (step 3, the guarded ones freed): a
  new graph at each of the first steps. The lists are cleared after each
  compiled step, so every step starts with them empty.
* A model's first call records Keras' call context and each layer's name
  scope. A model that was never called (one marked built, which `fit`
  does not build symbolically, such as `DPOModel`) is called once on
  symbolic inputs before its first compiled step, as `fit` does for an
  unbuilt model; otherwise the second step would compile again.
"""

from __future__ import annotations

import functools

import keras
import numpy as np


def _eager_call():
    """On PyTorch, `call(f, args, kwargs)` marked `torch.compiler.disable`
    (made once, at import: creating it inside a compiled region would break
    the graph there and recompile the caller later); elsewhere None."""
    if keras.config.backend() != "torch":
        return None
    import torch

    return torch.compiler.disable(lambda f, args, kwargs: f(*args, **kwargs))


_EAGER_CALL = _eager_call()


def run_eagerly(fn, *args, **kwargs):
    """`fn(*args, **kwargs)`; on PyTorch outside any `torch.compile` graph
    (a graph break: `torch.compiler.disable`). For work that compiles slowly
    and gains little from it, such as an optimizer update over every
    variable (multi-tensor kernels already, as `torch.optim` runs them)."""
    if _EAGER_CALL is None:
        return fn(*args, **kwargs)
    return _EAGER_CALL(fn, args, kwargs)


def prepare_tensorflow_step(model):
    """On TensorFlow, before `model`'s train function is traced: its
    optimizer built (`build_optimizer_first`), its traces collectable
    (`collectable_traces`) and its update run after the backward pass
    (`update_after_gradients`). Nothing elsewhere."""
    if keras.config.backend() == "tensorflow":
        build_optimizer_first(model)
        optimizer = getattr(model, "optimizer", None)
        collectable_traces(optimizer)
        update_after_gradients(optimizer)


def build_before_tracing(model, iterator=None, data_batch=None):
    """On TensorFlow without a `tf.distribute` strategy: `model`'s layers,
    compiled metrics and loss and optimizer built symbolically from the
    data's shapes before `fit` or `evaluate` first traces a step, as Keras
    builds them on JAX and PyTorch (and on TensorFlow under a strategy).
    Keras otherwise creates them inside the first trace, and a `tf.function`
    that creates variables there traces the whole step a second time (a
    2-layer BERT classifier fitted with an accuracy metric: two traces of
    its train step, whose metric variables were made in the first). A
    model without compiled metrics and with its layers built is left
    alone: building its loss symbolically would trace its forward pass
    for nothing.
    `iterator`: Keras' epoch iterator (its dataset's element spec gives the
    shapes; no batch is read), or `data_batch` (`train_on_batch`). Returns
    False where Keras' own hook is to run instead."""
    if keras.config.backend() != "tensorflow" or model._distribute_strategy is not None:
        return False
    metrics = getattr(model, "_compile_metrics", None)
    if (metrics is None or metrics.built) and all(
        layer.built for layer in model._flatten_layers()
    ):
        return True  # nothing to create in a trace (the optimizer: `build_optimizer_first`)
    import tensorflow as tf

    if data_batch is None:
        dataset = getattr(iterator, "_distributed_dataset", None)
        data_batch = getattr(dataset, "element_spec", None)
        specs = keras.tree.flatten(data_batch) if data_batch is not None else [None]
        if not all(isinstance(spec, tf.TensorSpec) for spec in specs):
            return False  # ragged or sparse data, or an unknown iterator
    model._symbolic_build(data_batch=data_batch)
    return True


class BuildsBeforeTracing:
    """Mixin for `keras.Model`s: on TensorFlow, `fit` and `evaluate` trace
    their step once (`build_before_tracing`, through the hook Keras'
    TensorFlow trainer calls before it makes its functions)."""

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if not build_before_tracing(self, iterator, data_batch):
            super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)


def build_optimizer_first(model):
    """Builds `model`'s optimizer eagerly before its train function is first
    traced. Keras otherwise builds it inside that trace (unless a
    distribution strategy is set), and a `tf.function` that creates
    variables in its first trace traces the whole step a second time: half
    of the first `fit` step of a small model (measured: gpt2_tiny, 5.1 s of
    CPU time, 2.4 s with the optimizer built first). Keras builds it the
    same way (`optimizer.build(model.trainable_variables)`); a model with a
    layer not yet built is left to Keras."""
    optimizer = getattr(model, "optimizer", None)
    if (
        optimizer is None
        or optimizer.built
        or model._distribute_strategy is not None  # Keras builds it first
        or not all(layer.built for layer in model._flatten_layers())
    ):
        return
    optimizer.build(model.trainable_variables)


def collectable_traces(optimizer):
    """Without a `tf.distribute` strategy, `optimizer` (and the one a loss
    scale optimizer wraps) takes its gradients as they are instead of
    summing them over the one replica. Keras' TensorFlow optimizer sums
    them with the replica context's `all_reduce`, which registers a gradient
    function in TensorFlow's process-wide registry at every trace (a
    `tf.custom_gradient` in graph mode); that function holds the traced
    graph, so every train function ever traced, with its model's graph,
    stayed in memory until the process ended (gpt2_tiny at one layer:
    ~9,500 objects per model fitted, a test process grew to 9 GB, and each
    garbage collection scanned them all). Under a strategy, Keras' sum
    runs as before."""
    for each in (optimizer, getattr(optimizer, "inner_optimizer", None)):
        if each is None or "_all_reduce_sum_gradients" in vars(each):
            continue
        keras_sum = each._all_reduce_sum_gradients
        each._all_reduce_sum_gradients = functools.partial(_one_replica_sum, keras_sum)


def update_after_gradients(optimizer):
    """`optimizer`'s update in a traced TensorFlow step waits for every
    gradient, as `optimizer.step()` follows `backward()` in PyTorch.

    TensorFlow's executor runs an operation as soon as its inputs exist,
    and Keras' decoupled weight decay (`AdamW`'s `w -= lr * rate * w`)
    needs no gradient: it would run at the step's start, while the forward
    pass still holds every weight for its backward pass, and TensorFlow
    writes to a copy of a variable that another tensor still reads: a
    second copy of every decayed weight at the step's peak. SmolLM2-135M's
    shape at 2,048 tokens on a 2-core CPU (AdamW, alternating processes):
    TensorFlow's peak allocation 4.71-4.91 GB without this ordering,
    4.24-4.31 GB with it; the process's peak resident memory 7.45-7.71 GB
    against 6.96-7.05 GB, at the same step time. The numbers are the same
    either way (the update reads what it read before). Eager updates
    (outside `tf.function`) run as they are."""
    if optimizer is None or "apply" in vars(optimizer):
        return
    optimizer.apply = functools.partial(_apply_after_gradients, optimizer.apply)


def _apply_after_gradients(keras_apply, grads, trainable_variables=None):
    import tensorflow as tf

    grads = list(grads)
    if tf.executing_eagerly():
        return keras_apply(grads, trainable_variables)
    # One operation that waits for all gradients, and each update on it
    # alone: a control edge from every gradient to every update operation
    # (SmolLM2's shape: 270 x about 3,000) took 1.9 GB more resident memory
    # and a 25% slower first step to optimize the graph.
    backward = tf.group(*[g for g in grads if g is not None])
    with tf.control_dependencies([backward]):
        return keras_apply(grads, trainable_variables)


def _one_replica_sum(keras_sum, grads_and_vars):
    import tensorflow as tf

    if tf.distribute.has_strategy():
        return keras_sum(grads_and_vars)
    return list(grads_and_vars)


def train_function(model, force=False, check_inputs=None):
    """`model`'s train function where PyTorch compiles it (else None: Keras
    makes its own). It runs Keras' PyTorch `train_step` with the forward
    pass and the loss as one `torch.compile`d function (whose backward
    `torch.compile` compiles too, as for a compiled `nn.Module`), and the
    rest eagerly: clearing gradients, `loss.backward()`, the optimizer
    update, the loss tracker and the metrics. Keras compiles the whole
    step instead; `torch.compile` then breaks the graph at `backward()`,
    traces the forward again for every frame between the compiled function
    and the break, and guards on every weight's gradient (GPT-2 small's
    first compiled step on a 2-core CPU took 126 s that way, 68 s with
    `train_step` compiled directly). The `add_loss` losses the forward
    adds are part of the compiled loss and cleared after each step
    (`model.losses` is empty between compiled steps, so every step runs the
    first compilation). NumPy inputs (`train_on_batch`) are checked by
    `check_inputs(x)` (the model's host-input checks) and made tensors
    before the compiled function sees them: Dynamo cannot read an array's
    dtype. Nothing changes elsewhere."""
    if (
        keras.config.backend() != "torch"
        or not model.jit_compile
        or model.steps_per_execution > 1  # Keras explains that PyTorch refuses it
    ):
        return None
    if model.train_function is not None and not force:
        return model.train_function
    import torch

    check_losses_survive_compiling(model, torch.__version__)

    def forward_and_loss(x, y, sample_weight):
        y_pred = model(x, training=True) if model._call_has_training_arg else model(x)
        loss = model._compute_loss(
            x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True
        )
        return y_pred, loss

    model._clear_losses()
    compiled = torch.compile(forward_and_loss)

    def one_step_on_data(data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data[0])
        x = check_inputs(x) if check_inputs is not None else x
        x, y, sample_weight = keras.tree.map_structure(
            lambda v: (
                keras.ops.convert_to_tensor(v) if isinstance(v, np.ndarray) else v
            ),
            (x, y, sample_weight),
        )
        if not model._called:
            _call_symbolically(model, x)
        model.zero_grad()
        y_pred, loss = compiled(x, y, sample_weight)
        model._clear_losses()
        batch = next(i for i in keras.tree.flatten(x) if i is not None).shape[0]
        model._loss_tracker.update_state(loss, sample_weight=batch)
        if model.optimizer is not None:
            loss = model.optimizer.scale_loss(loss)
        weights = model.trainable_weights[:]
        if weights:
            loss.backward()
            with torch.no_grad():
                model.optimizer.apply([v.value.grad for v in weights], weights)
        return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    model.train_function = one_step_on_data
    return one_step_on_data


def _call_symbolically(model, x):
    """Calls `model` on symbolic tensors shaped like `x` (Keras' symbolic
    build), which records what a first call records and computes nothing."""
    symbolic = keras.tree.map_structure(
        lambda v: None if v is None else keras.KerasTensor(v.shape, v.dtype), x
    )
    if model._call_has_training_arg:
        model(symbolic, training=False)
    else:
        model(symbolic)


def check_losses_survive_compiling(model, torch_version):
    """Raises if `model` has layers that add losses (`add_loss`: the MoE
    router's load-balancing and z-losses) and `torch_version` is older than
    2.13: there `torch.compile` drops those losses from the compiled step
    (seen on torch 2.11, on CPU and CUDA: the loss of a compiled MoE step
    lacked its router loss), so training would silently leave them out."""
    major, minor = (int(part) for part in torch_version.split(".")[:2])
    if (major, minor) >= (2, 13):
        return
    adders = [
        layer.name
        for layer in model._flatten_layers()
        if getattr(layer, "router_aux_loss_coef", 0)
        or getattr(layer, "router_z_loss_coef", 0)
    ]
    if adders:
        raise ValueError(
            f"torch {torch_version} leaves the router losses of "
            f"{len(adders)} layer(s) ({', '.join(adders[:3])}) out of a "
            "`torch.compile`d training step. Install torch>=2.13, or compile "
            "with jit_compile=False."
        )


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
