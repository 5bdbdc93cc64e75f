"""Generation for causal LMs: one compiled decode loop over a preallocated
KV cache, the same `call()` as training.

Prompts are right-padded to a bucketed length. One forward pass over the
shortest prompt, rounded up to a bucket, fills the cache, and its logits
at that prompt's last token choose the next position (`_begin_fn`); the
loop (`loop.py`) then produces position `i` from position `i - 1`, keeping
prompt tokens where a row's prompt is longer than the shortest one. A
sliding-window model's ring cache is filled with a bucketed prefix of
the shortest prompt only (see `_prefix_length`). Shapes are static, so XLA
compiles the loop once per bucket (JAX and TensorFlow); PyTorch runs it
eagerly without autograd, prefilling only the shortest prompt, with a
Python-int position (see `backend.while_loop`), or, for a model compiled
with `jit_compile=True`, as a Python loop over one `torch.compile`d step
with a tensor position over the same fixed-size cache
(`loop._decode_step`).

Each step runs the logits processors (`processors.py`: repetition penalty,
minimum length) before the sampler. Streaming and stop strings run the same
loop a chunk of positions at a time with the host in between
(`_chunked`; `stop_strings.py`). Defaults come from the model's
`generation_config` (`config.py`).
"""

from __future__ import annotations

import numpy as np
from keras import ops

from keras_transformers import backend
from keras_transformers.config.layer_types import recurrent, sliding_windows
from keras_transformers.generation import stop_strings as stop_strings_module
from keras_transformers.generation.config import generation_config, resolve_sampler
from keras_transformers.generation.loop import (
    _choose_fn,
    _compiled,
    _decode_step,
    _loop_index,
    decode_loop,
    initial_state,
)
from keras_transformers.generation.processors import (
    LogitsSettings,
    initial_presence,
    stop_mask,
)
from keras_transformers.generation.prompts import (  # noqa: F401 (re-exported)
    _check_ids,
    _check_rows,
    _prompt_rows,
    pad_rows,
)
from keras_transformers.generation.settings import (  # noqa: F401 (re-exported)
    DEFAULT_MAX_NEW_TOKENS,
    _max_new_tokens,
    _pick,
    _stop_ids,
    check_run_arguments,
)

BUCKET = 32


