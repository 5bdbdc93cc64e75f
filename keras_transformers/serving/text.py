"""A reply's text as its tokens arrive: what is safe to send so far, and
where a stop string ends it."""

from __future__ import annotations

REPLACEMENT = "\ufffd"  # a token that ends inside a UTF-8 character


class TextStream:
    """Incremental detokenization of one reply.

    `push(token)` decodes the reply so far and returns the text not sent
    yet, holding back what could still change: a character not finished
    (the tokenizer's replacement character at the end) and the last
    `len(longest stop string) - 1` characters, which may begin a stop
    string. A stop string ends the reply before it (as OpenAI's `stop`
    does: the returned text does not contain it).

    Args:
        tokenizer: has `decode(ids) -> str`.
        stop_strings: strings that end the reply.
    """

    def __init__(self, tokenizer, stop_strings=()):
        self.tokenizer, self.stops = tokenizer, tuple(stop_strings)
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.ids: list[int] = []
        self.sent = 0

    def push(self, token: int) -> tuple[str, bool]:
        """Adds `token`; returns `(new text, whether a stop string ended it)`."""
        self.ids.append(int(token))
        text = self.tokenizer.decode(self.ids)
        starts = [text.find(s) for s in self.stops if s in text]
        if starts:
            end = max(min(starts), self.sent)
            out, self.sent = text[self.sent : end], end
            return out, True
        safe = len(text.rstrip(REPLACEMENT)) - self.hold
        if safe <= self.sent:
            return "", False
        out, self.sent = text[self.sent : safe], safe
        return out, False

    def flush(self) -> str:
        """The text held back, at the end of a reply not ended by a stop string."""
        text = self.tokenizer.decode(self.ids) if self.ids else ""
        out, self.sent = text[self.sent :], len(text)
        return out

    @property
    def text(self) -> str:
        """The text sent so far."""
        return self.tokenizer.decode(self.ids)[: self.sent] if self.ids else ""
