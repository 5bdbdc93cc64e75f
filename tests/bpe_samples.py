"""Texts and a training corpus shared by the byte-level BPE tokenizer tests
(test_tokenizer.py, test_tokenizer_tiktoken.py)."""

from __future__ import annotations

END = "<|endoftext|>"
SPECIALS = (END, "<|pad|>", "<|im_start|>")
VOCAB_SIZE = 500

# Spaces, newlines, punctuation, digits, unicode, leading/trailing spaces.
SAMPLES = [
    "Hello, world!",
    "  leading and trailing  ",
    " leading space",
    "trailing space ",
    "foo  bar   baz",
    "tabs\tand\nnewlines\n\n\nend",
    "a\n\nb",
    "line one\r\nline two\r\n",
    "def f(x):\n    return x ** 2\n",
    "café 東京 🙂",
    "Ünïcödé ñ e\u0301 👩\u200d👩\u200d👧",
    "1234567 numbers 3.14159 -42 1e-9",
    "don't I'll WE'RE it's they've",
    '(paren) [x] {y} "q" <tag/> #!/usr/bin/env',
    f"a{END}b",
    f"{END} start and end {END}",
    "<|im_start|>user\nhi<|pad|><|pad|>",
    "   ",
    "",
    "\u00a0nbsp\u3000ideographic space",
    "!!!???...",
    "word\n  indented\n\tand tabbed",
    "x" * 300,
]

# The subset on which keras-hub's TensorFlow graph path (used inside tf.data)
# is known to give the GPT-2 ids: no runs of two or more whitespace
# characters before a word or at the end, no exotic whitespace.
TF_EXACT_SAMPLES = [
    "Hello, world!",
    " leading space",
    "trailing space ",
    "café 東京 🙂",
    "1234567 numbers 3.14159 -42 1e-9",
    "don't I'll WE'RE it's they've",
    '(paren) [x] {y} "q" <tag/> #!/usr/bin/env',
    f"a{END}b",
    "line one\nline two",
    "x" * 300,
]


def corpus() -> str:
    from pydoc_data.topics import topics

    return "\n".join(topics.values())[:300_000]


def chunks(text: str, size: int = 5000) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def tf_options():
    """Skips tf.data's graph optimizations, which only slow these tiny tests."""
    import tensorflow as tf

    options = tf.data.Options()
    options.experimental_optimization.apply_default_optimizations = False
    options.autotune.enabled = False
    return options
