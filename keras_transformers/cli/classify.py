"""`finetune --task classify` of the `keras-transformers` command.

A `BertClassifier` on a CSV of texts and labels, saved as a preset with
`labels.json` beside it. The handle is a bert checkpoint (a Hugging Face
directory, `hf://org/name` or a saved preset: its weights and its own
WordPiece vocabulary) or a built-in bert preset (random init and a
vocabulary learnt from the texts). `cli.finetune` parses the arguments
(`--task causal-lm` is `cli.lora`).
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path
from typing import Any

import keras
import numpy as np

from keras_transformers._atomic import atomic_directory
from keras_transformers.cli import resume
from keras_transformers.cli._common import (
    FINETUNE_DEFAULTS,
    LABELS_FILE,
    PROG,
    CLIError,
    quiet_stderr,
)
from keras_transformers.cli._training import fit, optimizer
from keras_transformers.data.text import ShuffledBatches


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


def is_builtin(handle: str) -> bool:
    """True for a built-in preset name or a preset JSON file: an architecture
    without weights or vocabulary. Anything else (a saved preset, a Hugging
    Face directory, an `hf://org/name` handle) is a checkpoint to load."""
    from keras_transformers.presets import list_presets

    if str(handle).startswith("hf://") or Path(handle).is_dir():
        return False
    return handle in list_presets() or str(handle).endswith(".json")


def _bert_family(handle: str) -> None:
    """Rejects a built-in preset that is not bert (checkpoints are checked
    when they load)."""
    from keras_transformers.loading import preset_data

    try:
        family = preset_data(handle).get("family")
    except (ValueError, FileNotFoundError, KeyError) as error:
        raise CLIError(f"cannot load preset {handle!r}: {error}") from None
    if family != "bert":
        raise CLIError(
            f"preset {handle!r} is a {family!r} model; `finetune --task classify` "
            f"needs a bert preset or checkpoint, `--task causal-lm` a decoder "
            f"(see `{PROG} presets`)."
        )


def wordpiece_preprocessor(model, sequence_length: int):
    """A `BertPreprocessor` with `model`'s own WordPiece vocabulary (the one
    its embedding table was trained with) at `min(sequence_length,
    max_sequence_length)` tokens.

    Raises:
        CLIError: the model carries no WordPiece vocabulary.
    """
    from keras_transformers.preprocessing import BertPreprocessor, WordPieceTokenizer

    tokenizer = getattr(model, "tokenizer", None)
    wordpiece = getattr(tokenizer, "tokenizer", tokenizer)
    if not isinstance(wordpiece, WordPieceTokenizer):
        raise CLIError(
            "the checkpoint has no WordPiece vocabulary (vocab.txt or a WordPiece "
            "tokenizer.json) to fine-tune with."
        )
    length = min(sequence_length, model.config.max_sequence_length)
    return BertPreprocessor(wordpiece, sequence_length=length)


def _load_classifier(handle: str, **kwargs: Any):
    """`BertClassifier.from_preset(handle)`, its errors as `CLIError`s."""
    from keras_transformers.models import BertClassifier

    try:
        with warnings.catch_warnings():  # the new head is expected here
            warnings.filterwarnings("ignore", ".*newly initialised, train before use")
            return BertClassifier.from_preset(handle, **kwargs)
    except (ValueError, FileNotFoundError, OSError) as error:
        raise CLIError(
            f"cannot load {handle!r} as a bert classifier: {error}"
        ) from None


def finetune_classifier(args: argparse.Namespace, **overrides: Any):
    """`finetune --task classify`: a `BertClassifier` on a labelled CSV.

    Args:
        args: the parsed `finetune` arguments.
        **overrides: config fields to change (e.g. `num_layers=1`).

    Returns:
        The fine-tuned `BertClassifier` (preprocessor attached), saved to
        `args.output` with `labels.json` (the label names, index = class id).
    """
    for key, value in FINETUNE_DEFAULTS["classify"].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    texts, labels = read_labelled_csv(args.data, args.text_column, args.label_column)
    builtin = is_builtin(args.preset)
    if builtin:
        _bert_family(args.preset)
    if not 0.0 < args.validation_fraction < 0.5:
        raise CLIError(
            f"--validation-fraction must be in (0, 0.5), got {args.validation_fraction}."
        )
    output = Path(args.output or "runs/finetune")
    if output.exists() and not output.is_dir():
        raise CLIError(f"--output {output} exists and is not a directory.")
    args.output = str(output)
    resume.check_resume(args)
    with quiet_stderr():
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
    if builtin:  # an architecture: a vocabulary learnt from the training texts
        tokenizer = train_wordpiece(train_texts, vocabulary_size=args.vocabulary_size)
        tokenizer = resume.backed_up_tokenizer(args, tokenizer)
        kwargs.update(
            vocabulary_size=tokenizer.vocabulary_size,
            pad_token_id=tokenizer.pad_token_id,
        )
        model = _load_classifier(args.preset, **kwargs)
        model.tokenizer = BertPreprocessor(tokenizer)
    else:  # a checkpoint: its weights and its own vocabulary
        model = _load_classifier(args.preset, **kwargs)
    model.tokenizer = wordpiece_preprocessor(model, args.sequence_length)
    length = model.tokenizer.sequence_length
    x = model.tokenizer(texts)
    x_train = {k: v[train] for k, v in x.items()}
    x_val = {k: v[val] for k, v in x.items()}
    steps = args.epochs * -(-len(train) // args.batch_size)
    model.compile(
        optimizer=optimizer(args, steps),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    print(
        f"Model: {args.preset} (BertClassifier), {model.count_params():,} "
        f"parameters; {args.epochs} epochs of {len(train):,} texts x {length} "
        f"tokens; backend: {keras.config.backend()}."
    )
    callbacks = resume.resume_callbacks(args)
    batches = ShuffledBatches(x_train, y[train], args.batch_size, seed=args.seed)
    fit(
        model,
        callbacks[0].resumable(batches),
        (x_val, y[val]),
        args,
        "accuracy",
        shuffle=False,
        callbacks=callbacks,
    )
    predicted = np.argmax(model.predict(x_val, batch_size=256, verbose=0), axis=-1)
    accuracy, f1 = accuracy_and_macro_f1(y[val], predicted, len(names))
    majority = np.bincount(y[train], minlength=len(names)).argmax()
    baseline = np.full(n_val, majority)
    base_acc, base_f1 = accuracy_and_macro_f1(y[val], baseline, len(names))
    print(
        f"Final: validation accuracy {accuracy:.3f}, macro-F1 {f1:.3f} (majority "
        f"class {names[majority]!r}: accuracy {base_acc:.3f}, macro-F1 {base_f1:.3f})."
    )
    columns = {"text_column": args.text_column, "label_column": args.label_column}
    labels_json = json.dumps({"labels": names, **columns}, indent=2)
    with atomic_directory(output, markers=("config.json",)) as directory:
        model.save_to_preset(directory)  # one atomic save with labels.json
        (directory / LABELS_FILE).write_text(labels_json + "\n")
    print(f"Saved the classifier, preprocessor and {LABELS_FILE} to {output}")
    return model
