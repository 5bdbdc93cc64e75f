"""A SentencePiece model file with its own settings, as `transformers`
builds it for a repository that names no tokenizer class of its own
(`TokenizersBackend`, e.g. `model_type` llama or a bare `tokenizer.model`):
SentencePiece's normalizer (extra whitespace removal, dummy prefix, `▁` for
spaces), BPE merges ranked by piece score, and user-defined pieces kept
whole, so the ids are SentencePiece's own (but for special tokens written
in the text, which map to their ids)."""

from __future__ import annotations

import re

from keras_transformers.tokenizer import hf_files, spm_classes, spm_proto
from keras_transformers.tokenizer.spm_classes import SPACE


def _renamed(model: spm_proto.SentencePieceModel, config: dict) -> dict[str, int]:
    """Piece -> id, with the names `added_tokens_decoder` gives some ids
    (unless another piece keeps that name)."""
    names = {}
    for key, value in (config.get("added_tokens_decoder") or {}).items():
        content = hf_files.token_content(value)
        if content is not None and str(key).isdigit():
            names[int(key)] = content
    kept = {p.piece for i, p in enumerate(model.pieces) if i not in names}
    return {
        names[i] if i in names and names[i] not in kept else p.piece: i
        for i, p in enumerate(model.pieces)
    }


def _model(model: spm_proto.SentencePieceModel, config: dict):
    """The Unigram or BPE model (merges ranked by the merged piece's score)
    and the user-defined pieces."""
    from tokenizers import Tokenizer
    from tokenizers.models import BPE, Unigram

    if model.model_type == "unigram":
        vocab = [(p.piece, p.score) for p in model.pieces]
        unigram = Unigram(vocab, unk_id=model.unk_id, byte_fallback=model.byte_fallback)
        user = [model.pieces[i].piece for i in model.ids_of(spm_proto.USER_DEFINED)]
        return Tokenizer(unigram), user
    vocab = _renamed(model, config)
    token = {i: t for t, i in vocab.items()}
    user = [token[i] for i in model.ids_of(spm_proto.USER_DEFINED) if i in token]
    normal = {
        token[i]: (model.pieces[i].score, i)
        for i in model.ids_of(spm_proto.NORMAL)
        if i in token
    }
    ranked = sorted(
        (-score, i, t[:k], t[k:])
        for t, (score, i) in normal.items()
        for k in range(1, len(t))
        if t[:k] in normal and t[k:] in normal
    )
    bpe = BPE(
        vocab,
        [(left, right) for _, _, left, right in ranked],
        unk_token=model.unk_piece,
        fuse_unk=True,
        byte_fallback=model.byte_fallback,
        ignore_merges=bool(user),
    )
    return Tokenizer(bpe), user


def _normalizer(model: spm_proto.SentencePieceModel, legacy: bool):
    from tokenizers import Regex, normalizers

    charsmap = model.precompiled_charsmap
    steps = [normalizers.Precompiled(charsmap)] if charsmap else []
    if model.remove_extra_whitespaces:  # spaces only, not other whitespace
        steps += [
            normalizers.Replace(Regex(r"\A +| +\z"), ""),
            normalizers.Replace(Regex(" {2,}"), " "),
        ]
    if model.escape_whitespaces:
        steps.append(normalizers.Replace(" ", SPACE))
    if model.add_dummy_prefix and legacy:
        # Metaspace adds no prefix to a text that starts with "▁"; SentencePiece does.
        steps.append(normalizers.Replace(Regex(f"\\A{SPACE}"), SPACE * 2))
    return normalizers.Sequence(steps)


def _decoder(model: spm_proto.SentencePieceModel):
    from tokenizers import decoders

    steps = [decoders.Replace(SPACE, " ")]
    if model.byte_fallback:
        steps.append(decoders.ByteFallback())
    if model.add_dummy_prefix:
        # Fused first, so that only the start of the text loses its space.
        steps += [decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    elif model.byte_fallback:
        steps.append(decoders.Fuse())
    return decoders.Sequence(steps)


def build(model: spm_proto.SentencePieceModel, config: dict, named: dict):
    """The `tokenizers.Tokenizer` of the model's own settings and its control
    pieces (special tokens); `legacy` (default true) in the config puts a
    `▁` before each piece of text between added tokens, not only the
    first."""
    from tokenizers import Regex, pre_tokenizers

    tokenizer, user = _model(model, config)
    legacy = config.get("legacy", True)
    tokenizer.normalizer = _normalizer(model, legacy)
    splits = []
    if model.add_dummy_prefix:
        scheme = "always" if legacy else "first"
        splits.append(
            pre_tokenizers.Metaspace(SPACE, prepend_scheme=scheme, split=False)
        )
    if user:  # kept whole, never merged
        pattern = "|".join(re.escape(t) for t in sorted(user, key=len, reverse=True))
        splits.append(pre_tokenizers.Split(Regex(pattern), behavior="isolated"))
    if splits:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(splits)
    tokenizer.decoder = _decoder(model)
    control = [t for t in spm_classes.added_pieces(model) if t["special"]]
    return tokenizer, control


def own_tokens(model: spm_proto.SentencePieceModel) -> dict[str, str]:
    """The named tokens the model file defines."""
    pieces = (
        ("unk_token", model.unk_id, model.unk_piece),
        ("bos_token", model.bos_id, model.bos_piece),
        ("eos_token", model.eos_id, model.eos_piece),
    )
    return {key: piece for key, i, piece in pieces if i >= 0 and piece}
