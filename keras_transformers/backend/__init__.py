"""The one package allowed to import a backend directly (this module and
the modules beside it).

Everything here is a fast path behind one function, with a pure `keras`
fallback that gives the same numbers.
"""

from __future__ import annotations

import contextlib
import math

import keras

from keras_transformers.backend.rows import update_cache  # noqa: F401

if keras.config.backend() == "jax":  # before JAX starts: see `xla_flags`
    from keras_transformers.backend.xla_flags import set_cpu_scheduler

    set_cpu_scheduler()

_DIRECT_CALLS = [False]
# Variable id -> its torch tensor, for the duration of one eager decoding call
# (see `compile_function`): reading `Variable.value` costs ~10 us on PyTorch.
_VALUES = [None]
# Per-call memo of eager decoding (see `memo`).
_MEMO = [None]


def call_layer(layer, *args, **kwargs):
    """Calls a layer. Inside `direct_calls` or `compile_function(...,
    direct_calls=True)` on PyTorch it skips Keras' `Layer.__call__`
    bookkeeping (~50 us per call: the per-token cost of eager decoding,
    about half the step time, and a fifth of a small model's training step)
    and runs `layer.call` of a built layer; everywhere else it is
    `layer(*args, **kwargs)`. Callers pass `training` explicitly wherever
    the layer has dropout (no call context propagates it)."""
    if _DIRECT_CALLS[0] and layer.built:
        return layer.call(*args, **kwargs)
    return layer(*args, **kwargs)


def call_block(layer, *args, **kwargs):
    """`call_layer` for a whole transformer block: inside `direct_calls`,
    `layer.call` directly unless Keras' `Layer.__call__` has work to do for
    it (rematerialisation, an activity regularizer). That spares a
    training step Keras' per-call bookkeeping (its call spec, argument
    binding, traceback wrapper and name scope) for every block; callers
    pass `training` explicitly."""
    if (
        _DIRECT_CALLS[0]
        and layer.built
        and getattr(layer, "_remat_mode", None) is None
        and layer.activity_regularizer is None
    ):
        return layer.call(*args, **kwargs)
    return layer(*args, **kwargs)


@contextlib.contextmanager
def direct_calls(layers):
    """While PyTorch runs `layers` (transformer blocks) eagerly, `call_layer`
    inside them calls their sub-layers directly. Only where every layer
    computes in its variables' dtype (no autocasting, which `Layer.__call__`
    does); `call_block` calls the blocks themselves directly too, except
    where Keras must run them (rematerialisation); the model's own call
    still clears and collects losses. Elsewhere, and when already direct,
    nothing changes."""
    if (
        keras.config.backend() != "torch"
        or _DIRECT_CALLS[0]
        or any(
            layer.dtype_policy.compute_dtype != layer.dtype_policy.variable_dtype
            for layer in layers
        )
    ):
        yield
        return
    _DIRECT_CALLS[0] = True
    try:
        yield
    finally:
        _DIRECT_CALLS[0] = False


def compile_function(fn, variables, direct_calls=False, donate=()):
    """Compiles `fn(*tensors)` for inference where the backend compiles.

    JAX: `jax.jit` of a pure function, with `variables` passed as
    arguments through a `keras.StatelessScope` (no weights baked into the
    program, so it stays valid after training). TensorFlow:
    `tf.function(jit_compile=True)` (XLA). PyTorch: eager under
    `torch.no_grad()` (no autograd bookkeeping per token) and, with
    `direct_calls=True` (only for models whose compute and variable dtypes
    agree: no autocasting needed), `call_layer` runs `layer.call` directly
    and the fast paths below read each variable's tensor from a snapshot
    taken once per call (weights do not change while decoding) and `memo`
    keeps per-step values shared by the layers. `donate`: positions of
    arguments whose buffers the result may reuse (JAX's `donate_argnums`;
    a KV cache passed in and returned, which is then updated in place
    instead of copied per call; the caller must not read the argument
    again). Elsewhere it has no effect.
    """
    backend = keras.config.backend()
    if backend == "jax":
        import jax

        def pure(values, *args):
            with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                return fn(*args)

        jitted = jax.jit(pure, donate_argnums=tuple(i + 1 for i in donate))
        return lambda *args: jitted([v.value for v in variables], *args)
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, jit_compile=True, autograph=False)
    if backend == "torch":
        import torch

        def no_grad(*args):
            previous = _DIRECT_CALLS[0], _VALUES[0], _MEMO[0]
            _DIRECT_CALLS[0] = direct_calls
            if direct_calls:
                _VALUES[0] = {id(v): v.value for v in variables}
                _MEMO[0] = {}
            try:
                with torch.no_grad():
                    return fn(*args)
            finally:
                _DIRECT_CALLS[0], _VALUES[0], _MEMO[0] = previous

        return no_grad
    return fn


