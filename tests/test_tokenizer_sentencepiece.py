"""Hugging Face directories whose tokenizer is a SentencePiece model only.

Each layout (Llama's BPE `tokenizer.model` with byte fallback, T5's and
ALBERT's Unigram `spiece.model`, XLM-R's and CamemBERT's
`sentencepiece.bpe.model` with fairseq's ids, DeBERTa-v3's `spm.model`) is trained here on a small text
with the `sentencepiece` package and written as its repository lays it
out; our tokenizer must give the ids and text of
`transformers.AutoTokenizer` on the same directory. Nothing here builds a
Keras model but the one `save_to_preset` test, so the file costs the same
on every backend.
"""

from __future__ import annotations

import io
import json
import os
import shutil

import pytest

transformers = pytest.importorskip("transformers")
sentencepiece = pytest.importorskip("sentencepiece")

from test_hf_tokenizer import AWKWARD, TRAINING_TEXT  # noqa: E402

import keras_transformers  # noqa: E402
from keras_transformers.presets import load_assets  # noqa: E402
from keras_transformers.tokenizer import (  # noqa: E402
    HFTokenizer,
    load_hf_tokenizer,
    load_tokenizer,
    spm_proto,  # noqa: E402
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Texts only some of these tokenizers treat specially.
TEXTS = AWKWARD + [
    "fill <mask> here and<mask>there",
    "<extra_id_0> sentinel <extra_id_1>",
    "<|im_start|>user hi<|im_end|><ctrl> x",
    "[CLS]a[SEP] [MASK]",
    "\u2581already \u2581escaped",
]

# Each model: its file, the trainer's settings (Llama 2, T5, XLM-R and
# DeBERTa-v3 use these ids and normalizers).
MODELS = {
    "llama": (
        "tokenizer.model",
        dict(
            model_type="bpe",
            vocab_size=600,
            byte_fallback=True,
            split_digits=True,
            normalization_rule_name="identity",
            remove_extra_whitespaces=False,
            allow_whitespace_only_pieces=True,
            user_defined_symbols=["<|im_start|>", "<|im_end|>"],
            control_symbols=["<ctrl>"],
        ),
    ),
    "t5": (
        "spiece.model",
        dict(
            model_type="unigram",
            vocab_size=500,
            pad_id=0,
            eos_id=1,
            unk_id=2,
            bos_id=-1,
        ),
    ),
    "albert": (
        "spiece.model",
        dict(
            model_type="unigram",
            vocab_size=500,
            **dict(pad_id=0, unk_id=1, bos_id=-1, eos_id=-1),
            control_symbols=["[CLS]", "[SEP]", "[MASK]"],
        ),
    ),
    "xlm-roberta": (
        "sentencepiece.bpe.model",
        dict(model_type="unigram", vocab_size=500),
    ),
    "deberta-v3": (
        "spm.model",
        dict(
            model_type="unigram",
            vocab_size=500,
            **dict(pad_id=0, bos_id=1, eos_id=2, unk_id=3),
            **dict(pad_piece="[PAD]", bos_piece="[CLS]", eos_piece="[SEP]"),
            unk_piece="[UNK]",
        ),
    ),
}
# Each repository: its model and the JSON files beside it.
REPOS = {
    "llama": (
        "llama",
        {
            "tokenizer_config.json": {
                "tokenizer_class": "LlamaTokenizer",
                "legacy": False,
                "add_bos_token": True,
            }
        },
    ),
    "llama-legacy": (
        "llama",
        {
            "tokenizer_config.json": {
                "tokenizer_class": "LlamaTokenizerFast",
                "legacy": True,
                "add_eos_token": True,
                "added_tokens_decoder": {
                    "600": {"content": "<pad>", "special": True, "normalized": False}
                },
                "pad_token": "<pad>",
            }
        },
    ),
    # No tokenizer class: `transformers` follows the model file's settings.
    "llama-model-type": ("llama", {"config.json": {"model_type": "llama"}}),
    "t5": ("t5", {"tokenizer_config.json": {"tokenizer_class": "T5Tokenizer"}}),
    "xlm-roberta": (
        "xlm-roberta",
        {"tokenizer_config.json": {"tokenizer_class": "XLMRobertaTokenizer"}},
    ),
    "camembert": (
        "xlm-roberta",
        {"tokenizer_config.json": {"tokenizer_class": "CamembertTokenizer"}},
    ),
    "albert": ("albert", {"config.json": {"model_type": "albert"}}),
    # DeBERTa-v3's repositories name no class: config.json's model_type does.
    "deberta-v3": (
        "deberta-v3",
        {
            "config.json": {"model_type": "deberta-v2"},
            "tokenizer_config.json": {"do_lower_case": False, "vocab_type": "spm"},
            "special_tokens_map.json": {
                "bos_token": "[CLS]",
                "eos_token": "[SEP]",
                "unk_token": "[UNK]",
                "sep_token": "[SEP]",
                "pad_token": "[PAD]",
                "cls_token": "[CLS]",
                "mask_token": "[MASK]",
            },
        },
    ),
    "deberta-v3-lower": (
        "deberta-v3",
        {
            "tokenizer_config.json": {
                "tokenizer_class": "DebertaV2Tokenizer",
                "do_lower_case": True,
                "split_by_punct": True,
            }
        },
    ),
}


def _train(settings: dict) -> bytes:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as file:
        lines = [line for line in file.read().splitlines() if line.strip()]
    out = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines + AWKWARD + TRAINING_TEXT),
        model_writer=out,
        minloglevel=2,
        num_threads=1,
        hard_vocab_limit=False,
        **settings,
    )
    return out.getvalue()


