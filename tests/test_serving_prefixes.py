"""The serving `Engine`'s kept prompt rows and warm-up: a prompt that
begins with a recent one's tokens prefills only the rest and replies as
`generate` does; the store keeps the most recent rows and finds the
longest shared beginning; after `warm_up` serving traces no program."""

import time

import keras
import numpy as np
import pytest
from test_serving_engine import TOKENS, _expected, _lm, _run

from keras_transformers.serving import Engine, Request, programs
from keras_transformers.serving.engine import BUCKET
from keras_transformers.serving.prefixes import PrefixStore


def test_a_prompt_sharing_a_beginning_prefills_the_rest_and_replies_as_generate():
    lm = _lm()
    rng = np.random.default_rng(1)
    system = rng.integers(1, 500, BUCKET + 3).tolist()  # a shared system prompt
    prompts = [system + rng.integers(1, 500, n).tolist() for n in (5, 9, 2)]
    prompts.append(list(prompts[1]))  # the same prompt again
    engine = Engine(lm, slots=2, max_length=96)
    try:
        requests = _run(engine, prompts, gap=True)
        reused = engine.stats()["prompt_tokens_reused"]
    finally:
        engine.close()
    for request, prompt in zip(requests, prompts):
        assert request.tokens == _expected(lm, prompt)
    # The second and third share the system prompt with the first; the
    # fourth repeats the second but its last token.
    assert reused == 2 * len(system) + len(prompts[3]) - 1


def test_prompts_arriving_together_prefill_their_ends_in_one_program():
    lm = _lm()
    rng = np.random.default_rng(3)
    system = rng.integers(1, 500, BUCKET + 3).tolist()
    prompts = [system + rng.integers(1, 500, n).tolist() for n in (1, 5, 9)]
    engine = Engine(lm, slots=4, max_length=96)
    sizes = []
    extend = engine._programs.extend
    engine._programs.extend = lambda rows, *args: (
        sizes.append(len(rows)) or extend(rows, *args)
    )
    try:
        _run(engine, [system + [1]])  # keeps the system prompt's row
        requests = [Request(prompt=p, max_tokens=TOKENS) for p in prompts]
        with engine._wake:  # all waiting when the engine next looks
            engine._waiting.extend(requests)
            engine._wake.notify()
        deadline = time.time() + 300
        while any(r.finish_reason is None for r in requests):
            assert time.time() < deadline
            time.sleep(0.01)
        reused = engine.stats()["prompt_tokens_reused"]
    finally:
        engine.close()
    assert sizes == [4]  # three prompts, one program of 4 rows (a copy pads it)
    assert reused == 3 * len(system)
    for request, prompt in zip(requests, prompts):
        assert request.tokens == _expected(lm, prompt)


def test_no_kept_rows_without_prefix_memory_or_for_sliding_windows():
    prompts = [[5, 6, 7, 8, 9], [5, 6, 7, 8, 3]]
    for lm, memory in (
        (_lm(), 0),
        (
            _lm(
                num_layers=2,
                layer_types=["sliding_attention", "full_attention"],
                sliding_window=8,
            ),
            256,
        ),
    ):
        engine = Engine(lm, slots=1, max_length=64, prefix_memory=memory)
        try:
            requests = _run(engine, prompts, gap=True)
            assert engine.stats()["prompt_tokens_reused"] == 0
        finally:
            engine.close()
        assert [r.tokens for r in requests] == [_expected(lm, p) for p in prompts]


def test_prefix_store_finds_the_longest_beginning_and_drops_the_oldest():
    store = PrefixStore(2)
    store.add([1, 2, 3, 4], "a")
    store.add([1, 2, 9], "b")
    assert store.find([1, 2, 3, 7]) == (3, "a")
    assert store.find([1, 2, 9, 9]) == (3, "b")
    assert store.find([1, 2, 3, 4]) == (3, "a")  # one token left to prefill
    assert store.find([8, 1]) == (0, None)
    store.add([5, 5], "c")  # drops "b", the least recently found
    assert len(store) == 2 and store.find([1, 2, 9, 9]) == (2, "a")
    empty = PrefixStore(0)
    empty.add([1, 2], "a")
    assert len(empty) == 0 and empty.find([1, 2, 3]) == (0, None)


def test_prefix_store_holds_what_its_memory_allows():
    def row(positions):  # one layer's keys and values of one row
        return ((keras.ops.zeros((1, positions, 2, 8)),) * 2,)

    size = 2 * 64 * 2 * 8 * 4  # bytes of a row of 64 positions
    store = PrefixStore.within(10 * size / 2**20)
    for n in range(12):
        store.add([n], row(64))
    assert len(store) == 10 and store.held == 10 * size
    for n in range(20):  # rows of 32 positions: twice as many
        store.add([100 + n], row(32))
    assert len(store) == 20 and store.find([0, 1]) == (0, None)
    store.add([100], row(32))  # again: replaced, not held twice
    assert len(store) == 20 and store.held == 10 * size
    assert PrefixStore.within(0).capacity == 0


@pytest.mark.skipif(
    keras.config.backend() == "torch", reason="PyTorch runs the programs eagerly"
)
def test_after_warm_up_serving_traces_no_program(monkeypatch):
    lm = _lm()
    engine = Engine(lm, slots=4, max_length=64, warm_up=True)
    traced = []

    def counted(name, function):
        return lambda *args, **kwargs: traced.append(name) or function(*args, **kwargs)

    call = lm.backbone.call
    lm.backbone.call = counted("model", call)
    for name in ("write_row", "copy_row"):  # `insert` and `move`
        monkeypatch.setattr(programs, name, counted(name, getattr(programs, name)))
    try:
        rng = np.random.default_rng(2)
        first = rng.integers(1, 500, 20).tolist()
        prompts = [first, first[:12] + [7, 7], [3, 4, 5], [9] * 40, [2, 2]]
        engine.submit(Request(prompt=[8, 8], max_tokens=2))  # a row freed early
        requests = _run(engine, prompts)  # all at once: 1 to 4 rows a step
    finally:
        lm.backbone.call = call
        engine.close()
    assert traced == []
    assert [r.tokens for r in requests] == [_expected(lm, p) for p in prompts]
