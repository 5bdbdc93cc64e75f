"""OpenAI `.tiktoken` rank files (base64 token + rank) as vocabulary + merges."""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping, Sequence

from keras_transformers.tokenizer._common import _bytes_to_token


def _read_ranks(path: str) -> dict[bytes, int]:
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"tiktoken file '{path}' does not exist. OpenAI's gpt2.tiktoken ships "
            "in the `openai-whisper` package at whisper/assets/gpt2.tiktoken."
        )
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                token, rank = line.split()
                ranks[base64.b64decode(token, validate=True)] = int(rank)
            except (ValueError, binascii.Error) as e:
                raise ValueError(
                    f"Line {number} of '{path}' is not '<base64 token> <rank>': "
                    f"{line[:80]!r}. The file is corrupt or not a .tiktoken file."
                ) from e
    if {bytes([b]) for b in range(256)} - ranks.keys():
        raise ValueError(
            f"'{path}' lacks some of the 256 single-byte tokens; it is not a "
            "byte-level BPE rank file."
        )
    return ranks


def _bpe_parts(ranks: Mapping[bytes, int], token: bytes, max_rank: int) -> list[bytes]:
    """Byte-pair-encodes `token` with the merges of rank below `max_rank`."""
    parts = [bytes([b]) for b in token]
    while len(parts) > 1:
        best, best_rank = -1, max_rank
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < best_rank:
                best, best_rank = i, rank
        if best < 0:
            break
        parts[best : best + 2] = [parts[best] + parts[best + 1]]
    return parts


def _merges_from_ranks(ranks: Mapping[bytes, int], where: str) -> list[str]:
    """A token's merge is the two parts BPE gives it with lower-ranked merges."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) == 1:
            continue
        parts = _bpe_parts(ranks, token, rank)
        if len(parts) != 2:
            raise ValueError(
                f"Token {token!r} (rank {rank}) of '{where}' cannot be built by "
                "merging two lower-ranked tokens; not a valid BPE rank file."
            )
        merges.append(f"{_bytes_to_token(parts[0])} {_bytes_to_token(parts[1])}")
    return merges


def _read_tiktoken(
    path: str, special_tokens: Mapping[str, int] | Sequence[str]
) -> tuple[dict[str, int], list[str], list[str]]:
    """`(vocab, merges, special token names)` of a rank file.

    `special_tokens` is a `{token: id}` mapping, or token strings that get
    the ids after the last rank.
    """
    ranks = _read_ranks(path)
    vocab = {_bytes_to_token(token): rank for token, rank in ranks.items()}
    merges = _merges_from_ranks(ranks, path)
    if not isinstance(special_tokens, Mapping):
        start = max(ranks.values()) + 1
        special_tokens = {t: start + i for i, t in enumerate(special_tokens)}
    for token, index in special_tokens.items():
        if token in vocab and vocab[token] != index:
            raise ValueError(f"Special token {token!r} is already in '{path}'.")
        vocab[token] = int(index)
    return vocab, merges, list(special_tokens)
