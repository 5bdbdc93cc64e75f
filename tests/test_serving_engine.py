"""The continuous-batching `Engine` in-process: requests that join while
others decode, and long prompts on a sliding-window model (prefilled in
whole buckets, the rest fed step by step), and a recurrent model's rows,
reply as `generate` does; a cancelled request frees its row for the next
one; `TextStream` holds back split characters and stop-string beginnings
and sends what decoding the whole reply gives."""

import threading

import numpy as np
import pytest

from keras_transformers import from_preset
from keras_transformers.serving import Engine, Request, TextStream
from keras_transformers.serving.engine import BUCKET
from keras_transformers.serving.programs import SPAN

TOKENS = 6


class _Chars:
    """A tokenizer whose tokens are characters (id = code point)."""

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def _lm(**fields):
    lm = from_preset("gpt_llama_tiny", max_sequence_length=128, **fields)
    lm.tokenizer = _Chars()
    return lm


def _expected(lm, prompt):
    row = np.asarray(lm.generate([prompt], max_new_tokens=TOKENS, stop_token_ids=None))
    return [int(t) for t in row[0][len(prompt) : len(prompt) + TOKENS]]


def _run(engine, prompts, gap=None):
    """Submits the prompts (each after the previous one produced a token when
    `gap`); returns each request once all finished."""
    done = threading.Semaphore(0)
    started = threading.Event()

    def on_event(text, reason):
        started.set()
        if reason is not None:
            done.release()

    requests = []
    for prompt in prompts:
        started.clear()
        request = Request(prompt=prompt, max_tokens=TOKENS, on_event=on_event)
        requests.append(engine.submit(request))
        if gap:
            assert started.wait(120)
    for _ in prompts:
        assert done.acquire(timeout=300)
    return requests


@pytest.mark.parametrize("sliding", [False, True], ids=["full", "sliding"])
def test_requests_joining_a_running_batch_reply_as_generate(sliding):
    fields = (
        dict(
            num_layers=2,
            layer_types=["sliding_attention", "full_attention"],
            sliding_window=8,
        )
        if sliding
        else {}
    )
    lm = _lm(**fields)
    rng = np.random.default_rng(0)
    lengths = (3, BUCKET + 5, 1, 2 * BUCKET + 3)  # past whole buckets too
    prompts = [rng.integers(1, 500, n).tolist() for n in lengths]
    engine = Engine(lm, slots=2, max_length=96)
    try:
        requests = _run(engine, prompts, gap=True)
    finally:
        engine.close()
    for request, prompt in zip(requests, prompts):
        assert request.tokens == _expected(lm, prompt)
        assert request.finish_reason == "length"


def test_steps_attend_to_the_positions_of_the_busy_rows_only():
    """A step attends to the positions up to its longest row's (a power of
    two where the step compiles), not to the whole cache."""
    lm = _lm()
    prompts = [[5, 9, 2], list(range(1, 71))]  # rows reach 8 and 75 positions
    engine = Engine(lm, slots=2, max_length=128)
    spans, decode = [], engine._programs.decode
    engine._programs.decode = lambda span: spans.append(span) or decode(span)
    try:
        requests = _run(engine, prompts[:1])
        short, spans[:] = list(spans), []
        requests += _run(engine, prompts[1:])
    finally:
        engine.close()
    assert 8 <= max(short) <= SPAN < 75 <= max(spans) <= 2 * SPAN
    for request, prompt in zip(requests, prompts):
        assert request.tokens == _expected(lm, prompt)


def test_a_recurrent_model_takes_its_rows_out_and_back():
    """Linear attention keeps a recurrent state per row: a step of fewer
    rows than slots takes them out of the cache and puts them back."""
    from test_row_decoding import _linear_attention

    lm = _linear_attention()
    lm.tokenizer = _Chars()
    prompts = [[5, 9, 2], [7, 1, 3]]
    engine = Engine(lm, slots=2, max_length=32)
    try:
        requests = _run(engine, prompts, gap=True)
    finally:
        engine.close()
    for request, prompt in zip(requests, prompts):
        assert request.tokens == _expected(lm, prompt)


def test_rows_move_forward_when_an_earlier_one_finishes():
    """A short first request finishes while later ones decode: they move
    into its row (the busy rows stay in front) and reply as generate."""
    lm = _lm()
    prompts = [[5, 6], [7, 8, 9], [3, 1], [2, 4, 6, 8]]
    engine = Engine(lm, slots=4, max_length=64)
    done = threading.Semaphore(0)

    def on_event(text, reason):
        if reason is not None:
            done.release()

    try:
        requests = [
            engine.submit(Request(prompt=p, max_tokens=n, on_event=on_event))
            for p, n in zip(prompts, (1, TOKENS, 2, TOKENS))
        ]
        for _ in prompts:
            assert done.acquire(timeout=300)
    finally:
        engine.close()
    for request, prompt, n in zip(requests, prompts, (1, TOKENS, 2, TOKENS)):
        assert request.tokens == _expected(lm, prompt)[:n]


