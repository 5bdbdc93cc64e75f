"""Supervised fine-tuning data: conversations rendered with a checkpoint's
chat template and trained on the assistant's turns only, prompt /
completion pairs trained on the completion only, and packing of several
examples per row.

An *example* is a token sequence with a per-token flag saying which
tokens the loss trains on (`Example.ids`, `Example.trained`). `sft_dataset`
turns examples into the arrays of `model.fit`: inputs `ids[:-1]`, labels
`ids[1:]`, and a `sample_weight` of 1 where the label is a trained token,
one example per row (padded) or several per row (`pack=True`, with
`document_ids` so that no token attends to another example's). With
`MaskedSparseCategoricalCrossentropy` (the mean over weighted tokens) a
packed batch has the loss of the same examples unpacked.

Examples:
    >>> template = (
    ...     "{% for m in messages %}<{{ m.role }}>{{ m.content }}</s>\\n{% endfor %}"
    ...     "{% if add_generation_prompt %}<assistant>{% endif %}"
    ... )
    >>> render_conversation(
    ...     [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}],
    ...     template,
    ... )
    ('<user>Hi</s>\\n<assistant>Yo</s>\\n', [(24, 30)])
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np

from keras_transformers.generation.chat import apply_chat_template, special_tokens


class Example(NamedTuple):
    """One training example: token `ids` and, per token, whether the loss
    trains on predicting it (`trained`, same length)."""

    ids: list[int]
    trained: list[bool]


class SFTData(NamedTuple):
    """Arrays for `model.fit(data.x, data.y, sample_weight=data.sample_weight)`.

    `x`: `{"token_ids": [N, T] int32, "padding_mask": [N, T] bool}` (plus
    `"document_ids": [N, T] int32` when packed: 1, 2, ... per example of a
    row, 0 on padding); `y`: `[N, T]` int32 next-token labels (0 on
    padding); `sample_weight`: `[N, T]` float32, 1 where the label is
    trained. `num_truncated`: examples cut to fit a row.
    """

    x: dict
    y: np.ndarray
    sample_weight: np.ndarray
    num_truncated: int


def render_conversation(
    messages: Sequence[dict], chat_template: str, **template_variables
) -> tuple[str, list[tuple[int, int]]]:
    """Renders a conversation and finds its assistant turns in the text.

    Each assistant turn is what rendering the conversation through that
    turn adds to rendering the turns before it with the generation prompt
    (the assistant's header): its content and the template's end-of-turn
    text, trailing whitespace excluded.

    Args:
        messages: `{"role", "content"}` dicts; at least one "assistant"
            message, none of them first.
        chat_template: the Jinja template (`tokenizer.chat_template`).
        **template_variables: e.g. `bos_token`, `eos_token`.

    Returns:
        `(text, spans)`: the rendered conversation (no generation prompt)
        and one `(start, end)` character span per assistant turn.

    Raises:
        ValueError: no assistant turn, an assistant turn first, or a
            template whose rendering of a conversation does not begin with
            its rendering of the earlier turns (e.g. one that drops the
            reasoning of earlier assistant turns): such a conversation
            cannot be split into prompt and answers; train on its last turn
            with `completion_example` instead.
    """

    def render(turns, prompt):
        return apply_chat_template(chat_template, turns, prompt, **template_variables)

    messages = list(messages)
    roles = [m.get("role") if isinstance(m, dict) else None for m in messages]
    if "assistant" not in roles:
        raise ValueError(
            "The conversation has no assistant turn to train on; roles: "
            f"{roles}. Add the answer as {{'role': 'assistant', 'content': ...}}."
        )
    if roles[0] == "assistant":
        raise ValueError(
            "The conversation starts with an assistant turn: it has no prompt. "
            "Start with a user (or system) message."
        )
    text = render(messages, False)
    spans = []
    for i, role in enumerate(roles):
        if role != "assistant":
            continue
        before = render(messages[:i], True)
        through = render(messages[: i + 1], False)
        if not (through.startswith(before) and text.startswith(through)):
            raise ValueError(
                f"The chat template renders the conversation up to turn {i} "
                "differently from the start of the whole conversation, so "
                "its assistant turns cannot be told apart (templates that "
                "rewrite earlier turns, e.g. dropping their reasoning). Train "
                "on the last turn with `completion_example(prompt_messages, "
                "answer)` instead."
            )
        end = len(through.rstrip())
        spans.append((len(before), max(end, len(before))))
    return text, spans


def _token_boundary(tokenizer, text: str, ids: list[int], position: int) -> int:
    """The index of the first token of `ids` (the tokens of `text`) at or
    after character `position`: the length of the common start of `ids`
    and the tokens of `text[:position]` (a token that straddles the
    position starts before it)."""
    head = [int(t) for t in tokenizer.encode(text[:position])]
    n = 0
    for a, b in zip(head, ids, strict=False):
        if a != b:
            break
        n += 1
    return n


def conversation_example(tokenizer, messages, chat_template=None) -> Example:
    """A conversation as an `Example` trained on its assistant turns only
    (see `render_conversation`), tokenized as `chat()` tokenizes prompts:
    the rendered text encoded without adding special tokens."""
    template = _template(tokenizer, chat_template)
    text, spans = render_conversation(messages, template, **special_tokens(tokenizer))
    return _example(tokenizer, text, spans)


def _example(tokenizer, text: str, spans) -> Example:
    """`text` encoded, trained on the tokens of its character `spans`."""
    ids = [int(t) for t in tokenizer.encode(text)]
    trained = [False] * len(ids)
    for start, end in spans:
        a = _token_boundary(tokenizer, text, ids, start)
        z = _token_boundary(tokenizer, text, ids, end) if end < len(text) else len(ids)
        trained[a:z] = [True] * (z - a)
    return Example(ids, trained)


def completion_example(tokenizer, prompt, completion, chat_template=None) -> Example:
    """A prompt / completion pair trained on the completion only.

    Args:
        prompt: a string (plain text), or a list of chat messages, rendered
            with the chat template and its generation prompt.
        completion: a string; after a chat prompt it is the assistant's
            reply, ended by the template's end-of-turn text; after a plain
            prompt the tokenizer's end token (`eos_token`) follows it.
    """
    if isinstance(prompt, str):
        eos = getattr(tokenizer, "eos_token_id", None)
        head = [int(t) for t in tokenizer.encode(prompt)]
        tail = [int(t) for t in tokenizer.encode(completion)]
        tail += [] if eos is None else [int(eos)]
        return Example(head + tail, [False] * len(head) + [True] * len(tail))
    messages = [*prompt, {"role": "assistant", "content": completion}]
    text, spans = render_conversation(
        messages, _template(tokenizer, chat_template), **special_tokens(tokenizer)
    )
    return _example(tokenizer, text, spans[-1:])


def _template(tokenizer, chat_template):
    template = chat_template or getattr(tokenizer, "chat_template", None)
    if not template:
        raise ValueError(
            f"The tokenizer ({type(tokenizer).__name__}) has no chat template: "
            "pass `chat_template=` (a Jinja string)."
        )
    return template


def pack_rows(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Best-fit decreasing: example indices grouped into rows of at most
    `capacity` tokens, longest examples first, each into the fullest row
    that still has room (a new row when none has).

    Examples:
        >>> pack_rows([5, 3, 4, 2, 6], 8)
        [[4, 3], [0, 1], [2]]
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    rows, room = [], []
    for i in order:
        need = lengths[i]
        fits = [r for r in range(len(rows)) if room[r] >= need]
        if fits:
            best = min(fits, key=lambda r: room[r])
        else:
            rows.append([])
            room.append(capacity)
            best = len(rows) - 1
        rows[best].append(i)
        room[best] -= need
    return rows


def sft_dataset(
    examples: Iterable[Example],
    sequence_length: int,
    pack: bool = False,
    pad_token_id: int = 0,
) -> SFTData:
    """The arrays of `model.fit` for supervised fine-tuning.

    Each example becomes inputs `ids[:-1]` and labels `ids[1:]`, weighted 1
    where the label is a trained token; an example longer than
    `sequence_length + 1` tokens is cut to that length (counted in
    `num_truncated`).

    Args:
        examples: `Example`s (`conversation_example`, `completion_example`).
        sequence_length: tokens per row, `T`.
        pack: several examples per row (best-fit decreasing, `pack_rows`),
            with `document_ids` keeping each one's attention and positions
            to itself; otherwise one example per row.
        pad_token_id: the id written on padding (never attended to nor
            trained).

    Returns:
        An `SFTData`.

    Raises:
        ValueError: `sequence_length` below 1, an example of fewer than 2
            tokens, or no example with a trained label.
    """
    if isinstance(sequence_length, bool) or int(sequence_length) < 1:
        raise ValueError(f"`sequence_length` must be >= 1. Received: {sequence_length}")
    cut = 0
    pairs = []  # (inputs, labels, weights) per example, at most T long
    for n, example in enumerate(examples):
        ids, trained = list(example.ids), list(example.trained)
        if len(ids) != len(trained) or len(ids) < 2:
            raise ValueError(
                f"Example {n} has {len(ids)} ids and {len(trained)} flags: it "
                "needs at least 2 tokens and one flag per token."
            )
        if len(ids) > sequence_length + 1:
            ids, trained, cut = (
                ids[: sequence_length + 1],
                trained[: sequence_length + 1],
                cut + 1,
            )
        pairs.append((ids[:-1], ids[1:], [float(t) for t in trained[1:]]))
    if not any(any(w) for _, _, w in pairs):
        raise ValueError(
            "No example has a trained token within `sequence_length`: check the "
            "assistant turns (or completions) and the sequence length."
        )
    groups = (
        pack_rows([len(p[0]) for p in pairs], sequence_length)
        if pack
        else [[i] for i in range(len(pairs))]
    )
    shape = (len(groups), sequence_length)
    token_ids = np.full(shape, pad_token_id, "int32")
    labels = np.zeros(shape, "int32")
    weights = np.zeros(shape, "float32")
    documents = np.zeros(shape, "int32")
    for row, group in enumerate(groups):
        at = 0
        for document, i in enumerate(group, start=1):
            inputs, targets, w = pairs[i]
            span = slice(at, at + len(inputs))
            token_ids[row, span], labels[row, span], weights[row, span] = (
                inputs,
                targets,
                w,
            )
            documents[row, span] = document
            at += len(inputs)
    x = {"token_ids": token_ids, "padding_mask": documents > 0}
    if pack:
        x["document_ids"] = documents
    return SFTData(x, labels, weights, cut)


__all__ = [
    "Example",
    "SFTData",
    "completion_example",
    "conversation_example",
    "pack_rows",
    "render_conversation",
    "sft_dataset",
]
