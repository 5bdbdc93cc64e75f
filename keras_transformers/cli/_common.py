"""What the modules of the `keras-transformers` command share: the program
name, `CLIError`, argument types, defaults that both the parser and a job
read, `prepare_training_process` and `quiet_stderr`.

Only the standard library is imported at the top here: the parser (and so
`--help`) must not wait for Keras.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

PROG = "keras-transformers"
LABELS_FILE = "labels.json"  # class names beside a saved classifier

# Defaults of `train`, sized so that `train gpt_mini` takes a few minutes on
# two CPU cores with the JAX backend.
DEFAULT_EPOCHS = 6
DEFAULT_STEPS_PER_EPOCH = 60
DEFAULT_BATCH_SIZE = 16
DEFAULT_SEQUENCE_LENGTH = 128
DEFAULT_LEARNING_RATE = 2e-3
DEFAULT_MAX_CHARS = 1_000_000
DEFAULT_VALIDATION_FRACTION = 0.05
# Defaults of `train` for vit presets, used unless the option is given: one
# epoch is one pass over the images. They make a short run: vit_mnist_28 on
# Fashion-MNIST reached 86.9% test accuracy after 5 epochs, fit 354 s on two
# CPU cores shared with other jobs (TensorFlow; load ~3.5). The full recipe,
# 25 epochs: examples/train_vit.py.
VIT_DEFAULTS = {"epochs": 5, "batch_size": 128, "learning_rate": 1e-3}

# Defaults of `finetune`, per --task, used unless the option is given.
FINETUNE_DEFAULTS = {
    "classify": dict(epochs=3, batch_size=32, sequence_length=64, learning_rate=5e-4),
    "causal-lm": dict(epochs=1, learning_rate=1e-3, sequence_length=128, batch_size=8),
}
WORDPIECE_VOCABULARY_SIZE = 8000  # the bert presets' 30,522 is for huge corpora


class CLIError(Exception):
    """A mistake the user can fix: printed as one line, exit status 2."""


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {value}")
    return value


class _IntDefault(int):
    """An int default the user did not give (see `mark_defaults`)."""


class _FloatDefault(float):
    """A float default the user did not give (see `mark_defaults`)."""


def mark_defaults(parser: argparse.ArgumentParser, names) -> None:
    """Marks the numeric defaults of options `names` so that `given` can tell
    them from values the user gave (a job may then replace them)."""
    for name in names:
        value = parser.get_default(name)
        marker = _IntDefault if isinstance(value, int) else _FloatDefault
        parser.set_defaults(**{name: marker(value)})


def wants_distribution(args: argparse.Namespace) -> bool:
    """Whether a `train` run shards its model over several devices or
    processes (`--distribution` or `--coordinator`; `cli.distributed`)."""
    return bool(
        getattr(args, "distribution", None) or getattr(args, "coordinator", None)
    )


def given(args: argparse.Namespace, name: str) -> bool:
    """Whether option `name` was given rather than left at a marked default."""
    return not isinstance(getattr(args, name), (_IntDefault, _FloatDefault))


def prepare_training_process() -> None:
    """What `train` and `finetune` set before Keras starts its backend.

    TensorFlow's oneDNN kernels are turned on (`TF_ENABLE_ONEDNN_OPTS=1`
    unless the environment already chooses): TensorFlow enables them by
    itself only on CPUs with AVX-512 VNNI or newer, and reads the variable
    once, when it is imported. Measured on a 2-core AMD EPYC (Zen 3, AVX2),
    a SmolLM2-135M training step at 2,048 tokens: 18.5 s with them, 24.1 s
    without, for 0.37 GB more resident memory (docs/training.md). Then
    freed host memory is kept for reuse (`retain_freed_memory`), before
    any computation.
    """
    if "tensorflow" not in sys.modules:
        os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
    from keras_transformers.backend.host_memory import retain_freed_memory

    retain_freed_memory()


@contextlib.contextmanager
def quiet_stderr():
    """Silences file descriptor 2 for the duration of a block.

    TensorFlow (which the keras-hub tokenizer imports on every backend)
    writes C++ start-up and device-probe logs straight to file descriptor 2,
    which neither Python nor `TF_CPP_MIN_LOG_LEVEL` can silence. Python
    exceptions still propagate (and print once stderr is back).
    """
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # e.g. a captured stderr
        yield
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), fd)
            try:
                yield
            finally:
                sys.stderr.flush()
                os.dup2(saved, fd)
    finally:
        os.close(saved)
