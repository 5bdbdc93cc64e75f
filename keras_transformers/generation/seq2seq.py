"""Generation for encoder-decoder models (`Seq2SeqLM`): greedy decoding,
sampling and beam search, each one compiled loop.

Source rows are right-padded to a bucketed length with a padding mask; the
encoder runs once and the cross-attention keys/values are projected once
(`Seq2SeqBackbone.init_cache`). The decoder then produces one target token
per step from the self-attention KV cache, starting from the start token.
Shapes are static, so XLA compiles one program per (source, target) bucket
pair on JAX and TensorFlow; PyTorch runs the same loop eagerly without
autograd, or, for a model compiled with `jit_compile=True`, as one
`torch.compile`d step per token (greedy decoding, sampling and beam
search).

Shape letters: B batch, S source length, L target buffer length (start
token included), N beams.
"""

from __future__ import annotations

import inspect
import numbers

import numpy as np
from keras import ops

from keras_transformers import backend
from keras_transformers.backend.compiled import compile_step, compiled_decoding
from keras_transformers.config.validation import (
    check_argument_choice,
    check_argument_int,
)
from keras_transformers.generation.beam_search import BeamSpec, beam_search
from keras_transformers.generation.config import generation_config, resolve_sampler
from keras_transformers.generation.generate import (
    BUCKET,
    _check_ids,
    _pick,
    _prompt_rows,
    _stop_ids,
    check_run_arguments,
    pad_rows,
)
from keras_transformers.generation.loop import (
    _compiled,
    _loop_index,
    _step_fn,
    decode_loop,
    initial_state,
)
from keras_transformers.generation.processors import (
    LogitsSettings,
    initial_presence,
    stop_mask,
)

DICT_KEYS = ("encoder_token_ids", "encoder_padding_mask")
DEFAULT_MAX_NEW_TOKENS = 64


