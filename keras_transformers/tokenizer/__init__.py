"""Tokenizers: any Hugging Face `tokenizer.json`, and GPT-family byte-level BPE.

:class:`HFTokenizer` runs a Hugging Face `tokenizer.json` of any model type
(BPE, byte-level or with byte fallback; WordPiece; Unigram / SentencePiece;
WordLevel) with the `tokenizers` library, with the special tokens, padding
side and chat templates of `tokenizer_config.json`; its ids and text are
those of `transformers.AutoTokenizer` on the same directory. Hugging Face
checkpoints with a `tokenizer.json`, or with only a SentencePiece model
(`tokenizer.model`, `spiece.model`, `sentencepiece.bpe.model`, `spm.model`;
read without the `sentencepiece` package, see `tokenizer.spm`), load with
it (see :func:`load_hf_tokenizer`), BERT-family ones excepted: they get
`keras_transformers.preprocessing.BertPreprocessor`, which gives the same
ids and also runs inside `tf.data`. ESM's protein `vocab.txt` loads as an
:class:`EsmTokenizer` (`keras_transformers.tokenizer.esm`).

:class:`BPETokenizer` is a thin wrapper around keras-hub's
`keras_hub.tokenizers.BytePairTokenizer` layer: the layer does the work, in
eager Python code and inside `tf.data` pipelines alike; the wrapper adds
NumPy / Python-list friendly `encode` / `decode`, named special tokens, and
reading and writing of the GPT-2 file formats:

* `vocab.json` + `merges.txt`: the GPT-2 / Hugging Face format (token -> id
  and the ranked merge rules), written by :meth:`BPETokenizer.save_assets`
  with our small `tokenizer_config.json` beside them;
* `tokenizer.json`: a Hugging Face "fast" tokenizer whose model is `"BPE"`
  with the GPT-2 byte-level pre-tokenizer;
* `*.tiktoken`: OpenAI's base64 token + rank files (`gpt2.tiktoken`).

:func:`train_bpe` trains one with the Hugging Face `tokenizers` library.

Exactness against the Hugging Face / OpenAI GPT-2 tokenizer (checked in
`tests/test_tokenizer.py`):

* Eager calls (`encode`, `__call__` outside a graph) give exactly the ids of
  `tokenizers` / `transformers.GPT2TokenizerFast`. keras-hub 0.32's eager
  path hands its split regex to `tokenizers.pre_tokenizers.Split` as a plain
  `str`, which `tokenizers` matches *literally*, so BPE merges would run
  across word boundaries (e.g. `"foo  bar"`); our layer uses the GPT-2
  pre-tokenizer (`ByteLevel(use_regex=True)`) instead.
* Inside `tf.data` / `tf.function`, keras-hub runs its TensorFlow graph
  implementation, which emulates the GPT-2 regex with RE2 (no look-ahead)
  and pre-tokenizes some whitespace differently, so ids differ wherever the
  vocabulary has a merge spanning the difference:

  - a run of two or more whitespace characters ending in a newline before
    a non-space (`"\\n\\n"`, `"\\r\\n"`, `" \\n"`): GPT-2 splits off the
    newline, keras-hub keeps the run whole (`"a\\n\\nb"`: GPT-2
    `[64, 198, 198, 65]`, keras-hub `[64, 628, 65]`);
  - a run of two or more whitespace characters at the end of the text or
    before a special token: keras-hub splits off the last character
    (`"a  "`: GPT-2 `"  "`, keras-hub `" ", " "`);
  - non-ASCII whitespace (`"\\u2028"`, `"\\x85"`, ...) and `"\\x0b"`, which
    RE2's `\\s` does not match (`"a \\u2028b"`, `"x\\x0b's"` with GPT-2).

  With GPT-2's own vocabulary these change the ids of about 45% of random
  1-400 character slices of Python's documentation (mostly blank lines).
  `decode` is exact on both paths. To train on exactly the ids `encode`
  produces, tokenize with `encode` (fast, Rust) and build the dataset from
  the ids.
"""

from keras_transformers.tokenizer._common import (
    CONFIG_FILENAME,
    DEFAULT_END_TOKEN,
    HF_TOKENIZER_FILENAME,
    MERGES_FILENAME,
    VOCAB_FILENAME,
    PathLike,
)
from keras_transformers.tokenizer.bpe import BPETokenizer, load_tokenizer
from keras_transformers.tokenizer.esm import EsmTokenizer
from keras_transformers.tokenizer.hf import HFTokenizer, load_hf_tokenizer
from keras_transformers.tokenizer.train import train_bpe

__all__ = [
    "CONFIG_FILENAME",
    "DEFAULT_END_TOKEN",
    "HF_TOKENIZER_FILENAME",
    "MERGES_FILENAME",
    "VOCAB_FILENAME",
    "BPETokenizer",
    "EsmTokenizer",
    "HFTokenizer",
    "PathLike",
    "load_hf_tokenizer",
    "load_tokenizer",
    "train_bpe",
]
