"""BERT preprocessing: WordPiece tokenization, sentence-pair packing and
dynamic masked-LM masking, usable from raw strings inside `fit()` on every
backend.

* :class:`WordPieceTokenizer` wraps keras-hub's `WordPieceTokenizer` layer
  (`tokenizer.layer`) with BERT's special tokens (`[PAD]`, `[UNK]`, `[CLS]`,
  `[SEP]`, `[MASK]`), NumPy-friendly `encode` / `decode`, and `vocab.txt`
  files (`from_vocab_file`, `save_assets`, `from_assets`).
* :func:`train_wordpiece` learns a vocabulary from the user's text with the
  Hugging Face `tokenizers` trainer.
* :class:`BertPreprocessor` turns strings or pairs of strings into
  `{"token_ids", "segment_ids", "padding_mask"}`: `[CLS] a [SEP] b [SEP]`,
  truncated to `sequence_length` and padded with `[PAD]`; NumPy eagerly,
  TensorFlow tensors inside `tf.data.Dataset.map`.
* :class:`MaskedLMMasker` chooses 15% of the tokens (never special tokens or
  padding) and corrupts them 80% `[MASK]` / 10% random / 10% unchanged,
  returning `mask_positions`, `labels` and `sample_weight` for
  `BertMaskedLM`; :class:`MaskedLMDataset` (a `keras.utils.PyDataset`)
  masks every batch afresh each epoch.
* :func:`load_preprocessor` loads a saved (or Hugging Face) tokenizer
  directory, or returns None when it has no WordPiece vocabulary.

Exactness against Hugging Face (`tests/test_preprocessing.py`): the
reference is `transformers.BertTokenizer` (transformers 5: the Rust
`tokenizers` pipeline) on the same `vocab.txt`, uncased and cased.

* Eager calls (`encode`, `BertPreprocessor` on Python strings) give exactly
  its ids, including pairs with `truncate="longest_first"` and
  `truncation=True`; `decode` gives its text. The eager path runs that same
  pipeline (`BertNormalizer`, `BertPreTokenizer`, `WordPiece` with words
  over 100 characters as `[UNK]`).
* Plain keras-hub 0.32 (both of its paths) differs from BERT in how it
  normalizes text, which our layer corrects: it lowercases with NFKC case
  folding (`"straße"` -> `"strasse"`, `"ﬁ"` -> `"fi"`, `"…"` -> `"..."`,
  `"Ａ"` -> `"a"`, `"ς"` -> `"σ"`) where BERT lowercases character by
  character; it does not split on non-ASCII spaces (`"\\u00a0"`,
  `"\\u3000"`, `"\\u2028"`); it splits words on control and format
  characters (`"\\u200b"`, soft hyphen, `"\\x0c"`) that BERT deletes; it
  keeps `"\\ufffd"` and NUL.
* Inside `tf.data` / `tf.function` keras-hub's TensorFlow graph runs, after
  our TensorFlow normalization; it gives the same ids except (1) words of
  at most 100 characters but more than 100 UTF-8 bytes (e.g. 60 accented
  letters, cased) become `[UNK]`, and (2) unassigned code points (RE2 has
  no `\\p{Cn}`) are kept where BERT deletes them.
* `transformers.BertTokenizerLegacy` (the old Python tokenizer) itself
  differs from `BertTokenizer` on final sigma (`"ΟΔΟΣ"`, uncased) and on
  decomposed accents (`"e\\u0301"`, cased: it composes them first); we
  follow `BertTokenizer`.
* `truncate="round_robin"` (the default, as keras-hub) differs from Hugging
  Face's longest-first only when both segments are too long and the budget
  is odd: keras-hub gives the extra token to the first segment, Hugging
  Face to the longer one (the second on a tie).
"""

from keras_transformers.preprocessing.bert_preprocessor import (
    BertPreprocessor,
    load_preprocessor,
)
from keras_transformers.preprocessing.masking import MaskedLMDataset, MaskedLMMasker
from keras_transformers.preprocessing.train import train_wordpiece
from keras_transformers.preprocessing.wordpiece import WordPieceTokenizer

__all__ = [
    "BertPreprocessor",
    "MaskedLMDataset",
    "MaskedLMMasker",
    "WordPieceTokenizer",
    "load_preprocessor",
    "train_wordpiece",
]
