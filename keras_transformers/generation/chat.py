"""Chat templates and `chat()` for causal LMs.

`apply_chat_template` renders a checkpoint's Jinja chat template with the
semantics of Hugging Face `transformers`' `tokenizer.apply_chat_template(
messages, tokenize=False, add_generation_prompt=True)`: a sandboxed,
immutable Jinja environment with `trim_blocks` and `lstrip_blocks`, the
`raise_exception` and `strftime_now` functions, a `tojson` filter that
keeps non-ASCII characters and does not escape HTML, loop controls
(`break`, `continue`), a no-op `{% generation %}` block, and the
variables `messages`, `add_generation_prompt`, `tools`, `documents` and
the special tokens (`bos_token`, `eos_token`, ...). Jinja2 is imported on
first use. `check_messages` checks a conversation's shape (roles, text
content) first, for `chat()` and any other entry point that takes messages.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime

# The turn layout of Gemma's instruction-tuned checkpoints ("user" and
# "model" turns, a system message opening the first user turn), for a Gemma
# checkpoint that ships without a chat template (a base model, a GGUF file).
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}{% set first = '' %}"
    "{% if messages[0].role == 'system' %}{% set first = messages[0].content + '\n\n' %}"
    "{% set messages = messages[1:] %}{% endif %}"
    "{% for m in messages %}{% set role = 'model' if m.role == 'assistant' else m.role %}"
    "<start_of_turn>{{ role }}\n{{ (first if loop.first else '') + m.content }}"
    "<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

SPECIAL_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


@functools.lru_cache(maxsize=16)
def _compile(template: str):
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(Extension):
        """`{% generation %}...{% endgeneration %}` renders its body (Hugging
        Face uses it to mark assistant tokens for training masks)."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            call = self.call_method("_render")
            return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x,
            ensure_ascii=ensure_ascii,
            indent=indent,
            separators=separators,
            sort_keys=sort_keys,
        )

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[GenerationBlock, loopcontrols],
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(template)


ROLES = ("system", "developer", "user", "assistant", "tool")
MESSAGE_FORM = "{'role': 'user', 'content': 'Hi'}"


def check_messages(messages) -> list[dict]:
    """Checks a conversation before it meets a chat template; returns it as
    fresh message dicts, with content given as text parts joined.

    A conversation is one string (a single user message) or a non-empty
    list of dicts, each with

    - `role`: "system", "developer", "user", "assistant" or "tool";
    - `content`: a string, or a list of text parts
      `{"type": "text", "text": "..."}` (as the OpenAI chat API allows),
      joined with newlines into one string. An assistant message with
      `tool_calls` may leave `content` out (or None).

    Other keys (`tool_calls`, `tool_call_id`, `name`, ...) pass through to
    the template unchanged.

    Args:
        messages: the conversation.

    Returns:
        A list of new dicts (the input is not modified).

    Raises:
        ValueError: naming the first bad message's index, what is wrong and
            the fix.
        TypeError: `messages` is neither a string nor a list, or one of its
            messages is not a dict.

    Examples:
        >>> check_messages("Hi")
        [{'role': 'user', 'content': 'Hi'}]
        >>> check_messages([{"role": "user", "content": [
        ...     {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
        [{'role': 'user', 'content': 'a\\nb'}]
    """
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    if isinstance(messages, dict) or not isinstance(messages, (list, tuple)):
        raise TypeError(
            "`messages` must be a string or a list of message dicts like "
            f"{MESSAGE_FORM}. Received: {type(messages).__name__}"
        )
    if not messages:
        raise ValueError("`messages` is empty: pass at least one message.")
    return [_check_message(i, message) for i, message in enumerate(messages)]


def _check_message(i: int, message) -> dict:
    where = f"Message {i}"
    if not isinstance(message, dict):
        raise TypeError(
            f"{where} is a {type(message).__name__}, not a dict: chat messages are "
            f"dicts like {MESSAGE_FORM}. Received: {message!r}"
        )
    role = message.get("role")
    if role is None:
        raise ValueError(
            f"{where} has no 'role'. Add one of {ROLES}, e.g. {MESSAGE_FORM}."
        )
    if role not in ROLES:
        raise ValueError(f"{where} has role {role!r}; the role must be one of {ROLES}.")
    content = message.get("content")
    if content is None and role == "assistant" and message.get("tool_calls"):
        return dict(message)
    return {**message, "content": _text(where, content)}


