"""Continuous batching of a causal LM: requests join and leave one running
batch.

The engine keeps one KV cache of `slots` rows and `max_length` positions
(`backbone.init_cache`). A request takes a free row: its prompt is
prefilled on its own (a cache of one row holding the prompt's positions,
then written into the batch's row, see `programs.short_rows`), and from
then on every decoding step advances all busy rows at once, each at its
own position (a `[B]` `cache_index`, see
`keras_transformers.layers.row_cache`). The busy rows are kept at the
front and a step decodes the first `n` of them (`n` a power of two) with
the whole cache: each attention layer writes one entry per row in place,
so a step costs what its rows cost, whatever the number of slots (a model
with recurrent states takes its rows out of the cache and puts them
back), and it attends to the positions up to the longest row's only
(rounded up to a power of two): short replies decode as fast in a
4,096-position cache as in a 128-position one. A finished or cancelled
request frees its row at once; the next waiting one takes it before the
next step. A prompt that begins with a recent one's tokens prefills only
the rest, from a copy of that prompt's row (`PrefixStore`). On JAX and
TensorFlow a step is a compiled program per number of rows and span (the
cache buffer donated on JAX, so it is updated in place), prefills one
program per prompt bucket (`warm_up` compiles them before serving);
PyTorch runs them eagerly without autograd, writing the cache in place
(`programs.build`).

All model calls happen on the engine's own thread; `submit` and `cancel`
may be called from any thread, and each request reports its text through
its `on_event` callback, called on the engine's thread.
"""

from __future__ import annotations

import collections
import itertools
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from keras import ops

from keras_transformers import backend
from keras_transformers.config.layer_types import recurrent
from keras_transformers.generation.generate import BUCKET, _prefix_length
from keras_transformers.serving import programs
from keras_transformers.serving.prefill import Prefiller
from keras_transformers.serving.text import TextStream


@dataclass
class Request:
    """One completion: prompt ids in, text out through `on_event`.

    Attributes:
        prompt: the prompt's token ids (at least one).
        max_tokens: new tokens at most.
        temperature: 0 decodes greedily; otherwise the logits are divided
            by it before sampling.
        top_p: nucleus sampling: the smallest set of tokens whose
            probability reaches `top_p` (1.0: all).
        seed: the sampler's seed (None: fresh randomness).
        stop_ids: token ids that end the reply (not part of its text).
        stop_strings: strings that end the reply (not part of its text).
        on_event: `(text, finish_reason)`: new text of the reply, and None
            until the last call, which gives "stop" (an end token or stop
            string), "length" (`max_tokens` or the cache's length) or
            "cancelled".
    """

    prompt: list
    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop_ids: frozenset = frozenset()
    stop_strings: tuple = ()
    on_event: Callable | None = None
    tokens: list = field(default_factory=list)
    finish_reason: str | None = None
    cancelled: bool = False