def _prefix_length(config, min_length, length):
    """Positions the prefill writes (None: the whole `length` buffer).

    Without a sliding window, the shortest prompt rounded up to a bucket:
    positions past a row's prompt hold garbage until the loop writes them,
    which causal attention never reads early. A sliding-window ring cache
    must see only real tokens (a slot written past a row's prompt would
    read as an earlier position), and so must a recurrent state
    ("linear_attention" layers: a token once folded in stays), so these
    prefill a bucketed prefix of the shortest prompt rounded down; the loop then feeds the
    remaining prompt tokens one by one, starting at position `prefix + 1`.
    Static lengths: one compiled program per bucket. Eager loops (PyTorch)
    have no program to share: they prefill exactly the shortest prompt, as
    Hugging Face does."""
    if backend.eager_loops():
        return min_length
    if not any(sliding_windows(config)) and not recurrent(config):
        prefix = -(-min_length // BUCKET) * BUCKET
        return None if prefix >= length else prefix
    return (min_length - 1) // BUCKET * BUCKET


def _prefill(model, token_ids, prefix=None, last=None):
    """A cache for the `[B, L]` buffer, filled with its first `prefix`
    positions (all of them when `prefix` is None), and, given a position
    `last` below `prefix`, the logits `[B, V]` there (else None)."""
    batch, length = token_ids.shape
    cache = model.backbone.init_cache(batch, length)
    if prefix is not None:
        if prefix == 0:
            return cache, None
        token_ids = token_ids[:, :prefix]
    hidden, cache = model.backbone(token_ids, cache=cache, cache_index=0)
    if last is None:
        return cache, None
    hidden = ops.take(hidden, ops.reshape(last, (1,)), axis=1)  # [B, 1, H]
    return cache, model.backbone.logits(hidden)[:, 0, :]


def _covers_start(prefix, start):
    """Whether the prefill reaches the position before `start`: then its
    logits there choose position `start` and the loop begins one later
    (no decoding step recomputes the last prompt token). Not for a
    sliding window's (or a recurrent state's) shorter prefix (see `_prefix_length`)."""
    return prefix is None or prefix >= start


def _begin_fn(model, spec, pad_id, prefix, settings, first):
    """`begin(token_ids, seen, consts, start) -> state`: the prefill, then,
    where `first` (see `_covers_start`), position `start` chosen from the
    prefill's last logits (state and consts as in `_step_fn`)."""
    choose = _choose_fn(spec, pad_id, settings)

    def begin(token_ids, seen, consts, start):
        cache, logits = _prefill(model, token_ids, prefix, start - 1 if first else None)
        state = initial_state(start, token_ids, cache, seen)
        return state if logits is None else choose(logits, state, consts)

    return begin


def _loop_fn(model, spec, pad_id, prefix, settings, first):
    begin = _begin_fn(model, spec, pad_id, prefix, settings, first)
    step = _decode_step(model, spec, pad_id, settings)

    def run(
        token_ids, seen, prompt_mask, limits, min_limits, uniforms, stop, start, end
    ):
        consts = (prompt_mask, limits, min_limits, uniforms, stop)
        state = begin(token_ids, seen, consts, start)
        state = decode_loop(step, state, consts, end)
        return state[1], state[4]

    return run


def _chunk_fn(model, spec, pad_id, settings):
    step = _decode_step(model, spec, pad_id, settings)

    def run(state, consts, end):
        return decode_loop(step, state, consts, end)

    return run


def generate(
    model,
    prompts,
    max_new_tokens: int | None = None,
    sampler: str | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    stop_token_ids="auto",
    seed: int | None = None,
    stream=None,
    stop_strings=None,
    min_new_tokens: int | None = None,
    repetition_penalty: float | None = None,
):
    """Generates continuations of `prompts` with a causal LM.

    Settings left at None take the model's `generation_config` (read from
    a Hugging Face checkpoint's `generation_config.json`), else the defaults
    below.

    Compilation follows the model's `compile(jit_compile=...)`, as in
    KerasHub: JAX and TensorFlow compile the whole decoding loop (XLA) in
    any case; PyTorch decodes eagerly unless the model was compiled with
    `jit_compile=True`, in which case each new token is one
    `torch.compile`d step over a preallocated, fixed-size KV cache with the
    position as a tensor (Hugging Face's "static cache"): one compilation
    per batch size and length bucket, then no recompilation per token. The
    tokens are the same either way.

    Args:
        model: a `CausalLM` (e.g. `GPTCausalLM`).
        prompts: a string or list of strings (needs `model.tokenizer`), a
            list of id lists of different lengths, a `[B, T]` id array, or a
            dict with `token_ids` and `padding_mask` (right padding).
        max_new_tokens: tokens to add to each prompt at most (default: the
            generation config's `max_new_tokens`, or its `max_length` minus
            the longest prompt, else 32).
        sampler: "greedy", "random", "top_k" or "top_p". None: greedy,
            unless `top_k` / `top_p` is given or the generation config has
            `do_sample` (then its temperature, top_k and top_p).
        temperature: softmax temperature of the random samplers (default 1).
        top_k: k of "top_k" (giving `top_k` alone selects it; with
            "top_p", the nucleus is taken among the top k).
        top_p: nucleus mass of "top_p" (giving `top_p` alone selects it).
        stop_token_ids: ids that end a row ("auto": the generation config's
            `eos_token_id`, an int or a list, else the model config's or the
            tokenizer's end token; None: never stop early). The stop token is
            kept in the output. The ids are an input of the compiled loop:
            other stop ids compile nothing new.
        seed: seed of the random samplers (same tokens on every backend).
        stream: optional callable `stream(tokens)` called after every step
            with a `[B]` int array of the new tokens (-1 where a row produced
            none). Streaming runs the compiled loop one step at a time.
        stop_strings: a string or list of strings (needs `model.tokenizer`):
            a row stops once its decoded completion contains one. Its ids
            end with the token that completes the string (as Hugging Face's
            `StopStringCriteria`); text results are cut right after it.
        min_new_tokens: the stop ids are masked (-inf) until a row has
            generated this many tokens (default 0).
        repetition_penalty: tokens already in the row (prompt or generated)
            have positive logits divided, negative ones multiplied, by it
            (Hugging Face's `RepetitionPenaltyLogitsProcessor`; default 1.0,
            no penalty).

    Returns:
        For text prompts, the prompt plus completion as strings (a single
        string for a single prompt); otherwise a `[B, T_out]` int32 NumPy
        array: each prompt followed by its completion, padded with
        `pad_token_id`.

    Raises:
        ValueError: an invalid setting, an empty or out-of-vocabulary
            prompt, a prompt too long for `max_sequence_length`, or text
            prompts / stop strings without a tokenizer.
    """
    defaults = generation_config(model)
    spec = resolve_sampler(defaults, sampler, temperature, top_k, top_p)
    settings = LogitsSettings(
        _pick(repetition_penalty, defaults.repetition_penalty, 1.0),
        _pick(min_new_tokens, defaults.min_new_tokens, 0),
    )
    strings = stop_strings_module.normalize(stop_strings)
    if strings and getattr(model, "tokenizer", None) is None:
        raise ValueError("`stop_strings` need a tokenizer: set `model.tokenizer`.")
    check_run_arguments(seed, stream)
    config = model.config
    rows, was_text, single = _prompt_rows(model, prompts)
    _check_ids(rows, config)
    lengths = np.array([len(r) for r in rows])
    max_new_tokens = _max_new_tokens(max_new_tokens, defaults, lengths, config)
    total = int(lengths.max()) + max_new_tokens
    _check_rows(rows, config, total)
    length = min(-(-total // BUCKET) * BUCKET, config.max_sequence_length)
    batch, pad_id = len(rows), config.pad_token_id
    token_ids = np.full((batch, length), pad_id, "int32")
    prompt_mask = np.zeros((batch, length), bool)
    for i, row in enumerate(rows):
        token_ids[i, : len(row)] = row
        prompt_mask[i, : len(row)] = True
    limits = (lengths + max_new_tokens).astype("int32")
    min_limits = (lengths + settings.min_new_tokens).astype("int32")
    uniforms = np.random.default_rng(seed).random((length, batch), dtype=np.float32)
    seen = initial_presence(token_ids, prompt_mask, config.vocabulary_size, settings)
    stop = stop_mask(_stop_ids(model, stop_token_ids), config.vocabulary_size)
    shortest = int(lengths.min())
    prefix = _prefix_length(config, shortest, length)
    start = shortest if prefix is None else min(shortest, prefix + 1)
    first = _covers_start(prefix, start)
    args = [token_ids, seen, prompt_mask, limits, min_limits, uniforms, stop]
    args = [ops.convert_to_tensor(a) for a in args]
    key = (spec, settings)
    checker = None
    if strings:
        checker = stop_strings_module.StopStringChecker(model.tokenizer, strings, batch)
    if stream is None and checker is None:
        fn = _compiled(
            model,
            ("loop", prefix, first),
            key,
            lambda: _loop_fn(model, spec, pad_id, prefix, settings, first),
        )
        out_ids, generated = fn(
            *args, _loop_index(model, start), backend.loop_index(total)
        )
        out_ids = np.asarray(ops.convert_to_numpy(out_ids))
        generated = np.asarray(ops.convert_to_numpy(generated))
    else:
        out_ids, generated = _chunked(
            model,
            (spec, settings),
            args,
            (start, total),
            (prefix, first),
            stream,
            checker,
        )
    return _finish(model, out_ids, generated, prompt_mask, was_text, single, checker)


def _chunked(model, key, args, span, prefill, callback, checker):
    """Runs the loop a chunk of positions at a time (one when streaming):
    between chunks, new tokens go to `callback` and `checker` (stop
    strings) marks rows done. `prefill` is `(prefix, first)` (see
    `_prefix_length`, `_covers_start`). Returns NumPy `(token_ids,
    generated)`."""
    spec, settings = key
    token_ids, seen, *consts = args
    pad_id = model.config.pad_token_id
    prefix, first = prefill
    begin = _compiled(
        model,
        ("begin", prefix, first),
        key,
        lambda: _begin_fn(model, spec, pad_id, prefix, settings, first),
    )
    chunk = _compiled(
        model, "chunk", key, lambda: _chunk_fn(model, spec, pad_id, settings)
    )

    def report(state, written):
        """Hands position `written` to `callback`, stops rows at a stop
        string; returns the state and its NumPy ids, generated, done."""
        ids, done, generated = (
            np.asarray(ops.convert_to_numpy(state[i])) for i in (1, 3, 4)
        )
        new = generated[:, written]
        if callback is not None and new.any():
            callback(np.where(new, ids[:, written], -1))
        if checker is not None:
            stopped = checker.update(ids, generated)
            if stopped:
                done[stopped] = True
                state = (*state[:3], ops.convert_to_tensor(done), *state[4:])
        return state, ids, generated, done

    start, end = span
    size = 1 if callback is not None else stop_strings_module.CHUNK
    state = begin(token_ids, seen, tuple(consts), _loop_index(model, start))
    position = start + 1 if first else start  # the next position to write
    state, ids, generated, done = report(state, position - 1)
    while position < end and not done.all():
        stop_at = min(position + size, end)
        state = chunk(tuple(state), tuple(consts), backend.loop_index(stop_at))
        state, ids, generated, done = report(state, stop_at - 1)
        position = stop_at
    if checker is not None:
        checker.trim(generated)
    return ids, generated


def _finish(model, token_ids, generated, prompt_mask, was_text, single, checker=None):
    keep = np.logical_or(generated, prompt_mask)
    rows = [row[k] for row, k in zip(token_ids, keep)]
    if not was_text:
        return pad_rows(rows, model.config.pad_token_id)
    decode = model.tokenizer.decode
    # The text given, then its continuation: without the special ids the
    # tokenizer put before it (e.g. <bos>).
    texts = [decode(r.tolist()[skip:]) for r, skip in zip(rows, was_text)]
    if checker is not None:
        for row in checker.keep:
            completion = decode(token_ids[row][generated[row]].tolist())
            texts[row] = checker.cut_text(texts[row], completion)
    return texts[0] if single else texts
