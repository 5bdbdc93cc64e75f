"""The translation jobs of the `keras-transformers` command, and the
decoding / BLEU helpers they share with `examples/translate.py`.

* `train TRANSFORMER_PRESET --source SRC.txt --target TGT.txt`: line-aligned
  text files (one sentence per line); trains a shared byte-level BPE
  vocabulary and an encoder-decoder `Seq2SeqLM` with the paper's recipe
  (Adam 0.9 / 0.98 / 1e-9, inverse-square-root warmup, label smoothing 0.1
  ignoring padding); saves a preset with its tokenizer. `--task numbers`
  trains on a generated task instead (English number words -> digits):
  with `--epochs 10 --steps-per-epoch 100 --batch-size 32`, transformer_tiny
  gets about half of the held-out numbers exactly right in a minute on two
  CPU cores (JAX).
* `translate DIR --text "..." [--num-beams 4]` translates with a saved one
  (`cli.translate`, with `translate` below).

`cli.train` parses the arguments; `cli._training` has the shared helpers.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from keras_transformers.cli import resume
from keras_transformers.cli._common import CLIError, quiet_stderr
from keras_transformers.cli._training import check_train_args
from keras_transformers.data.parallel import TASKS

SEQ2SEQ_FAMILY = "transformer"
MAX_VOCABULARY_SIZE = 8000  # the paper presets' 37,000 is for huge corpora
NUM_TASK_VALIDATION = 256  # held-out pairs of a generated task
TASK_VOCABULARY_SIZE = 300  # bytes, special tokens and whole number words
NUM_SAMPLES = 3  # validation translations printed after training
BLEU_SENTENCES = 64  # validation sentences translated for the final BLEU


# ---------------------------------------------------------------------------
# Decoding and BLEU.
# ---------------------------------------------------------------------------


def translate(
    lm,
    texts: Sequence[str],
    batch_size: int = 32,
    max_new_tokens: int = 64,
    **kwargs: Any,
) -> list[str]:
    """Translates `texts` with `lm.generate`, in batches of similar length.

    Sources are encoded as in training (`source + [eos]`, see
    `keras_transformers.data.Seq2SeqDataset`) with `lm.tokenizer`;
    the generated ids are decoded up to the first eos.

    Args:
        lm: a `Seq2SeqLM` with a `tokenizer`.
        texts: source sentences.
        batch_size: sentences per `generate` call.
        max_new_tokens: longest translation, in tokens.
        **kwargs: passed to `lm.generate` (`num_beams`, `length_penalty`).

    Returns:
        The translations, in the order of `texts`.

    Example:

    ```python
    translate(lm, ["In the beginning..."], num_beams=4, length_penalty=0.6)
    ```
    """
    tokenizer = lm.tokenizer
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    ids = [[*row, eos] for row in tokenizer.encode(list(texts))] if texts else []
    order = np.argsort([len(row) for row in ids], kind="stable")
    out = [""] * len(ids)
    for start in range(0, len(ids), batch_size):
        rows = order[start : start + batch_size]
        generated = lm.generate(
            [ids[i] for i in rows], max_new_tokens=max_new_tokens, **kwargs
        )  # [B, T_out] ids, padded
        for i, tokens in zip(rows, np.asarray(generated).tolist()):
            if eos in tokens:
                tokens = tokens[: tokens.index(eos)]
            out[i] = tokenizer.decode([t for t in tokens if t != pad]).strip()
    return out


def bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Corpus BLEU in [0, 100], one reference per sentence: the `sacrebleu`
    package when installed, else `keras_transformers.training.corpus_bleu`
    (the same numbers with default options)."""
    try:
        import sacrebleu
    except ImportError:
        from keras_transformers.training import corpus_bleu

        return corpus_bleu(list(hypotheses), list(references)).score
    return float(sacrebleu.corpus_bleu(list(hypotheses), [list(references)]).score)


def wants_seq2seq(args: argparse.Namespace, family: str | None) -> bool:
    """Whether `train` runs the translation job (a transformer preset, or
    translation options given)."""
    given = args.source or args.target or args.task
    return family == SEQ2SEQ_FAMILY or bool(given)


# ---------------------------------------------------------------------------
# train
# ---------------------------------------------------------------------------