@pytest.fixture(scope="session")
def spm_repos(tmp_path_factory):
    """Repository name -> directory (the model file and its JSON files)."""
    models = {name: _train(settings) for name, (_, settings) in MODELS.items()}
    root = tmp_path_factory.mktemp("spm_repos")
    repos = {}
    for repo, (model, files) in REPOS.items():
        path = root / repo
        path.mkdir()
        (path / MODELS[model][0]).write_bytes(models[model])
        for name, data in files.items():
            (path / name).write_text(json.dumps(data), encoding="utf-8")
        repos[repo] = path
    return repos


def _reference(directory):
    return transformers.AutoTokenizer.from_pretrained(str(directory))


def _assert_same_as_reference(ours, ref):
    for text in TEXTS:
        ids = ref(text, add_special_tokens=False)["input_ids"]
        assert ours.encode(text) == ids, text
        assert ours.encode(text, add_special_tokens=True) == ref(text)["input_ids"]
        assert ours.decode(ids) == ref.decode(ids), text
        skipped = ref.decode(ids, skip_special_tokens=True)
        assert ours.decode(ids, skip_special_tokens=True) == skipped, text
    assert ours.encode(TEXTS) == ref(TEXTS, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("repo", sorted(REPOS))
def test_ids_equal_transformers(spm_repos, repo):
    ours, ref = load_tokenizer(spm_repos[repo]), _reference(spm_repos[repo])
    assert isinstance(ours, HFTokenizer)
    _assert_same_as_reference(ours, ref)
    assert ours.vocabulary_size == len(ref)
    assert set(ref.all_special_ids) <= set(ours.special_token_ids)
    for name in ("bos", "eos", "unk", "pad", "cls", "sep", "mask"):
        assert getattr(ours, f"{name}_token_id") == getattr(ref, f"{name}_token_id")
    assert ours.padding_side == ref.padding_side
    pair = ours.backend.encode("a b", "c", add_special_tokens=True).ids
    assert pair == ref("a b", "c")["input_ids"]


@pytest.mark.parametrize("repo", ["llama", "t5", "camembert", "deberta-v3", "albert"])
def test_saved_tokenizer_json_loads_back_with_equal_ids(spm_repos, repo, tmp_path):
    ours = load_assets(spm_repos[repo])
    assert isinstance(ours, HFTokenizer)
    ours.save_assets(tmp_path)
    assert (tmp_path / "tokenizer.json").is_file()
    again = load_hf_tokenizer(tmp_path)
    _assert_same_as_reference(again, _reference(spm_repos[repo]))
    _assert_same_as_reference(again, _reference(tmp_path))
    assert again.special_tokens == ours.special_tokens


def test_model_save_to_preset_writes_a_tokenizer_json(spm_repos, tmp_path):
    """A Llama checkpoint with `tokenizer.model` only: the model carries the
    tokenizer, and its preset's `tokenizer.json` gives the same ids."""
    hf = tmp_path / "hf"
    shutil.copytree(spm_repos["llama"], hf)
    config = transformers.LlamaConfig(
        vocab_size=600,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
    )
    config.save_pretrained(hf)
    model = keras_transformers.from_preset(str(hf), load_weights=False)
    assert isinstance(model.tokenizer, HFTokenizer)
    model.save_to_preset(tmp_path / "preset")
    assert (tmp_path / "preset" / "tokenizer" / "tokenizer.json").is_file()
    again = load_assets(tmp_path / "preset" / "tokenizer")
    assert again.encode(TEXTS) == model.tokenizer.encode(TEXTS)
    _assert_same_as_reference(again, _reference(spm_repos["llama"]))


def test_model_file_reader_equals_sentencepiece(spm_repos):
    from sentencepiece import sentencepiece_model_pb2

    for repo in MODELS:
        path = spm_repos[repo] / MODELS[repo][0]
        ours = spm_proto.read(str(path))
        proto = sentencepiece_model_pb2.ModelProto.FromString(path.read_bytes())
        pieces = [(p.piece, p.score, p.type) for p in proto.pieces]
        assert [(p.piece, p.score, p.type) for p in ours.pieces] == pieces
        trainer, normalizer = proto.trainer_spec, proto.normalizer_spec
        for field in ("byte_fallback", "unk_id", "bos_id", "eos_id", "pad_id"):
            assert getattr(ours, field) == getattr(trainer, field), (repo, field)
        for field in ("unk_piece", "bos_piece", "eos_piece"):
            assert getattr(ours, field) == getattr(trainer, field), (repo, field)
        for field in (
            "precompiled_charsmap",
            "add_dummy_prefix",
            "remove_extra_whitespaces",
            "escape_whitespaces",
        ):
            assert getattr(ours, field) == getattr(normalizer, field), (repo, field)
        assert ours.model_type == spm_proto.MODEL_TYPES[trainer.model_type]


@pytest.mark.parametrize("model", sorted(MODELS))
def test_bare_model_file_gives_sentencepiece_ids(spm_repos, model, tmp_path):
    """With no class named anywhere: the model file's own settings."""
    name = MODELS[model][0]
    shutil.copy(spm_repos[model] / name, tmp_path / name)
    ours = load_tokenizer(tmp_path)
    processor = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / name))
    specials = {"<s>", "</s>", "<unk>", "<pad>", "[CLS]", "[SEP]", "[MASK]", "<ctrl>"}
    for text in TEXTS:
        if not any(token in text for token in specials):
            ids = processor.encode(text)
            assert ours.encode(text) == ids, text
            if processor.unk_id() not in ids:  # SentencePiece writes " ⁇ "
                assert ours.decode(ids) == processor.decode(ids), text


