"""`train_bpe`: byte-level BPE training with the Hugging Face `tokenizers`
library (a dependency of keras-hub, which has no BPE trainer)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

from keras_transformers.tokenizer._common import (
    DEFAULT_END_TOKEN,
    PathLike,
    _dedupe,
)
from keras_transformers.tokenizer.bpe import BPETokenizer


def _training_files(texts: Any) -> list[str] | None:
    """The file paths in `texts`, or None if `texts` holds text."""
    if isinstance(texts, os.PathLike):
        return [os.fspath(texts)]
    if isinstance(texts, str):
        return [texts] if os.path.isfile(texts) else None
    if isinstance(texts, (list, tuple)) and texts:
        if all(isinstance(t, os.PathLike) for t in texts):
            return [os.fspath(t) for t in texts]
        if all(
            isinstance(t, str) and len(t) < 4096 and "\n" not in t and os.path.isfile(t)
            for t in texts
        ):
            return list(texts)
    return None


def train_bpe(
    texts: Iterable[str] | Sequence[PathLike] | PathLike,
    vocabulary_size: int,
    special_tokens: Sequence[str] = (DEFAULT_END_TOKEN,),
    min_frequency: int = 2,
    *,
    end_token: str | None = None,
    sequence_length: int | None = None,
    show_progress: bool = False,
) -> BPETokenizer:
    """Trains a GPT-2 style byte-level BPE tokenizer.

    Uses the Hugging Face `tokenizers` trainer (GPT-2 byte-level
    pre-tokenizer without prefix space, all 256 bytes in the initial
    alphabet), then builds a `BPETokenizer` from the learned vocabulary and
    merges. Special tokens get the first ids.

    Args:
        texts: An iterable of strings; or file paths (`pathlib.Path` objects,
            or strings that all name existing files), read as UTF-8 text.
        vocabulary_size: Target size, special tokens and the 256 byte
            tokens included. Training stops earlier if no pair reaches
            `min_frequency`.
        special_tokens: Special tokens, never split; the first is the end
            token unless `end_token` is given.
        min_frequency: Minimum count of a pair for it to be merged.
        end_token: The end/bos/eos/pad token; defaults to `special_tokens[0]`.
        sequence_length: Passed to `BPETokenizer`.
        show_progress: Show the trainer's progress bar.

    Returns:
        The trained tokenizer.

    Example:

    ```python
    tokenizer = train_bpe(["some text", "more text"], vocabulary_size=300)
    tokenizer = train_bpe([pathlib.Path("corpus.txt")], vocabulary_size=8000)
    ```
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    special_tokens = list(special_tokens)
    if not special_tokens and end_token is None:
        raise ValueError("Give at least one special token (the end token).")
    end_token = end_token or special_tokens[0]
    special_tokens = _dedupe([end_token, *special_tokens])
    minimum = 256 + len(special_tokens)
    if (
        isinstance(vocabulary_size, bool)
        or not isinstance(vocabulary_size, int)
        or vocabulary_size < minimum
    ):
        raise ValueError(
            f"`vocabulary_size` must be an int >= {minimum} (256 byte tokens plus "
            f"{len(special_tokens)} special tokens). Received: {vocabulary_size!r}."
        )

    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocabulary_size,
        min_frequency=min_frequency,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    files = _training_files(texts)
    if files is not None:
        for path in files:
            if not os.path.isfile(path):
                raise FileNotFoundError(f"Training file '{path}' does not exist.")
        hf.train(files, trainer)
    else:
        if isinstance(texts, str):
            texts = [texts]
        hf.train_from_iterator(iter(texts), trainer)

    model = json.loads(hf.to_str())["model"]
    if not model["merges"]:
        raise ValueError(
            "BPE training learned no merges: the texts are too short or repeat too "
            f"little for min_frequency={min_frequency}. Give more text or lower "
            "`min_frequency` (strings that are not existing files are read as text)."
        )
    return BPETokenizer(
        hf.get_vocab(with_added_tokens=True),
        model["merges"],
        end_token=end_token,
        special_tokens=special_tokens,
        sequence_length=sequence_length,
    )
