"""Generation for causal LMs: one compiled decode loop over a preallocated
KV cache, the same `call()` as training.

Prompts are right-padded to a bucketed length. One forward pass over the
shortest prompt, rounded up to a bucket, fills the cache; the loop then
produces position `i` from position `i - 1`, keeping prompt tokens where a
row's prompt is longer than the shortest one. A sliding-window model's
rolling cache is filled with a bucketed prefix of the shortest prompt only
(see `_prefix_length`). Shapes are static, so XLA compiles the loop once per
bucket (JAX and TensorFlow); PyTorch runs it eagerly without autograd,
prefilling only the shortest prompt, with a Python-int position (see
`backend.while_loop`).
"""

from __future__ import annotations

import numpy as np
from keras import ops

from keras_transformers import backend
from keras_transformers.backend import compile_function
from keras_transformers.generation.sampling import SamplerSpec, next_token

BUCKET = 32


def _prompt_rows(model, prompts, ids_key="token_ids", mask_key="padding_mask"):
    """Normalises prompts to a list of id lists; returns (rows, was_text, single).

    A dict gives its ids under `ids_key` and its (right-padding) mask under
    `mask_key`; strings are encoded with `model.tokenizer`."""
    single = isinstance(prompts, str)
    if single:
        prompts = [prompts]
    if isinstance(prompts, dict):
        ids = np.asarray(ops.convert_to_numpy(prompts[ids_key]))
        mask = prompts.get(mask_key)
        mask = (
            np.ones_like(ids, bool)
            if mask is None
            else np.asarray(ops.convert_to_numpy(mask)).astype(bool)
        )
        return [list(r[m]) for r, m in zip(ids, mask)], False, False
    if isinstance(prompts, (list, tuple)) and prompts and isinstance(prompts[0], str):
        if getattr(model, "tokenizer", None) is None:
            raise ValueError(
                "Text prompts need a tokenizer: pass token ids, or attach one with "
                "`model.tokenizer = ...` (presets saved with a tokenizer restore it)."
            )
        return [list(model.tokenizer.encode(p)) for p in prompts], True, single
    array = (
        prompts if isinstance(prompts, (list, tuple)) else ops.convert_to_numpy(prompts)
    )
    if isinstance(array, np.ndarray) and array.ndim == 1:
        array = array[None]
        single = True
    rows = [list(np.asarray(r).reshape(-1)) for r in array]
    return rows, False, single


def _check_ids(rows, config, noun="prompt", arg="prompts"):
    """Every row is non-empty with ids in [0, vocabulary_size)."""
    if not rows:
        raise ValueError(f"`{arg}` is empty: pass at least one {noun}.")
    for i, row in enumerate(rows):
        if len(row) == 0:
            example = "a BOS id" if noun == "prompt" else "the end token"
            raise ValueError(
                f"{noun.capitalize()} {i} is empty: generation needs at least one "
                f"token (e.g. {example})."
            )
        bad = [t for t in row if not 0 <= int(t) < config.vocabulary_size]
        if bad:
            raise ValueError(
                f"{noun.capitalize()} {i} contains id {int(bad[0])}, outside "
                f"[0, vocabulary_size={config.vocabulary_size}). Check that the "
                "tokenizer matches the model."
            )


def _check_rows(rows, config, total):
    _check_ids(rows, config)
    if total > config.max_sequence_length:
        raise ValueError(
            f"Prompt length {max(map(len, rows))} plus max_new_tokens needs {total} positions, "
            f"more than max_sequence_length={config.max_sequence_length}. "
            "Shorten the prompt or lower `max_new_tokens`."
        )


def _stop_ids(model, stop_token_ids):
    if stop_token_ids == "auto":
        eos = model.config.eos_token_id
        if eos is None and getattr(model, "tokenizer", None) is not None:
            eos = getattr(model.tokenizer, "eos_token_id", None)
        return () if eos is None else (int(eos),)
    if stop_token_ids is None:
        return ()
    return tuple(int(t) for t in stop_token_ids)


