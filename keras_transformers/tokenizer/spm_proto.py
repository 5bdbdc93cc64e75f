"""A SentencePiece model file (`tokenizer.model`, `spiece.model`,
`sentencepiece.bpe.model`, `spm.model`), read without the `sentencepiece`
or `protobuf` packages.

The file is a serialized `ModelProto` (sentencepiece's
`sentencepiece_model.proto`); this module reads the few fields a
`tokenizers.Tokenizer` needs from the protocol-buffer wire format (varint
keys, length-delimited strings and messages, little-endian floats), and
skips the others.
"""

from __future__ import annotations

import dataclasses
import struct

# `ModelProto.SentencePiece.Type`.
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
# `TrainerSpec.ModelType`.
MODEL_TYPES = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}

_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5


@dataclasses.dataclass(frozen=True)
class Piece:
    """One vocabulary entry: its text, log-probability score and type."""

    piece: str
    score: float = 0.0
    type: int = NORMAL


@dataclasses.dataclass(frozen=True)
class SentencePieceModel:
    """What a SentencePiece model file says, with the proto's defaults.

    Attributes:
        pieces: The vocabulary in id order.
        model_type: `"unigram"`, `"bpe"`, `"word"` or `"char"`.
        byte_fallback: Unknown characters become `<0xNN>` byte pieces.
        unk_id, bos_id, eos_id, pad_id: Ids of those pieces (-1: none).
        unk_piece, bos_piece, eos_piece: Their text.
        precompiled_charsmap: The normalizer's compiled rules (b"" for none).
        add_dummy_prefix: Whether a space is put before the text.
        remove_extra_whitespaces: Whether spaces at the ends are removed and
            runs of them collapsed.
        escape_whitespaces: Whether spaces become `▁`.
    """

    pieces: tuple[Piece, ...]
    model_type: str = "unigram"
    byte_fallback: bool = False
    unk_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    pad_id: int = -1
    unk_piece: str = "<unk>"
    bos_piece: str = "<s>"
    eos_piece: str = "</s>"
    precompiled_charsmap: bytes = b""
    add_dummy_prefix: bool = True
    remove_extra_whitespaces: bool = True
    escape_whitespaces: bool = True

    def ids_of(self, *types: int) -> list[int]:
        """Ids of the pieces of the given types, in order."""
        return [i for i, p in enumerate(self.pieces) if p.type in types]


class _Malformed(ValueError):
    pass


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise _Malformed("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _fields(data: bytes):
    """Yields `(field_number, value)`: ints for varints, bytes for
    length-delimited fields, floats for 32-bit fields (the only fixed-width
    fields a model file has are scores); 64-bit fields are skipped."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            value, pos = _varint(data, pos)
        elif wire == _BYTES:
            size, pos = _varint(data, pos)
            value, pos = data[pos : pos + size], pos + size
            if len(value) != size:
                raise _Malformed("truncated field")
        elif wire == _FIXED32:
            if pos + 4 > len(data):
                raise _Malformed("truncated float")
            value, pos = struct.unpack_from("<f", data, pos)[0], pos + 4
        elif wire == _FIXED64:
            pos += 8
            continue
        else:
            raise _Malformed(f"wire type {wire}")
        yield number, value


def _int32(value: int) -> int:
    """A varint as a signed int32 (negatives take ten bytes on the wire)."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def _text(value: bytes) -> str:
    return value.decode("utf-8")


def _typed(value, kind: type):
    if not isinstance(value, kind):
        raise _Malformed(f"a {type(value).__name__} where a {kind.__name__} belongs")
    return value


def _piece(data: bytes) -> Piece:
    text, score, kind = "", 0.0, NORMAL
    for number, value in _fields(data):
        if number == 1:
            text = _text(_typed(value, bytes))
        elif number == 2:
            score = _typed(value, float)
        elif number == 3:
            kind = _typed(value, int)
    return Piece(text, score, kind)


# Field number -> (attribute, wire value type, conversion).
_TRAINER = {
    3: ("model_type", int, lambda v: MODEL_TYPES.get(v, str(v))),
    35: ("byte_fallback", int, bool),
    40: ("unk_id", int, _int32),
    41: ("bos_id", int, _int32),
    42: ("eos_id", int, _int32),
    43: ("pad_id", int, _int32),
    45: ("unk_piece", bytes, _text),
    46: ("bos_piece", bytes, _text),
    47: ("eos_piece", bytes, _text),
}
_NORMALIZER = {
    2: ("precompiled_charsmap", bytes, bytes),
    3: ("add_dummy_prefix", int, bool),
    4: ("remove_extra_whitespaces", int, bool),
    5: ("escape_whitespaces", int, bool),
}


def parse(data: bytes) -> SentencePieceModel:
    """The model in the bytes of a SentencePiece model file.

    Raises:
        ValueError: The bytes are not a SentencePiece model.
    """
    pieces, settings = [], {}
    for number, value in _fields(data):
        if number == 1:
            pieces.append(_piece(_typed(value, bytes)))
        elif number in (2, 3):
            table = _TRAINER if number == 2 else _NORMALIZER
            for field, item in _fields(_typed(value, bytes)):
                if field in table:
                    name, kind, convert = table[field]
                    settings[name] = convert(_typed(item, kind))
    if not pieces:
        raise _Malformed("no vocabulary pieces")
    return SentencePieceModel(pieces=tuple(pieces), **settings)


def read(path: str) -> SentencePieceModel:
    """The model in a SentencePiece model file.

    Raises:
        FileNotFoundError: The file does not exist.
        ValueError: The file is not a SentencePiece model (corrupt,
            truncated, or another format such as a tiktoken rank file).
    """
    with open(path, "rb") as file:
        data = file.read()
    try:
        return parse(data)
    except (_Malformed, UnicodeDecodeError) as error:
        raise ValueError(
            f"'{path}' is not a valid SentencePiece model ({error}). It is "
            "corrupt or truncated, or a file of another format under that "
            "name: download it again from the model's repository."
        ) from None