def _check_args(args: argparse.Namespace) -> None:
    """Validates the translation options before any slow work."""
    from keras_transformers.presets import list_presets

    presets = list_presets()
    family = presets.get(args.preset, {}).get("family")
    if family != SEQ2SEQ_FAMILY:
        names = ", ".join(
            n for n, i in presets.items() if i["family"] == SEQ2SEQ_FAMILY
        )
        what = f"a {family!r} model" if family else "not a built-in preset"
        raise CLIError(
            f"--source/--target/--task train encoder-decoder presets ({names}); "
            f"{args.preset!r} is {what}."
        )
    if args.data is not None:
        raise CLIError(
            "transformer presets train on --source and --target files (or --task), "
            "not --data."
        )
    if args.task and (args.source or args.target):
        raise CLIError("give either --task or --source/--target, not both.")
    if not args.task and not (args.source and args.target):
        raise CLIError(
            "a transformer preset needs --source and --target (line-aligned text "
            f"files) or --task ({', '.join(TASKS)})."
        )
    for flag, path in (("--source", args.source), ("--target", args.target)):
        if path is not None and not Path(path).is_file():
            raise CLIError(f"{flag} file not found: {path}")
    if args.warmup_steps is not None and args.warmup_steps < 1:
        raise CLIError(f"--warmup-steps must be >= 1, got {args.warmup_steps}.")
    check_train_args(args, families=(SEQ2SEQ_FAMILY,))


def _read_lines(path: str) -> list[str]:
    from keras_transformers.data import read_text

    try:
        return read_text(path).splitlines()
    except (OSError, UnicodeError) as error:
        raise CLIError(f"cannot read {path}: {error}") from None


def load_pairs(args: argparse.Namespace) -> tuple[list, list, str]:
    """`(train_pairs, validation_pairs, description)` of the files or task."""
    from keras_transformers.data.parallel import task_pairs

    if args.task:
        total = args.epochs * args.steps_per_epoch * args.batch_size
        train = task_pairs(args.task, total, "train", seed=args.seed)
        validation = task_pairs(args.task, NUM_TASK_VALIDATION, "test", seed=args.seed)
        return train, validation, f"generated task {args.task!r}"
    sources, targets = _read_lines(args.source), _read_lines(args.target)
    if len(sources) != len(targets):
        raise CLIError(
            f"--source has {len(sources)} lines but --target has {len(targets)}: "
            "the files must be line-aligned (one sentence pair per line)."
        )
    pairs = [(s.strip(), t.strip()) for s, t in zip(sources, targets)]
    pairs = [(s, t) for s, t in pairs if s and t]
    held_out = max(int(round(len(pairs) * args.validation_fraction)), 1)
    if len(pairs) - held_out < 1:
        raise CLIError(
            f"{len(pairs)} non-empty line pairs are too few: need at least 2 "
            "(training and validation)."
        )
    return pairs[:-held_out], pairs[-held_out:], f"{args.source} -> {args.target}"