def memo(key, compute):
    """`compute()`, computed once per key while PyTorch decodes eagerly
    (inside `compile_function(..., direct_calls=True)`): work every layer
    repeats within a step, such as the positions and rotary angles of the
    new tokens, is then done for the first layer only. Elsewhere (compiled
    backends trace each layer, and XLA deduplicates) it calls `compute()`.
    `key` must determine the value (e.g. hold the tensors it depends on); a
    callable `key` is called only while memoizing (so a key built from
    `id(tensor)` is never traced by `torch.compile`)."""
    store = _MEMO[0]
    if store is None:
        return compute()
    key = key() if callable(key) else key
    if key not in store:
        store[key] = compute()
    return store[key]


def eager_loops() -> bool:
    """Whether decode loops run as Python loops (PyTorch, eager): their
    position index then stays a Python int, which keeps Keras' `ops.slice`
    on its fast path and spares tensor arithmetic per token."""
    return keras.config.backend() == "torch"


def loop_index(value: int):
    """A decode-loop position: a Python int where loops run eagerly (see
    `eager_loops`), else an int32 scalar tensor, so one compiled program
    serves every start position."""
    return int(value) if eager_loops() else keras.ops.convert_to_tensor(value, "int32")


def while_loop(cond, body, loop_vars):
    """`keras.ops.while_loop`, except that eager loops (PyTorch) leave the
    loop variables as they are (Keras converts them to tensors, turning a
    Python-int index into a tensor)."""
    if not eager_loops():
        return keras.ops.while_loop(cond, body, loop_vars)
    loop_vars = tuple(loop_vars)
    while bool(cond(*loop_vars)):
        loop_vars = tuple(body(*loop_vars))
    return loop_vars


def in_shape_inference() -> bool:
    """True while Keras traces a model for its output shapes only (no data).

    `fit()` under `tf.distribute` builds the model from the first batch
    averaged over the replicas, which turns integer token ids into floats:
    input checks accept that trace (and cast back) instead of rejecting it.
    """
    from keras.src.backend.common.symbolic_scope import in_symbolic_scope

    return in_symbolic_scope()


def scale_loss_for_distribution(value):
    """`value / replicas` under `tf.distribute` (elsewhere `value`), as
    Keras' own losses do: the replicas' gradients are summed, so each
    replica's mean loss must count for its share of the global batch."""
    from keras.src.losses.loss import scale_loss_for_distribution

    return scale_loss_for_distribution(value)


def concrete_numpy(x):
    """`x` as a numpy array when its value is known now (eager execution),
    or None while tracing or compiling (then checks must wait for run time;
    under `torch.compile` reading a value would break the graph)."""
    import numpy as np

    if isinstance(x, (np.ndarray, list, tuple, int)):
        return np.asarray(x)
    if keras.config.backend() == "tensorflow":
        import tensorflow as tf

        if not tf.executing_eagerly():
            return None
    if keras.config.backend() == "torch" and torch_compiling():
        return None
    try:
        return keras.ops.convert_to_numpy(x)
    except Exception:  # a tracer or symbolic tensor
        return None


def none_if_all_true(mask):
    """`mask`, or None where it is known now to be all True (no padding):
    eager PyTorch outside `torch.compile`, where attention then runs the
    unmasked (or causal) kernel with no mask to build or read, as Hugging
    Face does; costs one device sync. Traced backends keep the mask."""
    if mask is None or keras.config.backend() != "torch":
        return mask
    import torch

    if not isinstance(mask, torch.Tensor) or mask.is_meta:  # symbolic build
        return mask
    if torch.compiler.is_compiling():
        return mask
    return None if bool(mask.all()) else mask


def torch_compiling() -> bool:
    """Whether `torch.compile` is tracing the running code (PyTorch with
    `jit_compile=True`): code that reads tensor values or branches on them
    must then take its traceable path."""
    if keras.config.backend() != "torch":
        return False
    import torch

    return torch.compiler.is_compiling()


