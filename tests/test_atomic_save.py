"""Atomic saves and consistent presets: a killed save leaves the previous
preset or the new one, whole; a preset directory holds exactly its last
save's files; `metadata.json` records them and loading checks it."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import keras
import numpy as np
import pytest

import keras_transformers
from keras_transformers import _atomic
from keras_transformers.models import GPTCausalLM
from keras_transformers.preprocessing import WordPieceTokenizer
from keras_transformers.preset_record import vocabulary_size

ATOMIC = Path(_atomic.__file__)
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _tokenizer(size):
    return WordPieceTokenizer(SPECIALS + [f"w{i}" for i in range(size - len(SPECIALS))])


def _no_leftovers(target):
    assert not any(_atomic.leftovers(target).values()), _atomic.leftovers(target)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Two presets: `a` (gpt2_tiny, 2 layers, with a 300-token tokenizer)
    and `b` (1 layer, no tokenizer)."""
    root = tmp_path_factory.mktemp("sources")
    a = GPTCausalLM.from_preset("gpt2_tiny")
    a.tokenizer = _tokenizer(300)
    a.save_to_preset(root / "a")
    GPTCausalLM.from_preset("gpt2_tiny", num_layers=1).save_to_preset(root / "b")
    return root


def test_overwrite_holds_only_the_new_save(saved, tmp_path):
    target = tmp_path / "preset"
    shutil.copytree(saved / "a", target)
    model = keras_transformers.from_preset(target)
    assert model.tokenizer is not None
    model = GPTCausalLM.from_preset("gpt2_tiny", num_layers=1)
    model.save_to_preset(target)  # no tokenizer: the old one must go
    assert sorted(os.listdir(target)) == sorted(os.listdir(saved / "b"))
    loaded = keras_transformers.from_preset(target)
    assert loaded.tokenizer is None and loaded.config.num_layers == 1
    _no_leftovers(target)
    record = json.loads((target / "metadata.json").read_text())
    assert sorted(record["files"]) == ["config.json", "model.weights.h5"]
    assert record["tokenizer"] is None


def test_the_record_names_the_first_mismatch(saved, tmp_path):
    target = tmp_path / "p"
    shutil.copytree(saved / "a", target)
    record = json.loads((target / "metadata.json").read_text())
    assert record["tokenizer"]["vocabulary_size"] == 300
    assert set(record["files"]) >= {"config.json", "model.weights.h5"}
    assert all(len(e["sha256"]) == 64 for e in record["files"].values())

    shutil.copy(saved / "b" / "model.weights.h5", target / "model.weights.h5")
    with pytest.raises(ValueError, match="model.weights.h5.*weights from another save"):
        keras_transformers.from_preset(target)
    model = keras_transformers.from_preset(target, load_weights=False)
    assert model.tokenizer is not None  # unchecked weights are not loaded
    shutil.copy(saved / "a" / "model.weights.h5", target / "model.weights.h5")

    config = json.loads((target / "config.json").read_text())
    config["config"]["hidden_dim"] = 32
    (target / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="config.json.*overrides"):
        keras_transformers.from_preset(target)
    shutil.copy(saved / "a" / "config.json", target / "config.json")

    vocab = target / "tokenizer" / "vocab.txt"
    vocab.write_text(vocab.read_text() + "extra\n")
    with pytest.raises(ValueError, match="vocab.txt.*another tokenizer"):
        keras_transformers.from_preset(target)
    vocab.unlink()
    with pytest.raises(FileNotFoundError, match="vocab.txt is missing.*incomplete"):
        keras_transformers.from_preset(target)
    shutil.copy(saved / "a" / "tokenizer" / "vocab.txt", vocab)

    stale = target / "generation_config.json"
    stale.write_text("{}")
    with pytest.raises(ValueError, match="generation_config.json is not part"):
        keras_transformers.from_preset(target)
    stale.unlink()
    assert vocabulary_size(keras_transformers.from_preset(target).tokenizer) == 300


def test_a_stale_tokenizer_larger_than_the_embedding_table(saved, tmp_path):
    model = GPTCausalLM.from_preset("gpt2_tiny")
    model.tokenizer = _tokenizer(600)
    with pytest.raises(ValueError, match="600 tokens.*vocabulary_size=512"):
        model.save_to_preset(tmp_path / "p")
    assert not (tmp_path / "p").exists()
    target = tmp_path / "q"
    shutil.copytree(saved / "b", target)
    _tokenizer(600).save_assets(target / "tokenizer")  # copied in by hand
    with pytest.raises(ValueError, match="tokenizer.*not part of this preset"):
        keras_transformers.from_preset(target)
    record = json.loads((target / "metadata.json").read_text())
    del record["files"]  # the way to load files as they are: unchecked
    (target / "metadata.json").write_text(json.dumps(record))
    with pytest.warns(UserWarning, match="600 tokens.*vocabulary_size=512"):
        keras_transformers.from_preset(target)


