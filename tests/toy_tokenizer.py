"""A tiny deterministic tokenizer for generation and chat tests: special
tokens, single characters and multi-character pieces (so that a stop
string can end inside a token)."""

SPECIALS = ["<pad>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|end|>"]
CHARS = list("abcdefghijklmnopqrstuvwxyz .,!?:\n")
PIECES = ["th", "he", "an", "in", "er", "on", "ing", "the", "and", "ion"]


class ToyTokenizer:
    """`encode` (longest match, specials first), `decode`, named specials.

    Args:
        vocabulary_size: ids beyond the pieces decode to "<N>" (so any id a
            model can produce decodes).
        chat_template: optional Jinja chat template.
    """

    bos_token, eos_token, pad_token = "<s>", "</s>", "<pad>"
    bos_token_id, eos_token_id, pad_token_id = 1, 2, 0

    def __init__(self, vocabulary_size=64, chat_template=None):
        self.pieces = SPECIALS + CHARS + PIECES
        self.pieces += [f"<{i}>" for i in range(len(self.pieces), vocabulary_size)]
        self.ids = {p: i for i, p in enumerate(self.pieces)}
        self.chat_template = chat_template

    def encode(self, text):
        out, i = [], 0
        while i < len(text):
            match = max(
                (p for p in self.pieces if text.startswith(p, i)), key=len, default=None
            )
            if match is None:
                raise ValueError(f"cannot encode {text[i]!r}")
            out.append(self.ids[match])
            i += len(match)
        return out

    def decode(self, ids):
        return "".join(self.pieces[int(i)] for i in ids)
