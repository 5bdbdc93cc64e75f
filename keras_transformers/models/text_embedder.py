"""`TextEmbedder`: a BERT-family encoder pooled into one vector per text,
as a sentence-transformers model computes it."""

from __future__ import annotations

import numpy as np

from keras_transformers.config.validation import check_argument_int
from keras_transformers.layers.pooling import TokenPooling, l2_normalize
from keras_transformers.layers.serializable import serializable
from keras_transformers.models.base import TaskModel
from keras_transformers.models.bert import BertBackbone
from keras_transformers.registry import register_model
from keras_transformers.tokenizer._common import _canonicalize_texts


@register_model("text_embedder")
@serializable
class TextEmbedder(TaskModel):
    """Sentence embeddings: a `BertBackbone`, then `TokenPooling` of its
    final states over the real tokens, optionally L2-normalised.

    A sentence-transformers directory (`modules.json` with Transformer,
    Pooling and optional Normalize modules) loads as this class through
    `keras_transformers.from_preset` or `TextEmbedder.from_preset` (local
    or `hf://`), with its pooling, normalisation and `max_seq_length`.
    Like every model it trains with `fit()` and saves with `save_to_preset`
    (the pooling settings with it).

    Args:
        backbone: a `BertBackbone` (or build one from `config`).
        pooling: a pooling mode or a sequence of them (concatenated):
            "mean" (default), "cls", "lasttoken", "max",
            "mean_sqrt_len_tokens", "weightedmean" (see `TokenPooling`).
        normalize: L2-normalise the embeddings.
        max_length: `encode` truncates texts to this many tokens, special
            tokens included (sentence-transformers' `max_seq_length`;
            None: the config's `max_sequence_length`).
        lowercase: `encode` lowercases texts first (sentence-transformers'
            `do_lower_case`).
        tokenizer: a `BertPreprocessor` or an `HFTokenizer` (what a model
            directory's files load as), used by `encode`.

    Call arguments:
        inputs: `{"token_ids": [B, T], "padding_mask": [B, T]}` (+
            `"segment_ids"`), as `BertBackbone` takes.

    Returns:
        `[B, embedding_dim]` float32 embeddings, `embedding_dim =
        hidden_dim * number of pooling modes`.

    Examples:
        >>> embedder = TextEmbedder.from_preset("bert_tiny", pooling="cls")
        >>> ids = np.ones((2, 8), "int32")
        >>> tuple(embedder({"token_ids": ids, "padding_mask": ids}).shape)
        (2, 128)
    """

    backbone_cls = BertBackbone
    task_arguments = ("pooling", "normalize", "max_length", "lowercase")

    def __init__(
        self,
        backbone=None,
        *,
        pooling="mean",
        normalize=False,
        max_length=None,
        lowercase=False,
        **kwargs,
    ):
        super().__init__(backbone, **kwargs)
        self.token_pooling = TokenPooling(
            pooling, normalize, dtype=self.dtype_policy, name="token_pooling"
        )
        self.pooling = self.token_pooling.pooling
        self.normalize = self.token_pooling.normalize
        if max_length is not None:
            max_length = check_argument_int("max_length", max_length, 2)
        self.max_length = max_length
        self.lowercase = bool(lowercase)

    @property
    def embedding_dim(self) -> int:
        """Width of an embedding: `hidden_dim` per pooling mode."""
        return self.config.hidden_dim * len(self.token_pooling.modes)

    def call(self, inputs, training=None):
        hidden = self.backbone(inputs, training=training)["sequence_output"]
        mask = inputs.get("padding_mask") if isinstance(inputs, dict) else None
        return self.token_pooling(hidden, mask)  # [B, embedding_dim]

    def encode(self, texts, batch_size=32, normalize_embeddings=None):
        """Embeds texts, as `SentenceTransformer.encode` does.

        Each text is tokenized with the model's special tokens and cut to
        `max_length` tokens; batches are formed from texts of similar
        length and padded to a few fixed lengths (powers of two), so a
        compiled model sees few shapes.

        Args:
            texts: a string or a sequence of strings.
            batch_size: texts per forward pass.
            normalize_embeddings: None: as the model says (`normalize`);
                True: L2-normalised in any case.

        Returns:
            `np.float32` embeddings `[len(texts), embedding_dim]`
            (`[embedding_dim]` for one string).

        Raises:
            ValueError: the model has no tokenizer, or
                `normalize_embeddings=False` on a model that normalises.
        """
        if normalize_embeddings is False and self.normalize:
            raise ValueError(
                "This model L2-normalises its embeddings (normalize=True, e.g. a "
                "Normalize module in its modules.json). For raw embeddings load it "
                "with `TextEmbedder.from_preset(handle, normalize=False)`."
            )
        batch_size = check_argument_int("batch_size", batch_size, 1)
        texts, single = _canonicalize_texts(texts)
        if self.lowercase:
            texts = [text.lower() for text in texts]
        limit = min(self.max_length or np.inf, self.config.max_sequence_length)
        rows = token_rows(self.tokenizer, texts, int(limit))
        pad = getattr(self.tokenizer, "pad_token_id", None) or 0
        out = np.zeros((len(rows), self.embedding_dim), "float32")
        order = np.argsort([-len(row) for row in rows], kind="stable")
        size = max(1, min(batch_size, len(rows)))  # rows of every batch
        for start in range(0, len(rows), size):
            index = order[start : start + size]
            batch = padded_batch([rows[i] for i in index], size, int(limit), pad)
            out[index] = np.asarray(self.predict_on_batch(batch))[: len(index)]
        if normalize_embeddings and not self.normalize:
            out = np.asarray(l2_normalize(out))
        return out[0] if single else out


