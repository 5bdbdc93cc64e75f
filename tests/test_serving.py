"""`keras-transformers serve`, driven by the official `openai` client
against a real server process on 127.0.0.1: greedy replies equal
`lm.chat` / `lm.generate` in-process, streamed text equals the
non-streamed text, stopping by end token, stop string and `max_tokens`,
seeded sampling repeats, bad requests get OpenAI-shaped 4xx errors while
the server keeps serving, concurrent clients all finish, a client that
leaves mid-stream frees its slot (`GET /stats`), and embeddings equal
`TextEmbedder.encode`."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from contracts import toy_run_env  # noqa: E402

from keras_transformers import from_preset  # noqa: E402
from keras_transformers.tokenizer import train_bpe  # noqa: E402

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TEXTS = [
    "hello world, how are you today? I am fine, thank you very much.",
    "the quick brown fox jumps over the lazy dog and runs away.",
    "serving models over http with batching is what this tests.",
]
MAX_LENGTH = 96
QUESTIONS = ["hello", "how are you?", "the fox", "tell me about dogs", "fine", "why?"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(directory, name, tmp_path_factory, *extra):
    """A server process for `directory` (JAX's test settings: its warm-up
    compiles tiny programs, `contracts.toy_run_env`); returns `(process,
    client)`."""
    port = _free_port()
    log = tmp_path_factory.mktemp("server") / "log.txt"
    command = [sys.executable, "-m", "keras_transformers.cli", "serve", str(directory)]
    command += ["--port", str(port), "--model-name", name, *extra]
    with open(log, "w") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=toy_run_env()
        )
    client = openai.OpenAI(
        base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0
    )
    deadline = time.time() + 300
    while True:
        try:
            client.models.list()
            return process, client
        except openai.APIConnectionError:
            if process.poll() is not None or time.time() > deadline:
                process.kill()
                raise AssertionError(
                    f"server did not start:\n{log.read_text()[-3000:]}"
                ) from None
            time.sleep(0.5)


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """A tiny chat model saved with its tokenizer and chat template, and the
    same model loaded in this process."""
    tokenizer = train_bpe(
        TEXTS * 4,
        vocabulary_size=300,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        end_token="<|im_end|>",
    )
    lm = from_preset(
        "gpt_llama_tiny",
        vocabulary_size=tokenizer.vocabulary_size,
        max_sequence_length=128,
    )
    lm.tokenizer = tokenizer
    directory = tmp_path_factory.mktemp("chat") / "preset"
    lm.save_to_preset(directory)
    (directory.parent / "template.jinja").write_text(TEMPLATE)
    return directory, from_preset(directory)


@pytest.fixture(scope="module")
def server(chat_model, tmp_path_factory):
    directory, lm = chat_model
    template = str(directory.parent / "template.jinja")
    extra = [
        "--slots",
        "4",
        "--max-length",
        str(MAX_LENGTH),
        "--chat-template",
        template,
    ]
    process, client = _start(directory, "tiny", tmp_path_factory, *extra)
    yield client, lm
    process.terminate()
    process.wait(timeout=60)


def _chat(client, question, **kwargs):
    kwargs.setdefault("max_tokens", 10)
    kwargs.setdefault("temperature", 0)
    messages = [{"role": "user", "content": question}]
    return client.chat.completions.create(model="tiny", messages=messages, **kwargs)


def test_models_lists_the_served_model(server):
    client, _ = server
    assert [m.id for m in client.models.list().data] == ["tiny"]


def test_greedy_chat_equals_lm_chat_and_streaming_equals_it(server):
    client, lm = server
    for question in QUESTIONS[:3]:
        reply = _chat(client, question)
        message = [{"role": "user", "content": question}]
        expected = lm.chat(
            message, max_new_tokens=10, sampler="greedy", chat_template=TEMPLATE
        )
        assert reply.choices[0].message.content == expected
        assert reply.choices[0].message.role == "assistant"
        ids = lm.tokenizer.encode(_render(lm, message))
        assert reply.usage.prompt_tokens == len(ids)
        chunks = list(_chat(client, question, stream=True))
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
        assert streamed == expected
        assert chunks[-1].choices[0].finish_reason == reply.choices[0].finish_reason
        assert chunks[0].choices[0].delta.role == "assistant"


def _render(lm, messages):
    from keras_transformers.generation import apply_chat_template
    from keras_transformers.generation.chat import special_tokens

    tokens = special_tokens(lm.tokenizer)
    return apply_chat_template(TEMPLATE, messages, True, **tokens)


def test_completion_equals_generate(server):
    client, lm = server
    prompt = "the quick brown"
    out = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=8, temperature=0
    )
    ids = [int(t) for t in lm.tokenizer.encode(prompt)]
    end = int(lm.tokenizer.eos_token_id)
    row = np.asarray(lm.generate([ids], max_new_tokens=8, stop_token_ids=[end]))[0]
    new = [int(t) for t in row[len(ids) :]]
    new = new[: new.index(end)] if end in new else new
    assert out.choices[0].text == lm.tokenizer.decode(new)
    assert out.usage.completion_tokens == len(new)
    assert out.choices[0].finish_reason == ("stop" if len(new) < 8 else "length")


def test_max_tokens_and_stop_strings_end_the_reply(server):
    client, _ = server
    short = _chat(client, "hello", max_tokens=3)
    assert short.usage.completion_tokens <= 3
    if short.usage.completion_tokens == 3:
        assert short.choices[0].finish_reason == "length"
    full = _chat(client, "hello", max_tokens=20).choices[0].message.content
    if len(full) < 4:
        pytest.skip("the random model's reply is too short to cut")
    stop = full[2:4]
    cut = _chat(client, "hello", max_tokens=20, stop=[stop])
    assert cut.choices[0].message.content == full[: full.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    streamed = _chat(client, "hello", max_tokens=20, stop=stop, stream=True)
    assert (
        "".join(c.choices[0].delta.content or "" for c in streamed)
        == full[: full.index(stop)]
    )


def test_seeded_sampling_repeats(server):
    client, _ = server
    first = _chat(client, "why?", temperature=1.0, top_p=0.9, seed=7, max_tokens=12)
    again = _chat(client, "why?", temperature=1.0, top_p=0.9, seed=7, max_tokens=12)
    assert first.choices[0].message.content == again.choices[0].message.content


def test_concurrent_clients_all_finish_with_their_own_replies(server):
    client, _ = server
    alone = [_chat(client, q).choices[0].message.content for q in QUESTIONS]
    with ThreadPoolExecutor(len(QUESTIONS)) as pool:
        replies = list(pool.map(lambda q: _chat(client, q), QUESTIONS))
    assert [r.choices[0].message.content for r in replies] == alone


def _stats(client) -> dict:
    url = str(client.base_url).rstrip("/").removesuffix("/v1") + "/stats"
    with urllib.request.urlopen(url, timeout=30) as answer:
        return json.load(answer)


def test_a_client_leaving_mid_stream_frees_its_slot(server):
    client, _ = server
    for token in range(3, 13):  # a one-token prompt whose reply fills the cache
        request = dict(model="tiny", prompt=[token], max_tokens=MAX_LENGTH - 1)
        whole = client.completions.create(temperature=0, **request)
        if whole.choices[0].finish_reason == "length":
            break
    else:
        pytest.skip("the random model's replies all end before the cache does")
    before = _stats(client)
    assert before["slots"] == 4 and before["slots_busy"] == 0
    stream = client.completions.create(temperature=0, stream=True, **request)
    next(iter(stream))  # the reply has begun
    stream.close()
    deadline = time.time() + 60
    while (after := _stats(client))["slots_busy"] and time.time() < deadline:
        time.sleep(0.02)
    assert after["slots_busy"] == 0
    cancelled = after["requests_finished"]["cancelled"]
    assert cancelled == before["requests_finished"]["cancelled"] + 1
    assert after["tokens_generated"] - before["tokens_generated"] < MAX_LENGTH - 1


@pytest.mark.parametrize(
    "kwargs, status, match",
    [
        (dict(model="nope"), 404, "does not exist"),
        (dict(messages=[{"role": "wizard", "content": "hi"}]), 400, "role"),
        (dict(messages=[{"role": "user", "content": None}]), 400, "content"),
        (dict(max_tokens=-1), 400, "max_tokens"),
        (dict(temperature=3), 400, "temperature"),
        (dict(messages=[{"role": "user", "content": "fox " * 200}]), 400, "Shorten"),
    ],
)
def test_bad_requests_get_openai_errors_and_the_server_goes_on(
    server, kwargs, status, match
):
    client, _ = server
    request = dict(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    with pytest.raises(openai.APIStatusError, match=match) as caught:
        client.chat.completions.create(**{**request, **kwargs})
    assert caught.value.status_code == status
    assert caught.value.body["message"] and caught.value.body["type"]
    assert _chat(client, "hello", max_tokens=2).choices


def test_embeddings_equal_encode(minilm_dir, tmp_path_factory):
    from keras_transformers.models import TextEmbedder

    process, client = _start(minilm_dir, "minilm", tmp_path_factory)
    try:
        texts = ["A man is eating food.", "A cheetah runs."]
        out = client.embeddings.create(model="minilm", input=texts)
        assert [d.index for d in out.data] == [0, 1]
        expected = TextEmbedder.from_preset(minilm_dir).encode(texts)
        np.testing.assert_allclose([d.embedding for d in out.data], expected, atol=1e-5)
        assert out.usage.prompt_tokens > 0
        with pytest.raises(openai.BadRequestError, match="causal language model"):
            client.chat.completions.create(
                model="minilm", messages=[{"role": "user", "content": "hi"}]
            )
    finally:
        process.terminate()
        process.wait(timeout=60)


@pytest.mark.once  # the command's check, before any backend work
def test_serve_refuses_a_model_without_a_tokenizer():
    done = subprocess.run(
        [sys.executable, "-m", "keras_transformers.cli", "serve", "gpt2_tiny"],
        capture_output=True,
        text=True,
        env={**os.environ},
        timeout=300,
    )
    assert done.returncode == 2
    assert "no tokenizer" in done.stderr
