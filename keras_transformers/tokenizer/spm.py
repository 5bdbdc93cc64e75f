"""Hugging Face directories whose tokenizer is a SentencePiece model only.

Older repositories ship no `tokenizer.json`, only the SentencePiece model:
`tokenizer.model` (Llama 2, Mistral), `spiece.model` (T5, ALBERT),
`sentencepiece.bpe.model` (XLM-RoBERTa, CamemBERT) or `spm.model`
(DeBERTa-v3). `read_directory` turns one into the `tokenizers.Tokenizer`
that `transformers.AutoTokenizer` builds for the repository's tokenizer
class (`spm_classes`), so `HFTokenizer` gives the same ids, and its
`save_assets` writes a `tokenizer.json`. The model file is read by
`spm_proto`: neither the `sentencepiece` nor the `protobuf` package is
needed.

The tokenizer class is the one `tokenizer_config.json` names, else the one
`transformers` gives `config.json`'s `model_type`; a repository naming
neither (or naming `TokenizersBackend` / `PreTrainedTokenizerFast`, or a
Llama or Mistral `model_type`) gets the model file's own settings
(`spm_native`), as `transformers` builds it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from typing import Any

from keras_transformers.tokenizer import hf_files, spm_classes, spm_native, spm_proto
from keras_transformers.tokenizer._common import (
    CONFIG_FILENAME,
    HF_TOKENIZER_FILENAME,
    SENTENCEPIECE_FILENAMES,
    _no_tokenizer,
)


@dataclasses.dataclass(frozen=True)
class _Recipe:
    """How `transformers` builds one tokenizer class from a model file.

    `build(model, config, named)` returns the `tokenizers.Tokenizer` and the
    special tokens the class adds; `post(tokenizer, named, config)` its
    post-processor (see `spm_classes`). `defaults` are the class's named
    tokens, or a function of the model giving them; a string from the
    config takes the `AddedToken` settings `token_settings` gives. With
    `added_tokens_raw`, the config's added tokens match the text before
    normalization.
    """

    build: Callable[..., tuple[Any, list[Any]]]
    post: Callable[..., Any]
    defaults: dict[str, str] | Callable[..., dict[str, str]]
    padding_side: str = "right"
    token_settings: dict[str, dict] = dataclasses.field(default_factory=dict)
    added_tokens_raw: bool = False


_FAIRSEQ_TOKENS = dict(
    bos_token="<s>",
    eos_token="</s>",
    sep_token="</s>",
    cls_token="<s>",
    unk_token="<unk>",
    pad_token="<pad>",
    mask_token="<mask>",
)
_BERT_TOKENS = dict(
    bos_token="[CLS]",
    eos_token="[SEP]",
    sep_token="[SEP]",
    cls_token="[CLS]",
    mask_token="[MASK]",
)
_NATIVE = _Recipe(
    spm_native.build, spm_classes.bos_eos, spm_native.own_tokens, added_tokens_raw=True
)
RECIPES = {
    "LlamaTokenizer": _Recipe(
        spm_classes.build_llama,
        spm_classes.bos_eos,
        dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>"),
        padding_side="left",
    ),
    "T5Tokenizer": _Recipe(
        spm_classes.build_t5,
        spm_classes.eos_after,
        dict(eos_token="</s>", unk_token="<unk>", pad_token="<pad>"),
    ),
    "XLMRobertaTokenizer": _Recipe(
        spm_classes.build_xlm_roberta, spm_classes.bos_and_eos, _FAIRSEQ_TOKENS
    ),
    "CamembertTokenizer": _Recipe(
        spm_classes.build_camembert,
        spm_classes.bos_and_eos,
        _FAIRSEQ_TOKENS,
        token_settings={"mask_token": {"lstrip": True}},
    ),
    "DebertaV2Tokenizer": _Recipe(
        spm_classes.build_deberta_v2,
        spm_classes.cls_and_sep,
        dict(_BERT_TOKENS, unk_token="[UNK]", pad_token="[PAD]"),
    ),
    "AlbertTokenizer": _Recipe(
        spm_classes.build_albert,
        spm_classes.albert_post,
        dict(_BERT_TOKENS, unk_token="<unk>", pad_token="<pad>"),
    ),
    # The generic classes (`PreTrainedTokenizerFast` is `TokenizersBackend`).
    "TokenizersBackend": _NATIVE,
    "PreTrainedTokenizerFast": _NATIVE,
}
# `config.json`'s `model_type` -> the class `transformers` gives it.
_MODEL_TYPES = {
    "llama": "TokenizersBackend",
    "mistral": "TokenizersBackend",
    "mixtral": "TokenizersBackend",
    "t5": "T5Tokenizer",
    "mt5": "T5Tokenizer",
    "xlm-roberta": "XLMRobertaTokenizer",
    "camembert": "CamembertTokenizer",
    "deberta-v2": "DebertaV2Tokenizer",
    "albert": "AlbertTokenizer",
}


def model_file(directory: str) -> str | None:
    """The directory's SentencePiece model file, or None."""
    for name in SENTENCEPIECE_FILENAMES:
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return path
    return None