def after(x, previous):
    """`x`, computed only once `previous` is (a tensor). TensorFlow's graph
    executor otherwise runs independent work as soon as its inputs exist:
    every block of blockwise attention at once, with all their transients
    (measured: 6 layers at 2,048 tokens, 4.6 GB unordered, 4.1 GB
    ordered). Elsewhere `x` (JAX orders a program's work itself; PyTorch
    runs eagerly in order)."""
    if keras.config.backend() != "tensorflow":
        return x
    import tensorflow as tf

    with tf.control_dependencies([previous]):
        return tf.identity(x)


def xla_cpu() -> bool:
    """Whether JAX computes on its CPU backend (XLA:CPU)."""
    if keras.config.backend() != "jax":
        return False
    import jax

    return jax.default_backend() == "cpu"


def supports_native_gqa() -> bool:
    """Whether `dot_product_attention` below attends grouped K/V heads
    without repeating them (JAX natively, PyTorch through `enable_gqa`)."""
    return keras.config.backend() in ("jax", "torch")


def dot_product_attention(query, key, value, mask=None, scale=None, is_causal=False):
    """Fused attention on `[B, T, N, H]` queries and `[B, S, K, H]` keys/values.

    PyTorch: `scaled_dot_product_attention` called directly, with
    `enable_gqa=True` for grouped K/V heads (Keras' op repeats them) and
    without Keras' per-call dtype and flash-attention checks. Elsewhere:
    `keras.ops.dot_product_attention`. `mask` is boolean, True = attend,
    broadcastable to `[B, N, T, S]`.
    """
    if keras.config.backend() != "torch":
        return keras.ops.dot_product_attention(
            query, key, value, mask=mask, scale=scale, is_causal=is_causal
        )
    import torch

    q, k, v = (_torch_tensor(t).transpose(1, 2) for t in (query, key, value))
    if mask is not None:  # additive and finite: fully masked rows stay finite
        mask = _torch_tensor(mask).to(torch.bool)
        mask = torch.where(mask, 0.0, torch.finfo(q.dtype).min).to(q.dtype)
    out = torch.nn.functional.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=mask,
        is_causal=is_causal and mask is None,
        scale=scale,
        enable_gqa=q.shape[1] != k.shape[1],
    )
    return out.transpose(1, 2)


def _torch_tensor(x):
    """A torch tensor as it is; anything else (a Keras variable, an array)
    through `convert_to_tensor` (which applies autocasting). In a symbolic
    call (Keras traces on PyTorch's "meta" device) a variable's stand-in has
    the variable's dtype, not the autocast one: it is cast here, so that a
    mixed-precision layer's output spec has the compute dtype."""
    import torch

    if isinstance(x, torch.Tensor):
        return x
    value = None if _VALUES[0] is None else _VALUES[0].get(id(x))
    if value is not None:
        return value
    value = keras.ops.convert_to_tensor(x)
    if value.device.type == "meta" and isinstance(x, keras.Variable):
        value = x._maybe_autocast(value)
    return value


def from_numpy(array):
    """A numpy constant (e.g. rotary frequencies) as a tensor: on PyTorch
    `torch.from_numpy` on Keras' device, which `torch.compile` traces (Keras'
    `convert_to_tensor` reads the array's dtype there, a graph break);
    elsewhere `keras.ops.convert_to_tensor`."""
    if keras.config.backend() != "torch":
        return keras.ops.convert_to_tensor(array)
    import torch
    from keras.src.backend.torch.core import get_device

    return torch.from_numpy(array).to(get_device())


def value(variable):
    """`keras.ops.convert_to_tensor(variable)`; while PyTorch decodes eagerly
    (see `compile_function`), the tensor from that call's weight snapshot."""
    if keras.config.backend() == "torch":
        return _torch_tensor(variable)
    return keras.ops.convert_to_tensor(variable)