def _write_old_layout(model, path):
    """A preset as saves wrote them before the record: in place, and a
    metadata.json without "files" and "tokenizer"."""
    path.mkdir()
    meta = {"class_name": "GPTCausalLM", "family": "gpt"}
    meta["config"] = model.config.to_dict()
    (path / "config.json").write_text(json.dumps(meta))
    model.save_weights(str(path / "model.weights.h5"))
    (path / "metadata.json").write_text(json.dumps({"params": model.count_params()}))
    model.tokenizer.save_assets(str(path / "tokenizer"))


def test_old_layout_presets_still_load(tmp_path):
    model = GPTCausalLM.from_preset("gpt2_tiny")
    model.tokenizer = _tokenizer(300)
    _write_old_layout(model, tmp_path / "old")
    ids = np.array([[1, 2, 3]], "int32")
    loaded = GPTCausalLM.from_preset(tmp_path / "old")
    expected = keras.ops.convert_to_numpy(model(ids))
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(loaded(ids)), expected, atol=1e-6
    )
    assert vocabulary_size(loaded.tokenizer) == 300
    loaded.save_to_preset(tmp_path / "old")  # an old preset is replaced too
    assert "files" in json.loads((tmp_path / "old" / "metadata.json").read_text())


def test_refuses_to_replace_a_directory_of_other_files(tmp_path, monkeypatch):
    model = GPTCausalLM.from_preset("gpt2_tiny")
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="notes.txt"):
        model.save_to_preset(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "keep me"
    with pytest.raises(ValueError, match="is a file"):
        model.save_to_preset(tmp_path / "notes.txt")
    (tmp_path / "run").mkdir()
    monkeypatch.chdir(tmp_path / "run")
    with pytest.raises(ValueError, match="working directory"):
        model.save_to_preset(tmp_path / "run")


def test_a_failed_save_keeps_the_previous_files(saved, tmp_path, monkeypatch):
    target = tmp_path / "p"
    shutil.copytree(saved / "a", target)
    before = sorted(os.listdir(target))

    def broken(*args, **kwargs):
        raise OSError("disk full")

    model = GPTCausalLM.from_preset("gpt2_tiny")
    monkeypatch.setattr(model, "save_weights", broken)
    with pytest.raises(OSError, match="disk full"):
        model.save_to_preset(target)
    assert sorted(os.listdir(target)) == before
    _no_leftovers(target)
    assert keras_transformers.from_preset(target).tokenizer is not None


# A process that replaces `target` with a copy of `source` through
# `atomic_directory` and dies (os._exit, no clean-up) at step `k`: 0 while
# writing, 1-3 before the first, second or third rename, 4 before removing
# the old directory. It loads `_atomic.py` alone, without Keras.
CHILD = textwrap.dedent(
    """
    import importlib.util, os, shutil, sys
    spec = importlib.util.spec_from_file_location("atomic", sys.argv[1])
    atomic = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(atomic)
    target, source, k = sys.argv[2], sys.argv[3], int(sys.argv[4])
    rename, calls = os.rename, []
    def dying_rename(a, b):
        calls.append(a)
        if len(calls) == k:
            os._exit(3)
        rename(a, b)
    os.rename = dying_rename
    atomic._remove = lambda path: os._exit(3) if k == 4 else shutil.rmtree(path)
    with atomic.atomic_directory(target, markers=("config.json",)) as new:
        shutil.copy(os.path.join(source, "config.json"), new)
        if k == 0:
            os._exit(3)
        for name in os.listdir(source):
            shutil.copy(os.path.join(source, name), new)
    """
)


@pytest.mark.parametrize("step,survivor", [(0, 2), (1, 2), (2, 2), (3, 1), (4, 1)])
def test_a_save_killed_at_each_step_leaves_a_whole_preset(tmp_path, step, survivor):
    tiny = GPTCausalLM.from_preset("gpt2_tiny")
    tiny.save_to_preset(tmp_path / "p")
    GPTCausalLM.from_preset("gpt2_tiny", num_layers=1).save_to_preset(tmp_path / "new")
    args = [str(ATOMIC), str(tmp_path / "p"), str(tmp_path / "new"), str(step)]
    done = subprocess.run([sys.executable, "-c", CHILD, *args], timeout=60)
    assert done.returncode == 3
    loaded = keras_transformers.from_preset(tmp_path / "p")
    assert loaded.config.num_layers == survivor
    tiny.save_to_preset(tmp_path / "p")  # the next save clears the leftovers
    _no_leftovers(tmp_path / "p")
    assert keras_transformers.from_preset(tmp_path / "p").config.num_layers == 2


def test_an_interrupted_swap_that_cannot_be_finished_names_the_fix(
    tmp_path, monkeypatch
):
    (tmp_path / ".p.complete-999999999-abcd").mkdir()  # a dead save's new preset

    def read_only(source, destination):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "rename", read_only)
    with pytest.raises(FileNotFoundError, match="Rename that directory to .*p "):
        keras_transformers.from_preset(tmp_path / "p")


