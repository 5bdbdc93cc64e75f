"""The keras-hub layer under `BPETokenizer`, created on first use."""

from __future__ import annotations

from keras_transformers._quiet import import_quietly
from keras_transformers.tokenizer._common import DEFAULT_END_TOKEN

_LAYER_CLASS = None


def _layer_class():
    """The keras-hub `BytePairTokenizer` subclass, created on first use.

    keras-hub imports TensorFlow, so it is imported when a tokenizer is
    built, never when `keras_transformers` is imported, and quietly (see
    `keras_transformers._quiet`).
    """
    global _LAYER_CLASS
    if _LAYER_CLASS is not None:
        return _LAYER_CLASS

    import keras
    from tokenizers import pre_tokenizers

    keras_hub = import_quietly("keras_hub")

    @keras.saving.register_keras_serializable(package="keras_transformers")
    class GPT2BytePairTokenizer(keras_hub.tokenizers.BytePairTokenizer):
        """`BytePairTokenizer` with GPT-2 pre-tokenization and named tokens.

        Differs from its base class only in (1) the eager path's
        pre-tokenizer, the GPT-2 byte-level regex (keras-hub 0.32 passes its
        regex as a literal string, see the package docstring), and (2)
        `end_token` / `start_token` / `pad_token` attributes with `*_id`
        twins, as keras-hub's model tokenizers have them.
        """

        def __init__(
            self,
            vocabulary=None,
            merges=None,
            end_token: str = DEFAULT_END_TOKEN,
            start_token: str | None = None,
            pad_token: str | None = None,
            **kwargs,
        ):
            self._add_special_token(end_token, "end_token")
            self._add_special_token(start_token or end_token, "start_token")
            self._add_special_token(pad_token or end_token, "pad_token")
            super().__init__(vocabulary=vocabulary, merges=merges, **kwargs)

        def _set_vocabulary_and_merges_tokenizers(self, vocabulary, merges):
            super()._set_vocabulary_and_merges_tokenizers(vocabulary, merges)
            self._tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(
                add_prefix_space=self.add_prefix_space, use_regex=True
            )

        def get_config(self):
            return {
                **super().get_config(),
                "end_token": self.end_token,
                "start_token": self.start_token,
                "pad_token": self.pad_token,
            }

    _LAYER_CLASS = GPT2BytePairTokenizer
    return _LAYER_CLASS
