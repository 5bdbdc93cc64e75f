"""`keras-transformers train --resume`: a run interrupted at step k and
resumed ends with the weights of an uninterrupted run (learning-rate
schedule position, MoE router statistics and data order included).

Each job trains three times, so these are `once` tests (CI runs them on
one backend);
tests/test_resume.py checks the same resume on every backend at the
level of `fit`."""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest
from test_resume import SMALL, Interrupt

import keras_transformers
from keras_transformers import cli
from keras_transformers.cli import resume, train
from keras_transformers.cli.bert import pretrain_bert
from keras_transformers.cli.classify import finetune_classifier
from keras_transformers.cli.seq2seq import train_seq2seq
from keras_transformers.cli.vit import train_vit
from keras_transformers.data import default_text, images

ARGS = ["--epochs", "2", "--steps-per-epoch", "3", "--batch-size", "2"]
ARGS += ["--sequence-length", "16", "--sample-tokens", "0", "--checkpoint-every", "1"]


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "corpus.txt"
    path.write_text(default_text()[:6_000], encoding="utf-8")
    return path


def _train(argv, job=None, **overrides):
    args = cli.build_parser().parse_args(argv)
    if job is None:
        assert train.run(args) == 0
    else:
        job(args, **overrides)


def _weights(directory):
    model = keras_transformers.from_preset(str(directory))
    return {v.path: keras.ops.convert_to_numpy(v) for v in model.weights}


def _check_resume(tmp_path, argv, job=None, interrupt=4, **overrides):
    """`interrupt`: the step after which the run stops, one step into its
    second epoch."""
    _train(argv + ["--output", str(tmp_path / "reference")], job, **overrides)
    output = ["--output", str(tmp_path / "resumed")]
    real = resume.resume_callbacks
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            resume, "resume_callbacks", lambda args: [*real(args), Interrupt(interrupt)]
        )
        with pytest.raises(RuntimeError, match="interrupted"):
            _train(argv + output, job, **overrides)
    metadata = tmp_path / "resumed" / "checkpoint" / "training_metadata.json"
    assert json.loads(metadata.read_text())["batches_done"] == 1
    _train(argv + output + ["--resume"], job, **overrides)
    assert not metadata.parent.exists()  # deleted once training completes
    expected, resumed = _weights(tmp_path / "reference"), _weights(tmp_path / "resumed")
    assert expected.keys() == resumed.keys()
    for path, value in expected.items():
        np.testing.assert_allclose(resumed[path], value, atol=1e-6, err_msg=path)


@pytest.mark.once
def test_train_resume_causal_lm(tmp_path, text_file):
    """The causal-LM job (`train.run`, the same for every causal preset; a
    Mixtral one): its BPE vocabulary, data order, the warmup + cosine
    schedule position and MoE router statistics."""
    argv = ["train", "mixtral_tiny", "--data", str(text_file), "--vocabulary-size"]
    _check_resume(tmp_path, argv + ["300", *ARGS])


def _train_wordpiece_once(monkeypatch):
    """WordPiece training is not reproducible (`tokenizers` breaks ties in
    hash-map order: 455 to 458 tokens here from run to run): --resume reuses
    the backed-up tokenizer, and the reference run must use the same one."""
    import keras_transformers.preprocessing as preprocessing

    trained = {}
    real = preprocessing.train_wordpiece

    def train_once(lines, **kwargs):
        return trained.setdefault("tokenizer", real(lines, **kwargs))

    monkeypatch.setattr(preprocessing, "train_wordpiece", train_once)


@pytest.mark.once
def test_train_resume_bert(tmp_path, text_file, monkeypatch):
    _train_wordpiece_once(monkeypatch)
    argv = ["train", "bert_tiny", "--data", str(text_file), *ARGS]
    _check_resume(tmp_path, argv, pretrain_bert, **SMALL)


@pytest.mark.once
def test_train_resume_transformer(tmp_path, monkeypatch):
    import keras_transformers.cli.seq2seq as seq2seq

    monkeypatch.setattr(seq2seq, "NUM_TASK_VALIDATION", 8)  # validation: a batch
    argv = ["train", "transformer_tiny", "--task", "numbers", *ARGS]
    _check_resume(tmp_path, argv, train_seq2seq, **SMALL)


@pytest.fixture(scope="module")
def labelled_csv(tmp_path_factory):
    """10 rows: 9 for training (4 batches of 2 per epoch), 1 for validation."""
    words = default_text()[:2_000].split()
    rows = [f"{' '.join(words[i : i + 6])},{'ab'[i % 2]}" for i in range(10)]
    path = tmp_path_factory.mktemp("data") / "labelled.csv"
    path.write_text("text,label\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return path


@pytest.mark.once
def test_finetune_resume_classifier(tmp_path, labelled_csv, monkeypatch):
    """A classifier trained from scratch: its WordPiece vocabulary comes from
    the backup, the data order and schedule position from the backup."""
    argv = ["finetune", "bert_tiny", "--data", str(labelled_csv), "--epochs", "2"]
    argv += ["--batch-size", "2", "--sequence-length", "16", "--vocabulary-size"]
    argv += ["200", "--checkpoint-every", "1"]
    _train_wordpiece_once(monkeypatch)
    _check_resume(tmp_path, argv, finetune_classifier, interrupt=5, **SMALL)


@pytest.mark.once
def test_train_resume_vit(tmp_path):
    """Image classification: batch order and the augmentation's random state."""
    rng = np.random.default_rng(0)
    labels = np.arange(40) % 2
    pixels = rng.integers(0, 60, (40, 28, 28)) + 180 * labels[:, None, None]
    idx = tmp_path / "train-images-idx3-ubyte.gz"
    images.write_idx(idx, pixels.astype(np.uint8))
    images.write_idx(tmp_path / "train-labels-idx1-ubyte.gz", labels.astype(np.uint8))
    argv = ["train", "vit_tiny_28", "--images", str(idx), "--epochs", "2"]
    argv += ["--steps-per-epoch", "3", "--batch-size", "4", "--checkpoint-every", "1"]
    _check_resume(tmp_path, argv, train_vit, num_layers=1)


def _error(capsys, argv):
    assert cli.main(argv) == 2
    return capsys.readouterr().err


def test_resume_errors(tmp_path, capsys, text_file):
    argv = ["train", "gpt2_tiny", "--data", str(text_file), "--output", str(tmp_path)]
    err = _error(capsys, argv + ["--resume"])
    assert "no backup in" in err and "Run without --resume" in err

    backup = tmp_path / "checkpoint"
    backup.mkdir()
    (backup / "training_metadata.json").write_text('{"epoch": 0, "batches_done": 1}')
    err = _error(capsys, argv)
    assert "add --resume" in err and str(backup) in err

    args = cli.build_parser().parse_args(argv + ["--resume", "--batch-size", "8"])
    (backup / resume.ARGS_FILE).write_text(json.dumps({"batch_size": 4}))
    with pytest.raises(cli.CLIError, match="--batch-size is 8 but the interrupted"):
        resume.resume_callbacks(args)