def _text(where: str, content) -> str:
    if isinstance(content, str):
        return content
    fix = (
        "Give the content as a string, or as a list of text parts "
        "[{'type': 'text', 'text': '...'}]"
    )
    if content is None:
        raise ValueError(f"{where} has no 'content' (or content None). {fix}.")
    if not isinstance(content, (list, tuple)):
        raise ValueError(
            f"{where} has content of type {type(content).__name__}. {fix}. "
            f"Received: {content!r}"
        )
    texts = []
    for j, part in enumerate(content):
        text = part.get("text") if isinstance(part, dict) else None
        if not (isinstance(part, dict) and part.get("type") == "text"):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise ValueError(
                f"{where}, content part {j} is {kind!r}, not a text part: these "
                f"models read text only. {fix}."
            )
        if not isinstance(text, str):
            raise ValueError(f"{where}, content part {j} has no string 'text'. {fix}.")
        texts.append(text)
    return "\n".join(texts)


def _plain(messages):
    """Messages as fresh dicts, keys whose value is None dropped."""
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    out = []
    for message in messages:
        if not isinstance(message, dict):
            raise TypeError(
                "Chat messages are dicts like {'role': 'user', 'content': 'Hi'}. "
                f"Received: {message!r}"
            )
        out.append({k: v for k, v in message.items() if v is not None})
    if not out:
        raise ValueError("`messages` is empty: pass at least one message.")
    return out


def apply_chat_template(
    template: str,
    messages,
    add_generation_prompt: bool = True,
    tools=None,
    documents=None,
    **special_tokens,
) -> str:
    """Renders a Jinja chat template, as `transformers`' `apply_chat_template(
    messages, tokenize=False, add_generation_prompt=...)`.

    Args:
        template: the Jinja source (e.g. `tokenizer.chat_template`).
        messages: a list of `{"role": ..., "content": ...}` dicts (keys
            whose value is None are dropped, as `transformers` does), or a
            single string: one user message.
        add_generation_prompt: end with the header that opens the
            assistant's reply.
        tools: optional list of tool JSON schemas, as the template expects.
        documents: optional list of documents, as the template expects.
        **special_tokens: more template variables, usually `bos_token`,
            `eos_token`, `pad_token`, `unk_token`...

    Returns:
        The rendered prompt text (special tokens written as text; encode it
        without adding special tokens).

    Raises:
        jinja2.exceptions.TemplateError: the template called
            `raise_exception(message)` or is invalid.
        jinja2.exceptions.SecurityError: the template tried something the
            sandbox forbids.

    Examples:
        >>> apply_chat_template(
        ...     "{% for m in messages %}<{{ m.role }}>{{ m.content }}\\n{% endfor %}"
        ...     "{% if add_generation_prompt %}<assistant>{% endif %}",
        ...     [{"role": "user", "content": "Hi"}],
        ... )
        '<user>Hi\\n<assistant>'
    """
    return _compile(template).render(
        messages=_plain(messages),
        tools=tools,
        documents=documents,
        add_generation_prompt=add_generation_prompt,
        **special_tokens,
    )


def special_tokens(tokenizer) -> dict:
    """The tokenizer's special-token strings that are set, by name."""
    out = {}
    for name in SPECIAL_TOKENS:
        value = getattr(tokenizer, name, None)
        if isinstance(value, str):
            out[name] = value
    return out


def _template(model, chat_template):
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        raise ValueError(
            "chat() needs a tokenizer: load a checkpoint that has one, or set "
            "`model.tokenizer = ...`."
        )
    template = chat_template or getattr(tokenizer, "chat_template", None)
    if not template:
        raise ValueError(
            f"The model's tokenizer ({type(tokenizer).__name__}) has no chat template. "
            "Pass `chat_template=` (a Jinja string), or set "
            "`model.tokenizer.chat_template = ...` (checkpoints ship it in "
            "tokenizer_config.json or chat_template.jinja)."
        )
    return tokenizer, template