def token_rows(tokenizer, texts: list[str], limit: int) -> list[list[int]]:
    """Ids of each text with the model's special tokens (`[CLS] ... [SEP]`,
    `<s> ... </s>`), the text's own tokens cut so that at most `limit`
    remain, as `transformers`' tokenizers truncate.

    Raises:
        ValueError: no tokenizer, or one that cannot add special tokens.
    """
    if hasattr(tokenizer, "backend"):  # HFTokenizer: tokenizer.json's post-processor
        backend = tokenizer.backend
        keep = limit - backend.num_special_tokens_to_add(False)
        encodings = backend.encode_batch(texts, add_special_tokens=False)
        for encoding in encodings:
            encoding.truncate(max(keep, 0))
        return [backend.post_process(e, None, True).ids for e in encodings]
    wordpiece = getattr(tokenizer, "tokenizer", None)
    if hasattr(wordpiece, "cls_token_id"):  # BertPreprocessor
        cls, sep = wordpiece.cls_token_id, wordpiece.sep_token_id
        return [[cls, *row[: limit - 2], sep] for row in wordpiece.encode(texts)]
    raise ValueError(
        "`encode` needs the model's tokenizer (a BertPreprocessor or HFTokenizer); "
        f"this model has {type(tokenizer).__name__ if tokenizer else 'none'}. Load "
        "the model from a directory with its tokenizer files, or set `model.tokenizer`."
    )


def padded_batch(rows, size: int, limit: int, pad: int) -> dict:
    """`{"token_ids", "padding_mask"}` `[B, L]` int32, right-padded with
    `pad`: `L` the longest row rounded up to a power of two (at least 8,
    at most `limit`); a short last batch repeats its first row up to
    `size` rows (one shape per length)."""
    longest = max(len(row) for row in rows)
    length = min(max(8, 1 << (longest - 1).bit_length()), max(limit, longest))
    rows = rows + [rows[0]] * (size - len(rows))
    ids = np.full((len(rows), length), pad, "int32")
    mask = np.zeros((len(rows), length), "int32")
    for i, row in enumerate(rows):
        ids[i, : len(row)], mask[i, : len(row)] = row, 1
    return {"token_ids": ids, "padding_mask": mask}
