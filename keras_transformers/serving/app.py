"""The OpenAI-compatible HTTP API (Starlette; `pip install
keras-transformers[serve]`).

Routes: `GET /v1/models`; for a causal LM `POST /v1/chat/completions` and
`POST /v1/completions` (decoded by one continuous-batching `Engine`,
streamed as server-sent events with `stream: true`) and `GET /stats` (the
engine's counts as JSON, see `Engine.stats`); for a `TextEmbedder`
`POST /v1/embeddings`. A refused request gets a 4xx answer with OpenAI's
error body, and the server keeps serving.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import threading

import numpy as np
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from keras_transformers.generation.chat import (
    apply_chat_template,
    check_messages,
    end_token_ids,
    special_tokens,
)
from keras_transformers.generation.config import generation_config
from keras_transformers.generation.prompts import encode_text
from keras_transformers.models.text_embedder import token_rows
from keras_transformers.serving.engine import Engine, Request
from keras_transformers.serving.protocol import (
    APIError,
    choice,
    sampling,
    stamp,
    usage,
)


class _Served:
    """What the routes share: the model, its engine or embedding lock."""

    def __init__(self, model, model_id, chat_template, **engine):
        self.model, self.model_id = model, model_id
        self.tokenizer = getattr(model, "tokenizer", None)
        self.embeds = hasattr(model, "encode") and not hasattr(model, "generate")
        self.engine = None if self.embeds else Engine(model, **engine)
        self.template = chat_template or getattr(self.tokenizer, "chat_template", None)
        self.lock = threading.Lock()

    def check_model(self, body: dict, route: str, embeds: bool) -> None:
        name = body.get("model")
        if name is not None and name != self.model_id:
            raise APIError(
                f"The model {name!r} does not exist here; this server serves "
                f"{self.model_id!r} (GET /v1/models).",
                status=404,
                param="model",
                code="model_not_found",
            )
        if embeds != self.embeds:
            what = "text embedding model" if embeds else "causal language model"
            raise APIError(
                f"{route} needs a {what}; {self.model_id!r} is a "
                f"{type(self.model).__name__}.",
                param="model",
            )


async def _body(http: HTTPRequest) -> dict:
    try:
        body = json.loads(await http.body())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise APIError("The request body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise APIError("The request body must be a JSON object.")
    return body


def _prompt_ids(served: _Served, body: dict, chat: bool) -> list[int]:
    tokenizer = served.tokenizer
    if chat:
        try:
            messages = check_messages(body.get("messages"))
        except (ValueError, TypeError) as error:
            raise APIError(str(error), param="messages") from None
        if not served.template:
            raise APIError(
                f"{served.model_id!r} has no chat template: use /v1/completions, "
                "or start the server with --chat-template FILE.",
                param="messages",
            )
        text = apply_chat_template(
            served.template, messages, True, **special_tokens(tokenizer)
        )
        return [int(t) for t in tokenizer.encode(text)]
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        return encode_text(tokenizer, prompt)[0]
    vocabulary = served.model.config.vocabulary_size
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and 0 <= t < vocabulary for t in prompt)
    ):
        return list(prompt)
    raise APIError(
        "`prompt` must be a non-empty string (or a list of token ids in "
        f"[0, {vocabulary})); one prompt per request.",
        param="prompt",
    )


async def _complete(served: _Served, http: HTTPRequest, chat: bool):
    body = await _body(http)
    route = "/v1/chat/completions" if chat else "/v1/completions"
    served.check_model(body, route, embeds=False)
    ids = _prompt_ids(served, body, chat)
    settings = sampling(body, generation_config(served.model))
    loop, queue = asyncio.get_running_loop(), asyncio.Queue()

    def on_event(text, reason):
        loop.call_soon_threadsafe(queue.put_nowait, (text, reason))

    request = Request(
        prompt=ids,
        stop_ids=frozenset(end_token_ids(served.model)),
        on_event=on_event,
        **settings,
    )
    try:
        served.engine.submit(request)
    except ValueError as error:
        param = "messages" if chat else "prompt"
        raise APIError(
            str(error), param=param, code="context_length_exceeded"
        ) from None
    kind = "chat.completion" if chat else "text_completion"
    if body.get("stream"):
        options = body.get("stream_options") or {}
        events = _events(served, request, queue, chat, len(ids), options)
        return StreamingResponse(events, media_type="text/event-stream")
    pieces = []
    while True:
        try:
            text, reason = await asyncio.wait_for(queue.get(), timeout=1.0)
        except asyncio.TimeoutError:
            if await http.is_disconnected():
                served.engine.cancel(request)
                return JSONResponse({}, status_code=499)
            continue
        pieces.append(text)
        if reason is not None:
            break
    _raise_failure(reason)
    return JSONResponse(
        {
            **stamp(kind),
            "model": served.model_id,
            "choices": [choice(chat, "".join(pieces), reason)],
            "usage": usage(len(ids), len(request.tokens)),
        }
    )


def _raise_failure(reason: str) -> None:
    if reason.startswith("error"):
        raise APIError(f"Generation failed: {reason[7:]}", status=500)


async def _events(served, request, queue, chat, prompt_tokens, options):
    """Server-sent events of a streamed completion; a client that goes away
    cancels its request (its row is freed)."""
    kind = "chat.completion.chunk" if chat else "text_completion"
    base, first = {**stamp(kind), "model": served.model_id}, True
    try:
        while True:
            text, reason = await queue.get()
            if reason is not None and reason.startswith("error"):
                reason = "error"
            if text or first or reason is not None:
                part = choice(chat, text, reason, delta=True, first=first)
                yield f"data: {json.dumps({**base, 'choices': [part]})}\n\n"
                first = False
            if reason is not None:
                break
        if options.get("include_usage"):
            tail = {
                **base,
                "choices": [],
                "usage": usage(prompt_tokens, len(request.tokens)),
            }
            yield f"data: {json.dumps(tail)}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        if request.finish_reason is None:
            served.engine.cancel(request)


async def _embeddings(served: _Served, http: HTTPRequest):
    body = await _body(http)
    served.check_model(body, "/v1/embeddings", embeds=True)
    texts = body.get("input")
    if isinstance(texts, str):
        texts = [texts]
    if not (
        isinstance(texts, list)
        and texts
        and all(isinstance(t, str) and t for t in texts)
    ):
        raise APIError(
            "`input` must be a non-empty string or a list of them.", param="input"
        )
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise APIError(
            "`encoding_format` must be 'float' or 'base64'.", param="encoding_format"
        )

    def embed():
        with served.lock:
            vectors = np.asarray(served.model.encode(texts), "float32")
        limit = served.model.config.max_sequence_length
        count = sum(len(row) for row in token_rows(served.tokenizer, texts, limit))
        return vectors, count

    vectors, count = await run_in_threadpool(embed)
    data = [
        {
            "object": "embedding",
            "index": i,
            "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode()
            if encoding == "base64"
            else v.tolist(),
        }
        for i, v in enumerate(vectors)
    ]
    return JSONResponse(
        {
            "object": "list",
            "data": data,
            "model": served.model_id,
            "usage": {"prompt_tokens": count, "total_tokens": count},
        }
    )


@contextlib.asynccontextmanager
async def _lifespan(app):
    yield
    engine = app.state.served.engine
    if engine is not None:
        engine.close()


def create_app(
    model,
    model_id: str,
    slots: int = 8,
    max_length=None,
    chat_template=None,
    warm_up: bool = False,
    prefix_memory: float = 256,
) -> Starlette:
    """The server's ASGI application (run it with uvicorn).

    Args:
        model: a causal LM with a tokenizer (chat and completions), or a
            `TextEmbedder` (embeddings).
        model_id: the name clients pass as `model`.
        slots, max_length, warm_up, prefix_memory: the engine's batch rows,
            positions per row, whether it compiles its programs before
            serving, and MiB for kept prompt rows (see `Engine`).
        chat_template: a Jinja template instead of the tokenizer's.
    """
    engine = {"slots": slots, "max_length": max_length, "warm_up": warm_up}
    served = _Served(
        model, model_id, chat_template, prefix_memory=prefix_memory, **engine
    )

    async def models(http):
        entry = {
            "id": model_id,
            "object": "model",
            "created": 0,
            "owned_by": "keras-transformers",
        }
        return JSONResponse({"object": "list", "data": [entry]})

    async def chat(http):
        return await _complete(served, http, chat=True)

    async def completions(http):
        return await _complete(served, http, chat=False)

    async def embeddings(http):
        return await _embeddings(served, http)

    async def stats(http):
        engine = served.engine
        return JSONResponse({"model": model_id, **(engine.stats() if engine else {})})

    async def api_error(http, error: APIError):
        return JSONResponse(error.body(), status_code=error.status)

    async def http_error(http, error: HTTPException):
        body = APIError(
            f"{http.method} {http.url.path}: {error.detail}", error.status_code
        )
        return JSONResponse(body.body(), status_code=error.status_code)

    app = Starlette(
        routes=[
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/embeddings", embeddings, methods=["POST"]),
            Route("/stats", stats, methods=["GET"]),
        ],
        exception_handlers={APIError: api_error, HTTPException: http_error},
        lifespan=_lifespan,
    )
    app.state.served = served
    return app


__all__ = ["APIError", "create_app"]
