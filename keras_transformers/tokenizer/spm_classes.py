"""How `transformers` builds each SentencePiece tokenizer class from a
model file alone, as `tokenizers` pipelines: the normalizer, pre-tokenizer,
model, decoder and post-processor of Llama, T5, XLM-RoBERTa, CamemBERT,
DeBERTa-v2 and ALBERT (see `keras_transformers.tokenizer.spm`).

A `build_*(model, config, named)` function takes the parsed model file
(`spm_proto.SentencePieceModel`), `tokenizer_config.json` and the named
special tokens (`{"bos_token": "<s>", ...}`, strings or None), and returns
the `tokenizers.Tokenizer` and the special tokens the class adds (strings
or `AddedToken` dicts). A post-processor function `(tokenizer, named,
config)` runs once the special tokens are in the tokenizer.
"""

from __future__ import annotations

from typing import Any

from keras_transformers.tokenizer import spm_proto

SPACE = "\u2581"  # SentencePiece's "▁"


def template(single: list[str], pair: list[str], specials: dict[str, Any]):
    from tokenizers import processors

    return processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=list(specials.items())
    )


def _merges_by_rank(vocab: dict[str, int]) -> list[tuple[str, str]]:
    """BPE merges from a vocabulary alone, as `transformers` derives them
    (`generate_merges`): every split of a piece into two pieces, ranked by
    the merged piece's id, then the parts' lengths."""
    merges = []
    for piece, rank in vocab.items():
        splits = [
            (piece[:i], piece[i:], rank)
            for i in range(1, len(piece))
            if piece[:i] in vocab and piece[i:] in vocab
        ]
        merges += sorted(splits, key=lambda m: (vocab[m[0]], vocab[m[1]]))
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])))
    return [(left, right) for left, right, _ in merges]


def metaspace(prepend_scheme: str, split: bool = True):
    from tokenizers import decoders, pre_tokenizers

    return (
        pre_tokenizers.Metaspace(SPACE, prepend_scheme=prepend_scheme, split=split),
        decoders.Metaspace(SPACE, prepend_scheme=prepend_scheme, split=split),
    )


def _whitespace_then_metaspace(tokenizer, model, prepend_scheme: str, steps=None):
    """The T5 / XLM-R / CamemBERT / ALBERT pipeline: the model's normalizer
    (after the normalizers `steps`, if given), then whitespace splitting and
    `▁` prefixes."""
    from tokenizers import normalizers, pre_tokenizers

    pre, decoder = metaspace(prepend_scheme)
    charsmap = model.precompiled_charsmap
    precompiled = [normalizers.Precompiled(charsmap)] if charsmap else []
    if steps is not None:
        tokenizer.normalizer = normalizers.Sequence([*steps, *precompiled])
    elif precompiled:
        tokenizer.normalizer = precompiled[0]
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre]
    )
    tokenizer.decoder = decoder


def build_llama(model, config, named):
    from tokenizers import Tokenizer, decoders
    from tokenizers.models import BPE

    add_prefix_space = config.get("add_prefix_space")
    add_prefix_space = True if add_prefix_space is None else bool(add_prefix_space)
    scheme = "always" if config.get("legacy", False) else "first"
    vocab = {p.piece: i for i, p in enumerate(model.pieces)}
    tokenizer = Tokenizer(
        BPE(vocab, _merges_by_rank(vocab), fuse_unk=True, byte_fallback=True)
    )
    tokenizer.pre_tokenizer, _ = metaspace(
        scheme if add_prefix_space else "never", split=False
    )
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_prefix_space:
        steps.append(decoders.Strip(" ", 1, 0))
    tokenizer.decoder = decoders.Sequence(steps)
    return tokenizer, added_pieces(model)


def bos_eos(tokenizer, named: dict, config: dict):
    """The post-processor of `add_bos_token` / `add_eos_token` (both off
    unless `tokenizer_config.json` turns them on)."""
    bos, eos = named["bos_token"], named["eos_token"]
    add_bos = bool(config.get("add_bos_token", False)) and bos is not None
    add_eos = bool(config.get("add_eos_token", False)) and eos is not None
    first = [f"{bos}:0"] if add_bos else []
    last = [f"{eos}:0"] if add_eos else []
    single = [*first, "$A:0", *last]
    pair = [*single, *([f"{bos}:1"] if add_bos else []), "$B:1"]
    pair += [f"{eos}:1"] if add_eos else []
    used = ([bos] if add_bos else []) + ([eos] if add_eos else [])
    return template(single, pair, {t: tokenizer.token_to_id(t) for t in used})


def build_t5(model, config, named):
    from tokenizers import Tokenizer
    from tokenizers.models import Unigram

    extra_ids = int(config.get("extra_ids", 100))
    extra = [f"<extra_id_{i}>" for i in range(extra_ids)]
    vocab = [(p.piece, p.score) for p in model.pieces]
    vocab += [(token, 0.0) for token in reversed(extra)]
    tokenizer = Tokenizer(Unigram(vocab, unk_id=2, byte_fallback=False))
    _whitespace_then_metaspace(tokenizer, model, "always")
    return tokenizer, [*added_pieces(model), *extra]


def eos_after(tokenizer, named: dict, config: dict):
    """T5's `text </s>` (the id of the eos token, under the name `</s>`)."""
    eos = tokenizer.token_to_id(named["eos_token"] or "")
    return template(["$A", "</s>"], ["$A", "</s>", "$B", "</s>"], {"</s>": eos})


