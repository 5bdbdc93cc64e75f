"""`finetune --task causal-lm`: LoRA fine-tuning of a decoder checkpoint.

The checkpoint (a Hugging Face directory, an `hf://org/name` handle or a
saved preset) is loaded with its tokenizer, LoRA adapters are added
(`enable_lora`: only the adapter weights train), and `model.fit` runs on

* a CSV file of prompt / completion pairs: the loss covers the completion
  tokens (and the end token after them) only, or
* plain text (a `.txt` file, or a CSV with only a text column): the token
  stream cut into windows, the loss on every token, or
* a JSON Lines file of chat examples, TRL's dataset formats: one
  `{"messages": [...]}` conversation per line, rendered with the
  checkpoint's chat template (or `--chat-template FILE`) with the loss on
  the assistant turns, or `{"prompt": ..., "completion": ...}` with the
  loss on the completion (a prompt may be a list of messages);
  `--pack` puts several examples in each row
  (`keras_transformers.data.sft_dataset`).

Validation loss is reported before and after; the adapter goes to
`--output` as `adapter.lora.npz` with `lora.json` (base checkpoint, rank,
alpha, targets), and with `--merge` the merged model is saved there as a
preset as well. `load_finetuned(directory)` rebuilds the fine-tuned model.

The array helpers (`encode_pairs`, `pair_arrays`, `answer_losses`) serve
`examples/finetune_lora.py` too.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import keras
import numpy as np

from keras_transformers._atomic import atomic_directory
from keras_transformers.cli import resume
from keras_transformers.cli._common import FINETUNE_DEFAULTS, CLIError, quiet_stderr
from keras_transformers.cli._training import optimizer
from keras_transformers.data.text import ShuffledBatches

ADAPTER_FILE = "adapter.lora.npz"
LORA_FILE = "lora.json"


def encode_pairs(tokenizer, prompts, completions, sequence_length: int, end_id=None):
    """Token rows `prompt + completion (+ end)` of at most `sequence_length + 1`
    tokens (inputs and shifted labels both fit in `sequence_length`).

    A row too long loses the start of its prompt; a completion alone too long
    is cut at the end. Prompt and completion are encoded apart, so a
    completion should start with its separating space (" positive").

    Returns:
        `(rows, starts)`: lists of id lists and the index in each row where
        the completion starts.
    """
    rows, starts = [], []
    for prompt, completion in zip(prompts, completions):
        p = [int(i) for i in tokenizer.encode(prompt)]
        c = [int(i) for i in tokenizer.encode(completion)]
        c = (c + ([int(end_id)] if end_id is not None else []))[:sequence_length]
        p = p[max(len(p) + len(c) - sequence_length - 1, 0) :]
        if not p:  # at least one token to predict the completion from
            p, c = c[:1], c[1:]
        rows.append(p + c)
        starts.append(len(p))
    return rows, starts


def pair_arrays(rows, starts, sequence_length: int, pad_id: int) -> tuple:
    """`(inputs, labels, weights)` for `fit`: right-padded `[N, T]` inputs
    (`token_ids`, `padding_mask`), next-token labels, and weights that are 1
    where the label is a completion token."""
    n = len(rows)
    ids = np.full((n, sequence_length + 1), pad_id, "int32")
    weights = np.zeros((n, sequence_length), "float32")
    for i, (row, start) in enumerate(zip(rows, starts)):
        ids[i, : len(row)] = row
        weights[i, start - 1 : len(row) - 1] = 1.0
    mask = np.zeros((n, sequence_length), "int32")
    for i, row in enumerate(rows):
        mask[i, : len(row) - 1] = 1
    inputs = {"token_ids": ids[:, :-1], "padding_mask": mask}
    return inputs, ids[:, 1:], weights


def answer_losses(model, inputs, labels, weights, batch_size: int = 16, choices=None):
    """Per-row mean cross-entropy over the weighted positions, computed in
    NumPy from `model.predict_on_batch` logits (no `[N, T, V]` array kept).

    Args:
        choices: optional token ids: also return, per row, the logits of
            these ids at the first weighted position (for classification by
            the most likely answer).

    Returns:
        `losses [N]`, plus `choice_logits [N, len(choices)]` and the greedy
        token `[N]` there when `choices` is given.
    """
    losses, chosen, greedy = [], [], []
    for begin in range(0, len(labels), batch_size):
        part = slice(begin, begin + batch_size)
        x = {k: v[part] for k, v in inputs.items()}
        logits = np.asarray(model.predict_on_batch(x), "float32")
        top = logits.max(-1, keepdims=True)
        log_z = np.log(np.exp(logits - top).sum(-1)) + top[..., 0]
        picked = np.take_along_axis(logits, labels[part][..., None], -1)[..., 0]
        w = weights[part]
        losses.append(((log_z - picked) * w).sum(-1) / np.maximum(w.sum(-1), 1))
        if choices is not None:
            first = np.argmax(w > 0, axis=-1)
            at = logits[np.arange(len(first)), first]
            chosen.append(at[:, list(choices)])
            greedy.append(at.argmax(-1))
    losses = np.concatenate(losses)
    if choices is None:
        return losses
    return losses, np.concatenate(chosen), np.concatenate(greedy)


def read_pairs(args: argparse.Namespace) -> tuple:
    """`("pairs", prompts, completions)`, `("text", text, None)` or
    `("chat", records, None)` (a `.jsonl` file) from --data."""
    import csv

    path = Path(args.data)
    if not path.is_file():
        raise CLIError(f"data file not found: {args.data}")
    if path.suffix.lower() == ".jsonl":
        return "chat", read_chat_records(path), None
    if path.suffix.lower() != ".csv":
        return "text", path.read_text(encoding="utf-8", errors="replace"), None
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        reader = csv.DictReader(f)
        columns = reader.fieldnames or []
        rows = list(reader)
    wanted = (args.prompt_column, args.completion_column)
    if all(c in columns for c in wanted):
        pairs = [(r[wanted[0]], r[wanted[1]]) for r in rows]
        pairs = [(p, c) for p, c in pairs if p and c and c.strip()]
        if not pairs:
            raise CLIError(f"{args.data} has no rows with a prompt and a completion.")
        return "pairs", [p for p, _ in pairs], [c for _, c in pairs]
    if args.text_column in columns:
        texts = [r[args.text_column] for r in rows if r[args.text_column]]
        return "text", "\n".join(texts), None
    raise CLIError(
        f"{args.data} has neither columns {wanted[0]!r} and {wanted[1]!r} "
        f"(prompt / completion pairs) nor {args.text_column!r} (plain text); "
        "its columns: " + (", ".join(repr(c) for c in columns) or "none")
    )


def read_chat_records(path: Path) -> list[dict]:
    """The records of a JSON Lines file, each with `"messages"` or with
    `"prompt"` and `"completion"` (blank lines skipped)."""
    records = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise CLIError(f"{path}:{number} is not JSON: {error.msg}.") from None
        if not isinstance(record, dict) or not (
            "messages" in record or {"prompt", "completion"} <= set(record)
        ):
            raise CLIError(
                f'{path}:{number} needs a "messages" list (a conversation) or '
                '"prompt" and "completion" keys.'
            )
        records.append(record)
    if not records:
        raise CLIError(f"{path} has no records.")
    return records


def chat_examples(tokenizer, records, chat_template=None) -> list:
    """`Example`s of `read_chat_records`' records: conversations trained on
    their assistant turns, prompt / completion pairs on the completion."""
    from keras_transformers.data import completion_example, conversation_example

    examples = []
    for number, record in enumerate(records, 1):
        try:
            if "messages" in record:
                example = conversation_example(
                    tokenizer, record["messages"], chat_template
                )
            else:
                example = completion_example(
                    tokenizer, record["prompt"], record["completion"], chat_template
                )
        except (ValueError, TypeError, KeyError) as error:
            raise CLIError(f"record {number}: {error}") from None
        examples.append(example)
    return examples


def _chat_arrays(args, model, records, length: int, pad_id: int) -> tuple:
    """Training and validation `(x, y, sample_weight)` of chat records (the
    training rows packed with `--pack`) and a line describing them."""
    from keras_transformers.data import sft_dataset

    template = None
    if args.chat_template:
        template = Path(args.chat_template).read_text(encoding="utf-8")
    examples = chat_examples(model.tokenizer, records, template)
    train, val = _split(len(examples), args.validation_fraction, args.seed)
    try:
        parts = [
            sft_dataset([examples[i] for i in rows], length, pack, pad_id)
            for rows, pack in ((train, args.pack), (val, False))
        ]
    except ValueError as error:
        raise CLIError(str(error)) from None
    cut = sum(part.num_truncated for part in parts)
    rows = f"{len(parts[0].y):,} packed rows" if args.pack else f"{len(train):,} rows"
    line = (
        f"{len(examples):,} chat examples of up to {length} tokens ({cut} cut); "
        f"{len(train):,} training in {rows}, {len(val):,} validation; loss on "
        "the assistant turns."
    )
    return [(p.x, p.y, p.sample_weight) for p in parts], line


def _load_decoder(handle: str):
    from keras_transformers.presets import from_preset

    try:
        with quiet_stderr():
            model = from_preset(handle)
    except (ValueError, FileNotFoundError, OSError) as error:
        raise CLIError(f"cannot load {handle!r}: {error}") from None
    if not hasattr(model, "generate"):
        raise CLIError(
            f"{handle} is a {type(model).__name__}; `--task causal-lm` needs a "
            f"decoder (GPT, Llama, Mixtral...), `--task classify` a bert model."
        )
    if getattr(model, "tokenizer", None) is None:
        raise CLIError(f"{handle} has no tokenizer; fine-tuning on text needs one.")
    return model


def _split(n: int, fraction: float, seed: int) -> tuple:
    if not 0.0 < fraction < 0.5:
        raise CLIError(f"--validation-fraction must be in (0, 0.5), got {fraction}.")
    order = np.random.default_rng(seed).permutation(n)
    n_val = max(int(round(n * fraction)), 1)
    if n - n_val < 1:
        raise CLIError(f"too few examples ({n}) for a training and a validation split.")
    return order[n_val:], order[:n_val]


def _text_arrays(model, text: str, length: int) -> tuple:
    ids = np.asarray(model.tokenizer.encode(text), "int32").ravel()
    rows = len(ids) // (length + 1)
    if rows < 2:
        raise CLIError(
            f"{len(ids):,} tokens are too few for two windows of {length + 1}: "
            "use more text or a shorter --sequence-length."
        )
    windows = ids[: rows * (length + 1)].reshape(rows, length + 1)
    inputs = {
        "token_ids": windows[:, :-1],
        "padding_mask": np.ones_like(windows[:, 1:]),
    }
    return inputs, windows[:, 1:], np.ones(windows[:, 1:].shape, "float32")


def _evaluate(model, x, y, w, batch_size: int) -> float:
    losses = answer_losses(model, x, y, w, batch_size)
    return float(np.average(losses, weights=w.sum(-1)))


def finetune_causal_lm(args: argparse.Namespace, **overrides: Any):
    """`finetune --task causal-lm`: LoRA on a decoder checkpoint.

    Args:
        args: the parsed `finetune` arguments.
        **overrides: unused (the checkpoint fixes the architecture); kept
            for the same signature as `finetune_classifier`.

    Returns:
        The fine-tuned model (LoRA still enabled, not merged).
    """
    from keras_transformers.training import MaskedSparseCategoricalCrossentropy

    for key, value in FINETUNE_DEFAULTS["causal-lm"].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    kind, data, completions = read_pairs(args)
    output = Path(args.output or "runs/finetune")
    if output.exists() and not output.is_dir():
        raise CLIError(f"--output {output} exists and is not a directory.")
    args.output = str(output)
    resume.check_resume(args)
    start = time.perf_counter()
    model = _load_decoder(args.preset)
    length = min(args.sequence_length, model.config.max_sequence_length - 1)
    pad_id = model.config.pad_token_id or 0
    if kind == "chat":
        parts, line = _chat_arrays(args, model, data, length, pad_id)
        (x_train, y_train, w_train), (x_val, y_val, w_val) = parts
        print(f"Data: {args.data}, {line}")
    else:
        if kind == "pairs":
            rows, starts = encode_pairs(
                model.tokenizer, data, completions, length, model.config.eos_token_id
            )
            x, y, w = pair_arrays(rows, starts, length, pad_id)
        else:
            x, y, w = _text_arrays(model, data, length)
        train, val = _split(len(y), args.validation_fraction, args.seed)
        pick = lambda rows: ({k: v[rows] for k, v in x.items()}, y[rows], w[rows])  # noqa: E731
        (x_train, y_train, w_train), (x_val, y_val, w_val) = pick(train), pick(val)
        what = "the completions" if kind == "pairs" else "every token"
        print(
            f"Data: {args.data}, {len(y):,} {'pairs' if kind == 'pairs' else 'windows'}"
            f" of up to {length} tokens; {len(train):,} training, {len(val):,} "
            f"validation; loss on {what}."
        )
    keras.utils.set_random_seed(args.seed)
    try:
        model.enable_lora(
            args.lora_rank,
            target=tuple(args.lora_target.split(",")),
            alpha=args.lora_alpha,
        )
    except ValueError as error:
        raise CLIError(str(error)) from None
    trainable = sum(int(np.prod(v.shape)) for v in model.trainable_weights)
    steps = args.epochs * -(-len(y_train) // args.batch_size)
    model.compile(
        optimizer=optimizer(args, steps),
        loss=MaskedSparseCategoricalCrossentropy(from_logits=True),
    )
    print(
        f"Model: {args.preset} ({type(model).__name__}), {model.count_params():,} "
        f"parameters, {trainable:,} trainable (LoRA rank {args.lora_rank} on "
        f"{args.lora_target}); {args.epochs} epochs of {len(y_train):,} rows; "
        f"backend: {keras.config.backend()}."
    )
    before = _evaluate(model, x_val, y_val, w_val, args.batch_size)
    print(f"Validation loss before: {before:.4f}")
    fit_start = time.perf_counter()
    callbacks = resume.resume_callbacks(args)
    batches = ShuffledBatches(
        x_train, y_train, args.batch_size, seed=args.seed, sample_weight=w_train
    )
    model.fit(
        callbacks[0].resumable(batches),
        epochs=args.epochs,
        shuffle=False,
        verbose=2,
        callbacks=callbacks,
    )
    seconds = time.perf_counter() - fit_start
    after = _evaluate(model, x_val, y_val, w_val, args.batch_size)
    print(
        f"Final: validation loss {before:.4f} -> {after:.4f}; fit {seconds:.0f} s, "
        f"total {time.perf_counter() - start:.0f} s."
    )
    save_adapter(model, output, args, merge=args.merge)
    return model


def save_adapter(model, output: Path, args: argparse.Namespace, merge=False) -> None:
    """Writes `adapter.lora.npz` + `lora.json` to `output` (with the merged
    preset when `merge`), atomically: `output` is replaced as a whole once
    everything is written (see `keras_transformers._atomic`)."""
    state = model._lora_state
    info = {
        "base": str(args.preset),
        "rank": state.rank,
        "alpha": float(state.alpha),
        "target": list(state.target),
        "merged_preset": bool(merge),
    }
    markers = (LORA_FILE, ADAPTER_FILE, "config.json")
    with atomic_directory(output, markers=markers) as directory:
        if merge:
            model.save_to_preset(directory)  # Keras merges LoRA kernels on save
        model.save_lora_weights(directory / ADAPTER_FILE)
        (directory / LORA_FILE).write_text(json.dumps(info, indent=2) + "\n")
    what = "the merged preset, " if merge else ""
    print(f"Saved {what}{ADAPTER_FILE} and {LORA_FILE} to {output}")


def load_finetuned(directory, base=None):
    """The model `finetune --task causal-lm` saved in `directory`: its base
    checkpoint (or `base`) with the adapter loaded (LoRA enabled; call
    `merge_lora()` for a plain model)."""
    from keras_transformers.presets import from_preset

    directory = Path(directory)
    info = json.loads((directory / LORA_FILE).read_text())
    model = from_preset(base or info["base"])
    model.enable_lora(info["rank"], target=tuple(info["target"]), alpha=info["alpha"])
    model.load_lora_weights(directory / ADAPTER_FILE)
    return model
