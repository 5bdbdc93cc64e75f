"""The BERT jobs of the `keras-transformers` command.

* `train BERT_PRESET`: a WordPiece vocabulary and masked-LM pretraining
  (dynamic masking) on a text file, saved as a `BertMaskedLM` preset.
* `finetune PRESET_OR_DIR --task classify`: a `BertClassifier` on a CSV of
  texts and labels, saved as a preset with `labels.json` beside it.

`cli.py` parses the arguments; the helpers of the causal-LM `train` job
(`cli_train`) are reused.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import keras
import numpy as np

from keras_transformers.cli_train import (
    PROG,
    CLIError,
    _check_train_args,
    _load_text,
    _optimizer,
    _quiet_stderr,
)

LABELS_FILE = "labels.json"
DEFAULT_VOCABULARY_SIZE = 8000  # the presets' 30,522 is for huge corpora
BERT_SEQUENCE_LENGTH = 128


def accuracy_and_macro_f1(y_true: Any, y_pred: Any, num_classes: int) -> tuple:
    """Accuracy and macro-averaged F1 (a class never seen nor predicted: F1 0).

    Args:
        y_true: integer labels.
        y_pred: predicted integer labels, same shape.
        num_classes: number of classes averaged over.

    Returns:
        `(accuracy, macro_f1)`, two floats.
    """
    y_true, y_pred = np.asarray(y_true).ravel(), np.asarray(y_pred).ravel()
    f1 = []
    for c in range(num_classes):
        tp = np.sum((y_pred == c) & (y_true == c))
        denominator = np.sum(y_pred == c) + np.sum(y_true == c)
        f1.append(2 * tp / denominator if denominator else 0.0)
    return float(np.mean(y_true == y_pred)), float(np.mean(f1))


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


def _fit(model, x, validation, args, metric, y=None, batch_size=None) -> tuple:
    """`model.fit`; prints the validation `metric` per epoch."""
    start = time.perf_counter()
    history = model.fit(
        x,
        y,
        batch_size=batch_size,
        validation_data=validation,
        epochs=args.epochs,
        verbose=1 if sys.stdout.isatty() else 2,
    ).history
    values = " -> ".join(f"{v:.3f}" for v in history[f"val_{metric}"])
    print(f"Validation {metric.replace('_', ' ')} per epoch: {values}")
    return history, time.perf_counter() - start


def pretrain_bert(args: argparse.Namespace, **overrides: Any):
    """`train` for a bert preset: WordPiece vocabulary + masked-LM pretraining.

    Args:
        args: the parsed `train` arguments.
        **overrides: config fields to change (e.g. `num_layers=1`).

    Returns:
        The trained `BertMaskedLM`, its preprocessor attached, saved to
        `args.output`.
    """
    _check_train_args(args, families=("bert",))
    from keras_transformers import data
    from keras_transformers.models import BertMaskedLM
    from keras_transformers.presets import load_config
    from keras_transformers.training import (
        MaskedAccuracy,
        MaskedSparseCategoricalCrossentropy,
    )

    with _quiet_stderr():
        from keras_transformers.preprocessing import (
            BertPreprocessor,
            MaskedLMDataset,
            MaskedLMMasker,
            train_wordpiece,
        )
    start = time.perf_counter()
    config = load_config(args.preset, **overrides)
    text, source = _load_text(args)
    lines = [line for line in text.splitlines() if line.strip()]
    print(f"Data: {source}, {len(text):,} characters, {len(lines):,} lines.")
    size = args.vocabulary_size or min(config.vocabulary_size, DEFAULT_VOCABULARY_SIZE)
    try:
        tokenizer = train_wordpiece(lines, vocabulary_size=size)
    except ValueError as error:
        raise CLIError(f"cannot train the tokenizer: {error}") from None
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
        optimizer=_optimizer(args, args.epochs * args.steps_per_epoch),
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
        history, seconds = _fit(model, train, validation, args, "masked_accuracy")
    model.tokenizer = BertPreprocessor(tokenizer, sequence_length=length)
    model.save_to_preset(args.output)
    print(
        f"Final: val_loss {history['val_loss'][-1]:.4f}, val masked accuracy "
        f"{history['val_masked_accuracy'][-1]:.3f}; fit {seconds:.0f} s, total "
        f"{time.perf_counter() - start:.0f} s."
    )
    print(f"Saved the model and preprocessor to {args.output}")
    return model


# ---------------------------------------------------------------------------
# finetune
# ---------------------------------------------------------------------------


def add_finetune_parser(commands, positive_int, positive_float) -> None:
    """Adds the `finetune` sub-command to the `keras-transformers` parser."""
    p = commands.add_parser(
        "finetune",
        help="fine-tune a bert preset as a text classifier on a CSV file",
        description=(
            "Fine-tunes a BertClassifier on the texts and labels of a CSV file "
            "(labels may be strings), reports validation accuracy and macro-F1, "
            f"and saves the preset with the label names in {LABELS_FILE}."
        ),
    )
    p.add_argument("preset", help="bert preset name or a saved preset directory")
    p.add_argument("--task", choices=("classify",), default="classify")
    p.add_argument("--data", required=True, help="CSV file with a header row")
    p.add_argument("--text-column", default="text", help="default: %(default)s")
    p.add_argument("--label-column", default="label", help="default: %(default)s")
    p.add_argument("--output", help="default: runs/finetune")
    p.add_argument("--epochs", type=positive_int, default=3)
    p.add_argument("--batch-size", type=positive_int, default=32)
    p.add_argument("--sequence-length", type=positive_int, default=64)
    p.add_argument("--learning-rate", type=positive_float, default=5e-4)
    p.add_argument("--validation-fraction", type=float, default=0.1)
    p.add_argument(
        "--vocabulary-size",
        type=positive_int,
        default=DEFAULT_VOCABULARY_SIZE,
        help="WordPiece size when the preset has no vocabulary (default: %(default)s)",
    )
    p.add_argument("--seed", type=int, default=0)


def read_labelled_csv(path: str, text_column: str, label_column: str) -> tuple:
    """The non-empty `(texts, labels)` of a CSV file, labels as strings."""
    import csv

    if not Path(path).is_file():
        raise CLIError(f"data file not found: {path}")
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        reader = csv.DictReader(f)
        columns = reader.fieldnames or []
        for column in (text_column, label_column):
            if column not in columns:
                raise CLIError(
                    f"{path} has no column {column!r}; its columns: "
                    + (", ".join(repr(c) for c in columns) or "none")
                )
        rows = [(r[text_column], r[label_column]) for r in reader]
    rows = [(t, str(y).strip()) for t, y in rows if t and t.strip() and y]
    if not rows:
        raise CLIError(f"{path} has no rows with both a text and a label.")
    return [t for t, _ in rows], [y for _, y in rows]


def _label_names(labels: list[str]) -> list[str]:
    names = sorted(set(labels))
    try:  # numeric labels in numeric order
        return sorted(names, key=float)
    except ValueError:
        return names


def _bert_family(handle: str) -> None:
    from keras_transformers.presets import _preset_data

    try:
        family = _preset_data(handle).get("family")
    except (ValueError, FileNotFoundError, KeyError) as error:
        raise CLIError(f"cannot load preset {handle!r}: {error}") from None
    if family != "bert":
        raise CLIError(
            f"preset {handle!r} is a {family!r} model; `finetune` needs a bert "
            f"preset or a directory saved from one (see `{PROG} presets`)."
        )


def finetune_classifier(args: argparse.Namespace, **overrides: Any):
    """`finetune --task classify`: a `BertClassifier` on a labelled CSV.

    Args:
        args: the parsed `finetune` arguments.
        **overrides: config fields to change (e.g. `num_layers=1`).

    Returns:
        The fine-tuned `BertClassifier` (preprocessor attached), saved to
        `args.output` with `labels.json` (the label names, index = class id).
    """
    texts, labels = read_labelled_csv(args.data, args.text_column, args.label_column)
    _bert_family(args.preset)
    if not 0.0 < args.validation_fraction < 0.5:
        raise CLIError(
            f"--validation-fraction must be in (0, 0.5), got {args.validation_fraction}."
        )
    output = Path(args.output or "runs/finetune")
    if output.exists() and not output.is_dir():
        raise CLIError(f"--output {output} exists and is not a directory.")
    from keras_transformers.models import BertClassifier

    with _quiet_stderr():
        from keras_transformers.preprocessing import BertPreprocessor, train_wordpiece
    names = _label_names(labels)
    y = np.array([names.index(label) for label in labels], "int32")
    order = np.random.default_rng(args.seed).permutation(len(texts))
    n_val = max(int(round(len(texts) * args.validation_fraction)), 1)
    if len(texts) - n_val < 2:
        raise CLIError(f"{args.data} has too few rows ({len(texts)}) to fine-tune.")
    val, train = order[:n_val], order[n_val:]
    train_texts = [texts[i] for i in train]
    print(
        f"Data: {args.data}, {len(texts):,} rows, {len(names)} labels "
        f"({', '.join(names)}); {len(train):,} training, {n_val:,} validation."
    )
    keras.utils.set_random_seed(args.seed)
    kwargs = dict(num_classes=len(names), **overrides)
    if Path(args.preset).is_dir():
        model = BertClassifier.from_preset(args.preset, **kwargs)
    else:
        tokenizer = train_wordpiece(train_texts, vocabulary_size=args.vocabulary_size)
        kwargs.update(
            vocabulary_size=tokenizer.vocabulary_size,
            pad_token_id=tokenizer.pad_token_id,
        )
        model = BertClassifier.from_preset(args.preset, **kwargs)
        model.tokenizer = BertPreprocessor(tokenizer)
    if not isinstance(model.tokenizer, BertPreprocessor):
        raise CLIError(f"{args.preset} has no WordPiece vocabulary to fine-tune with.")
    length = min(args.sequence_length, model.config.max_sequence_length)
    model.tokenizer = BertPreprocessor(model.tokenizer.tokenizer, length)
    x = model.tokenizer(texts)
    x_train = {k: v[train] for k, v in x.items()}
    x_val = {k: v[val] for k, v in x.items()}
    steps = args.epochs * -(-len(train) // args.batch_size)
    model.compile(
        optimizer=_optimizer(args, steps),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    print(
        f"Model: {args.preset} (BertClassifier), {model.count_params():,} "
        f"parameters; {args.epochs} epochs of {len(train):,} texts x {length} "
        f"tokens; backend: {keras.config.backend()}."
    )
    _fit(model, x_train, (x_val, y[val]), args, "accuracy", y[train], args.batch_size)
    predicted = np.argmax(model.predict(x_val, batch_size=256, verbose=0), axis=-1)
    accuracy, f1 = accuracy_and_macro_f1(y[val], predicted, len(names))
    majority = np.bincount(y[train], minlength=len(names)).argmax()
    baseline = np.full(n_val, majority)
    base_acc, base_f1 = accuracy_and_macro_f1(y[val], baseline, len(names))
    print(
        f"Final: validation accuracy {accuracy:.3f}, macro-F1 {f1:.3f} (majority "
        f"class {names[majority]!r}: accuracy {base_acc:.3f}, macro-F1 {base_f1:.3f})."
    )
    model.save_to_preset(output)
    columns = {"text_column": args.text_column, "label_column": args.label_column}
    labels_json = json.dumps({"labels": names, **columns}, indent=2)
    (output / LABELS_FILE).write_text(labels_json + "\n")
    print(f"Saved the classifier, preprocessor and {LABELS_FILE} to {output}")
    return model