def linear(x, kernel, bias, contracted):
    """`x [..., C_1..C_n] @ kernel [C_1..C_n, O_1..O_m] + bias [O_1..O_m]`
    (`n = contracted`; bias may be None) -> `[..., O_1..O_m]`, as one
    PyTorch `linear` (the bias added inside the matrix product) over the
    flattened `C` and `O` axes; on XLA:CPU and TensorFlow as one 2-D
    product `[N, C] @ [C, O]` with `N` the flattened leading axes (see
    `_flat_linear`). None where that does not apply (JAX off the CPU, or
    operands of different dtypes, whose promotion the caller's Keras op
    handles): the caller then computes it with Keras ops."""
    if xla_cpu() or keras.config.backend() == "tensorflow":
        return _flat_linear(x, kernel, bias, contracted)
    if keras.config.backend() != "torch":
        return None
    import torch

    x, kernel = _torch_tensor(x), _torch_tensor(kernel)
    bias = None if bias is None else _torch_tensor(bias)
    if x.dtype != kernel.dtype or (bias is not None and bias.dtype != x.dtype):
        return None
    inner, outer = kernel.shape[:contracted], kernel.shape[contracted:]
    c, o = math.prod(inner), math.prod(outer)
    if contracted > 1:
        x = x.reshape(*x.shape[:-contracted], c)
    # Reshapes only where needed: each is a view that autograd records and
    # walks back in a training step (~10 us per projection each way).
    if bias is not None and bias.ndim != 1:
        bias = bias.reshape(o)
    if kernel.ndim != 2:
        kernel = kernel.reshape(c, o)
    out = torch.nn.functional.linear(x, kernel.T, bias)
    return out if len(outer) == 1 else out.reshape(*out.shape[:-1], *outer)


def _flat_linear(x, kernel, bias, contracted):
    """`linear` on XLA:CPU and TensorFlow. Given a 3-D `[B, T, C] x [C, O]` product,
    XLA:CPU computes the kernel's gradient from a transposed copy of the
    `[B, T, O]` output gradient, with the elementwise backward that produces
    it (SiLU's, log-softmax's) fused into that strided copy: a SwiGLU
    feed-forward's forward and backward (`[8, 256, 256]`, F 1024) takes
    105 ms that way and 45 ms as 2-D products, an 8192-word LM head with its
    cross-entropy 406 ms vs 146 ms. On TensorFlow, `tf.einsum` for
    `"btd,dnh->btnh"` then `"btnh,nhd->btd"` with a SiLU between, forward
    and backward (`[8, 256, 512]`, 8 heads of 64), takes 75 ms compiled by
    XLA and 60 ms eagerly; the 2-D products 61 and 58 ms. The reshapes are
    free (row-major)."""
    from keras import ops

    dtype = keras.backend.standardize_dtype
    if dtype(x.dtype) != dtype(kernel.dtype) or (
        bias is not None and dtype(bias.dtype) != dtype(x.dtype)
    ):
        return None
    lead = tuple(ops.shape(x)[: len(x.shape) - contracted])  # TF: None dims
    outer = tuple(kernel.shape[contracted:])
    c = math.prod(kernel.shape[:contracted])
    out = ops.matmul(ops.reshape(x, (-1, c)), ops.reshape(kernel, (c, -1)))
    if bias is not None:
        out = out + ops.reshape(bias, (-1,))
    return ops.reshape(out, lead + outer)


def norm(x, weight, bias, epsilon, rms=False):
    """Layer norm (or RMS norm with `rms=True`) over the last axis on
    PyTorch (fused `layer_norm`; RMS norm as `x * rsqrt(mean(x^2) + eps)`,
    Hugging Face's formula), when `x` and the weights are all float32 (no
    casts needed); None otherwise: the caller then uses Keras' op, which
    computes half-precision inputs in float32."""
    if keras.config.backend() != "torch":
        return None
    import torch

    x, weight = _torch_tensor(x), _torch_tensor(weight)
    bias = None if bias is None else _torch_tensor(bias)
    dtypes = {x.dtype, weight.dtype} | ({bias.dtype} if bias is not None else set())
    if dtypes != {torch.float32}:
        return None
    if rms:  # torch 2.13's fused CPU rms_norm is ~10x slower without autograd
        variance = x.pow(2).mean(-1, keepdim=True)
        return weight * (x * torch.rsqrt(variance + epsilon))
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, epsilon)


def tensorflow_module():
    """TensorFlow, imported on first use, for `tf.data` preprocessing paths
    only (keras-hub's graph tokenizers run in TensorFlow whatever the Keras
    backend); never a compute backend outside `KERAS_BACKEND=tensorflow`."""
    import tensorflow

    return tensorflow
