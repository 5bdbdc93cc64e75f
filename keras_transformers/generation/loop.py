"""The decoding loop shared by causal and seq2seq generation: its state,
one step (a cached forward pass of the previous token, then `choose`:
the logits processors and the sampler write the next position), and the
`ops.while_loop` that runs it; compiled functions are kept per model.

State: `(index, token_ids [B, L], cache, done [B], generated [B, L],
seen [B, V])`; constants: `(prompt_mask [B, L], limits [B], min_limits
[B], uniforms [L, B], stop [V])` (see `_step_fn`). The stop ids are an
input (`stop [V]`, `processors.stop_mask`), not part of a program: one
compiled loop serves every set of stop ids."""

from __future__ import annotations

from keras import ops

from keras_transformers import backend
from keras_transformers.backend import compile_function
from keras_transformers.backend.compiled import compile_step, compiled_decoding
from keras_transformers.generation.processors import (
    LogitsSettings,
    force_token,
    process_logits,
    update_presence,
)
from keras_transformers.generation.sampling import next_token


def _step_fn(model, spec, pad_id, call=None, settings=None):
    """The loop body: produce position `index` for every row.

    `call(token_ids [B, 1], cache, cache_index) -> (logits [B, 1, V], cache)`
    is one cached decoding step (default: `model.call_with_cache`). The
    state is `(index, token_ids [B, L], cache, done [B], generated [B, L],
    seen [B, V])` (see `processors`); `consts` is `(prompt_mask [B, L],
    limits [B], min_limits [B], uniforms [L, B], stop [V])` (`stop`: True
    at the ids that end a row)."""
    call = model.call_with_cache if call is None else call
    choose = _choose_fn(spec, pad_id, settings)

    def step(state, consts):
        index, token_ids, cache, *rest = state
        previous = _column(token_ids, index - 1)[:, None]  # [B, 1]
        logits, cache = call(previous, cache, index - 1)  # [B, 1, V]
        return choose(logits[:, 0, :], (index, token_ids, cache, *rest), consts)

    return step


def _choose_fn(spec, pad_id, settings=None):
    """`choose(logits [B, V], state, consts) -> state`: writes position
    `index` from the logits computed at `index - 1` (the logits
    processors, then the sampler; prompt tokens stay where a row's prompt
    is longer) and advances `index` (state and consts as in `_step_fn`)."""
    settings = LogitsSettings() if settings is None else settings

    def choose(logits, state, consts):
        index, token_ids, cache, done, generated, seen = state
        prompt_mask, limits, min_limits, uniforms, stop = consts
        logits = ops.cast(logits, "float32")  # [B, V]
        logits = process_logits(logits, index, seen, min_limits, stop, settings)
        if settings.forced_eos_token_id is not None:  # the last position
            last = index + 1 >= limits
            logits = force_token(logits, last, settings.forced_eos_token_id)
        uniform = ops.take(uniforms, index, axis=0) if spec.random else None  # [B]
        sampled = next_token(logits, uniform, spec)  # [B]
        in_prompt = _column(prompt_mask, index)  # [B]
        current = _column(token_ids, index)
        token = ops.where(in_prompt, current, ops.where(done, pad_id, sampled))
        new = ops.logical_and(ops.logical_not(in_prompt), ops.logical_not(done))
        token_ids = backend.update_cache(token_ids, token[:, None], index)
        generated = backend.update_cache(generated, new[:, None], index)
        seen = update_presence(seen, token, new, settings)
        hit = ops.logical_and(new, ops.take(stop, token, axis=0))  # [B]
        finished = ops.logical_or(index + 1 >= limits, hit)
        done = ops.logical_or(
            done, ops.logical_and(finished, ops.logical_not(in_prompt))
        )
        return index + 1, token_ids, cache, done, generated, seen

    return choose


def _column(x, index):
    """`x [B, L]` at position `index` -> `[B]`: `ops.slice`, or under
    `torch.compile` (a compiled step's tensor position) `ops.take`, which
    it traces (Keras' PyTorch slice reads a tensor start on the host)."""
    if backend.torch_compiling():
        return ops.take(x, index, axis=1)
    return ops.slice(x, (0, index), (x.shape[0], 1))[:, 0]


def initial_state(start, token_ids, cache, seen):
    """The loop state before the first step (see `_step_fn`)."""
    done = ops.zeros((token_ids.shape[0],), "bool")
    generated = ops.zeros(token_ids.shape, "bool")
    return (start, token_ids, cache, done, generated, seen)


def decode_loop(step, state, consts, end):
    """Runs `step` (from `_step_fn`) from the state's index to `end - 1`
    inside one `ops.while_loop`, stopping once every row is done.

    Returns the final state; its `token_ids [B, L]` and `generated [B, L]`
    (True where the loop wrote a new token) are items 1 and 4."""

    def cond(index, token_ids, cache, done, generated, seen):
        return ops.logical_and(index < end, ops.logical_not(ops.all(done)))

    def body(*state):
        return step(state, consts)

    return backend.while_loop(cond, body, tuple(state))


def _decode_step(model, spec, pad_id, settings):
    """`_step_fn`'s step, compiled on its own where the model decodes with a
    compiled step (PyTorch with `jit_compile=True`; its position is then a
    tensor, see `_loop_index`)."""
    step = _step_fn(model, spec, pad_id, settings=settings)
    return compile_step(step) if compiled_decoding(model) else step


def _loop_index(model, value):
    """The loop's start position: a tensor for a compiled step (one program
    for every position), else `backend.loop_index`."""
    if compiled_decoding(model):
        return ops.convert_to_tensor(value, "int32")
    return backend.loop_index(value)


def _compiled(model, kind, spec, make):
    """Compiled functions are kept on the model, one per kind of loop and
    sampler setting."""
    store = model.__dict__.setdefault("_generate_functions", {})
    key = (kind, spec, compiled_decoding(model))
    if key not in store:
        policy = model.dtype_policy
        direct = policy.compute_dtype == policy.variable_dtype  # no autocasting
        store[key] = compile_function(make(), model.variables, direct_calls=direct)
    return store[key]
