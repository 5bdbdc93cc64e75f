"""A WordPiece vocabulary trained on Python's documentation, shared by the
BERT preprocessing tests (test_preprocessing.py, test_mlm_masking.py)."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pydoc_data.topics import topics

from keras_transformers.preprocessing import WordPieceTokenizer, train_wordpiece

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
DOCS = [topics[k] for k in sorted(topics)]
# Handcrafted tokens so that accents, CJK and punctuation hit the vocabulary.
EXTRA = (
    "café ##é é naïve 中 文 東 京 の « » — … ¿ ¡ “ ” ’ ß straße ##ss σ ς ο ##ο "
    "##δ ##σ ##ς ﬁ ##ﬁ ü ##ü über İ ı Ａ １ ① ٣ ##\u0301 \u0301 ⁵ ##x"
).split()


@functools.cache
def tokenizers(lowercase):
    """`(our tokenizer, transformers.BertTokenizer, saved directory)`."""
    trained = train_wordpiece(DOCS, 1000, lowercase=lowercase)
    vocab = trained.vocabulary
    vocab += [t for t in dict.fromkeys(EXTRA) if t not in vocab]
    tokenizer = WordPieceTokenizer(vocab, lowercase=lowercase)
    directory = tempfile.mkdtemp(prefix="wordpiece_")
    atexit.register(shutil.rmtree, directory, True)
    tokenizer.save_assets(directory)
    import transformers

    hf = transformers.BertTokenizer(f"{directory}/vocab.txt", do_lower_case=lowercase)
    return tokenizer, hf, directory
