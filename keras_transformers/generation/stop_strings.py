"""Stop strings, checked on the host between chunks of the compiled loop.

Strings cannot be matched inside a compiled program without the
tokenizer's help, so `generate(stop_strings=...)` runs the decode loop in
chunks of `CHUNK` positions (one position when streaming): after each
chunk the completion of every running row is decoded, and a row whose
completion now contains a stop string is marked done for the next chunks.
A row that stopped inside a chunk may have produced a few more tokens in
it; they are dropped, so the result equals stopping at the exact token.

What is returned, as in Hugging Face's `StopStringCriteria`: a row's ids
end with the token that completes the stop string (that token may run past
the stop string's end). Text results are cut right after the stop string.
Only the completion is searched, never the prompt.
"""

from __future__ import annotations

CHUNK = 8


def normalize(stop_strings) -> tuple[str, ...]:
    """A string or a list of strings -> a tuple of non-empty strings."""
    if stop_strings is None:
        return ()
    if isinstance(stop_strings, str):
        stop_strings = (stop_strings,)
    iterable = isinstance(stop_strings, (list, tuple, set, frozenset))
    out = tuple(stop_strings) if iterable else (stop_strings,)
    if not all(isinstance(s, str) and s for s in out):
        raise ValueError(
            "`stop_strings` must be a non-empty string or a list of them. "
            f"Received: {stop_strings!r}"
        )
    return out


def first_end(text: str, strings) -> int | None:
    """Where the earliest-ending stop string in `text` ends (None: none)."""
    ends = [text.find(s) + len(s) for s in strings if s in text]
    return min(ends) if ends else None


class StopStringChecker:
    """Tracks, per row, how many completion tokens to keep.

    Args:
        tokenizer: has `decode(ids) -> str`.
        strings: the stop strings.
        batch: number of rows.
    """

    def __init__(self, tokenizer, strings, batch: int):
        self.tokenizer = tokenizer
        self.strings = strings
        self.keep: dict[int, int] = {}  # row -> completion tokens kept
        self.checked = [0] * batch

    def _found(self, ids) -> bool:
        return (
            first_end(self.tokenizer.decode([int(t) for t in ids]), self.strings)
            is not None
        )

    def update(self, token_ids, generated) -> list[int]:
        """Checks the completions (`token_ids [B, L]` where `generated
        [B, L]`, NumPy); returns the rows that stopped since the last call."""
        stopped = []
        for row in range(token_ids.shape[0]):
            if row in self.keep:
                continue
            completion = token_ids[row][generated[row]]
            count = len(completion)
            if count > self.checked[row] and self._found(completion):
                k = self.checked[row] + 1
                while not self._found(completion[:k]):
                    k += 1
                self.keep[row] = k
                stopped.append(row)
            self.checked[row] = count
        return stopped

    def trim(self, generated):
        """Clears `generated [B, L]` (NumPy, in place) after each stopped
        row's last kept token."""
        for row, k in self.keep.items():
            positions = generated[row].nonzero()[0]
            generated[row, positions[k:]] = False
        return generated

    def cut_text(self, full: str, completion: str) -> str:
        """`full` (prompt + completion text) cut after the first stop
        string of `completion`."""
        end = first_end(completion, self.strings)
        if end is None or not full.endswith(completion):
            return full
        return full[: len(full) - len(completion) + end]
