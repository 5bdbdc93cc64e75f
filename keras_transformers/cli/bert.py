"""The masked-LM job of `keras-transformers train BERT_PRESET`: a WordPiece
vocabulary and masked-LM pretraining (dynamic masking) on a text file, saved
as a `BertMaskedLM` preset.

`finetune HANDLE --task classify` (a `BertClassifier` on a CSV of texts and
labels) is `cli.classify`. `cli.train` parses the arguments;
`cli._training` has the helpers shared with the other training jobs.
"""

from __future__ import annotations

import argparse
import time
import warnings
from typing import Any

import keras
import numpy as np

from keras_transformers.cli import resume
from keras_transformers.cli._common import (
    WORDPIECE_VOCABULARY_SIZE,
    CLIError,
    quiet_stderr,
)
from keras_transformers.cli._training import (
    check_train_args,
    fit,
    load_text,
    optimizer,
)

BERT_SEQUENCE_LENGTH = 128


class RepeatBatches(keras.utils.PyDataset):
    """`num_batches` batches per epoch from a `PyDataset`, wrapping around.

    An "epoch" of `fit` can then be any number of steps; the wrapped
    dataset's `on_epoch_end` (new masks, new order) runs whenever it wraps.
    Batches must be read in order (the default, one worker).

    Args:
        dataset: the `keras.utils.PyDataset` to draw batches from.
        num_batches: batches per epoch.
    """

    def __init__(self, dataset: keras.utils.PyDataset, num_batches: int) -> None:
        super().__init__()
        self.dataset, self.steps = dataset, num_batches
        self._epoch, self._inner_epochs = 0, 0

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, index: int):
        step = self._epoch * self.steps + index
        inner_epoch, inner_index = divmod(step, len(self.dataset))
        while self._inner_epochs < inner_epoch:
            self.dataset.on_epoch_end()
            self._inner_epochs += 1
        return self.dataset[inner_index]

    def on_epoch_end(self) -> None:
        self._epoch += 1


def pack_windows(token_ids: Any, tokenizer, sequence_length: int) -> dict:
    """Cuts a token stream into `[CLS] ... [SEP]` rows with no padding.

    Args:
        token_ids: 1-D ids of the text (no special tokens).
        tokenizer: the `WordPieceTokenizer` (for the `[CLS]` / `[SEP]` ids).
        sequence_length: length of each row, special tokens included.

    Returns:
        `{"token_ids", "segment_ids", "padding_mask"}` int32 `[N, T]` arrays.
    """
    body = sequence_length - 2
    rows = len(token_ids) // body
    ids = np.asarray(token_ids[: rows * body], dtype="int32").reshape(rows, body)
    cls = np.full((rows, 1), tokenizer.cls_token_id, "int32")
    sep = np.full((rows, 1), tokenizer.sep_token_id, "int32")
    ids = np.concatenate([cls, ids, sep], axis=1)
    return {
        "token_ids": ids,
        "segment_ids": np.zeros_like(ids),
        "padding_mask": np.ones_like(ids),
    }


