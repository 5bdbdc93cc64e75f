"""The `keras-transformers` command and the data helpers behind it.

`main([...])` runs in-process; one test runs the real console command. The
training run is tiny (gpt2_tiny, a 300-token vocabulary, 3 steps) and shared
by the tests that need a saved preset.
"""

import contextlib
import io
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from keras import ops

import keras_transformers
from keras_transformers import cli
from keras_transformers.cli import causal_lm, train
from keras_transformers.data import (
    default_text,
    kjv_text,
    lm_dataset,
    read_text,
    split_tokens,
)

TRAIN_ARGS = [
    "--epochs",
    "1",
    "--steps-per-epoch",
    "3",
    "--batch-size",
    "4",
    "--sequence-length",
    "32",
    "--vocabulary-size",
    "300",
    "--sample-tokens",
    "4",
]


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "corpus.txt"
    path.write_text(default_text()[:12_000], encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory, text_file):
    """Runs `train` once through `main`; keeps the model, directory and stdout."""
    output = tmp_path_factory.mktemp("runs") / "tiny"
    models = []
    real_train = causal_lm.train_model

    def recording_train(args):
        models.append(real_train(args))
        return models[-1]

    argv = ["train", "gpt2_tiny", "--data", str(text_file), "--output", str(output)]
    stdout = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(stdout):
        patch.setattr(causal_lm, "train_model", recording_train)
        status = cli.main(argv + TRAIN_ARGS)
    assert status == 0
    return models[0], output, stdout.getvalue()


def _errors(capsys, argv):
    """Runs `main(argv)`; returns (status, stderr) and checks the message shape."""
    status = cli.main(argv)
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    return status, err


# -- presets ----------------------------------------------------------------


def test_presets_table(capsys):
    assert cli.main(["presets"]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("gpt2_small "))
    assert "gpt" in line.split() and "124.4M" in line.split()
    assert "gpt_mini" in out


def test_presets_family_filter(capsys):
    assert cli.main(["presets", "--family", "gpt"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]]
    assert "gpt2_tiny" in names and "gpt_llama_tiny" in names


def test_console_command_presets():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, "-m", "keras_transformers.cli", "presets"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "124.4M" in result.stdout and "gpt2_small" in result.stdout


# -- the parser -------------------------------------------------------------

HEAVY_MODULES = ("keras", "tensorflow", "jax", "torch", "keras_hub")

# Runs every `--help` of the command, then prints the heavy modules imported.
HELP_SCRIPT = """
import contextlib, io, sys
from keras_transformers.cli import COMMANDS, build_parser
for argv in ([], *([name] for name in COMMANDS)):
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args([*argv, "--help"])
    except SystemExit as exit:
        assert exit.code == 0, argv
print(sorted(m for m in %r if m in sys.modules))
"""


