"""A reply's text as its tokens arrive: what is safe to send so far, and
where a stop string ends it."""

from __future__ import annotations

REPLACEMENT = "\ufffd"  # a token that ends inside a UTF-8 character


class TextStream:
    """Incremental detokenization of one reply.

    `push(token)` returns the text not sent yet, holding back what could
    still change: a character not finished (the tokenizer's replacement
    character at the end) and the last `len(longest stop string) - 1`
    characters, which may begin a stop string. A stop string ends the
    reply before it (as OpenAI's `stop` does: the returned text does not
    contain it).

    Each token is decoded with a few tokens before it, never the whole
    reply: the tokens from `start` on are decoded with and without the
    ones after `done` (the last point where the text was complete), and
    the new text is the difference. Decoding from a token before the new
    ones keeps what a tokenizer does at the start of a text (SentencePiece
    drops a word's leading space there) out of the difference; the text
    equals decoding the whole reply for tokenizers whose text is the
    concatenation of their tokens' (byte-level BPE, SentencePiece).

    Args:
        tokenizer: has `decode(ids) -> str`.
        stop_strings: strings that end the reply.
    """

    def __init__(self, tokenizer, stop_strings=()):
        self.tokenizer, self.stops = tokenizer, tuple(stop_strings)
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.ids: list[int] = []
        self.decoded = ""  # the text of ids[:done]
        self.start = self.done = 0  # decoding window: ids[start:done] known
        self.sent = 0

    def push(self, token: int) -> tuple[str, bool]:
        """Adds `token`; returns `(new text, whether a stop string ended it)`."""
        self.ids.append(int(token))
        tail = self._tail()
        if tail.endswith(REPLACEMENT):  # a character not finished yet
            text = self.decoded + tail.rstrip(REPLACEMENT)
        else:
            self.decoded += tail
            self.start, self.done = self.done, len(self.ids)
            text = self.decoded
        since = max(0, self.sent - self.hold)  # earlier text holds no stop
        starts = [i for i in (text.find(s, since) for s in self.stops) if i >= 0]
        if starts:
            end = max(min(starts), self.sent)
            out, self.sent = text[self.sent : end], end
            return out, True
        safe = len(text) - self.hold
        if safe <= self.sent:
            return "", False
        out, self.sent = text[self.sent : safe], safe
        return out, False

    def flush(self) -> str:
        """The text held back, at the end of a reply not ended by a stop string."""
        text = self.decoded + self._tail()
        out, self.sent = text[self.sent :], len(text)
        return out

    @property
    def text(self) -> str:
        """The text sent so far."""
        return (self.decoded + self._tail())[: self.sent]

    def _tail(self) -> str:
        """The text of the tokens after `done` (decoded from `start`)."""
        if self.done == len(self.ids):
            return ""
        decode = self.tokenizer.decode
        before = decode(self.ids[self.start : self.done]) if self.done else ""
        return decode(self.ids[self.start :])[len(before) :]
