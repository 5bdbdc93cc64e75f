"""`HFTokenizer` (any Hugging Face `tokenizer.json`) against `transformers`.

The reference is `transformers.AutoTokenizer.from_pretrained(directory)` on
the same directory: `encode` must equal its `(text,
add_special_tokens=False)["input_ids"]` and `decode` its `decode`, on an
awkward set of texts, for a byte-level BPE (SmolLM2), WordPiece
(all-MiniLM-L6-v2), Unigram with a Metaspace pre-tokenizer (SentencePiece /
T5 style) and BPE with byte fallback (Llama 2 style); the last two are
trained here.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

import keras_transformers  # noqa: E402
from keras_transformers.presets import load_assets  # noqa: E402
from keras_transformers.tokenizer import (  # noqa: E402
    BPETokenizer,
    HFTokenizer,
    load_hf_tokenizer,
    train_bpe,
)

AWKWARD = [
    "",
    " ",
    "Hello, world!",
    "Café naïve résumé façade",
    "e\u0301 a\u0308 n\u0303o",  # combining marks
    "Ǆ ﬁ straße ΟΔΟΣ İstanbul",
    "👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️",  # skin tone, ZWJ sequences, variation selector
    "東京は日本の首都です。中文测试，한국어 텍스트",
    "a    b     c",
    "   leading and trailing   ",
    "tab\there\t\tand\tthere",
    "line1\r\nline2\n\nline3\r\n",
    "\u00a0nbsp\u3000ideographic\u2028sep",
    "zero\u200bwidth soft\u00adhyphen",
    "def f(x):\n    return x ** 2  # square\n",
    "if (a && b) { return {'k': [1, 2]}; } // done",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "[CLS] hello [SEP] world [MASK] [PAD] [UNK]",
    "<s> bos and </s> eos <unk> <pad>",
    "Numbers 1234567 3.14159 1e-10 $100.00 50%",
    "URL https://example.com/path?q=1&x=y#frag a.b@c.de",
    "don't won't I'm it's we've they're .,!?",
    "x" * 120,
    "word " * 200,
]
TRAINING_TEXT = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Café naïve résumé 東京 한국어 def f(x): return x ** 2",
    "Hello, world! Numbers 1234567 and tabs\tand\nnewlines.",
    "It's a tokenizer test: don't split <s> or </s>.",
] * 5


@pytest.fixture(scope="module")
def unigram_dir(tmp_path_factory):
    """A Unigram tokenizer with SentencePiece's Metaspace pre-tokenizer, two
    chat templates (written as `.jinja` files) and left padding."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from tokenizers import trainers as tr

    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = tr.UnigramTrainer(
        vocab_size=200, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>"
    )
    tok.train_from_iterator(TRAINING_TEXT, trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="left",
        chat_template=[
            {
                "name": "default",
                "template": "{% for m in messages %}{{ m.content }}{% endfor %}",
            },
            {"name": "tool_use", "template": "tools: {{ tools }}"},
        ],
    )
    path = tmp_path_factory.mktemp("unigram") / "tok"
    fast.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def byte_fallback_dir(tmp_path_factory):
    """Llama 2 style: BPE over `▁`-words with `<0xNN>` byte fallback, a
    Prepend + Replace normalizer and no pre-tokenizer."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from tokenizers import trainers as tr

    base = Tokenizer(models.BPE())
    base.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=False)
    base.train_from_iterator(TRAINING_TEXT, tr.BpeTrainer(vocab_size=300))
    trained = json.loads(base.to_str())["model"]
    specials = ["<unk>", "<s>", "</s>"]
    names = specials + [f"<0x{b:02X}>" for b in range(256)]
    vocab = {t: i for i, t in enumerate(names)}
    for token in sorted(trained["vocab"], key=trained["vocab"].get):
        vocab.setdefault(token, len(vocab))
    merges = [
        tuple(m) if isinstance(m, list) else tuple(m.split()) for m in trained["merges"]
    ]
    tok = Tokenizer(
        models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True)
    )
    tok.normalizer = normalizers.Sequence(
        [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
    )
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    tok.add_special_tokens(specials)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    path = tmp_path_factory.mktemp("byte_fallback") / "tok"
    fast.save_pretrained(path)
    return path


@pytest.fixture(params=["smollm2", "minilm", "unigram", "byte_fallback"])
def tokenizer_dir(request):
    return request.getfixturevalue(f"{request.param}_dir")


def _reference(directory):
    return transformers.AutoTokenizer.from_pretrained(str(directory))


def _assert_same_as_reference(ours, ref):
    for text in AWKWARD:
        ids = ref(text, add_special_tokens=False)["input_ids"]
        assert ours.encode(text) == ids, text
        assert ours.decode(ids) == ref.decode(ids), text
        skipped = ref.decode(ids, skip_special_tokens=True)
        assert ours.decode(ids, skip_special_tokens=True) == skipped, text
    batch = ref(AWKWARD, add_special_tokens=False)["input_ids"]
    assert ours.encode(AWKWARD) == batch
    assert ours.decode(batch) == ref.batch_decode(batch)


# -- equality with transformers ----------------------------------------------


def test_encode_decode_equal_transformers(tokenizer_dir):
    ours, ref = HFTokenizer.from_assets(tokenizer_dir), _reference(tokenizer_dir)
    _assert_same_as_reference(ours, ref)
    assert ours.vocabulary_size == len(ref)
    assert set(ref.all_special_ids) <= set(ours.special_token_ids)
    assert ours.padding_side == ref.padding_side
    for name in ("bos", "eos", "unk", "pad", "cls", "sep", "mask"):
        assert getattr(ours, f"{name}_token_id") == getattr(ref, f"{name}_token_id")
    rows = ours.encode(AWKWARD[2:4], add_special_tokens=True)
    assert rows == ref(AWKWARD[2:4])["input_ids"]


def test_byte_fallback_splits_unknown_characters_into_bytes(byte_fallback_dir):
    tok = HFTokenizer.from_assets(byte_fallback_dir)
    ids = tok.encode("🙂")  # not in the training text
    assert [tok.id_to_token(i) for i in ids][-4:] == [
        "<0xF0>",
        "<0x9F>",
        "<0x99>",
        "<0x82>",
    ]
    assert tok.decode(ids) == "🙂" and tok.model_type == "BPE"


def test_minilm_wordpiece_preprocessor_equals_transformers(minilm_dir):
    """BERT directories keep the WordPiece preprocessor (it also runs in
    `tf.data`); its ids equal `transformers`' eagerly and in a graph."""
    import tensorflow as tf

    from keras_transformers.preprocessing import BertPreprocessor

    preprocessor, ref = load_assets(minilm_dir), _reference(minilm_dir)
    assert isinstance(preprocessor, BertPreprocessor)
    tok = preprocessor.tokenizer
    expected = [ref(t, add_special_tokens=False)["input_ids"] for t in AWKWARD]
    assert [[int(i) for i in tok.encode(t)] for t in AWKWARD] == expected
    assert [tok.decode(ids) for ids in expected] == [ref.decode(i) for i in expected]
    graph = tf.data.Dataset.from_tensor_slices(AWKWARD).map(tok)
    assert [row.numpy().tolist() for row in graph] == expected