def test_lora_adapter_and_hf_export_are_atomic(tmp_path, monkeypatch):
    from keras_transformers.convert import checkpoint, export_hf

    lm = GPTCausalLM.from_preset("gpt2_tiny")
    lm.tokenizer = _tokenizer(300)
    export_hf(lm, tmp_path / "hf")
    assert (tmp_path / "hf" / "vocab.txt").exists()
    original = checkpoint.save_file

    def dying(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint, "save_file", dying)
    lm.tokenizer = None
    with pytest.raises(KeyboardInterrupt):
        export_hf(lm, tmp_path / "hf")
    assert (tmp_path / "hf" / "vocab.txt").exists()  # the previous export, whole
    monkeypatch.setattr(checkpoint, "save_file", original)
    export_hf(lm, tmp_path / "hf")
    assert sorted(os.listdir(tmp_path / "hf")) == ["config.json", "model.safetensors"]
    _no_leftovers(tmp_path / "hf")

    lm.enable_lora(2)
    path = tmp_path / "adapter.lora.npz"
    lm.save_lora_weights(path)
    first = path.read_bytes()
    monkeypatch.setattr(np, "savez", dying)
    with pytest.raises(KeyboardInterrupt):
        lm.save_lora_weights(path)
    assert path.read_bytes() == first
    assert sorted(os.listdir(tmp_path)) == ["adapter.lora.npz", "hf"]


# A process that builds `source` (a preset handle) once, then, for each
# target read from its standard input, forks a process that saves the model
# there (the save the test kills) and prints "saving <pid>". It reaps that
# process only when told (a further line), so the pid the test signals is
# never another process's, and prints "ended <wait status>". It runs on
# PyTorch whatever the suite's backend: a fork of a process that runs JAX's
# or TensorFlow's threads may deadlock, and the files a save writes are the
# same on every backend.
SAVER = textwrap.dedent(
    """
    import os, sys, time
    import keras_transformers
    lm = keras_transformers.from_preset(sys.argv[1])
    print("ready", flush=True)
    for target in iter(sys.stdin.readline, ""):
        pid = os.fork()
        if pid == 0:
            start = time.perf_counter()
            lm.save_to_preset(target.strip())
            print(f"saved {time.perf_counter() - start:.3f}", flush=True)
            os._exit(0)
        print(f"saving {pid}", flush=True)
        sys.stdin.readline()
        print(f"ended {os.waitpid(pid, 0)[1]}", flush=True)
    """
)


def _until(saver, word):
    """The value on the next line of `saver`'s output that starts with
    `word` (the lines of the saving process and its parent may interleave)."""
    while line := saver.stdout.readline():
        if line.startswith(word + " "):
            return line.split()[1]
    raise AssertionError(f"the saving processes ended before {word!r}")


def _save(saver, target):
    """Has `saver` save into `target` in a new process; returns its pid
    and the moment it started."""
    saver.stdin.write(f"{target}\n")
    saver.stdin.flush()
    return int(_until(saver, "saving")), time.perf_counter()


def _reap(saver):
    """Lets `saver` reap the last saving process; returns its wait status."""
    saver.stdin.write("reap\n")
    saver.stdin.flush()
    return int(_until(saver, "ended"))


@pytest.mark.once
def test_killing_a_real_gpt2_small_save(tmp_path):
    """Saves `gpt2_small` (124M parameters) over a `gpt2_tiny` preset in a
    process killed with SIGKILL at several moments; the directory loads
    after each kill, as one preset or the other. The model is built once,
    in one process; each save runs in a fork of it."""
    target = tmp_path / "p"
    tiny = GPTCausalLM.from_preset("gpt2_tiny")
    tiny.save_to_preset(target)
    saver = subprocess.Popen(
        [sys.executable, "-c", SAVER, "gpt2_small"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": "torch"},
        start_new_session=True,  # its forks are in its process group
    )
    # A save that hangs fails the test instead of blocking it.
    watchdog = threading.Timer(900, os.killpg, (saver.pid, signal.SIGKILL))
    watchdog.start()
    try:
        assert saver.stdout.readline().strip() == "ready"
        _save(saver, target)  # once uncut, to time it
        seconds = float(_until(saver, "saved"))
        assert _reap(saver) == 0
        assert keras_transformers.from_preset(target).config.num_layers == 12
        found = set()
        for delay in (0.05, 0.35 * seconds, 0.7 * seconds, seconds):
            tiny.save_to_preset(target)
            pid, start = _save(saver, target)
            time.sleep(max(0.0, delay - (time.perf_counter() - start)))
            os.kill(pid, signal.SIGKILL)
            _reap(saver)  # dead and gone: its leftovers are a dead save's
            layers = keras_transformers.from_preset(target).config.num_layers
            assert layers in (2, 12)
            found.add(layers)
        assert 2 in found  # at least one kill hit the save before its swap
    finally:
        watchdog.cancel()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(saver.pid, signal.SIGKILL)  # the saver and any fork left
        saver.communicate(timeout=60)