def _compile(lm, args: argparse.Namespace, total_steps: int, pad_id: int) -> None:
    """The paper's recipe; the schedule peaks at `--learning-rate`."""
    from keras_transformers.training import (
        MaskedAccuracy,
        MaskedSparseCategoricalCrossentropy,
        transformer_adam,
    )

    warmup = args.warmup_steps or min(4000, max(total_steps // 10, 1))
    hidden_dim = lm.config.hidden_dim
    scale = args.learning_rate * (hidden_dim * warmup) ** 0.5  # peak = lr
    lm.compile(
        optimizer=transformer_adam(hidden_dim, warmup_steps=warmup, scale=scale),
        loss=MaskedSparseCategoricalCrossentropy(
            ignore_class=pad_id, label_smoothing=0.1
        ),
        metrics=[MaskedAccuracy(ignore_class=pad_id, name="accuracy")],
    )


def train_seq2seq(args: argparse.Namespace, **overrides: Any):
    """`train` for a transformer preset: shared BPE vocabulary + `Seq2SeqLM`.

    Args:
        args: the parsed `train` arguments.
        **overrides: config fields to change (e.g. `num_layers=1`).

    Returns:
        The trained `Seq2SeqLM`, its tokenizer attached, saved to
        `args.output` (`lm.history` holds the Keras `History`).

    Raises:
        CLIError: an argument or the data cannot be used.
    """
    _check_args(args)
    import keras

    from keras_transformers.data.parallel import seq2seq_dataset
    from keras_transformers.models import Seq2SeqLM
    from keras_transformers.presets import from_preset, load_config

    with quiet_stderr():
        from keras_transformers.data.parallel import train_shared_tokenizer

    start = time.perf_counter()
    train_pairs, validation_pairs, source = load_pairs(args)
    print(
        f"Data: {source}; {len(train_pairs):,} training and "
        f"{len(validation_pairs):,} validation pairs."
    )
    config = load_config(args.preset, **overrides)
    size = args.vocabulary_size or min(config.vocabulary_size, MAX_VOCABULARY_SIZE)
    if args.task and not args.vocabulary_size:
        size = TASK_VOCABULARY_SIZE
    try:
        with quiet_stderr():
            tokenizer = train_shared_tokenizer(train_pairs, vocabulary_size=size)
    except ValueError as error:
        raise CLIError(f"cannot train the tokenizer: {error}") from None
    tokenizer = resume.backed_up_tokenizer(args, tokenizer)
    length = args.sequence_length or min(64, config.max_sequence_length)
    options = dict(max_source_length=length, max_target_length=length, truncate=True)
    train_data = seq2seq_dataset(
        train_pairs,
        tokenizer,
        args.batch_size,
        shuffle=True,
        seed=args.seed,
        num_batches=args.steps_per_epoch,
        **options,
    )
    validation_data = seq2seq_dataset(
        validation_pairs, tokenizer, args.batch_size, **options
    )
    print(
        f"Tokenizer: shared byte-level BPE, {tokenizer.vocabulary_size:,} tokens, "
        f"{time.perf_counter() - start:.1f} s."
    )

    keras.utils.set_random_seed(args.seed)
    lm = from_preset(
        args.preset,
        **overrides,
        vocabulary_size=tokenizer.vocabulary_size,
        max_sequence_length=max(length, config.max_sequence_length),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    if not isinstance(lm, Seq2SeqLM):
        raise CLIError(f"preset {args.preset!r} is not an encoder-decoder model.")
    _compile(lm, args, args.epochs * args.steps_per_epoch, tokenizer.pad_token_id)
    print(
        f"Model: {args.preset} (Seq2SeqLM), {lm.count_params():,} parameters; "
        f"{args.epochs} epochs x {args.steps_per_epoch} steps of {args.batch_size} "
        f"pairs (at most {length} tokens a side); backend: {keras.config.backend()}."
    )
    callbacks = resume.resume_callbacks(args)
    fit_start = time.perf_counter()
    history = lm.fit(
        callbacks[0].resumable(train_data),
        shuffle=False,  # the dataset shuffles itself, reproducibly
        validation_data=validation_data,
        epochs=args.epochs,
        callbacks=callbacks,
        verbose=1 if sys.stdout.isatty() else 2,
    ).history
    fit_seconds = time.perf_counter() - fit_start
    lm.tokenizer = tokenizer
    lm.save_to_preset(args.output)
    losses = " -> ".join(f"{v:.3f}" for v in history["val_loss"])
    print(f"Validation loss per epoch: {losses}")
    print(
        f"Final: val_loss {history['val_loss'][-1]:.4f}, val_accuracy "
        f"{history['val_accuracy'][-1]:.3f}; fit {fit_seconds:.0f} s, total "
        f"{time.perf_counter() - start:.0f} s."
    )
    print(f"Saved the model and tokenizer to {args.output}")
    if args.sample_tokens > 0:
        _report(lm, validation_pairs[:BLEU_SENTENCES], args.sample_tokens)
    return lm


def _report(lm, pairs: list, max_new_tokens: int) -> None:
    """Prints greedy validation BLEU and a few sample translations."""
    sources, references = [s for s, _ in pairs], [t for _, t in pairs]
    try:
        hypotheses = translate(lm, sources, max_new_tokens=max_new_tokens)
    except ValueError as error:  # the model is saved: report, do not fail
        print(f"No sample translations: {error}")
        return
    hits = sum(h == r for h, r in zip(hypotheses, references))
    print(
        f"Validation BLEU (greedy, {len(pairs)} sentences): "
        f"{bleu(hypotheses, references):.2f}; exact match {hits / len(pairs):.1%}"
    )
    for i in range(min(NUM_SAMPLES, len(pairs))):
        print(
            f"  {sources[i]!r}\n    -> {hypotheses[i]!r}\n    reference {references[i]!r}"
        )