# -- errors ------------------------------------------------------------------------


def test_directory_without_tokenizer_files_names_them(tmp_path):
    names = r"tokenizer\.model, spiece\.model, sentencepiece\.bpe\.model, spm\.model"
    with pytest.raises(FileNotFoundError, match=names):
        load_tokenizer(tmp_path)
    with pytest.raises(FileNotFoundError, match=f"tokenizer\\.json, {names}"):
        HFTokenizer.from_assets(tmp_path)
    assert load_hf_tokenizer(tmp_path) is None
    assert load_assets(tmp_path) is None  # a model directory without a tokenizer


def test_unreadable_model_files_name_the_file_and_the_fix(spm_repos, tmp_path):
    shutil.copy(spm_repos["t5"] / "spiece.model", tmp_path / "spiece.model")
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"tokenizer_class": "XLNetTokenizer"}))
    with pytest.raises(
        ValueError, match=r"spiece\.model.*XLNetTokenizer.*save_pretrained"
    ):
        load_tokenizer(tmp_path)
    config.unlink()
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "xlnet"}))
    with pytest.raises(ValueError, match=r"model_type='xlnet'.*tokenizer\.json"):
        load_assets(tmp_path)
    (tmp_path / "config.json").unlink()
    data = (spm_repos["t5"] / "spiece.model").read_bytes()
    (tmp_path / "spiece.model").write_bytes(data[: len(data) // 3])
    with pytest.raises(ValueError, match=r"spiece\.model.*not a valid SentencePiece"):
        load_hf_tokenizer(tmp_path)
    (tmp_path / "spiece.model").write_text("IQ== 0\nIg== 1\n")  # a tiktoken file
    with pytest.raises(ValueError, match="download it again"):
        HFTokenizer.from_assets(tmp_path)
