"""`BPETokenizer.from_tiktoken`: a rank file written from a trained
tokenizer gives back its merges, and OpenAI's real GPT-2 files (found in an
`openai-whisper` sdist, see `_find_in_whisper_sdist`; skipped otherwise)
give GPT-2's ids, in Python and inside tf.data."""

from __future__ import annotations

import base64
import glob
import os
import pathlib
import tarfile

import pytest
from bpe_samples import SAMPLES, SPECIALS, VOCAB_SIZE, chunks, corpus, tf_options

from keras_transformers.tokenizer import BPETokenizer, train_bpe


@pytest.fixture(scope="module")
def tokenizer() -> BPETokenizer:
    return train_bpe(chunks(corpus()), VOCAB_SIZE, special_tokens=SPECIALS)


def test_from_tiktoken_reconstructs_merges(tokenizer, tmp_path):
    """A rank file written from our tokenizer gives back its merges."""
    from keras_transformers.tokenizer._common import _BYTE_TO_UNICODE

    unicode_to_byte = {u: b for b, u in _BYTE_TO_UNICODE.items()}
    lines = []
    for token, index in sorted(tokenizer.vocabulary.items(), key=lambda x: x[1]):
        if token not in SPECIALS:
            data = bytes(unicode_to_byte[c] for c in token)
            lines.append(f"{base64.b64encode(data).decode()} {index}\n")
    (tmp_path / "ours.tiktoken").write_text("".join(lines))
    loaded = BPETokenizer.from_tiktoken(
        tmp_path / "ours.tiktoken",
        special_tokens={token: i for i, token in enumerate(SPECIALS)},
    )
    assert loaded.vocabulary == tokenizer.vocabulary
    assert loaded.merges == tokenizer.merges
    assert loaded.special_tokens == SPECIALS


def _find_in_whisper_sdist(suffix: str, tmp_path: pathlib.Path) -> pathlib.Path | None:
    """Finds a GPT-2 asset in an `openai-whisper` sdist or install.

    Looks at `$KERAS_TRANSFORMERS_WHISPER_DIR` (default `/tmp/whisper*`) for
    extracted files or sdists, e.g. after
    `pip download --no-deps --no-binary :all: openai-whisper==20250625 -d /tmp/whisper`
    (which has `assets/gpt2.tiktoken`; versions up to 20230124 have
    `assets/gpt2/vocab.json` and `merges.txt`), and at an installed `whisper`.
    """
    roots = glob.glob(os.environ.get("KERAS_TRANSFORMERS_WHISPER_DIR", "/tmp/whisper*"))
    try:
        import whisper  # type: ignore[import-not-found]

        roots.append(os.path.dirname(whisper.__file__))
    except Exception:
        pass
    for root in roots:
        found = glob.glob(os.path.join(root, "**", "*" + suffix), recursive=True)
        if found:
            return pathlib.Path(found[0])
        for archive in glob.glob(os.path.join(root, "*.tar.gz")):
            with tarfile.open(archive) as tar:
                for member in tar.getmembers():
                    if member.name.endswith(suffix):
                        out = tmp_path / pathlib.Path(suffix).name
                        out.write_bytes(tar.extractfile(member).read())
                        return out
    return None


@pytest.fixture(scope="module")
def gpt2_tiktoken(tmp_path_factory):
    path = _find_in_whisper_sdist("assets/gpt2.tiktoken", tmp_path_factory.mktemp("tt"))
    if path is None:
        pytest.skip("gpt2.tiktoken not found (download the openai-whisper sdist)")
    return BPETokenizer.from_tiktoken(path)


def test_gpt2_tiktoken_known_ids(gpt2_tiktoken):
    assert gpt2_tiktoken.vocabulary_size == 50257
    assert gpt2_tiktoken.eos_token_id == 50256
    assert gpt2_tiktoken.encode("Hello world").tolist() == [15496, 995]
    assert gpt2_tiktoken.encode(" Hello world").tolist() == [18435, 995]
    assert gpt2_tiktoken.encode("a\n\nb").tolist() == [64, 198, 198, 65]
    for text in SAMPLES:
        assert gpt2_tiktoken.decode(gpt2_tiktoken.encode(text)) == text


def test_gpt2_tiktoken_equals_gpt2_vocab_and_merges(gpt2_tiktoken, tmp_path):
    vocab = _find_in_whisper_sdist("assets/gpt2/vocab.json", tmp_path)
    merges = _find_in_whisper_sdist("assets/gpt2/merges.txt", tmp_path)
    if vocab is None or merges is None:
        pytest.skip("GPT-2 vocab.json/merges.txt not found (openai-whisper<=20230124)")
    gpt2 = BPETokenizer.from_gpt2_files(vocab, merges)
    assert gpt2_tiktoken.vocabulary == gpt2.vocabulary
    assert gpt2_tiktoken.merges == gpt2.merges

    from transformers import GPT2TokenizerFast

    (tmp_path / "gpt2").mkdir()
    for path in (vocab, merges):
        (tmp_path / "gpt2" / path.name).write_bytes(path.read_bytes())
    hf = GPT2TokenizerFast.from_pretrained(str(tmp_path / "gpt2"))
    for text in SAMPLES:
        assert gpt2.encode(text).tolist() == hf(text)["input_ids"], text


@pytest.mark.once
def test_gpt2_tf_data_blank_line_difference(gpt2_tiktoken):
    """keras-hub's graph path with GPT-2's vocabulary, pinned as it is today.

    A blank line before a word is one `"\\n\\n"` token (628) inside tf.data,
    where GPT-2 and `encode` give two `"\\n"` (198, 198): keras-hub 0.32 keeps
    newline runs whole (a Llama 3 rule). If this fails because the ids became
    `[64, 198, 198, 65]`, keras-hub was fixed: update test_tokenizer.py's docstring.
    """
    import tensorflow as tf

    texts = ["a\n\nb", "Hello world"]
    ds = tf.data.Dataset.from_tensor_slices(texts).with_options(tf_options())
    got = next(iter(ds.batch(2).map(gpt2_tiktoken))).to_list()
    assert gpt2_tiktoken.encode(texts) == [[64, 198, 198, 65], [15496, 995]]
    assert got == [[64, 628, 65], [15496, 995]]
    assert gpt2_tiktoken.decode(got) == texts