def _step_fn(model, spec, stop_ids, pad_id, call=None):
    """The loop body: produce position `index` for every row.

    `call(token_ids [B, 1], cache, cache_index) -> (logits [B, 1, V], cache)`
    is one cached decoding step (default: `model.call_with_cache`)."""
    call = model.call_with_cache if call is None else call
    stop = (
        None if not stop_ids else ops.convert_to_tensor(np.asarray(stop_ids, "int32"))
    )

    def step(index, token_ids, cache, done, generated, prompt_mask, limits, uniforms):
        batch = token_ids.shape[0]
        previous = ops.slice(token_ids, (0, index - 1), (batch, 1))  # [B, 1]
        logits, cache = call(previous, cache, index - 1)  # [B, 1, V]
        uniform = ops.take(uniforms, index, axis=0) if spec.random else None  # [B]
        sampled = next_token(logits[:, 0, :], uniform, spec)  # [B]
        in_prompt = ops.slice(prompt_mask, (0, index), (batch, 1))[:, 0]
        current = ops.slice(token_ids, (0, index), (batch, 1))[:, 0]
        token = ops.where(in_prompt, current, ops.where(done, pad_id, sampled))
        new = ops.logical_and(ops.logical_not(in_prompt), ops.logical_not(done))
        token_ids = backend.update_cache(token_ids, token[:, None], index)
        generated = backend.update_cache(generated, new[:, None], index)
        finished = index + 1 >= limits
        if stop is not None:
            hit = ops.any(token[:, None] == stop[None, :], axis=-1)
            finished = ops.logical_or(finished, ops.logical_and(new, hit))
        done = ops.logical_or(
            done, ops.logical_and(finished, ops.logical_not(in_prompt))
        )
        return index + 1, token_ids, cache, done, generated

    return step


