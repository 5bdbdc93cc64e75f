"""Tests for `keras_transformers.tokenizer` (GPT-2 style byte-level BPE).

The reference everywhere is the Hugging Face `tokenizers` / `transformers`
implementation. Inside tf.data, keras-hub's TensorFlow graph path gives the
GPT-2 ids on `bpe_samples.TF_EXACT_SAMPLES` and differs on a whitespace run
before a word or at the end (`TF_KNOWN_DIFFERENCES`). OpenAI's real GPT-2
files: test_tokenizer_tiktoken.py.
"""

from __future__ import annotations

import json
import pathlib

import keras
import numpy as np
import pytest
from bpe_samples import (
    END,
    SAMPLES,
    SPECIALS,
    TF_EXACT_SAMPLES,
    VOCAB_SIZE,
    chunks,
    corpus,
    tf_options,
)

from keras_transformers.tokenizer import (
    BPETokenizer,
    load_tokenizer,
    train_bpe,
)


def _train_reference_hf(texts: list[str]):
    """Training with `tokenizers` directly, as `train_bpe` documents it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    hf.train_from_iterator(texts, trainer)
    return hf


@pytest.fixture(scope="module")
def corpus_chunks() -> list[str]:
    return chunks(corpus())


@pytest.fixture(scope="module")
def tokenizer(corpus_chunks) -> BPETokenizer:
    return train_bpe(corpus_chunks, VOCAB_SIZE, special_tokens=SPECIALS)


@pytest.fixture(scope="module")
def hf_reference(corpus_chunks):
    return _train_reference_hf(corpus_chunks)


# ---------------------------------------------------------------------------
# Training and equality with Hugging Face `tokenizers`.
# ---------------------------------------------------------------------------


def test_module_imports_no_heavy_dependency_at_import_time():
    """keras_hub (which imports TensorFlow) is imported lazily, backends never."""
    import ast

    import keras_transformers.tokenizer as module

    tree = ast.parse(pathlib.Path(module.__file__).read_text(encoding="utf-8"))
    top_level = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            top_level |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            top_level.add((node.module or "").split(".")[0])
    assert not top_level & {"keras_hub", "keras_nlp", "tensorflow", "jax", "torch"}
    everywhere = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not any(
        name and name.split(".")[0] in {"tensorflow", "jax", "torch"}
        for name in everywhere
    )
    assert not any(name and name.startswith("keras.src") for name in everywhere)


def test_train_matches_hf_trainer(tokenizer, hf_reference):
    import keras_hub

    assert isinstance(tokenizer.layer, keras_hub.tokenizers.BytePairTokenizer)
    assert tokenizer.vocabulary == hf_reference.get_vocab()
    ref_merges = json.loads(hf_reference.to_str())["model"]["merges"]
    assert tokenizer.merges == [" ".join(m) for m in ref_merges]
    assert tokenizer.vocabulary_size == VOCAB_SIZE
    assert len(tokenizer.merges) == VOCAB_SIZE - 256 - len(SPECIALS)


def test_special_tokens(tokenizer):
    assert tokenizer.end_token == END
    assert tokenizer.special_tokens == SPECIALS
    assert tokenizer.special_token_ids == (0, 1, 2)
    end_id = tokenizer.token_to_id(END)
    assert end_id == tokenizer.end_token_id == 0
    for name in ("pad", "bos", "eos"):
        assert getattr(tokenizer, f"{name}_token") == END
        assert getattr(tokenizer, f"{name}_token_id") == end_id
    assert tokenizer.id_to_token(end_id) == END
    assert tokenizer.token_to_id("Ġ") == tokenizer.vocabulary["Ġ"]
    assert tokenizer.id_to_token(tokenizer.vocabulary["Ġt"]) == "Ġt"
    # keras-hub's named special tokens are set on the layer too.
    assert tokenizer.layer.end_token_id == tokenizer.layer.pad_token_id == end_id


@pytest.mark.parametrize("text", SAMPLES)
def test_ids_equal_hf_and_round_trip(tokenizer, hf_reference, text):
    ids = tokenizer.encode(text)
    assert isinstance(ids, np.ndarray) and ids.dtype == np.int32
    assert ids.tolist() == hf_reference.encode(text).ids
    assert tokenizer.decode(ids) == text


def test_ids_equal_hf_on_corpus(tokenizer, hf_reference, rng):
    text = corpus()
    starts = rng.integers(0, len(text) - 2000, size=200)
    lengths = rng.integers(1, 2000, size=200)
    texts = [text[s : s + n] for s, n in zip(starts, lengths)]
    ours = tokenizer.encode(texts)
    assert ours == [e.ids for e in hf_reference.encode_batch(texts)]
    assert tokenizer.decode(ours) == texts


def test_special_tokens_are_never_split(tokenizer):
    ids = tokenizer.encode(f"x{END}<|im_start|>y<|pad|>").tolist()
    assert ids[1:3] == [0, 2] and ids[-1] == 1
    assert tokenizer.decode(ids, skip_special_tokens=True) == "xy"


# ---------------------------------------------------------------------------
# encode / decode / __call__ shapes and types.
# ---------------------------------------------------------------------------


def test_batch_padding_and_truncation(tokenizer):
    texts = ["Hello, world!", "a", ""]
    ragged = tokenizer.encode(texts)
    assert isinstance(ragged, list) and all(isinstance(r, list) for r in ragged)
    assert ragged[2] == []
    dense = tokenizer.encode(texts, sequence_length=4)
    assert dense.shape == (3, 4) and dense.dtype == np.int32
    for row, ids in zip(dense, ragged):
        n = min(len(ids), 4)
        assert row[:n].tolist() == ids[:n]
        assert (row[n:] == tokenizer.pad_token_id).all()
    single = tokenizer.encode("Hello, world!", sequence_length=64)
    assert single.shape == (64,)
    assert tokenizer.decode(single, skip_special_tokens=True) == "Hello, world!"
    assert tokenizer.decode(dense, skip_special_tokens=True)[1] == "a"
    assert tokenizer.encode([]) == []
    assert tokenizer.encode(np.array(texts)) == ragged
    assert tokenizer.encode(b"Hello, world!").tolist() == ragged[0]


def test_decode_accepts_backend_tensors_and_batches(tokenizer):
    texts = ["café 東京 🙂", "Hello, world!"]
    dense = tokenizer.encode(texts, sequence_length=20)
    tensor = keras.ops.convert_to_tensor(dense)
    decoded = tokenizer.decode(tensor, skip_special_tokens=True)
    assert decoded == texts
    assert tokenizer.decode(tensor[0], skip_special_tokens=True) == texts[0]
    ragged = tokenizer.encode(texts)
    assert tokenizer.decode(ragged) == texts
    assert tokenizer.decode([np.array(r) for r in ragged]) == texts
    assert tokenizer.decode(tokenizer.end_token_id) == END
    assert tokenizer.decode([]) == ""


def test_training_and_encoding_argument_errors(tokenizer):
    with pytest.raises(ValueError, match="learned no merges"):
        train_bpe(["x"], vocabulary_size=300)
    for length in (-1, 0, 2.5):
        with pytest.raises(ValueError, match="sequence_length"):
            tokenizer.encode("ab", sequence_length=length)


def test_decode_skips_stream_markers_and_rejects_negative_ids(tokenizer):
    """`generate(stream=...)` reports -1 for a finished row: decoding the
    stacked steps drops it; other negative ids and ids past int32 are
    errors that say so (not the tokenizers library's OverflowError)."""
    ids = np.asarray(tokenizer.encode("ab cd ef gh", sequence_length=4))
    steps = np.stack([ids, np.concatenate([ids[:2], [-1, -1]])])
    assert tokenizer.decode(steps) == [tokenizer.decode(ids), tokenizer.decode(ids[:2])]
    assert tokenizer.decode([-1, -1]) == ""
    for bad in ([5, -2], [2**40]):
        with pytest.raises(ValueError, match="token ids >= 0"):
            tokenizer.decode(bad)


def test_call_eager_equals_encode(tokenizer):
    assert tokenizer("a b").tolist() == tokenizer.encode("a b").tolist()
    assert tokenizer(["a b", "c"]) == tokenizer.encode(["a b", "c"])


# ---------------------------------------------------------------------------
# tf.data.
# ---------------------------------------------------------------------------


# Where keras-hub's graph path gives other ids than GPT-2 with this vocabulary:
# a whitespace run at the end of the text or before a special token.
TF_KNOWN_DIFFERENCES = ["a  ", "a\n  ", f"a  {END}"]


@pytest.fixture(scope="module")
def tf_data_ids(tokenizer) -> dict[str, list[int]]:
    """Ids from ONE `dataset.map(tokenizer)` (each trace of keras-hub's graph
    takes seconds)."""
    import tensorflow as tf

    texts = list(dict.fromkeys(SAMPLES + TF_EXACT_SAMPLES + TF_KNOWN_DIFFERENCES))
    ds = tf.data.Dataset.from_tensor_slices(texts).with_options(tf_options())
    ds = ds.batch(16).map(tokenizer)
    rows = [row for batch in ds for row in batch.to_list()]
    return dict(zip(texts, rows))


def test_tf_data_ids_equal_eager(tokenizer, tf_data_ids):
    for text in TF_EXACT_SAMPLES:
        assert tf_data_ids[text] == tokenizer.encode(text).tolist(), text


def test_tf_data_decode_is_exact_on_all_samples(tokenizer, tf_data_ids):
    texts = list(tf_data_ids)
    assert tokenizer.decode([tf_data_ids[t] for t in texts]) == texts


@pytest.mark.xfail(
    strict=True,
    reason=(
        "keras-hub 0.32's TensorFlow graph path (used in tf.data) splits a "
        "trailing whitespace run, where GPT-2's `\\s+(?!\\S)` keeps it whole; "
        "see the module docstring. If this passes, keras-hub was fixed: update "
        "the docstring and this test."
    ),
)
@pytest.mark.parametrize("text", TF_KNOWN_DIFFERENCES)
def test_tf_data_known_differences(tokenizer, tf_data_ids, text):
    assert tokenizer.decode(tf_data_ids[text]) == text  # Decoding stays exact.
    assert tf_data_ids[text] == tokenizer.encode(text).tolist()


def test_tf_data_unbatched_with_sequence_length(tokenizer, tmp_path):
    import tensorflow as tf

    tokenizer.save_assets(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["sequence_length"] = 6
    config["pad_token"] = "<|pad|>"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    padded = BPETokenizer.from_assets(tmp_path)
    assert padded.sequence_length == 6 and padded.pad_token_id == 1
    texts = ["Hello", "x" * 50, ""]
    expected = padded.encode(texts)
    assert expected.shape == (3, 6) and expected[0, -1] == 1
    assert (expected[2] == 1).all()
    assert padded("Hello").tolist() == expected[0].tolist()
    ds = tf.data.Dataset.from_tensor_slices(texts).with_options(tf_options())
    got = [x.numpy() for x in ds.map(padded)]
    assert all(x.shape == (6,) for x in got)
    np.testing.assert_array_equal(np.stack(got), expected)


# ---------------------------------------------------------------------------
# Files.
# ---------------------------------------------------------------------------


def test_save_and_load_assets(tokenizer, tmp_path):
    tokenizer.save_assets(tmp_path / "tok")
    names = sorted(p.name for p in (tmp_path / "tok").iterdir())
    assert names == ["merges.txt", "tokenizer_config.json", "vocab.json"]
    config = json.loads((tmp_path / "tok" / "tokenizer_config.json").read_text())
    assert config["class_name"] == "BPETokenizer"
    assert config["special_tokens"] == list(SPECIALS)
    assert config["sequence_length"] is None
    merges = (tmp_path / "tok" / "merges.txt").read_text(encoding="utf-8")
    assert merges.startswith("#version: 0.2\n")
    for loaded in (
        BPETokenizer.from_assets(tmp_path / "tok"),
        load_tokenizer(str(tmp_path / "tok")),
        BPETokenizer.from_gpt2_files(
            tmp_path / "tok" / "vocab.json", tmp_path / "tok" / "merges.txt"
        ),
    ):
        assert loaded.vocabulary == tokenizer.vocabulary
        assert loaded.merges == tokenizer.merges
        assert loaded.encode(SAMPLES[:10]) == tokenizer.encode(SAMPLES[:10])
    assert BPETokenizer.from_assets(tmp_path / "tok").special_tokens == SPECIALS
    with pytest.raises(FileNotFoundError, match=r"none of vocab\.json \+ merges"):
        load_tokenizer(tmp_path)  # No tokenizer files there.


def test_transformers_loads_saved_files_with_same_ids(tokenizer, tmp_path):
    from transformers import GPT2TokenizerFast

    tokenizer.save_assets(tmp_path / "ours")
    hf = GPT2TokenizerFast.from_pretrained(str(tmp_path / "ours"))
    assert hf(SAMPLES)["input_ids"] == tokenizer.encode(SAMPLES)
    assert hf.eos_token == hf.bos_token == hf.pad_token == END
    # And back: a directory written by transformers (tokenizer.json only).
    hf.save_pretrained(str(tmp_path / "hf"))
    loaded = load_tokenizer(tmp_path / "hf")
    assert loaded is not None and loaded.eos_token == END
    assert set(loaded.special_tokens) == set(SPECIALS)
    assert loaded.encode(SAMPLES) == tokenizer.encode(SAMPLES)


def test_chat_template_is_saved_and_read_by_transformers(tokenizer, tmp_path):
    from transformers import AutoTokenizer

    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    assert tokenizer.chat_template is None
    tokenizer.chat_template = template
    try:
        tokenizer.save_assets(tmp_path / "tok")
    finally:
        tokenizer.chat_template = None
    assert BPETokenizer.from_assets(tmp_path / "tok").chat_template == template
    hf = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    assert hf.chat_template == template
    hf.save_pretrained(str(tmp_path / "hf"))  # chat_template.jinja
    assert BPETokenizer.from_assets(tmp_path / "hf").chat_template == template


def test_load_hf_tokenizer_json_directory(tokenizer, tmp_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    hf = Tokenizer(
        models.BPE(tokenizer.vocabulary, [tuple(m.split()) for m in tokenizer.merges])
    )
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens(list(SPECIALS))
    hf.save(str(tmp_path / "tokenizer.json"))
    for loaded in (
        load_tokenizer(tmp_path),
        BPETokenizer.from_hf_tokenizer_json(tmp_path / "tokenizer.json"),
    ):
        assert loaded.vocabulary == tokenizer.vocabulary
        assert loaded.end_token == END and set(loaded.special_tokens) == set(SPECIALS)
        for text in SAMPLES:
            assert loaded.encode(text).tolist() == hf.encode(text).ids, text


# ---------------------------------------------------------------------------
# Errors.
# ---------------------------------------------------------------------------


def test_missing_files_raise(tokenizer, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        BPETokenizer.from_assets(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tokenizer(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="No tokenizer files"):
        BPETokenizer.from_assets(tmp_path)
    tokenizer.save_assets(tmp_path)
    (tmp_path / "merges.txt").unlink()
    with pytest.raises(FileNotFoundError, match="merges.txt"):
        load_tokenizer(tmp_path)
    with pytest.raises(FileNotFoundError, match="merges.txt"):
        BPETokenizer.from_gpt2_files(tmp_path / "vocab.json", tmp_path / "merges.txt")
    with pytest.raises(FileNotFoundError, match="missing.tiktoken"):
        BPETokenizer.from_tiktoken(tmp_path / "missing.tiktoken")


def test_corrupt_files_raise(tokenizer, tmp_path):
    tokenizer.save_assets(tmp_path)
    vocab = tmp_path / "vocab.json"
    good_vocab = vocab.read_text(encoding="utf-8")
    vocab.write_text(good_vocab[: len(good_vocab) // 2], encoding="utf-8")
    with pytest.raises(ValueError, match="vocab.json.*not valid"):
        BPETokenizer.from_assets(tmp_path)
    vocab.write_text('["a", "b"]')
    with pytest.raises(ValueError, match="vocab.json"):
        BPETokenizer.from_assets(tmp_path)
    vocab.write_text(good_vocab, encoding="utf-8")

    merges = tmp_path / "merges.txt"
    good_merges = merges.read_text(encoding="utf-8")
    merges.write_text(good_merges + "a b c\n", encoding="utf-8")
    with pytest.raises(ValueError, match="merges.txt"):
        BPETokenizer.from_assets(tmp_path)
    merges.write_text(good_merges + "zzzq zzzr\n", encoding="utf-8")
    with pytest.raises(ValueError, match="not in the vocabulary"):
        BPETokenizer.from_assets(tmp_path)
    merges.write_text(good_merges, encoding="utf-8")

    (tmp_path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="tokenizer_config.json"):
        BPETokenizer.from_assets(tmp_path)


def test_bad_tokenizer_json_and_arguments_raise(tokenizer, tmp_path):
    (tmp_path / "tokenizer.json").write_text(
        json.dumps({"model": {"type": "WordPiece", "vocab": {"a": 0}}})
    )
    with pytest.raises(ValueError, match="not a BPE tokenizer"):
        load_tokenizer(tmp_path)
    with pytest.raises(ValueError, match="not in the vocabulary"):
        BPETokenizer(tokenizer.vocabulary, tokenizer.merges, end_token="<|nope|>")
    with pytest.raises(ValueError, match="vocabulary_size"):
        train_bpe(["abc"], vocabulary_size=100)
    (tmp_path / "bad.tiktoken").write_text("not base64!! x\n")
    with pytest.raises(ValueError, match="bad.tiktoken"):
        BPETokenizer.from_tiktoken(tmp_path / "bad.tiktoken")


# ---------------------------------------------------------------------------
# Training from files.
# ---------------------------------------------------------------------------


def test_train_from_files(corpus_chunks, tmp_path):
    paths = []
    for i in range(3):
        path = tmp_path / f"part{i}.txt"
        path.write_text("".join(corpus_chunks[i * 10 : (i + 1) * 10]), encoding="utf-8")
        paths.append(path)
    for files in (paths, [str(p) for p in paths]):
        trained = train_bpe(files, 300)
        assert trained.vocabulary_size == 300
        text = paths[0].read_text(encoding="utf-8")[:3000]
        assert trained.decode(trained.encode(text)) == text


# ---------------------------------------------------------------------------
# tiktoken rank files.
# ---------------------------------------------------------------------------