def _bucket(length: int, cap: int) -> int:
    return min(-(-length // BUCKET) * BUCKET, cap)


def _source_rows(model, inputs):
    """Source id lists; returns (rows, was_text, single)."""
    if isinstance(inputs, dict):
        unknown = sorted(set(inputs) - set(DICT_KEYS))
        if "encoder_token_ids" not in inputs or unknown:
            raise ValueError(
                f"A dict of inputs has 'encoder_token_ids' and optionally "
                f"'encoder_padding_mask' (right padding). Received keys: {sorted(inputs)}"
            )
    rows, was_text, single = _prompt_rows(model, inputs, *DICT_KEYS)
    if was_text:  # a source sentence ends with the end token
        eos = model.config.eos_token_id
        if eos is None:
            eos = getattr(model.tokenizer, "eos_token_id", None)
        if eos is not None:
            rows = [r if r and int(r[-1]) == eos else list(r) + [eos] for r in rows]
    return rows, was_text, single


def _greedy_fn(model, spec, pad_id, settings):
    """`(source_ids [B, S], source_mask [B, S], token_ids [B, L], ...) ->
    (token_ids [B, L], generated [B, L])`, the loop of `generate.py` fed by
    the encoder-decoder cache. The loop's cache is `(decoder cache,
    source_mask)`, so that one step function (on PyTorch with
    `jit_compile=True`, one `torch.compile`d step) serves every call."""

    def call(ids, cache, index):
        inner, source_mask = cache
        logits, inner = model.call_with_cache(ids, inner, index, source_mask)
        return logits, (inner, source_mask)

    step = _step_fn(model, spec, pad_id, call, settings)
    if compiled_decoding(model):
        step = compile_step(step)

    def run(source_ids, source_mask, token_ids, seen, consts, start, end):
        encoded = model.backbone.encode(source_ids, source_mask)  # [B, S, D]
        cache = model.backbone.init_cache(encoded, token_ids.shape[1])
        state = initial_state(start, token_ids, (cache, source_mask), seen)
        state = decode_loop(step, state, consts, end)
        return state[1], state[4]

    return run


def _check_settings(config, max_new_tokens, num_beams, spec, return_all_beams):
    """Validates the search settings; returns `max_new_tokens` as an int."""
    max_new_tokens = check_argument_int("max_new_tokens", max_new_tokens, 1)
    check_argument_choice("return_all_beams", return_all_beams, (True, False))
    if max_new_tokens + 1 > config.max_sequence_length:
        raise ValueError(
            f"max_new_tokens={max_new_tokens} plus the start token needs "
            f"{max_new_tokens + 1} target positions, more than "
            f"max_sequence_length={config.max_sequence_length}."
        )
    if not isinstance(num_beams, int) or num_beams < 1:
        raise ValueError(
            f"`num_beams` must be an integer >= 1. Received: num_beams={num_beams!r}"
        )
    if spec.random and (num_beams > 1 or return_all_beams):
        raise ValueError(
            f"Beam search is deterministic: sampler={spec.name!r} (or top_k / top_p) "
            f"cannot be combined with num_beams={num_beams} or return_all_beams. "
            "Use num_beams=1 to sample."
        )
    return max_new_tokens


def _pad_sources(rows, config):
    longest = max(len(r) for r in rows)
    if longest > config.max_sequence_length:
        raise ValueError(
            f"A source has {longest} tokens, more than max_sequence_length="
            f"{config.max_sequence_length}. Shorten or split it."
        )
    width = _bucket(longest, config.max_sequence_length)
    ids = np.full((len(rows), width), config.pad_token_id, "int32")
    mask = np.zeros((len(rows), width), bool)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
        mask[i, : len(row)] = True
    return ids, mask


def generate(
    model,
    inputs,
    max_new_tokens: int | None = None,
    num_beams: int = 1,
    length_penalty: float = 0.6,
    length_penalty_style: str = "gnmt",
    early_stopping: bool | str = True,
    sampler: str | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    start_token_id: int | None = None,
    stop_token_ids="auto",
    return_all_beams: bool = False,
    min_new_tokens: int | None = None,
    repetition_penalty: float | None = None,
):
    """Generates target sequences for source sequences with a `Seq2SeqLM`.

    Args:
        model: a `Seq2SeqLM`.
        inputs: a string or list of strings (needs `model.tokenizer`; the
            end token is appended where the tokenizer does not add it), a
            list of source id lists of different lengths, a `[B, S]` int
            array, or a dict with `encoder_token_ids [B, S]` and optional
            `encoder_padding_mask [B, S]` (True for real tokens, right
            padding).
        max_new_tokens: target tokens to generate at most per input, the
            stop token included (default: the generation config's
            `max_new_tokens`, or its `max_length` minus the start token,
            else 64).
        num_beams: 1 decodes greedily (or samples, see `sampler`); N > 1
            runs beam search with N beams.
        length_penalty: alpha of the beam-search length normalisation; 0
            ranks hypotheses by summed log-probability, larger values favour
            longer ones. Ignored when num_beams=1.
        length_penalty_style: "gnmt": score / `((5 + length) / 6) ** alpha`
            (Wu et al., 2016; Vaswani et al., 2017 used alpha=0.6, 4 beams);
            "power": score / `length ** alpha`, as Hugging Face `transformers`
            (same tokens as its `generate(num_beams=N, length_penalty=alpha)`).
        early_stopping: beam search only. True: an input is done once it
            has `num_beams` finished hypotheses; False: once the best running
            beam cannot beat the worst finished one at its current length (a
            heuristic); "never": the same at the maximum length (Hugging
            Face's meanings).
        sampler: "greedy", "random", "top_k" or "top_p" (num_beams=1 only).
            None: greedy, unless `top_k` / `top_p` is given or the
            generation config has `do_sample` (as in
            `keras_transformers.generation.generate`).
        temperature: softmax temperature of the random samplers.
        top_k: k of "top_k" (giving `top_k` alone selects it).
        top_p: nucleus mass of "top_p" (giving `top_p` alone selects it).
        seed: seed of the random samplers (same tokens on every backend).
        start_token_id: the decoder's first input; default the generation
            config's `decoder_start_token_id`, else `config.bos_token_id`.
        stop_token_ids: ids that end a target ("auto": the generation
            config's `eos_token_id`, else the config's or the tokenizer's
            end token; None: always generate `max_new_tokens`).
        return_all_beams: also return every finished beam and its score
            (runs beam search, with one beam when num_beams=1).
        min_new_tokens: num_beams=1 only: the stop ids are masked until
            this many target tokens were generated (default 0).
        repetition_penalty: num_beams=1 only: Hugging Face's repetition
            penalty over the target so far, the start token included
            (default 1.0: none).

    Returns:
        For id inputs, a `[B, T_out]` int32 NumPy array of the generated
        target ids (without the start token, with the stop token where one
        was produced, padded with `pad_token_id`). For text inputs, the
        decoded strings (a single string for a single string input). With
        `return_all_beams`, a pair `(targets, scores)`: targets `[B, N,
        T_out]` (text: lists of N strings), best first, and their
        length-normalised scores `[B, N]`.

    Examples:
        >>> from keras_transformers.models import Seq2SeqLM
        >>> lm = Seq2SeqLM.from_preset("transformer_tiny")
        >>> lm.generate([[5, 6, 7, 2], [8, 2]], max_new_tokens=4).shape[0]
        2
        >>> lm.generate([[5, 6, 7, 2]], max_new_tokens=4, num_beams=4, stop_token_ids=None).shape
        (1, 4)
    """
    defaults = generation_config(model)
    spec = resolve_sampler(defaults, sampler, temperature, top_k, top_p)
    forced_bos = _forced(defaults.forced_bos_token_id, model.config)
    forced_eos = _forced(defaults.forced_eos_token_id, model.config)
    settings = LogitsSettings(
        _pick(repetition_penalty, defaults.repetition_penalty, 1.0),
        _pick(min_new_tokens, defaults.min_new_tokens, 0),
        forced_eos,
    )
    config = model.config
    if max_new_tokens is None:
        max_new_tokens = defaults.max_new_tokens
    if max_new_tokens is None and defaults.max_length is not None:
        max_new_tokens = min(defaults.max_length, config.max_sequence_length) - 1
    max_new_tokens = (
        DEFAULT_MAX_NEW_TOKENS if max_new_tokens is None else max_new_tokens
    )
    max_new_tokens = _check_settings(
        config, max_new_tokens, num_beams, spec, return_all_beams
    )
    check_run_arguments(seed)
    if (num_beams > 1 or return_all_beams) and settings.processes:
        raise ValueError(
            "Beam search applies no logits processors: `repetition_penalty` and "
            "`min_new_tokens` need num_beams=1 (and return_all_beams=False)."
        )
    beam_spec = None
    if num_beams > 1 or return_all_beams:
        beam_spec = BeamSpec(
            num_beams,
            length_penalty,
            length_penalty_style,
            early_stopping,
            forced_bos,
            forced_eos,
        )
    rows, was_text, single = _source_rows(model, inputs)
    _check_ids(rows, config, noun="source", arg="inputs")
    source_ids, source_mask = _pad_sources(rows, config)
    start = _pick(
        start_token_id,
        _pick(defaults.decoder_start_token_id, defaults.bos_token_id, None),
        config.bos_token_id,
    )
    integer = isinstance(start, numbers.Integral) and not isinstance(start, bool)
    if not integer or not 0 <= start < config.vocabulary_size:
        raise ValueError(
            "Decoding starts from `start_token_id` (default: config.bos_token_id), "
            f"an id in [0, {config.vocabulary_size}). Received: {start!r}"
        )
    stop_ids = _stop_ids(model, stop_token_ids)
    length = _bucket(max_new_tokens + 1, config.max_sequence_length)
    common = (model, source_ids, source_mask, int(start), max_new_tokens)
    if beam_spec is None:
        targets = _greedy(*common, (spec, settings), stop_ids, length, seed, forced_bos)
        return _to_output(model, targets, was_text, single)
    sequences, scores, lengths = beam_search(*common, beam_spec, stop_ids, length)
    if not return_all_beams:
        best = [seq[0, 1 : 1 + n[0]] for seq, n in zip(sequences, lengths)]
        return _to_output(model, best, was_text, single)
    batch, beams = lengths.shape
    hypotheses = [
        s[1 : 1 + n] for seq, k in zip(sequences, lengths) for s, n in zip(seq, k)
    ]
    out = _to_output(model, hypotheses, was_text, False)  # B * N rows
    if not was_text:
        return out.reshape(batch, beams, -1), scores
    out = [out[i * beams : (i + 1) * beams] for i in range(batch)]
    return (out[0], scores[0]) if single else (out, scores)


def _greedy(
    model,
    source_ids,
    source_mask,
    start,
    max_new,
    key,
    stop_ids,
    length,
    seed,
    forced_bos=None,
):
    """The num_beams=1 loop; returns the generated id rows. A forced first
    token is fed as part of the decoder prompt and returned as generated."""
    spec, settings = key
    config = model.config
    batch, pad_id = source_ids.shape[0], config.pad_token_id
    token_ids = np.full((batch, length), pad_id, "int32")
    token_ids[:, 0] = start
    prompt_mask = np.zeros((batch, length), bool)
    prompt_mask[:, 0] = True
    if forced_bos is not None:
        token_ids[:, 1], prompt_mask[:, 1] = forced_bos, True
    limits = np.full((batch,), max_new + 1, "int32")
    min_limits = np.full((batch,), settings.min_new_tokens + 1, "int32")
    uniforms = np.random.default_rng(seed).random((length, batch), dtype=np.float32)
    seen = initial_presence(token_ids, prompt_mask, config.vocabulary_size, settings)
    stop = stop_mask(stop_ids, config.vocabulary_size)
    fn = _compiled(
        model, "seq2seq", key, lambda: _greedy_fn(model, spec, pad_id, settings)
    )
    consts = tuple(
        ops.convert_to_tensor(a)
        for a in (prompt_mask, limits, min_limits, uniforms, stop)
    )
    args = [
        ops.convert_to_tensor(a) for a in (source_ids, source_mask, token_ids, seen)
    ]
    out_ids, generated = fn(
        *args, consts, _loop_index(model, 1), backend.loop_index(max_new + 1)
    )
    out_ids = np.asarray(ops.convert_to_numpy(out_ids))
    generated = np.array(ops.convert_to_numpy(generated))
    generated[:, 1] |= forced_bos is not None
    return [row[g] for row, g in zip(out_ids, generated)]


def _forced(token_id, config):
    """A generation config's forced token id, checked against the vocabulary."""
    if token_id is None:
        return None
    if not 0 <= token_id < config.vocabulary_size:
        raise ValueError(
            f"The generation config forces token id {token_id}, outside the "
            f"vocabulary [0, {config.vocabulary_size}). Fix forced_bos_token_id / "
            "forced_eos_token_id in generation_config.json, or set them to None."
        )
    return int(token_id)


def _to_output(model, rows, was_text, single):
    """Id rows -> a padded `[B, T_out]` int32 array, or decoded strings."""
    if was_text:
        texts = [_decode(model, [int(t) for t in r]) for r in rows]
        return texts[0] if single else texts
    return pad_rows(rows, model.config.pad_token_id)


def _decode(model, ids):
    """Text of generated ids without special tokens: the tokenizer's
    `skip_special_tokens=True` where it has one, else without the config's
    pad / start / end ids."""
    decode = model.tokenizer.decode
    parameters = inspect.signature(decode).parameters
    if "skip_special_tokens" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    ):
        return decode(ids, skip_special_tokens=True)
    c = model.config
    special = {c.pad_token_id, c.bos_token_id, c.eos_token_id}
    return decode([t for t in ids if t not in special])