# -- configuration files -------------------------------------------------------


def test_special_tokens_padding_side_and_templates(smollm2_dir, unigram_dir):
    smol = HFTokenizer.from_assets(smollm2_dir)
    assert (smol.bos_token, smol.eos_token, smol.pad_token) == (
        "<|im_start|>",
        "<|im_end|>",
        "<|im_end|>",
    )
    assert smol.model_max_length is None  # 1e30 in the file: no limit
    assert smol.chat_template.startswith("{% for message in messages %}")
    assert smol.encode("<|im_start|>") == [smol.bos_token_id]
    uni = HFTokenizer.from_assets(unigram_dir)
    assert uni.padding_side == "left" and uni.bos_token is None
    assert set(uni.chat_templates) == {"default", "tool_use"}
    assert uni.chat_template == _reference(unigram_dir).chat_template["default"]
    ids = uni(["a", "The quick"], return_dict=True)
    assert ids["token_ids"].dtype == np.int32
    assert ids["token_ids"][0, 0] == uni.pad_token_id and not ids["padding_mask"][0, 0]
    assert ids["padding_mask"][1].all()
    length = len(uni.encode("The quick brown fox"))
    assert (
        uni.encode("The quick brown fox", sequence_length=length + 2)[:2].tolist()
        == [uni.pad_token_id] * 2
    )


