"""Beam search for encoder-decoder models, in one compiled loop.

Shape letters: B batch, N beams, C candidates per step (`2 * N`, more with
several stop tokens), L target buffer length (start token included), S
source length, V vocabulary size.

The `N` beams of every input are flattened into the batch (`[B * N, ...]`)
for the decoder, so the encoder runs once per input and the projected
cross-attention keys/values are repeated per beam. Each step scores all
`N * V` continuations by their summed float32 log-probabilities, keeps the
best `C`, moves the `N` best that did not stop to the next step (reordering
the self-attention KV cache by their parent beams with `ops.take`), and
offers those of the best `N` that did stop to a fixed-size set of `N`
finished hypotheses, scored `sum(log p) / length_penalty(length)`. Every
shape is static, so JAX and TensorFlow compile the whole search as one
`ops.while_loop`; PyTorch runs the loop in Python without autograd, each
step one `torch.compile`d program for a model compiled with
`jit_compile=True`.

The candidate, finishing and early-stopping rules are those of Hugging Face
`transformers` (`GenerationMixin._beam_search`): with `style="power"` the
search returns the same hypotheses as `model.generate(num_beams=N,
length_penalty=alpha, early_stopping=...)` when no logits processors are
active. `style="gnmt"` (the default of `Seq2SeqLM.generate`) changes only the
normaliser, `((5 + length) / 6) ** alpha` (Wu et al., 2016, the setting of
Vaswani et al., 2017 with alpha=0.6 and 4 beams), instead of
`length ** alpha`: both favour longer hypotheses for alpha > 0, but "gnmt"
is 1 at length 1 and grows more slowly, so it ranks short and long
hypotheses differently from Hugging Face's, and its scores differ.

Reference:
    - Wu et al., 2016, "Google's Neural Machine Translation System"
      (length penalty, section 7).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from keras import ops

from keras_transformers import backend
from keras_transformers.backend.compiled import compile_step, compiled_decoding
from keras_transformers.config.validation import check_argument_number
from keras_transformers.generation.loop import _column, _compiled, _loop_index

PENALTY_STYLES = ("gnmt", "power")
EARLY_STOPPING = (True, False, "never")
NEG = -1.0e9  # the score of an excluded candidate, as in Hugging Face


@dataclass(frozen=True)
class BeamSpec:
    """The static settings of one compiled search.

    Attributes:
        num_beams: beams kept per input (N >= 1).
        length_penalty: alpha; 0 ranks finished hypotheses by summed
            log-probability alone, > 0 favours longer ones.
        style: "gnmt" (`((5 + length) / 6) ** alpha`) or "power"
            (`length ** alpha`); `length` counts generated tokens, the stop
            token included.
        early_stopping: True: an input is done once it has `num_beams`
            finished hypotheses. False: done when the best running beam,
            normalised at its current length, cannot beat the worst
            finished one (a heuristic). "never": the same test, normalised
            at the maximum length when alpha > 0 (exact for alpha >= 0).
        forced_bos_token_id: the first generated token of every hypothesis
            (its log-probability counted as 0, as Hugging Face's
            `ForcedBOSTokenLogitsProcessor`); None: none.
        forced_eos_token_id: the token of every hypothesis that reaches the
            last step (also scored 0); None: none.
    """

    num_beams: int
    length_penalty: float = 0.6
    style: str = "gnmt"
    early_stopping: bool | str = True
    forced_bos_token_id: int | None = None
    forced_eos_token_id: int | None = None

    def __post_init__(self):
        if not isinstance(self.num_beams, int) or self.num_beams < 1:
            raise ValueError(
                f"`num_beams` must be an integer >= 1. Received: num_beams={self.num_beams!r}"
            )
        penalty = check_argument_number(
            "length_penalty", self.length_penalty, -math.inf
        )
        object.__setattr__(self, "length_penalty", penalty)  # a compile key
        if self.style not in PENALTY_STYLES:
            raise ValueError(
                f"`length_penalty_style` must be one of {PENALTY_STYLES}. "
                f"Received: length_penalty_style={self.style!r}"
            )
        if not any(self.early_stopping is e for e in EARLY_STOPPING):
            raise ValueError(
                f"`early_stopping` must be True, False or 'never'. "
                f"Received: early_stopping={self.early_stopping!r}"
            )

    def penalty(self, length):
        """The normaliser of a hypothesis with `length` generated tokens."""
        length = ops.cast(length, "float32")
        if self.style == "gnmt":
            length = (5.0 + length) / 6.0
        return ops.power(length, float(self.length_penalty))


def _gather(x, index):
    """Picks entries along axis 1: `x [B, M, ...]`, `index [B, J]` -> `[B, J, ...]`."""
    batch, size = x.shape[0], x.shape[1]
    flat = ops.reshape(x, (batch * size,) + tuple(x.shape[2:]))  # [B * M, ...]
    offsets = ops.arange(batch, dtype="int32")[:, None] * size
    return ops.take(flat, ops.cast(index, "int32") + offsets, axis=0)


def _step_fn(model, spec: BeamSpec, stop, candidates):
    """One search step: `((step [], sequences [B, N, L], scores [B, N],
    self_cache, finished, is_open [B]), cross_cache, mask [B * N, S],
    max_new_tokens []) -> (step + 1, sequences, scores, self_cache,
    finished, is_open)`. Every input is a tensor, so one compiled step
    (PyTorch with `jit_compile=True`) serves every token and every call."""
    beams = spec.num_beams

    def step_fn(state, cross_cache, mask, max_new_tokens):
        step, sequences, scores, self_cache, finished, is_open = state
        batch, _, length = sequences.shape
        flat = ops.reshape(sequences, (batch * beams, length))
        token = _column(flat, step)[:, None]  # [B * N, 1]
        logits, (self_cache, _) = model.call_with_cache(
            token, (self_cache, cross_cache), step, mask
        )  # [B * N, 1, V]
        log_probs = ops.log_softmax(ops.cast(logits[:, 0, :], "float32"), axis=-1)
        log_probs = _forced(log_probs, spec, step, max_new_tokens)
        top_scores, parents, grown, ended = _expand(
            sequences, scores, log_probs, step, max_new_tokens, stop, candidates
        )
        # The N best candidates that did not stop continue.
        live_scores = ops.where(ended, top_scores + NEG, top_scores)
        scores, chosen = ops.top_k(live_scores, beams)  # [B, N]
        sequences = _gather(grown, chosen)
        origin = ops.take_along_axis(parents, ops.cast(chosen, "int32"), axis=1)
        rows = ops.reshape(
            origin + ops.arange(batch, dtype="int32")[:, None] * beams, (-1,)
        )  # [B * N] parent rows of the flattened batch
        self_cache = tuple(
            (ops.take(k, rows, axis=0), ops.take(v, rows, axis=0))
            for k, v in self_cache
        )
        finished = _offer_finished(
            spec, finished, is_open, grown, top_scores, ended, step + 1
        )
        is_open = _still_open(spec, is_open, scores, finished, step + 1, max_new_tokens)
        return step + 1, sequences, scores, self_cache, finished, is_open

    return compile_step(step_fn) if compiled_decoding(model) else step_fn


def _search_fn(model, spec: BeamSpec, stop_ids):
    """The compiled search: `(source_ids [B, S], source_mask [B, S],
    sequences [B, N, L], max_new_tokens []) -> (sequences [B, N, L],
    scores [B, N], lengths [B, N])` of the finished hypotheses, best first."""
    beams = spec.num_beams
    stop = (
        None if not stop_ids else ops.convert_to_tensor(np.asarray(stop_ids, "int32"))
    )
    # Enough candidates that N of them go on even if N others just ended.
    step_fn = _step_fn(model, spec, stop, max(2, 1 + len(stop_ids)) * beams)

    def run(source_ids, source_mask, sequences, max_new_tokens):
        batch, _, length = sequences.shape
        encoded = model.backbone.encode(source_ids, source_mask)  # [B, S, D]
        self_cache, cross_cache = model.backbone.init_cache(encoded, length)

        # [B, ...] -> [B * N, ...], each input's rows adjacent. A gather, not
        # `ops.repeat`: PyTorch's repeat can return a view that aliases rows,
        # and the self-attention cache is written in place there.
        beam_rows = ops.convert_to_tensor(np.repeat(np.arange(batch), beams), "int32")

        def per_beam(x):
            return ops.take(x, beam_rows, axis=0)

        self_cache = tuple((per_beam(k), per_beam(v)) for k, v in self_cache)
        cross_cache = tuple((per_beam(k), per_beam(v)) for k, v in cross_cache)
        mask = per_beam(source_mask)  # [B * N, S]
        # Only the first beam is live at the start, so the first step expands
        # one hypothesis instead of N copies of it.
        scores = ops.convert_to_tensor(
            np.array([[0.0] + [NEG] * (beams - 1)] * batch, "float32")
        )  # [B, N]
        finished = (
            ops.copy(sequences),  # [B, N, L] (not aliased: a compile guard)
            ops.full((batch, beams), NEG, "float32"),  # scores
            ops.zeros((batch, beams), "int32"),  # generated lengths
            ops.zeros((batch, beams), "bool"),  # slot holds a finished hypothesis
        )
        is_open = ops.ones((batch,), "bool")  # improvement still possible

        def cond(step, sequences, scores, self_cache, finished, is_open):
            keep_going = ops.logical_and(step < max_new_tokens, ops.any(is_open))
            if spec.early_stopping is True:
                keep_going = ops.logical_and(
                    keep_going, ops.logical_not(ops.all(finished[3]))
                )
            return keep_going

        def body(*state):
            return step_fn(state, cross_cache, mask, max_new_tokens)

        state = (_loop_index(model, 0), sequences, scores, self_cache)
        state = backend.while_loop(cond, body, state + (finished, is_open))
        return state[4][:3]

    return run


def _forced(log_probs, spec, step, max_new_tokens):
    """`log_probs [B * N, V]` with the forced first / last token: 0 for it,
    `NEG` for every other token, at step 0 / the last step."""
    for token, when in (
        (spec.forced_bos_token_id, step == 0),
        (spec.forced_eos_token_id, step + 1 >= max_new_tokens),
    ):
        if token is not None:
            vocabulary = ops.arange(log_probs.shape[-1], dtype="int32")
            forced = ops.where(vocabulary == token, 0.0, NEG)[None, :]
            log_probs = ops.where(when, forced, log_probs)
    return log_probs


def _expand(sequences, scores, log_probs, step, max_new_tokens, stop, count):
    """The best `count` continuations of all beams.

    Args:
        sequences: `[B, N, L]` running beams; position `step` holds their
            last token.
        scores: `[B, N]` their summed log-probabilities.
        log_probs: `[B * N, V]` float32 next-token log-probabilities.
        step: tokens generated so far.
        max_new_tokens: the last step ends every candidate.
        stop: `[E]` int32 stop ids, or None.
        count: C, candidates to keep (capped at `N * V`).

    Returns:
        `scores [B, C]` (best first), `parents [B, C]` (beam indices),
        `grown [B, C, L]` (parent beam plus the new token at `step + 1`) and
        `ended [B, C]` (stop token, or the last step).
    """
    batch, beams, length = sequences.shape
    vocab = log_probs.shape[-1]
    total = ops.reshape(log_probs, (batch, beams, vocab)) + scores[:, :, None]
    total = ops.reshape(total, (batch, beams * vocab))
    top_scores, top_index = ops.top_k(total, min(count, beams * vocab))
    top_index = ops.cast(top_index, "int32")
    parents, tokens = top_index // vocab, top_index % vocab  # [B, C]
    grown = _gather(sequences, parents)  # [B, C, L]
    at_next = ops.arange(length, dtype="int32")[None, None, :] == step + 1
    grown = ops.where(at_next, tokens[:, :, None], grown)
    ended = ops.broadcast_to(step + 1 >= max_new_tokens, tokens.shape)
    if stop is not None:
        hit = ops.any(tokens[:, :, None] == stop[None, None, :], axis=-1)
        ended = ops.logical_or(ended, hit)
    return top_scores, parents, grown, ended


def _offer_finished(spec, finished, is_open, grown, top_scores, ended, new_length):
    """Merges the candidates that just ended among the best N of this step
    into the N finished hypotheses, keeping the N best normalised scores."""
    beams = spec.num_beams
    sequences, scores, lengths, flags = finished
    rank = ops.arange(top_scores.shape[1], dtype="int32")[None, :]
    just_ended = ops.logical_and(ended, rank < beams)  # [B, C]
    offered = top_scores / spec.penalty(new_length)
    excluded = ops.logical_not(just_ended)
    if spec.early_stopping is True:  # an input with N finished takes no more
        full = ops.all(flags, axis=1, keepdims=True)
        offered = ops.where(full, offered + NEG, offered)
    offered = ops.where(is_open[:, None], offered, offered + NEG)
    offered = ops.where(excluded, offered + NEG, offered)
    merged_scores = ops.concatenate([scores, offered], axis=1)  # [B, N + C]
    scores, keep = ops.top_k(merged_scores, beams)
    new_lengths = ops.zeros(top_scores.shape, "int32") + new_length
    return (
        _gather(ops.concatenate([sequences, grown], axis=1), keep),
        scores,
        _gather(ops.concatenate([lengths, new_lengths], axis=1), keep),
        _gather(ops.concatenate([flags, just_ended], axis=1), keep),
    )


def _still_open(spec, is_open, scores, finished, new_length, max_new_tokens):
    """Whether the best running beam could still beat the worst finished
    hypothesis of each input (always, until N hypotheses have finished)."""
    _, finished_scores, _, flags = finished
    if spec.early_stopping == "never" and spec.length_penalty > 0:
        best_length = max_new_tokens
    else:
        best_length = new_length
    best_possible = scores[:, :1] / spec.penalty(best_length)  # [B, 1]
    # `amin`: Keras' PyTorch `min` breaks a `torch.compile` graph.
    worst = ops.amin(finished_scores, axis=1, keepdims=True)
    worst = ops.where(flags, worst, NEG)  # [B, N]
    return ops.logical_and(is_open, ops.any(best_possible > worst, axis=1))


def beam_search(
    model,
    source_ids,
    source_mask,
    start_token_id,
    max_new_tokens,
    spec,
    stop_ids,
    length,
):
    """Runs the compiled beam search.

    Args:
        model: a `Seq2SeqLM`.
        source_ids: `[B, S]` int32 source ids, right-padded.
        source_mask: `[B, S]` bool, True for real source tokens.
        start_token_id: the decoder's first input token.
        max_new_tokens: tokens to generate at most (the stop token included).
        spec: a `BeamSpec`.
        stop_ids: tuple of ids that end a hypothesis (may be empty: then
            every hypothesis runs to `max_new_tokens`).
        length: target buffer length L >= max_new_tokens + 1 (a bucket, so
            one compiled program serves many lengths).

    Returns:
        NumPy `(sequences [B, N, L], scores [B, N], lengths [B, N])`: the
        finished hypotheses of each input, best first; `sequences[:, :, 0]`
        is the start token, followed by `lengths` generated tokens.
    """
    batch = source_ids.shape[0]
    sequences = np.full(
        (batch, spec.num_beams, length), model.config.pad_token_id, "int32"
    )
    sequences[:, :, 0] = start_token_id
    # The stop ids size the search's candidate buffer: part of the program.
    fn = _compiled(
        model,
        ("beam_search", tuple(stop_ids)),
        spec,
        lambda: _search_fn(model, spec, tuple(stop_ids)),
    )
    out = fn(
        ops.convert_to_tensor(source_ids, "int32"),
        ops.convert_to_tensor(source_mask, "bool"),
        ops.convert_to_tensor(sequences),
        _loop_index(model, max_new_tokens),
    )
    return tuple(np.asarray(ops.convert_to_numpy(x)) for x in out)