def test_a_cancelled_request_frees_its_row():
    lm = _lm()
    engine = Engine(lm, slots=1, max_length=64)
    try:
        first = Request(prompt=[5, 6], max_tokens=50)
        engine.submit(first)
        engine.cancel(first)
        (second,) = _run(engine, [[7, 8, 9]])
    finally:
        engine.close()
    assert first.finish_reason == "cancelled"
    assert second.tokens == _expected(lm, [7, 8, 9])


def test_stop_ids_and_the_length_limit():
    lm = _lm()
    expected = _expected(lm, [4, 2])
    engine = Engine(lm, slots=2, max_length=64)
    try:
        events = []
        stop = Request(
            prompt=[4, 2],
            max_tokens=TOKENS,
            stop_ids=frozenset({expected[2]}),
            on_event=lambda text, reason: events.append((text, reason)),
        )
        engine.submit(stop)
        (short,) = _run(engine, [[4, 2]])
    finally:
        engine.close()
    assert short.tokens == expected and short.finish_reason == "length"
    cut = expected.index(expected[2])
    assert stop.tokens == expected[:cut] and stop.finish_reason == "stop"
    assert "".join(text for text, _ in events) == "".join(map(chr, expected[:cut]))


def test_engine_errors_name_the_fix():
    lm = _lm()
    with pytest.raises(ValueError, match="max_length in"):
        Engine(lm, slots=1, max_length=10_000)
    engine = Engine(lm, slots=1, max_length=16)
    try:
        with pytest.raises(ValueError, match="Shorten it"):
            engine.submit(Request(prompt=list(range(1, 17))))
        with pytest.raises(ValueError, match="empty"):
            engine.submit(Request(prompt=[]))
    finally:
        engine.close()
    bare = from_preset("gpt_llama_tiny")
    with pytest.raises(ValueError, match="tokenizer"):
        Engine(bare)


def test_text_stream_holds_back_what_may_change():
    class Bytes:
        def decode(self, ids):
            return bytes(ids).decode("utf-8", errors="replace")

    stream = TextStream(Bytes(), stop_strings=("END",))
    pieces = [stream.push(b) for b in "é!".encode()]  # é is two bytes
    assert pieces[0] == ("", False)  # half a character
    assert "".join(p for p, _ in pieces) == ""  # 2 characters may begin "END"
    out = [stream.push(b) for b in b"abE"]
    assert "".join(p for p, _ in out) == "é!a"
    assert stream.push(ord("N")) == ("b", False)
    assert stream.push(ord("D")) == ("", True)  # "END" is not sent
    assert stream.text == "é!ab"


class _Pieces:
    """A tokenizer of fixed byte pieces (`pieces[id]`), decoded as one UTF-8
    string with errors replaced; `sentencepiece=True`: "▁" is a space, and a
    text's leading space is dropped, as SentencePiece decodes."""

    def __init__(self, pieces, sentencepiece=False):
        self.pieces, self.sentencepiece = pieces, sentencepiece

    def decode(self, ids):
        text = b"".join(self.pieces[i] for i in ids).decode("utf-8", "replace")
        if self.sentencepiece:
            text = text.replace("▁", " ")
            text = text[1:] if text.startswith(" ") else text
        return text


@pytest.mark.parametrize("kind", ["bytes", "pairs", "sentencepiece", "bpe"])
def test_text_stream_sends_the_whole_decoding(kind):
    """Pushed token by token, the text sent (and flushed) equals decoding
    the whole reply, for characters split across tokens (one byte per
    token, or two-byte pieces that end mid-character) and SentencePiece's
    leading space; no piece sent holds half a character."""
    text = "héllo wörld — 価格 😀 done, ok€!"
    data = text.encode()
    if kind == "bpe":
        from keras_transformers.tokenizer import train_bpe

        tokenizer = train_bpe([text, "hello world, ok"] * 4, vocabulary_size=280)
        ids = tokenizer.encode(text)
    elif kind == "sentencepiece":
        words = ["▁" + w for w in text.split(" ")]
        tokenizer = _Pieces([w.encode() for w in words], sentencepiece=True)
        ids = list(range(len(words)))
    else:
        size = 1 if kind == "bytes" else 2
        pieces = [data[i : i + size] for i in range(0, len(data), size)]
        tokenizer, ids = _Pieces(pieces), list(range(len(pieces)))
    for stops in ((), ("wör", "XYZW")):
        stream, sent = TextStream(tokenizer, stops), []
        for token in ids:
            piece, stopped = stream.push(token)
            assert "\ufffd" not in piece
            sent.append(piece)
            if stopped:
                break
        else:
            sent.append(stream.flush())
        whole = tokenizer.decode(ids)
        assert whole == text
        assert "".join(sent) == (whole[: whole.find("wör")] if stops else whole)
        assert stream.text == "".join(sent)