def pretrain_bert(args: argparse.Namespace, **overrides: Any):
    """`train` for a bert preset: WordPiece vocabulary + masked-LM pretraining.

    Args:
        args: the parsed `train` arguments.
        **overrides: config fields to change (e.g. `num_layers=1`).

    Returns:
        The trained `BertMaskedLM`, its preprocessor attached, saved to
        `args.output`.
    """
    check_train_args(args, families=("bert",))
    from keras_transformers import data
    from keras_transformers.models import BertMaskedLM
    from keras_transformers.presets import load_config
    from keras_transformers.training import (
        MaskedAccuracy,
        MaskedSparseCategoricalCrossentropy,
    )

    with quiet_stderr():
        from keras_transformers.preprocessing import (
            BertPreprocessor,
            MaskedLMDataset,
            MaskedLMMasker,
            train_wordpiece,
        )
    start = time.perf_counter()
    config = load_config(args.preset, **overrides)
    text, source = load_text(args)
    lines = [line for line in text.splitlines() if line.strip()]
    print(f"Data: {source}, {len(text):,} characters, {len(lines):,} lines.")
    size = args.vocabulary_size or min(
        config.vocabulary_size, WORDPIECE_VOCABULARY_SIZE
    )
    try:
        tokenizer = train_wordpiece(lines, vocabulary_size=size)
    except ValueError as error:
        raise CLIError(f"cannot train the tokenizer: {error}") from None
    tokenizer = resume.backed_up_tokenizer(args, tokenizer)
    stream = [i for row in tokenizer.encode(lines) for i in row] if lines else []
    length = args.sequence_length or min(
        BERT_SEQUENCE_LENGTH, config.max_sequence_length
    )
    if length < 8:
        raise CLIError(f"--sequence-length must be at least 8, got {length}.")
    train_ids, val_ids = data.split_tokens(
        np.asarray(stream, "int32"), args.validation_fraction
    )
    train_x = pack_windows(train_ids, tokenizer, length)
    val_x = pack_windows(val_ids, tokenizer, length)
    if len(train_x["token_ids"]) < args.batch_size or not len(val_x["token_ids"]):
        raise CLIError(
            f"{len(stream):,} tokens are too few for a batch of {args.batch_size} x "
            f"{length} tokens plus a validation split: use more text, a shorter "
            "--sequence-length or a smaller --batch-size."
        )
    print(
        f"Tokenizer: WordPiece, {tokenizer.vocabulary_size:,} tokens; "
        f"{len(stream):,} tokens; {len(train_x['token_ids']):,} training and "
        f"{len(val_x['token_ids']):,} validation sequences of {length}."
    )
    masker = MaskedLMMasker.from_tokenizer(tokenizer, seed=args.seed)
    train = RepeatBatches(
        MaskedLMDataset(train_x, masker, args.batch_size, seed=args.seed),
        args.steps_per_epoch,
    )
    m = masker(val_x["token_ids"], rng=np.random.default_rng(args.seed + 1))
    val_inputs = {**val_x, **{k: m[k] for k in ("token_ids", "mask_positions")}}
    validation = (val_inputs, m["labels"], m["sample_weight"])

    keras.utils.set_random_seed(args.seed)
    model = BertMaskedLM.from_preset(
        args.preset,
        vocabulary_size=tokenizer.vocabulary_size,
        max_sequence_length=max(length, config.max_sequence_length),
        pad_token_id=tokenizer.pad_token_id,
        **overrides,
    )
    model.compile(
        optimizer=optimizer(args, args.epochs * args.steps_per_epoch),
        loss=MaskedSparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=[MaskedAccuracy(name="masked_accuracy")],
    )
    print(
        f"Model: {args.preset} (BertMaskedLM), {model.count_params():,} parameters; "
        f"{args.epochs} epochs x {args.steps_per_epoch} steps of {args.batch_size} "
        f"sequences; backend: {keras.config.backend()}."
    )
    with warnings.catch_warnings():  # the masked-LM loss never uses the pooler
        warnings.filterwarnings("ignore", "Gradients do not exist.*pooler")
        callbacks = resume.resume_callbacks(args)
        history, seconds = fit(
            model,
            callbacks[0].resumable(train),
            validation,
            args,
            "masked_accuracy",
            shuffle=False,  # the dataset shuffles itself, reproducibly
            callbacks=callbacks,
        )
    model.tokenizer = BertPreprocessor(tokenizer, sequence_length=length)
    model.save_to_preset(args.output)
    print(
        f"Final: val_loss {history['val_loss'][-1]:.4f}, val masked accuracy "
        f"{history['val_masked_accuracy'][-1]:.3f}; fit {seconds:.0f} s, total "
        f"{time.perf_counter() - start:.0f} s."
    )
    print(f"Saved the model and preprocessor to {args.output}")
    return model
