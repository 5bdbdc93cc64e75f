"""The keras-hub layer under `WordPieceTokenizer`, created on first use.

keras-hub imports TensorFlow, so it is imported when a tokenizer is built,
never when `keras_transformers` is imported, and quietly (see
`keras_transformers._quiet`).
"""

from __future__ import annotations

import importlib
import re

from keras_transformers._quiet import import_quietly
from keras_transformers.backend import tensorflow_module as tensorflow

SPECIAL_TOKENS = {
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "mask_token": "[MASK]",
}
# Longer words (in characters) become `[UNK]`, as in BERT and Hugging Face.
MAX_INPUT_CHARS_PER_WORD = 100

# What Hugging Face's `BertNormalizer(clean_text=True)` deletes: NUL, U+FFFD
# and "other" characters (Cc, Cf, Co, Cs) but tab, newline and carriage
# return. RE2 has no `\p{Cn}`: unassigned code points are kept (see the
# package docstring).
_CONTROL_RE = r"[\x00-\x08\x0B\x0C\x0E-\x1F\x7F-\x9F\p{Cf}\p{Co}\p{Cs}\x{FFFD}]"
# What it maps to a space: Unicode White_Space that survived the deletion.
_SPACE_RE = r"[\p{Zs}\x{2028}\x{2029}]"

_LAYER_CLASS = None


def hf_tokenizer(vocabulary, lowercase, strip_accents, split_on_cjk):
    """The Hugging Face `tokenizers` pipeline of `transformers.BertTokenizer`."""
    from tokenizers import (
        AddedToken,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
    )

    vocab = {token: i for i, token in enumerate(vocabulary)}
    hf = Tokenizer(
        models.WordPiece(
            vocab,
            unk_token=SPECIAL_TOKENS["unk_token"],
            max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD,
        )
    )
    hf.normalizer = normalizers.BertNormalizer(
        clean_text=True,
        handle_chinese_chars=split_on_cjk,
        strip_accents=strip_accents,
        lowercase=lowercase,
    )
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    hf.decoder = decoders.WordPiece(prefix="##")
    hf.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS.values()]
    )
    return hf


def layer_class():
    """The keras-hub `WordPieceTokenizer` subclass, created on first use."""
    global _LAYER_CLASS
    if _LAYER_CLASS is not None:
        return _LAYER_CLASS

    import keras

    keras_hub = import_quietly("keras_hub")

    @keras.saving.register_keras_serializable(package="keras_transformers")
    class BertWordPieceTokenizer(keras_hub.tokenizers.WordPieceTokenizer):
        """keras-hub's `WordPieceTokenizer` normalizing text like BERT.

        Differs from its base class in (1) the eager path, which runs the
        Hugging Face `tokenizers` pipeline of `transformers.BertTokenizer`,
        (2) the graph path, which first deletes control characters, maps
        Unicode spaces to `" "` and lowercases with `tf.strings.lower`
        (keras-hub applies NFKC case folding), and (3) the named BERT special
        tokens with `*_id` attributes, as keras-hub's `BertTokenizer` has.
        """

        def __init__(
            self,
            vocabulary=None,
            lowercase=True,
            strip_accents=None,
            split_on_cjk=True,
            **kwargs,
        ):
            for name, token in SPECIAL_TOKENS.items():
                self._add_special_token(token, name)
            self._add_special_token(SPECIAL_TOKENS["cls_token"], "start_token")
            self._add_special_token(SPECIAL_TOKENS["sep_token"], "end_token")
            self.bert_lowercase = bool(lowercase)
            self.bert_strip_accents = strip_accents
            kwargs.pop("special_tokens_in_strings", None)
            kwargs.pop("oov_token", None)
            super().__init__(
                vocabulary=vocabulary,
                lowercase=False,  # done in `_normalize_tf` / by `tokenizers`
                strip_accents=lowercase if strip_accents is None else strip_accents,
                split_on_cjk=split_on_cjk,
                oov_token=SPECIAL_TOKENS["unk_token"],
                special_tokens_in_strings=True,
                **kwargs,
            )

        def set_vocabulary(self, vocabulary):
            super().set_vocabulary(vocabulary)
            self._hf = None
            if self.vocabulary is not None:
                self._hf = hf_tokenizer(
                    self.vocabulary,
                    self.bert_lowercase,
                    self.bert_strip_accents,
                    self.split_on_cjk,
                )

        def get_config(self):
            return {
                **super().get_config(),
                "lowercase": self.bert_lowercase,
                "strip_accents": self.bert_strip_accents,
                "split_on_cjk": self.split_on_cjk,
            }

        def _tokenize_python(self, inputs):
            from keras_transformers.tokenizer._common import _canonicalize_texts

            texts, single = _canonicalize_texts(inputs)
            rows = [
                e.ids for e in self._hf.encode_batch(texts, add_special_tokens=False)
            ]
            if single:
                import numpy as np

                return np.asarray(rows[0], dtype=self.compute_dtype)
            return rows

        def _tokenize_tf(self, inputs):
            return super()._tokenize_tf(self._normalize_tf(inputs))

        def _normalize_tf(self, text):
            tf = tensorflow()
            if isinstance(text, tf.RaggedTensor):
                return tf.ragged.map_flat_values(self._normalize_tf, text)
            text = tf.convert_to_tensor(text)
            shape = tf.shape(text)
            text = tf.reshape(text, [-1])
            text = tf.strings.regex_replace(text, _CONTROL_RE, "")
            text = tf.strings.regex_replace(text, _SPACE_RE, " ")
            if self.bert_lowercase:
                text = self._lowercase_tf(text)
            return tf.reshape(text, shape)

        def _lowercase_tf(self, text):
            """Lowercases all but the special tokens, character by character."""
            tf = tensorflow()
            tf_text = importlib.import_module("tensorflow_text")

            pattern = "|".join(re.escape(t) for t in self.special_tokens)
            pieces = tf_text.regex_split(text, pattern, pattern)
            flat = pieces.flat_values
            # `tf.strings.lower` applies the final-sigma rule; Hugging Face
            # (Rust `char::to_lowercase`) does not: always map "Σ" to "σ".
            lowered = tf.strings.lower(
                tf.strings.regex_replace(flat, "Σ", "σ"), encoding="utf-8"
            )
            special = tf.strings.regex_full_match(flat, pattern)
            pieces = pieces.with_flat_values(tf.where(special, flat, lowered))
            return tf.strings.reduce_join(pieces, axis=-1)

    _LAYER_CLASS = BertWordPieceTokenizer
    return _LAYER_CLASS
