"""`train_wordpiece`: WordPiece vocabulary training with the Hugging Face
`tokenizers` trainer (a dependency of keras-hub).

keras-hub's own `compute_word_piece_vocabulary` (TensorFlow Text's BERT
vocabulary learner) took ~12 s for 80% of Python's documentation where this
takes ~0.4 s, and it stopped far short of the requested size.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

from keras_transformers.preprocessing._layer import SPECIAL_TOKENS, hf_tokenizer
from keras_transformers.preprocessing.wordpiece import WordPieceTokenizer
from keras_transformers.tokenizer._common import PathLike
from keras_transformers.tokenizer.train import _training_files


def train_wordpiece(
    texts: Iterable[str] | Sequence[PathLike] | PathLike,
    vocabulary_size: int,
    *,
    lowercase: bool = True,
    strip_accents: bool | None = None,
    split_on_cjk: bool = True,
    min_frequency: int = 2,
    limit_alphabet: int = 1000,
    sequence_length: int | None = None,
    show_progress: bool = False,
) -> WordPieceTokenizer:
    """Trains a BERT WordPiece vocabulary on the user's text.

    Text is normalized and split exactly as `WordPieceTokenizer` does
    (the `transformers.BertTokenizer` pipeline), then the Hugging Face
    `WordPieceTrainer` learns the vocabulary. `[PAD]`, `[UNK]`, `[CLS]`,
    `[SEP]`, `[MASK]` get the ids 0-4.

    Args:
        texts: An iterable of strings; or file paths (`pathlib.Path` objects,
            or strings that all name existing files), read as UTF-8 text.
        vocabulary_size: Target size, special tokens included. Training
            stops earlier when no pair reaches `min_frequency`.
        lowercase: Lowercase the text (BERT "uncased").
        strip_accents: Remove accents; `None` follows `lowercase`.
        split_on_cjk: Make each CJK ideograph a word of its own.
        min_frequency: Minimum count of a pair for it to be merged.
        limit_alphabet: Keep at most this many distinct characters (the
            rarest others become `[UNK]`).
        sequence_length: Passed to `WordPieceTokenizer`.
        show_progress: Show the trainer's progress bar.

    Returns:
        The trained `WordPieceTokenizer`.

    Example:

    ```python
    from pydoc_data.topics import topics
    tokenizer = train_wordpiece(topics.values(), vocabulary_size=4000)
    ```
    """
    from tokenizers import trainers

    minimum = len(SPECIAL_TOKENS) + 1
    if (
        isinstance(vocabulary_size, bool)
        or not isinstance(vocabulary_size, int)
        or vocabulary_size < minimum
    ):
        raise ValueError(
            f"`vocabulary_size` must be an int >= {minimum}. Received: "
            f"{vocabulary_size!r}."
        )
    special = list(SPECIAL_TOKENS.values())
    hf = hf_tokenizer(special, lowercase, strip_accents, split_on_cjk)
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocabulary_size,
        min_frequency=min_frequency,
        special_tokens=special,
        limit_alphabet=limit_alphabet,
        continuing_subword_prefix="##",
        show_progress=show_progress,
    )
    files = _training_files(texts)
    if files is not None:
        for path in files:
            if not os.path.isfile(path):
                raise FileNotFoundError(f"Training file '{path}' does not exist.")
        hf.train(files, trainer)
    else:
        hf.train_from_iterator(_strings(texts), trainer)
    vocab = hf.get_vocab(with_added_tokens=True)
    return WordPieceTokenizer(
        sorted(vocab, key=vocab.get),
        lowercase=lowercase,
        strip_accents=strip_accents,
        split_on_cjk=split_on_cjk,
        sequence_length=sequence_length,
    )


def _strings(texts: Any) -> Iterable[str]:
    if isinstance(texts, str):
        yield texts
        return
    for text in texts:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        if not isinstance(text, str):
            raise TypeError(
                f"`texts` must hold strings. Received an element of type "
                f"{type(text).__name__}."
            )
        yield text