def test_help_imports_no_framework():
    result = subprocess.run(
        [sys.executable, "-c", HELP_SCRIPT % (HEAVY_MODULES,)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_translation_tasks_match_the_data_module():
    from keras_transformers.data.parallel import TASKS

    assert train.TRANSLATION_TASKS == TASKS


# -- train ------------------------------------------------------------------


def test_train_writes_loadable_preset(trained):
    model, output, _ = trained
    for name in ("config.json", "model.weights.h5", "metadata.json", "tokenizer"):
        assert (output / name).exists(), name
    assert model.config.vocabulary_size == 300
    assert model.tokenizer.vocabulary_size == 300
    history = model.history.history
    assert {"val_loss", "val_perplexity", "val_accuracy"} <= set(history)
    np.testing.assert_allclose(
        history["val_perplexity"][-1], np.exp(history["val_loss"][-1]), rtol=1e-3
    )

    reloaded = keras_transformers.from_preset(str(output))
    assert type(reloaded) is type(model)
    ids = model.tokenizer.encode("The keyword is evaluated first.")[None]
    np.testing.assert_array_equal(
        reloaded.tokenizer.encode("The keyword is evaluated first.")[None], ids
    )
    np.testing.assert_array_equal(
        ops.convert_to_numpy(reloaded(ids)), ops.convert_to_numpy(model(ids))
    )
    text = reloaded.generate("The", max_new_tokens=5)
    assert isinstance(text, str) and text.startswith("The") and len(text) > 3


def test_train_prints_progress_and_summary(trained):
    model, output, out = trained
    assert model.history.params["epochs"] == 1
    assert model.history.params["steps"] == 3
    assert "3/3" in out and "val_loss" in out and "val_perplexity" in out
    assert (
        "Final: val_loss" in out and f"Saved the model and tokenizer to {output}" in out
    )
    assert "Sample" in out


# -- generate ---------------------------------------------------------------


def test_generate_prints_text(trained, capsys):
    _, output, _ = trained
    argv = ["generate", str(output), "--prompt", "The", "--max-new-tokens", "6"]
    assert cli.main(argv + ["--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("The") and len(out.strip()) > 3


def test_generate_stream_matches_batch(trained, capsys):
    _, output, _ = trained
    argv = ["generate", str(output), "--prompt", "The", "--max-new-tokens", "6"]
    argv += ["--sampler", "greedy"]
    assert cli.main(argv) == 0
    batch = capsys.readouterr().out
    assert cli.main(argv + ["--stream"]) == 0
    streamed = capsys.readouterr().out
    assert streamed == batch


def test_generate_from_a_hugging_face_directory(trained, capsys, tmp_path):
    from keras_transformers.convert import export_hf

    model, output, _ = trained
    export_hf(model, tmp_path / "hf")
    argv = ["--prompt", "The", "--max-new-tokens", "5", "--sampler", "greedy"]
    assert cli.main(["generate", str(output)] + argv) == 0
    saved = capsys.readouterr().out
    assert cli.main(["generate", str(tmp_path / "hf")] + argv) == 0
    assert capsys.readouterr().out == saved


# -- chat -------------------------------------------------------------------

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


@pytest.fixture
def template_file(tmp_path):
    path = tmp_path / "chat.jinja"
    path.write_text(CHAT_TEMPLATE)
    return path


def test_chat_loop(trained, template_file, capsys, monkeypatch):
    _, output, _ = trained
    lines = "The first\n\n/reset\nThe second\n/exit\nnever read\n"
    monkeypatch.setattr(sys, "stdin", io.StringIO(lines))
    argv = ["chat", str(output), "--chat-template", str(template_file)]
    argv += ["--max-new-tokens", "4", "--system", "Be brief."]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    model = keras_transformers.from_preset(str(output))
    system = [{"role": "system", "content": "Be brief."}]
    replies = [
        model.chat(
            system + [{"role": "user", "content": text}],
            max_new_tokens=4,
            chat_template=CHAT_TEMPLATE,
        )
        for text in ("The first", "The second")
    ]
    assert out == f"{replies[0]}\n(new conversation)\n{replies[1]}\n"


@pytest.mark.once  # reading a pipe is the same on every backend; chat per backend: test_chat.py
def test_chat_through_a_pipe(trained, template_file):
    _, output, _ = trained
    result = subprocess.run(
        [sys.executable, "-m", "keras_transformers.cli", "chat", str(output)]
        + ["--chat-template", str(template_file), "--max-new-tokens", "3"],
        input="Hello\nAgain\n",
        capture_output=True,
        text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 2  # one line per reply, then EOF


def test_chat_errors(trained, capsys, tmp_path):
    _, output, _ = trained
    status, err = _errors(capsys, ["chat", str(output)])
    assert status == 2 and "no chat template" in err and "chat_template" in err
    bare = tmp_path / "bare"
    keras_transformers.from_preset("gpt_llama_tiny").save_to_preset(bare)
    status, err = _errors(capsys, ["chat", str(bare)])
    assert status == 2 and "has no tokenizer" in err
    status, err = _errors(capsys, ["chat", str(tmp_path / "nowhere")])
    assert status == 2 and "not a directory" in err and "hf://" in err
    missing = ["chat", str(output), "--chat-template", str(tmp_path / "no.jinja")]
    status, err = _errors(capsys, missing)
    assert status == 2 and "--chat-template" in err


# -- errors -----------------------------------------------------------------


def test_unknown_preset(capsys, tmp_path):
    status, err = _errors(capsys, ["train", "gpt_nope", "--output", str(tmp_path)])
    assert status == 2
    assert (
        "unknown preset 'gpt_nope'" in err
        and "gpt_mini" in err
        and "vit_mnist_28" in err
    )


def test_missing_data_file(capsys, tmp_path):
    missing = tmp_path / "missing.txt"
    status, err = _errors(capsys, ["train", "gpt2_tiny", "--data", str(missing)])
    assert status == 2 and "data file not found" in err and str(missing) in err


def test_output_not_a_directory(capsys, tmp_path, text_file):
    output = tmp_path / "a_file"
    output.write_text("x")
    argv = ["train", "gpt2_tiny", "--data", str(text_file), "--output", str(output)]
    status, err = _errors(capsys, argv)
    assert status == 2 and "not a directory" in err


def test_too_little_text(capsys, tmp_path):
    data = tmp_path / "short.txt"
    data.write_text("Too short to train on. " * 3)
    argv = ["train", "gpt2_tiny", "--data", str(data), "--output", str(tmp_path / "o")]
    status, err = _errors(capsys, argv + TRAIN_ARGS)
    assert status == 2 and "too few" in err


def test_generate_without_preset(capsys, tmp_path):
    status, err = _errors(capsys, ["generate", str(tmp_path), "--prompt", "Hi"])
    assert status == 2 and "no saved preset" in err
    missing = tmp_path / "nowhere"
    status, err = _errors(capsys, ["generate", str(missing), "--prompt", "Hi"])
    assert status == 2 and "not a directory" in err


def test_generate_prompt_too_long(capsys, trained):
    _, output, _ = trained
    argv = ["generate", str(output), "--prompt", "The", "--max-new-tokens", "500"]
    status, err = _errors(capsys, argv)
    assert status == 2 and "max_sequence_length" in err


def test_bad_arguments_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["train"])
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:
        cli.main(["train", "gpt2_tiny", "--epochs", "0"])
    assert info.value.code == 2


# -- data -------------------------------------------------------------------


def test_lm_dataset_shapes_and_shift():
    ids = np.arange(1000) % 97
    data = lm_dataset(ids, sequence_length=16, batch_size=4)
    assert len(data) == -(-(999 // 16) // 4)  # 62 windows, a last batch of 2
    inputs, labels = data[0]
    assert inputs["token_ids"].shape == (4, 16) and labels.shape == (4, 16)
    assert inputs["token_ids"].dtype == np.int32 and labels.dtype == np.int32
    assert inputs["padding_mask"].dtype == bool and inputs["padding_mask"].all()
    np.testing.assert_array_equal(inputs["token_ids"][0], ids[:16])
    np.testing.assert_array_equal(labels[0], ids[1:17])
    np.testing.assert_array_equal(inputs["token_ids"][1], ids[16:32])
    assert data[len(data) - 1][1].shape == (2, 16)
    with pytest.raises(IndexError):
        data[len(data)]


def test_lm_dataset_shuffle_and_wraparound():
    ids = np.arange(500)
    data = lm_dataset(ids, 10, 8, shuffle=True, seed=0, num_batches=20)
    assert len(data) == 20 and data.num_tokens == 20 * 8 * 10
    seen = set()
    for i in range(len(data)):
        inputs, labels = data[i]
        assert inputs["token_ids"].shape == (8, 10)  # drop_remainder: always full
        np.testing.assert_array_equal(labels, inputs["token_ids"] + 1)
        seen.update(inputs["token_ids"][:, 0].tolist())
    assert len(seen) == data.num_windows  # every window in each pass
    first = data[0][0]["token_ids"].copy()
    data.on_epoch_end()
    assert not np.array_equal(first, data[0][0]["token_ids"])


def test_lm_dataset_errors():
    with pytest.raises(ValueError, match="too few"):
        lm_dataset(np.arange(20), 16, 4, shuffle=True)
    with pytest.raises(ValueError, match="1-D"):
        lm_dataset(np.zeros((4, 4), "int32"), 2, 1)
    with pytest.raises(ValueError, match="sequence_length"):
        lm_dataset(np.arange(20), 0, 1)


def test_split_tokens():
    train, validation = split_tokens(np.arange(1000), validation_fraction=0.1)
    assert len(train) == 900 and len(validation) == 100
    assert train[-1] + 1 == validation[0]
    with pytest.raises(ValueError):
        split_tokens(np.arange(10), 1.5)


def test_text_sources(tmp_path):
    text = default_text()
    assert isinstance(text, str) and len(text) > 100_000 and "Python" in text
    path = tmp_path / "t.txt"
    path.write_text("héllo wörld", encoding="utf-8")
    assert read_text(path) == "héllo wörld" and read_text(path, max_chars=3) == "hél"
    with pytest.raises(FileNotFoundError):
        read_text(tmp_path / "missing.txt")
    if shutil.which("bible") is None:
        assert kjv_text() is None
    else:
        kjv = kjv_text()
        assert kjv.startswith("In the beginning God created the heaven and the earth.")
        assert "Ge1:1" not in kjv[:100]