def bos_and_eos(tokenizer, named: dict, config: dict):
    """RoBERTa's `<s> A </s>` and `<s> A </s> </s> B </s>`."""
    bos, eos = named["bos_token"], named["eos_token"]
    ids = {bos: tokenizer.token_to_id(bos), eos: tokenizer.token_to_id(eos)}
    return template([bos, "$A", eos], [bos, "$A", eos, eos, "$B", eos], ids)


def build_xlm_roberta(model, config, named, camembert: bool = False):
    """XLM-R (fairseq's ids: `<s> <pad> </s> <unk>`, then the pieces after
    the model's first three, then `<mask>`) and CamemBERT (its own four,
    then the pieces after the first)."""
    from tokenizers import Tokenizer
    from tokenizers.models import Unigram

    names = [named[k] for k in ("bos_token", "pad_token", "eos_token", "unk_token")]
    if camembert:
        head = ["<s>NOTUSED", names[1], "</s>NOTUSED", names[3]]
        head = [(token, 0.0) for token in head] + [("<unk>NOTUSED", -100.0)]
        pieces = model.pieces[1:]
    else:
        head, pieces = [(token, 0.0) for token in names], model.pieces[3:]
    vocab = head + [(p.piece, p.score) for p in pieces]
    vocab.append((named["mask_token"], 0.0))
    unk = next((i for i, (t, _) in enumerate(vocab) if t == names[3]), 0)
    tokenizer = Tokenizer(Unigram(vocab, unk_id=3 if not camembert else unk))
    add_prefix_space = config.get("add_prefix_space", True)
    scheme = "always" if add_prefix_space else "never"
    _whitespace_then_metaspace(tokenizer, model, scheme)
    return tokenizer, added_pieces(model)


def build_camembert(model, config, named):
    return build_xlm_roberta(model, config, named, camembert=True)


def build_deberta_v2(model, config, named):
    from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers
    from tokenizers.models import Unigram

    vocab = [(p.piece, p.score) for p in model.pieces]
    unk = (named["unk_token"], 0.0)
    unk_id = vocab.index(unk) if unk in vocab else model.unk_id
    tokenizer = Tokenizer(Unigram(vocab, unk_id=unk_id, byte_fallback=False))
    steps = [normalizers.Lowercase()] if config.get("do_lower_case") else []
    if model.precompiled_charsmap:  # the model's own normalization rules
        steps += [
            normalizers.Precompiled(model.precompiled_charsmap),
            normalizers.Strip(left=False, right=True),
            normalizers.Replace(Regex(r" {2,}"), " "),
        ]
    else:
        steps += [
            normalizers.Replace(Regex(r"\s{2,}|[\n\r\t]"), " "),
            normalizers.NFC(),
            normalizers.Strip(left=False, right=True),
        ]
    tokenizer.normalizer = normalizers.Sequence(steps)
    add_prefix_space = config.get("add_prefix_space", True)
    pre, tokenizer.decoder = metaspace("always" if add_prefix_space else "first")
    splits = (
        [pre_tokenizers.Punctuation("isolated")] if config.get("split_by_punct") else []
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([*splits, pre])
    return tokenizer, added_pieces(model)


def cls_and_sep(tokenizer, named: dict, config: dict):
    """BERT's `[CLS] A [SEP]` and `[CLS] A [SEP] B [SEP]`."""
    cls, sep = named["cls_token"], named["sep_token"]
    ids = {cls: tokenizer.token_to_id(cls) or 0, sep: tokenizer.token_to_id(sep) or 0}
    return template(
        [f"{cls}:0", "$A:0", f"{sep}:0"],
        [f"{cls}:0", "$A:0", f"{sep}:0", "$B:1", f"{sep}:1"],
        ids,
    )


def build_albert(model, config, named):
    from tokenizers import Tokenizer, normalizers
    from tokenizers.models import Unigram

    vocab = [(p.piece, p.score) for p in model.pieces]
    tokenizer = Tokenizer(Unigram(vocab, unk_id=1, byte_fallback=False))
    steps = [normalizers.Replace("``", '"'), normalizers.Replace("''", '"')]
    if not config.get("keep_accents", False):
        steps += [normalizers.NFKD(), normalizers.StripAccents()]
    if config.get("do_lower_case", True):
        steps.append(normalizers.Lowercase())
    scheme = "always" if config.get("add_prefix_space", True) else "never"
    _whitespace_then_metaspace(tokenizer, model, scheme, steps)
    return tokenizer, added_pieces(model)


def albert_post(tokenizer, named: dict, config: dict):
    """`[CLS] A [SEP]`, unless the config sets `add_bos_token` or
    `add_eos_token` (ALBERT builds it before those apply)."""
    if "add_bos_token" in config or "add_eos_token" in config:
        return bos_eos(tokenizer, named, config)
    ids = {
        "[CLS]": tokenizer.token_to_id(named["cls_token"] or ""),
        "[SEP]": tokenizer.token_to_id(named["sep_token"] or ""),
    }
    return template(
        ["[CLS]:0", "$A:0", "[SEP]:0"],
        ["[CLS]:0", "$A:0", "[SEP]:0", "$B:1", "[SEP]:1"],
        ids,
    )


def added_pieces(model: spm_proto.SentencePieceModel) -> list[dict]:
    """The model's control pieces (special) and user-defined ones (not
    special, but never split), as `transformers` adds them."""
    kinds = (spm_proto.CONTROL, spm_proto.USER_DEFINED)
    return [
        {
            "content": model.pieces[i].piece,
            "special": model.pieces[i].type == spm_proto.CONTROL,
            "normalized": False,
        }
        for i in model.ids_of(*kinds)
    ]