def _copy_without_templates(source, target, config_updates):
    shutil.copytree(source, target)
    for name in ("chat_template.jinja", "additional_chat_templates"):
        path = target / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    config = json.loads((target / "tokenizer_config.json").read_text())
    config.update(config_updates)
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    return target


@pytest.mark.parametrize(
    "value, expected",
    [
        ("{{ messages }}", {"default": "{{ messages }}"}),
        (
            [{"name": "default", "template": "D"}, {"name": "rag", "template": "R"}],
            {"default": "D", "rag": "R"},
        ),
    ],
)
def test_chat_template_from_tokenizer_config(unigram_dir, tmp_path, value, expected):
    path = _copy_without_templates(
        unigram_dir, tmp_path / "t", {"chat_template": value}
    )
    ours = HFTokenizer.from_assets(path)
    assert ours.chat_templates == expected
    assert ours.chat_template == expected["default"]
    ref = _reference(path).chat_template
    assert ref == (expected if len(expected) > 1 else expected["default"])
    (path / "chat_template.jinja").write_text("J")  # the file takes priority
    assert HFTokenizer.from_assets(path).chat_template == "J"


def test_special_tokens_from_legacy_files_and_added_token_dicts(unigram_dir, tmp_path):
    """AddedToken dicts, `special_tokens_map.json`, a named token the
    vocabulary lacks (added, as `transformers` does) and an absurd
    `model_max_length`."""
    path = _copy_without_templates(
        unigram_dir,
        tmp_path / "t",
        {
            "eos_token": {"content": "</s>", "__type": "AddedToken", "special": True},
            "bos_token": None,
            "model_max_length": 1e30,
        },
    )
    (path / "special_tokens_map.json").write_text(
        json.dumps(
            {"bos_token": "<extra_bos>", "additional_special_tokens": ["<tool>"]}
        )
    )
    ours, ref = HFTokenizer.from_assets(path), _reference(path)
    assert ours.bos_token == "<extra_bos>" == ref.bos_token
    assert ours.bos_token_id == ref.bos_token_id and ours.eos_token == "</s>"
    assert ours.model_max_length is None
    assert "<tool>" in ours.special_tokens
    _assert_same_as_reference(ours, ref)
    text = "a <extra_bos> b <tool>"
    assert ours.encode(text) == ref(text, add_special_tokens=False)["input_ids"]


# -- saving ----------------------------------------------------------------------


def test_save_assets_round_trip(tokenizer_dir, tmp_path):
    ours = HFTokenizer.from_assets(tokenizer_dir)
    ours.save_assets(tmp_path / "saved")
    again, ref = (
        HFTokenizer.from_assets(tmp_path / "saved"),
        _reference(tmp_path / "saved"),
    )
    _assert_same_as_reference(again, ref)
    _assert_same_as_reference(again, _reference(tokenizer_dir))
    assert again.special_tokens == ours.special_tokens
    assert again.chat_templates == ours.chat_templates
    assert (again.padding_side, again.model_max_length) == (
        ours.padding_side,
        ours.model_max_length,
    )
    assert ref.padding_side == ours.padding_side
    assert ref.eos_token == ours.eos_token and ref.pad_token == ours.pad_token
    # A WordPiece one too: what save_assets wrote loads as an HFTokenizer.
    assert isinstance(load_assets(tmp_path / "saved"), HFTokenizer)


def test_load_assets_picks_the_right_class(smollm2_dir, minilm_dir, tmp_path):
    from keras_transformers.preprocessing import BertPreprocessor

    assert isinstance(load_assets(smollm2_dir), HFTokenizer)
    assert isinstance(load_assets(minilm_dir), BertPreprocessor)
    bpe = train_bpe(TRAINING_TEXT, vocabulary_size=300)
    bpe.save_assets(tmp_path / "bpe")
    assert isinstance(load_assets(tmp_path / "bpe"), BPETokenizer)
    assert load_hf_tokenizer(tmp_path / "bpe") is None
    (tmp_path / "empty").mkdir()
    assert load_assets(tmp_path / "empty") is None


