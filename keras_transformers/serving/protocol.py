"""The OpenAI API's request checks and response shapes (the parts a chat,
completion or embedding client reads), without a web framework."""

from __future__ import annotations

import numbers
import time
import uuid


class APIError(Exception):
    """A request the server refuses: HTTP `status` and an OpenAI-shaped body
    (`{"error": {"message", "type", "param", "code"}}`)."""

    def __init__(self, message, status=400, param=None, code=None):
        super().__init__(message)
        self.status, self.param, self.code = status, param, code

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {
            "error": {
                "message": str(self),
                "type": kind,
                "param": self.param,
                "code": self.code,
            }
        }


def _number(body, name, default, low, high, integer=False):
    value = body.get(name)
    if value is None:
        return default
    kinds = numbers.Integral if integer else numbers.Real
    if (
        isinstance(value, bool)
        or not isinstance(value, kinds)
        or not low <= value <= high
    ):
        what = "an integer" if integer else "a number"
        raise APIError(
            f"`{name}` must be {what} in [{low}, {high}]; got {value!r}.", param=name
        )
    return value


def sampling(body: dict, defaults) -> dict:
    """`max_tokens`, `temperature`, `top_p`, `seed`, `stop` of a request
    (missing ones from the model's generation config `defaults`, else
    OpenAI's defaults) as `Request` fields.

    Raises:
        APIError: a value of the wrong type or out of range, `n` other
            than 1.
    """
    if _number(body, "n", 1, 1, 1, integer=True) != 1:
        raise APIError("Only `n=1` is served.", param="n")
    tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    sampled = bool(getattr(defaults, "do_sample", False))
    temperature = getattr(defaults, "temperature", None) if sampled else 0.0
    top_p = getattr(defaults, "top_p", None) if sampled else 1.0
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (
        not isinstance(stop, list)
        or len(stop) > 4
        or not all(isinstance(s, str) and s for s in stop)
    ):
        raise APIError(
            "`stop` must be a non-empty string or a list of up to 4 of them.",
            param="stop",
        )
    return {
        "max_tokens": _number({"max_tokens": tokens}, "max_tokens", 16, 1, 10**9, True),
        "temperature": float(
            _number(
                body, "temperature", 1.0 if temperature is None else temperature, 0, 2
            )
        ),
        "top_p": float(_number(body, "top_p", 1.0 if top_p is None else top_p, 0, 1)),
        "seed": _number(body, "seed", None, 0, 2**63 - 1, integer=True),
        "stop_strings": tuple(stop or ()),
    }


def stamp(kind: str) -> dict:
    """The `id`, `object` and `created` fields of a response of `kind`."""
    prefix = "chatcmpl" if kind.startswith("chat") else "cmpl"
    return {
        "id": f"{prefix}-{uuid.uuid4().hex[:24]}",
        "object": kind,
        "created": int(time.time()),
    }


def usage(prompt: int, completion: int) -> dict:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def choice(chat: bool, text: str, reason, delta: bool = False, first=False) -> dict:
    """One entry of `choices`: a chat message (or its streamed `delta`) or
    a completion's text."""
    if not chat:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
    if delta:
        part = {"role": "assistant", "content": text} if first else {"content": text}
        if reason is not None and not text:
            part = {}
        return {"index": 0, "delta": part, "logprobs": None, "finish_reason": reason}
    message = {"role": "assistant", "content": text}
    return {"index": 0, "message": message, "logprobs": None, "finish_reason": reason}