def end_token_ids(model) -> tuple[int, ...]:
    """Ids that end a reply: the generation config's `eos_token_id`s, the
    model config's and the tokenizer's end token."""
    from keras_transformers.generation.config import generation_config

    ids = list(generation_config(model).eos_token_id or ())
    ids.append(model.config.eos_token_id)
    ids.append(getattr(getattr(model, "tokenizer", None), "eos_token_id", None))
    return tuple(dict.fromkeys(int(i) for i in ids if i is not None))


def chat(
    model,
    messages,
    max_new_tokens: int | None = None,
    stream=None,
    chat_template: str | None = None,
    **generate_kwargs,
) -> str:
    """Answers a conversation with a causal LM and its chat template.

    Renders `messages` with the template (`apply_chat_template`, with the
    generation prompt), encodes the text without adding special tokens,
    generates until an end token (the generation config's `eos_token_id`s,
    e.g. `<|im_end|>`, the config's and the tokenizer's end token) and
    returns the reply. To continue the conversation, append
    `{"role": "assistant", "content": reply}` and the next user message to
    `messages` and call `chat` again.

    Args:
        model: a `CausalLM` whose `tokenizer` has `encode`, `decode` and a
            `chat_template` (or pass `chat_template`).
        messages: a list of `{"role", "content"}` dicts, or one string (a
            single user message); checked by `check_messages`.
        max_new_tokens: reply tokens at most (default: as `generate`).
        stream: None; True prints the reply as it is generated; or a
            callable `stream(text)` called with the new text of the reply
            each time complete characters arrive.
        chat_template: a Jinja template to use instead of the tokenizer's.
        **generate_kwargs: sampler settings and the rest of `generate()`'s
            options (`sampler`, `temperature`, `top_k`, `top_p`, `seed`,
            `stop_strings`, `min_new_tokens`, `repetition_penalty`, ...).

    Returns:
        The reply text, without the prompt and without the end token.

    Raises:
        ValueError: a malformed message (see `check_messages`), no
            tokenizer, or no chat template.
    """
    messages = check_messages(messages)
    tokenizer, template = _template(model, chat_template)
    prompt = apply_chat_template(template, messages, True, **special_tokens(tokenizer))
    ids = [int(t) for t in tokenizer.encode(prompt)]
    end_ids = end_token_ids(model)
    generate_kwargs.setdefault("stop_token_ids", end_ids)
    stop = set(generate_kwargs["stop_token_ids"] or ())
    reply: list[int] = []
    callback = emit = None
    if stream is not None and stream is not False:
        emit = _Emitter(_print if stream is True else stream)

        def callback(tokens):
            token = int(tokens[0])
            if token < 0 or token in stop:
                return
            reply.append(token)
            text = tokenizer.decode(reply)
            if not text.endswith("\ufffd"):  # wait for a split character's bytes
                emit(text)

    out = model.generate(
        [ids], max_new_tokens=max_new_tokens, stream=callback, **generate_kwargs
    )
    completion = [int(t) for t in out[0][len(ids) :]]  # one row: no padding
    if completion and completion[-1] in stop:
        completion = completion[:-1]  # the end token
    text = tokenizer.decode(completion)
    if callback is not None:
        emit(text)  # what a split character held back, if anything
    if stream is True:
        print(flush=True)
    return _cut(text, generate_kwargs.get("stop_strings"))


def _print(text):
    print(text, end="", flush=True)


class _Emitter:
    """Passes only the new part of the reply's text to a user callback."""

    def __init__(self, callback):
        self.callback, self.sent = callback, 0

    def __call__(self, text_so_far):
        if len(text_so_far) > self.sent:
            self.callback(text_so_far[self.sent :])
            self.sent = len(text_so_far)


def _cut(text, stop_strings):
    from keras_transformers.generation.stop_strings import first_end, normalize

    strings = normalize(stop_strings)
    end = first_end(text, strings) if strings else None
    return text if end is None else text[:end]