def _prefix_length(config, min_length, length):
    """Positions the prefill writes (None: the whole `length` buffer).

    Without a sliding window, the shortest prompt rounded up to a bucket:
    positions past a row's prompt hold garbage until the loop writes them,
    which causal attention never reads early. A rolling (sliding-window)
    cache must see only real tokens, in order, so it prefills a bucketed
    prefix of the shortest prompt rounded down; the loop then feeds the
    remaining prompt tokens one by one, starting at position `prefix + 1`.
    Static lengths: one compiled program per bucket. Eager loops (PyTorch)
    have no program to share: they prefill exactly the shortest prompt but
    its last token, as Hugging Face does."""
    if backend.eager_loops():
        return min_length - 1
    if config.sliding_window is None:
        prefix = -(-min_length // BUCKET) * BUCKET
        return None if prefix >= length else prefix
    return (min_length - 1) // BUCKET * BUCKET


def _prefill(model, token_ids, prefix=None):
    """A cache for the `[B, L]` buffer, filled with its first `prefix`
    positions (all of them when `prefix` is None)."""
    batch, length = token_ids.shape
    cache = model.backbone.init_cache(batch, length)
    if prefix is not None:
        if prefix == 0:
            return cache
        token_ids = token_ids[:, :prefix]
    _, cache = model.backbone(token_ids, cache=cache, cache_index=0)
    return cache


def decode_loop(step, token_ids, cache, prompt_mask, limits, uniforms, start, end):
    """Runs `step` (from `_step_fn`) for positions `start .. end - 1` inside
    one `ops.while_loop`, stopping once every row is done.

    Returns `(token_ids [B, L], generated [B, L])`, `generated` True where
    the loop wrote a new token."""
    done = ops.zeros((token_ids.shape[0],), "bool")
    generated = ops.zeros(token_ids.shape, "bool")

    def cond(index, token_ids, cache, done, generated):
        return ops.logical_and(index < end, ops.logical_not(ops.all(done)))

    def body(index, token_ids, cache, done, generated):
        return step(
            index, token_ids, cache, done, generated, prompt_mask, limits, uniforms
        )

    state = backend.while_loop(cond, body, (start, token_ids, cache, done, generated))
    return state[1], state[4]


def _loop_fn(model, spec, stop_ids, pad_id, prefix=None):
    step = _step_fn(model, spec, stop_ids, pad_id)

    def run(token_ids, prompt_mask, limits, uniforms, start, end):
        cache = _prefill(model, token_ids, prefix)
        return decode_loop(
            step, token_ids, cache, prompt_mask, limits, uniforms, start, end
        )

    return run


def generate(
    model,
    prompts,
    max_new_tokens: int = 32,
    sampler: str = "greedy",
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop_token_ids="auto",
    seed: int | None = None,
    stream=None,
):
    """Generates continuations of `prompts` with a causal LM.

    Args:
        model: a `CausalLM` (e.g. `GPTCausalLM`).
        prompts: a string or list of strings (needs `model.tokenizer`), a
            list of id lists of different lengths, a `[B, T]` id array, or a
            dict with `token_ids` and `padding_mask` (right padding).
        max_new_tokens: tokens to add to each prompt at most.
        sampler: "greedy", "random", "top_k" or "top_p".
        temperature: softmax temperature for the random samplers.
        top_k: k for "top_k" (giving `top_k` alone selects it).
        top_p: nucleus mass for "top_p" (giving `top_p` alone selects it).
        stop_token_ids: ids that end a row ("auto": the config's or the
            tokenizer's end token; None: never stop early). The stop token is
            kept in the output.
        seed: seed of the random samplers (same tokens on every backend).
        stream: optional callable `stream(tokens)` called after every step
            with a `[B]` int array of the new tokens (-1 where a row produced
            none). Streaming runs the compiled step in a Python loop.

    Returns:
        For text prompts, the prompt plus completion as strings (a single
        string for a single prompt); otherwise a `[B, T_out]` int32 NumPy
        array: each prompt followed by its completion, padded with
        `pad_token_id`.
    """
    if sampler == "greedy" and top_k is not None:
        sampler = "top_k"
    if sampler == "greedy" and top_p is not None:
        sampler = "top_p"
    spec = SamplerSpec(sampler, float(temperature), top_k, top_p)
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(
            f"`max_new_tokens` must be a positive integer. Received: {max_new_tokens!r}"
        )
    config = model.config
    rows, was_text, single = _prompt_rows(model, prompts)
    lengths = np.array([len(r) for r in rows])
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
    uniforms = np.random.default_rng(seed).random((length, batch), dtype=np.float32)
    stop_ids = _stop_ids(model, stop_token_ids)
    shortest = int(lengths.min())
    prefix = _prefix_length(config, shortest, length)
    start = shortest if prefix is None else min(shortest, prefix + 1)
    end = total
    args = [token_ids, prompt_mask, limits, uniforms]
    args = [ops.convert_to_tensor(a) for a in args]
    if stream is None:
        fn = _compiled(
            model,
            "loop" if prefix is None else ("loop", prefix),
            spec,
            stop_ids,
            lambda: _loop_fn(model, spec, stop_ids, pad_id, prefix),
        )
        out_ids, generated = fn(
            *args,
            backend.loop_index(start),
            backend.loop_index(end),
        )
    else:
        out_ids, generated = _stream(
            model, spec, stop_ids, pad_id, args, start, end, stream, prefix
        )
    return _finish(
        model,
        np.asarray(ops.convert_to_numpy(out_ids)),
        np.asarray(ops.convert_to_numpy(generated)),
        prompt_mask,
        was_text,
        single,
    )


def _compiled(model, kind, spec, stop_ids, make):
    """Compiled functions are kept on the model, one per sampler setting."""
    store = model.__dict__.setdefault("_generate_functions", {})
    key = (kind, spec, stop_ids)
    if key not in store:
        policy = model.dtype_policy
        direct = policy.compute_dtype == policy.variable_dtype  # no autocasting
        store[key] = compile_function(make(), model.variables, direct_calls=direct)
    return store[key]


def _stream(model, spec, stop_ids, pad_id, args, start, end, callback, prefix=None):
    token_ids, prompt_mask, limits, uniforms = args
    step = _step_fn(model, spec, stop_ids, pad_id)
    prefill = _compiled(
        model,
        "prefill" if prefix is None else ("prefill", prefix),
        None,
        (),
        lambda: lambda ids: _prefill(model, ids, prefix),
    )
    step_c = _compiled(model, "step", spec, stop_ids, lambda: step)
    cache = prefill(token_ids)
    done = ops.zeros((token_ids.shape[0],), "bool")
    generated = ops.zeros(token_ids.shape, "bool")
    index = backend.loop_index(start)
    for i in range(start, end):
        index, token_ids, cache, done, generated = step_c(
            index, token_ids, cache, done, generated, prompt_mask, limits, uniforms
        )
        new = np.asarray(ops.convert_to_numpy(generated[:, i]))
        tokens = np.where(new, np.asarray(ops.convert_to_numpy(token_ids[:, i])), -1)
        if new.any():
            callback(tokens)
        if bool(np.asarray(ops.convert_to_numpy(ops.all(done)))):
            break
    return token_ids, generated


def _finish(model, token_ids, generated, prompt_mask, was_text, single):
    keep = np.logical_or(generated, prompt_mask)
    rows = [row[k] for row, k in zip(token_ids, keep)]
    if was_text:
        texts = [model.tokenizer.decode(r.tolist()) for r in rows]
        return texts[0] if single else texts
    return pad_rows(rows, model.config.pad_token_id)


def pad_rows(rows, pad_id):
    """Id rows of different lengths -> a right-padded `[B, T_max]` int32 array."""
    out = np.full((len(rows), max(len(r) for r in rows)), pad_id, "int32")
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out
