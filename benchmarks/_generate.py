"""Generation figures of ``bench.py``. Causal rows: greedy decoding, no
early stop, at batch 1 and the row's batch; prefill is the time of a call
that generates one token, per-token decode the rest of a ``new_tokens``
call divided by the ``new_tokens - 1`` further tokens. Encoder-decoder
rows: beam search (4 beams, length penalty 0.6, exactly ``new_tokens``
tokens after the start token) on 4 sources of ``prompt`` tokens."""

from __future__ import annotations

import statistics

import numpy as np
from _common import bench_calls


def check(name, out, prompts, new_tokens):
    """The output is `[B, prompt + new_tokens]` and keeps the prompt."""
    expected = (prompts.shape[0], prompts.shape[1] + new_tokens)
    if tuple(out.shape) != expected:
        raise RuntimeError(
            f"{name}: generate returned shape {tuple(out.shape)}, expected {expected}"
        )
    if not np.array_equal(out[:, : prompts.shape[1]], prompts):
        raise RuntimeError(f"{name}: generate did not keep the prompt")


NUM_BEAMS, LENGTH_PENALTY = 4, 0.6


def check_beam(name, out, sources, new_tokens, start_id):
    """Beam search returns `[B, 1 + new_tokens]`, starting with the start id."""
    expected = (sources.shape[0], 1 + new_tokens)
    if tuple(out.shape) != expected:
        raise RuntimeError(
            f"{name}: beam search returned shape {tuple(out.shape)}, expected "
            f"{expected} (start token + {new_tokens} new tokens)"
        )
    if not np.all(out[:, 0] == start_id):
        raise RuntimeError(f"{name}: sequences do not start with {start_id}")


def record_beam(contenders, out, batch, row, start_id, args):
    """Seconds per beam-search call: `beam_b{b}_s`, `beam_b{b}_tokens_per_s`
    (new tokens of the returned sequences over the call's time) and the
    first call's time."""
    n = row.new_tokens
    for b, sources in batch.prompts.items():
        errors = {}
        firsts, samples = bench_calls(
            contenders,
            lambda c, s=sources: c.beam(s, n, NUM_BEAMS, LENGTH_PENALTY, start_id),
            lambda name, o, s=sources: check_beam(name, o, s, n, start_id),
            args.repeats,
            f"beam{NUM_BEAMS} b={b}",
            errors,
        )
        for c in contenders:
            r = out["contenders"][c.name]
            if c.name in errors:
                r[f"beam_b{b}_error"] = errors[c.name]
                continue
            median = statistics.median(samples[c.name])
            r[f"beam_b{b}_first_call_s"] = firsts[c.name]
            r[f"beam_b{b}_samples_s"] = samples[c.name]
            r[f"beam_b{b}_s"] = median
            r[f"beam_b{b}_tokens_per_s"] = b * n / median


def record(contenders, out, batch, row, args):
    """Times prefill and decode for every contender; stores, per batch `b`,
    `gen_b{b}_prefill_s`, `gen_b{b}_decode_s_per_token`,
    `gen_b{b}_decode_tokens_per_s` (`b / per-token seconds`),
    `gen_b{b}_tokens_per_s` (new tokens of the whole call over its time) and
    the first calls' times."""
    n = max(row.new_tokens, 2)
    for b, prompts in batch.prompts.items():
        medians, errors = {}, {}
        for new in (1, n):
            label = f"gen b={b} new={new}"
            firsts, samples = bench_calls(
                contenders,
                lambda c, p=prompts, new=new: c.generate(p, new),
                lambda name, o, p=prompts, new=new: check(name, o, p, new),
                args.repeats,
                label,
                errors,
            )
            for c in contenders:
                if c.name in errors:
                    continue
                r = out["contenders"][c.name]
                r[f"gen_b{b}_new{new}_first_call_s"] = firsts[c.name]
                r[f"gen_b{b}_new{new}_samples_s"] = samples[c.name]
                medians[c.name, new] = statistics.median(samples[c.name])
        for c in contenders:
            r = out["contenders"][c.name]
            if c.name in errors:
                r[f"gen_b{b}_error"] = errors[c.name]
                continue
            prefill, total = medians[c.name, 1], medians[c.name, n]
            # None where noise hides the decode time (a loaded machine, few tokens).
            per_token = (total - prefill) / (n - 1) if total > prefill else None
            r[f"gen_b{b}_prefill_s"] = prefill
            r[f"gen_b{b}_decode_s_per_token"] = per_token
            r[f"gen_b{b}_decode_tokens_per_s"] = per_token and b / per_token
            r[f"gen_b{b}_tokens_per_s"] = b * n / total