class Engine:
    """Serves `model` (a causal LM with a tokenizer) to concurrent requests.

    Args:
        model: a `GPTCausalLM` / `MixtralCausalLM` (not Transformer-XL).
        slots: rows of the running batch (requests decoded together).
        max_length: positions per row: prompt plus reply at most (default:
            the model's `max_sequence_length`, at most 4,096).
        warm_up: compile the programs before serving (JAX and TensorFlow):
            a decoding step for every number of rows and span (up to
            `programs.WARM_SPAN` positions) a step can take, the prefill
            of prompts up to `prefill.WARM_PROMPT` tokens and of prompt
            ends after a kept beginning (`prefill.WARM_CHUNK`); otherwise
            each compiles the first time it is needed, and the running
            requests wait for it (seconds).
        prefix_memory: MiB for the cache rows of recent prompts (0: none
            kept): a prompt that begins with a kept one's tokens prefills
            only the rest, from a copy of its row. Only models whose
            layers all cache plain attention (no sliding window, no
            recurrent state) keep them.

    Raises:
        ValueError: a model without a tokenizer or without a KV cache.
    """

    def __init__(
        self,
        model,
        slots: int = 8,
        max_length: int | None = None,
        warm_up: bool = False,
        prefix_memory: float = 256,
    ):
        backbone = getattr(model, "backbone", None)
        if backbone is None or not hasattr(backbone, "init_cache"):
            raise ValueError(
                f"{type(model).__name__} is not a causal LM with a KV cache; "
                "serve a GPTCausalLM or MixtralCausalLM."
            )
        if getattr(backbone, "segment_memory", None) is not None:
            raise ValueError(
                "Transformer-XL memory decodes every row at one position; "
                "serve a model without `memory_length`."
            )
        if getattr(model, "tokenizer", None) is None:
            raise ValueError("Serving needs the model's tokenizer: load a checkpoint.")
        config = model.config
        limit = config.max_sequence_length
        self.model, self.slots = model, int(slots)
        self.max_length = int(max_length or min(limit, 4096))
        if self.slots < 1 or not 2 <= self.max_length <= limit:
            raise ValueError(
                f"slots must be >= 1 and max_length in [2, {limit}] "
                f"(max_sequence_length); got slots={slots}, max_length={max_length}."
            )
        self._cache = backbone.init_cache(self.slots, self.max_length)
        self._index = np.zeros(self.slots, "int32")  # the position fed next
        self._feed = np.zeros(self.slots, "int32")  # the token fed there
        self._pending = [[] for _ in range(self.slots)]  # prompt still to feed
        self._rows: list = [None] * self.slots
        self._texts: list = [None] * self.slots
        self._rngs: list = [None] * self.slots
        self._waiting: collections.deque = collections.deque()
        self._wake = threading.Condition()
        self._closed = False
        self._ids: dict = {}  # row ids per step size (`_row_ids`)
        reasons = ("stop", "length", "cancelled", "error")
        self._finished = collections.Counter(dict.fromkeys(reasons, 0))
        self._tokens = 0  # reply tokens generated
        self._in_place = not recurrent(config)
        self._programs = programs.build(model, self.max_length)
        self._prefill = Prefiller(
            model,
            self._programs,
            self.max_length,
            self.slots,
            prefix_memory,
        )
        if warm_up and not backend.eager_loops():
            self._warm_up()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- public
    def submit(self, request: Request) -> Request:
        """Queues `request`; it starts as soon as a row is free.

        Raises:
            ValueError: an empty prompt, or one with no room for a reply in
                `max_length`.
        """
        if not request.prompt:
            raise ValueError("The prompt is empty: give at least one token.")
        if len(request.prompt) >= self.max_length:
            raise ValueError(
                f"The prompt has {len(request.prompt)} tokens; this server holds "
                f"{self.max_length} per request (prompt and reply). Shorten it."
            )
        with self._wake:
            if self._closed:
                raise RuntimeError("The engine is closed.")
            self._waiting.append(request)
            self._wake.notify()
        return request

    def cancel(self, request: Request) -> None:
        """Stops `request` (its row is freed before the next step)."""
        request.cancelled = True
        with self._wake:
            self._wake.notify()

    def close(self) -> None:
        """Stops the engine's thread (running requests are cancelled)."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join(timeout=60)

    @property
    def busy(self) -> int:
        """Requests decoding now."""
        return sum(r is not None for r in self._rows)

    def stats(self) -> dict:
        """The engine's counts: `slots`, `slots_busy`, `requests_waiting`,
        `requests_finished` (per finish reason: "stop", "length",
        "cancelled", "error"), `tokens_generated` (reply tokens, all
        requests)."""
        with self._wake:
            waiting = len(self._waiting)
        return {
            "slots": self.slots,
            "slots_busy": self.busy,
            "requests_waiting": waiting,
            "requests_finished": dict(self._finished),
            "tokens_generated": self._tokens,
            "prompt_tokens_reused": self._prefill.reused,
        }

    # ----------------------------------------------------------------- loop
    def _run(self):
        while True:
            with self._wake:
                while not self._closed and not self._waiting and not self.busy:
                    self._wake.wait()
                if self._closed:
                    break
            try:
                self._admit()
                if self.busy:
                    self._step()
            except Exception as error:  # a failed step ends the running requests
                traceback.print_exc()
                for slot, request in enumerate(self._rows):
                    if request is not None:
                        self._finish(slot, f"error: {error}")
                self._cache = self.model.backbone.init_cache(
                    self.slots, self.max_length
                )
        for slot, request in enumerate(self._rows):
            if request is not None:
                self._finish(slot, "cancelled")

    def _admit(self):
        """Gives free rows to waiting requests: prompts that arrive together
        prefill in one program when they can (`Prefiller.many`)."""
        starting = []
        for slot in range(self.slots):
            if self._rows[slot] is not None:
                continue
            with self._wake:
                request = self._waiting.popleft() if self._waiting else None
            if request is None:
                break
            if request.cancelled:
                self._report(request, "", "cancelled")
                continue
            self._rows[slot] = request
            starting.append((slot, request))
        prompts = [[int(t) for t in r.prompt] for _, r in starting]
        together = self._prefill.many(prompts) if len(starting) > 1 else None
        for (slot, request), done in zip(starting, together or [None] * len(starting)):
            self._start(slot, request, done)

    def _start(self, slot: int, request: Request, done=None):
        """Prefills `request`'s prompt into row `slot`, as `generate` does
        (`_prefix_length`): a whole prompt padded to a bucket (or its end
        after a kept beginning, see `Prefiller`), then its first reply token
        chosen; or, for ring caches and recurrent states, its prefix in
        whole buckets, the rest fed by the batched steps. `done`:
        `(logits [V], row)` when prefilled already."""
        prompt = [int(t) for t in request.prompt]
        size = len(prompt)
        self._rows[slot] = request
        self._texts[slot] = TextStream(self.model.tokenizer, request.stop_strings)
        self._rngs[slot] = np.random.default_rng(request.seed)
        prefix = _prefix_length(self.model.config, size, self.max_length)
        prefix = self.max_length if prefix is None else prefix
        if done is not None:
            logits, row = done[0][None], done[1]
        elif prefix:
            logits, row = self._prefill.one(prompt, prefix)
        else:
            row = self.model.backbone.init_cache(1, self.max_length)
        self._cache = self._programs.insert(self._cache, row, _scalar(slot))
        if prefix >= size:
            self._index[slot], self._pending[slot] = size, []
            return self._advance(slot, np.asarray(logits)[0])
        self._index[slot], self._feed[slot] = prefix, prompt[prefix]
        self._pending[slot] = prompt[prefix + 1 :]

    def _warm_up(self):
        """Runs every program once (see `warm_up`), on free rows."""
        run = self._programs
        steps = sorted(
            {programs.rows_for(n, self.slots) for n in range(1, self.slots + 1)}
        )
        spans = programs.warm_spans(self.max_length)
        for rows, span in itertools.product(steps, spans):
            tokens = ops.convert_to_tensor(np.zeros((rows, 1), "int32"))
            index = ops.convert_to_tensor(np.zeros(rows, "int32"))
            decode = run.decode(span)
            ids, _, self._cache = decode(
                tokens, self._cache, index, self._row_ids(rows)
            )
            ops.convert_to_numpy(ids)
        made = self._prefill.warm_up([n for n in steps if n > 1])
        for row in [*made, self.model.backbone.init_cache(1, self.max_length)]:
            self._cache = run.insert(self._cache, row, _scalar(0))
        for span in spans:
            self._cache = run.move(span)(self._cache, _scalar(0), _scalar(0))

    def _step(self):
        """One decoding step of the busy rows: moved to the front first, then
        the first `n` rows decoded (`n` the next power of two, so a few
        programs serve every number of busy requests)."""
        for slot, request in enumerate(self._rows):
            if request is not None and request.cancelled:
                self._finish(slot, "cancelled")
        busy = self._compact()
        if not busy:
            return
        rows = programs.rows_for(busy, self.slots)
        tokens = ops.convert_to_tensor(self._feed[:rows, None])
        index = ops.convert_to_tensor(self._index[:rows])
        greedy = all(r.temperature <= 0 for r in self._rows[:busy])
        span = programs.span_for(self._index[:busy].max() + 1, self.max_length)
        decode = self._programs.decode(span)
        ids, logits, self._cache = decode(
            tokens, self._cache, index, self._row_ids(rows)
        )
        out = np.asarray(ops.convert_to_numpy(ids if greedy else logits))
        for slot in range(busy):
            self._index[slot] += 1
            if self._pending[slot]:
                self._feed[slot] = self._pending[slot].pop(0)
                continue
            self._advance(slot, *((None, int(out[slot])) if greedy else (out[slot],)))

    def _row_ids(self, rows: int):
        """How a step takes the first `rows` rows: None, the whole cache
        (attention caches take a step of fewer rows, see
        `keras_transformers.layers.row_cache`; and every cache a step of
        all its rows); for a model with recurrent states (which hold one
        row per token) the rows, for `take_rows`: an int where PyTorch runs
        the step eagerly (a view of the cache), else an int32 tensor of
        their ids, made once per size."""
        if self._in_place or rows == self.slots:
            return None
        if backend.eager_loops():
            return rows
        if rows not in self._ids:
            self._ids[rows] = ops.convert_to_tensor(np.arange(rows, dtype="int32"))
        return self._ids[rows]

    def _compact(self) -> int:
        """Moves busy rows into the free slots before them; returns how many
        rows are busy (then the first ones)."""
        free = [s for s, r in enumerate(self._rows) if r is None]
        busy = [s for s, r in enumerate(self._rows) if r is not None]
        while free and busy and free[0] < busy[-1]:
            target, source = free.pop(0), busy.pop()
            span = programs.span_for(self._index[source] + 1, self.max_length)
            move = self._programs.move(span)
            self._cache = move(self._cache, _scalar(source), _scalar(target))
            for state in (self._rows, self._texts, self._rngs, self._pending):
                state[target], state[source] = state[source], None
            self._pending[source] = []
            for array in (self._index, self._feed):
                array[target], array[source] = array[source], 0
            busy = sorted([*busy, target])
            free = sorted([*free, source])
        return self.busy

    def _advance(self, slot: int, logits, token=None):
        """Chooses row `slot`'s next token (`token`, or from its logits
        `[V]`) and reports it."""
        request = self._rows[slot]
        if token is None:
            token = _choose(logits, request, self._rngs[slot])
        if token in request.stop_ids:
            return self._finish(slot, "stop")
        request.tokens.append(token)
        self._tokens += 1
        text, stopped = self._texts[slot].push(token)
        if stopped:
            return self._finish(slot, "stop", text, stopped=True)
        full = len(request.tokens) >= request.max_tokens
        if full or self._index[slot] >= self.max_length:
            return self._finish(slot, "length", text)
        if text:
            self._report(request, text, None)
        self._feed[slot] = token

    def _finish(self, slot: int, reason: str, text: str = "", stopped=False):
        """Frees row `slot` and reports the rest of its text (what the
        stream held back, unless a stop string or a cancellation ended it)."""
        request, stream = self._rows[slot], self._texts[slot]
        if not stopped and not reason.startswith(("cancelled", "error")):
            text += stream.flush()
        self._rows[slot] = self._texts[slot] = self._rngs[slot] = None
        self._pending[slot] = []
        self._index[slot] = self._feed[slot] = 0
        self._report(request, text, reason)

    def _report(self, request: Request, text: str, reason):
        if reason is not None:
            request.finish_reason = reason
            self._finished[reason.split(":")[0]] += 1
        if request.on_event is not None:
            request.on_event(text, reason)


def _scalar(value: int):
    return ops.convert_to_tensor(value, "int32")


def _choose(logits: np.ndarray, request: Request, rng) -> int:
    """Greedy (temperature 0) or a sample with `temperature` and `top_p`."""
    if request.temperature <= 0:
        return int(np.argmax(logits))
    scaled = logits.astype("float64") / request.temperature
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    if request.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        keep = np.cumsum(probs[order]) - probs[order] < request.top_p
        kept = np.zeros_like(probs)
        kept[order[keep]] = probs[order[keep]]
        probs = kept / kept.sum()
    return int(rng.choice(len(probs), p=probs))


__all__ = ["BUCKET", "Engine", "Request"]