def test_chat_template_removed_on_save(smollm2_dir, tmp_path):
    tok = HFTokenizer.from_assets(smollm2_dir)
    tok.save_assets(tmp_path)
    tok.chat_template = None
    tok.save_assets(tmp_path)
    assert not (tmp_path / "chat_template.jinja").exists()
    assert HFTokenizer.from_assets(tmp_path).chat_template is None


# -- errors ------------------------------------------------------------------------


def test_corrupt_files_name_the_file_and_the_fix(smollm2_dir, tmp_path):
    path = tmp_path / "t"
    path.mkdir()
    text = (smollm2_dir / "tokenizer.json").read_text(encoding="utf-8")
    (path / "tokenizer.json").write_text(text[: len(text) // 2], encoding="utf-8")
    with pytest.raises(ValueError, match=r"tokenizer\.json.*corrupt or truncated"):
        HFTokenizer.from_assets(path)
    with pytest.raises(ValueError, match="download it again"):
        load_assets(path)
    (path / "tokenizer.json").write_text(text, encoding="utf-8")
    (path / "tokenizer_config.json").write_text("{ not json")
    with pytest.raises(ValueError, match=r"tokenizer_config\.json.*not valid"):
        HFTokenizer.from_assets(path)
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        HFTokenizer.from_assets(tmp_path)


def test_graph_tensors_are_refused_with_the_fix(smollm2_dir):
    import tensorflow as tf

    tok = HFTokenizer.from_assets(smollm2_dir)
    with pytest.raises(TypeError, match="encode"):
        tf.data.Dataset.from_tensor_slices(["a"]).map(tok)
    with pytest.raises(KeyError, match="not in the vocabulary"):
        tok.token_to_id("no such token")


# -- a model that carries it ---------------------------------------------------------


# SmolLM2's layout at one narrow layer, with random weights: what these
# tests check is the tokenizer the model carries, not its 135M weights
# (tests/test_generate_text.py runs the real checkpoint).
SMALL = dict(load_weights=False, num_layers=1, hidden_dim=72, intermediate_dim=64)


@pytest.fixture(scope="module")
def smol(smollm2_dir):
    return keras_transformers.from_preset(str(smollm2_dir), **SMALL)


def test_model_generates_saves_and_exports_with_its_tokenizer(
    smol, smollm2_dir, tmp_path
):
    assert isinstance(smol.tokenizer, HFTokenizer)
    text = smol.generate("The capital of France is", max_new_tokens=3)
    assert isinstance(text, str) and text.startswith("The capital of France is")
    smol.save_to_preset(tmp_path / "preset")
    assert sorted(os.listdir(tmp_path / "preset" / "tokenizer")) == [
        "chat_template.jinja",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    reloaded = keras_transformers.from_preset(
        str(tmp_path / "preset"), load_weights=False
    )
    assert isinstance(reloaded.tokenizer, HFTokenizer)
    assert reloaded.tokenizer.encode(AWKWARD) == smol.tokenizer.encode(AWKWARD)
    assert reloaded.tokenizer.chat_template == smol.tokenizer.chat_template
    assert reloaded.tokenizer.special_tokens == smol.tokenizer.special_tokens
    from keras_transformers.convert import export_hf

    export_hf(smol, tmp_path / "hf")
    ref = _reference(tmp_path / "hf")
    _assert_same_as_reference(smol.tokenizer, ref)
    assert ref.chat_template == _reference(smollm2_dir).chat_template


def test_checkpoint_with_a_corrupt_tokenizer_loads_with_a_warning(
    smollm2_dir, tmp_path
):
    (tmp_path / "config.json").symlink_to(smollm2_dir / "config.json")
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "trunc')
    with pytest.warns(UserWarning, match=r"tokenizer\.json.*download it again"):
        model = keras_transformers.from_preset(str(tmp_path), **SMALL)
    assert model.tokenizer is None