def _model_type(directory: str) -> str | None:
    try:
        with open(os.path.join(directory, "config.json"), encoding="utf-8") as file:
            data = json.load(file)
    except (OSError, ValueError):
        return None
    value = data.get("model_type") if isinstance(data, dict) else None
    return value if isinstance(value, str) else None


def tokenizer_class(directory: str, path: str, config: dict) -> str:
    """The `transformers` tokenizer class of the directory's model file.

    Raises:
        ValueError: A class (or model type) we cannot build, with the fix.
    """
    name = config.get("tokenizer_class")
    source = f"its {CONFIG_FILENAME} names tokenizer_class={name!r}"
    if not isinstance(name, str):
        model_type = _model_type(directory)
        if model_type is None:
            return "TokenizersBackend"
        name = _MODEL_TYPES.get(model_type)
        source = f"its config.json has model_type={model_type!r}"
    elif name not in RECIPES:
        name = name.removesuffix("Fast")
    if name not in RECIPES:
        supported = ", ".join(sorted(RECIPES))
        raise ValueError(
            f"Cannot read the SentencePiece tokenizer '{path}': {source}, and "
            f"the SentencePiece tokenizers this library builds are {supported}. "
            f"Write its {HF_TOKENIZER_FILENAME} once with `transformers` "
            "(`AutoTokenizer.from_pretrained(directory).save_pretrained("
            "directory)`) and load the directory again."
        )
    return name


def read_directory(directory: str) -> tuple[Any, dict[str, Any]]:
    """The `tokenizers.Tokenizer` of a directory's SentencePiece model and the
    other `HFTokenizer` arguments (special tokens, padding side, ...).

    Raises:
        FileNotFoundError: The directory has no SentencePiece model file.
        ValueError: The file is not a SentencePiece model, or belongs to a
            tokenizer class this library cannot build.
    """
    path = model_file(directory)
    if path is None:
        raise _no_tokenizer(directory, SENTENCEPIECE_FILENAMES)
    config = hf_files.read_json_object(os.path.join(directory, CONFIG_FILENAME))
    recipe = RECIPES[tokenizer_class(directory, path, config)]
    model = spm_proto.read(path)
    options = hf_files.read_options(directory, {"padding_side": recipe.padding_side})
    defaults = recipe.defaults
    if callable(defaults):
        defaults = defaults(model)
    if recipe.added_tokens_raw:
        for token in options["added_tokens"]:
            token["normalized"] = False
    for key, value in defaults.items():
        options.setdefault(key, value)
        if isinstance(options[key], str) and key in recipe.token_settings:
            options[key] = {"content": options[key], **recipe.token_settings[key]}
    named = {k: hf_files.token_content(options.get(k)) for k in hf_files.NAMED_TOKENS}
    tokenizer, extra = recipe.build(model, config, named)
    options["additional_special_tokens"] = _dedupe_tokens(
        [*extra, *options["additional_special_tokens"]]
    )
    # In `HFTokenizer`'s order, so that tokens the model lacks get the same
    # ids; the post-processor needs the ids of the special tokens.
    hf_files.add_missing_tokens(
        tokenizer,
        [
            *options["added_tokens"],
            *(options.get(k) for k in hf_files.NAMED_TOKENS),
            *options["additional_special_tokens"],
        ],
    )
    tokenizer.post_processor = recipe.post(tokenizer, named, config)
    return tokenizer, options


def _dedupe_tokens(values: list[Any]) -> list[Any]:
    seen, out = set(), []
    for value in values:
        content = hf_files.token_content(value)
        if content and content not in seen:
            seen.add(content)
            out.append(value)
    return out
