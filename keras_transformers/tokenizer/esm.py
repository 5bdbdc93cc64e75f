"""ESM's protein tokenizer: one token per amino-acid letter.

A `vocab.txt` (one token a line, the line number its id; ESM-2's has 33:
`<cls>`, `<pad>`, `<eos>`, `<unk>`, the amino-acid letters, `.`, `-`,
`<null_1>`, `<mask>`) and a `tokenizer_config.json` naming
`"tokenizer_class": "EsmTokenizer"`, as `transformers.EsmTokenizer` saves
them. Text splits as transformers splits it: every vocabulary token written
in the text is one token (the longest one at each place), the text between
them splits on whitespace and each word that is not a token is `<unk>`.
`encode` then gives `transformers`' ids exactly.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import numpy as np

from keras_transformers._json import read_json_object
from keras_transformers.tokenizer._common import _canonicalize_ids, _pad

VOCAB_FILE = "vocab.txt"
CONFIG_FILE = "tokenizer_config.json"
CLASS_NAME = "EsmTokenizer"
SPECIAL = dict(
    cls_token="<cls>",
    pad_token="<pad>",
    eos_token="<eos>",
    unk_token="<unk>",
    mask_token="<mask>",
)


class EsmTokenizer:
    """ESM's tokenizer (`transformers.EsmTokenizer`'s ids).

    Args:
        vocabulary: the tokens in id order (the lines of `vocab.txt`).
        sequence_length: pad (with `<pad>`, on the right) or truncate
            `encode`'s output to this length; None: as long as the text.

    Examples:
        >>> from keras_transformers.tokenizer.esm import EsmTokenizer
        >>> vocab = ["<cls>", "<pad>", "<eos>", "<unk>", "A", "K", "M", "<mask>"]
        >>> tokenizer = EsmTokenizer(vocab)
        >>> tokenizer.encode("MKA<mask> K")
        [6, 5, 4, 7, 5]
        >>> tokenizer.encode("MKJ", add_special_tokens=True)
        [0, 6, 5, 3, 2]
        >>> tokenizer.decode([0, 6, 5, 2])
        '<cls> M K <eos>'
    """

    def __init__(self, vocabulary: Sequence[str], sequence_length: int | None = None):
        vocabulary = [str(token) for token in vocabulary]
        missing = [t for t in SPECIAL.values() if t not in vocabulary]
        if missing:
            raise ValueError(
                f"An ESM vocabulary needs the tokens {list(SPECIAL.values())}; this "
                f"one lacks {missing}."
            )
        self.vocabulary = vocabulary
        self._ids = {token: i for i, token in enumerate(vocabulary)}
        self._longest = max(len(token) for token in vocabulary)
        self.sequence_length = sequence_length
        for name, token in SPECIAL.items():
            setattr(self, name + "_id", self._ids[token])

    @property
    def vocabulary_size(self) -> int:
        """Number of ids."""
        return len(self.vocabulary)

    def token_to_id(self, token: str) -> int:
        """The id of `token` (`<unk>`'s when it is not in the vocabulary)."""
        return self._ids.get(token, self.unk_token_id)

    def id_to_token(self, id: int) -> str:
        """The token of `id`."""
        return self.vocabulary[int(id)]

    def tokenize(self, text: str) -> list[str]:
        """`text` as token strings (words outside the vocabulary kept as
        they are; `encode` maps them to `<unk>`)."""
        out, start, i = [], 0, 0
        while i < len(text):
            match = next(
                (
                    text[i : i + n]
                    for n in range(min(self._longest, len(text) - i), 0, -1)
                    if text[i : i + n] in self._ids
                ),
                None,
            )
            if match is None:
                i += 1
                continue
            out += text[start:i].split() + [match]
            i = start = i + len(match)
        return out + text[start:].split()

    def encode(
        self,
        inputs: str | Sequence[str],
        sequence_length: int | None = None,
        add_special_tokens: bool = False,
    ):
        """Ids of one text (a list) or of a batch (a list of lists); with
        `add_special_tokens`, `<cls> ... <eos>`. With a sequence length,
        an `np.int32` array `[sequence_length]` or `[batch, sequence_length]`
        padded with `<pad>` on the right."""
        single = isinstance(inputs, str)
        texts = [inputs] if single else [str(t) for t in inputs]
        rows = []
        for text in texts:
            ids = [self.token_to_id(token) for token in self.tokenize(text)]
            if add_special_tokens:
                ids = [self.cls_token_id, *ids, self.eos_token_id]
            rows.append(ids)
        length = sequence_length or self.sequence_length
        if length:
            padded = _pad([row[:length] for row in rows], length, self.pad_token_id)
            return padded[0] if single else padded
        return rows[0] if single else rows

    def decode(self, ids, skip_special_tokens: bool = False) -> str | list[str]:
        """Tokens of `ids` joined by spaces, as `transformers` decodes."""
        rows, batched = _canonicalize_ids(ids)
        special = {self._ids[t] for t in SPECIAL.values()}
        texts = [
            " ".join(
                self.id_to_token(i)
                for i in row
                if not (skip_special_tokens and i in special)
            )
            for row in rows
        ]
        return texts if batched else texts[0]

    def __call__(self, inputs, sequence_length=None) -> np.ndarray:
        """`encode` with special tokens, as an `np.int32` array."""
        return np.asarray(
            self.encode(inputs, sequence_length, add_special_tokens=True), "int32"
        )

    def save_assets(self, directory) -> None:
        """Writes `vocab.txt` and a `tokenizer_config.json` that
        `transformers.AutoTokenizer` loads as an `EsmTokenizer`."""
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, VOCAB_FILE), "w", encoding="utf-8") as f:
            f.write("\n".join(self.vocabulary))
        config = {"tokenizer_class": CLASS_NAME, **SPECIAL}
        if self.sequence_length:
            config["model_max_length"] = self.sequence_length
        with open(os.path.join(directory, CONFIG_FILE), "w", encoding="utf-8") as f:
            f.write(json.dumps(config, indent=2) + "\n")

    @classmethod
    def from_assets(cls, directory) -> EsmTokenizer:
        """Loads `vocab.txt` of a directory `save_assets` or transformers wrote.

        Raises:
            FileNotFoundError: the directory has no `vocab.txt`.
        """
        path = os.path.join(os.fspath(directory), VOCAB_FILE)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"'{directory}' has no {VOCAB_FILE}.")
        with open(path, encoding="utf-8") as f:
            vocabulary = [line.strip() for line in f.read().splitlines()]
        return cls(vocabulary)


def is_esm_directory(directory) -> bool:
    """Whether `directory` holds an ESM tokenizer: a `vocab.txt` and a
    `tokenizer_config.json` whose `tokenizer_class` is `EsmTokenizer`."""
    directory = os.fspath(directory)
    config = os.path.join(directory, CONFIG_FILE)
    if not (
        os.path.isfile(config) and os.path.isfile(os.path.join(directory, VOCAB_FILE))
    ):
        return False
    try:
        return read_json_object(config).get("tokenizer_class") == CLASS_NAME
    except ValueError:
        return False


__all__ = ["EsmTokenizer", "is_esm_directory"]
