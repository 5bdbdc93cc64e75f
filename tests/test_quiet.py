"""Loading a tokenizer on JAX or PyTorch prints none of TensorFlow's start-up
lines (keras-hub imports TensorFlow), unless the user set
`TF_CPP_MIN_LOG_LEVEL`; the Hugging Face `tokenizer.json` path, and saving
and loading a preset, import no TensorFlow at all."""

import os
import subprocess
import sys
from pathlib import Path

import keras
import pytest
from contracts import toy_run_env

ROOT = Path(__file__).resolve().parents[1]
NOISE = ("cuda", "cuinit", "onednn")
# A byte-level BPE (keras-hub layer, so TensorFlow) loaded and used: all
# that the log-level checks run.
BPE_SCRIPT = """
import os
from keras_transformers.tokenizer import BPETokenizer

vocabulary = {"a": 0, "b": 1, "ab": 2, "<|endoftext|>": 3}
bpe = BPETokenizer(vocabulary, ["a b"])
assert bpe.decode(bpe.encode("ab")) == "ab"
print("TF_CPP_MIN_LOG_LEVEL:", os.environ.get("TF_CPP_MIN_LOG_LEVEL"))
"""
# A Hugging Face `tokenizer.json` (the `tokenizers` library only) loaded and
# used, a preset saved and loaded, then the byte-level BPE.
SCRIPT = (
    """
import os, sys, tempfile
from tokenizers import Tokenizer, models, pre_tokenizers
from keras_transformers.tokenizer import load_hf_tokenizer

directory = tempfile.mkdtemp()
hf = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
hf.pre_tokenizer = pre_tokenizers.Whitespace()
hf.save(os.path.join(directory, "tokenizer.json"))
tokenizer = load_hf_tokenizer(directory)
assert tokenizer.decode(tokenizer.encode("a b")) == "a b"
print("tensorflow after HFTokenizer:", "tensorflow" in sys.modules)
from keras_transformers import from_preset
from keras_transformers.models import GPTCausalLM
GPTCausalLM.from_preset("gpt2_tiny", num_layers=1).save_to_preset(directory + "/lm")
assert from_preset(directory + "/lm").config.num_layers == 1
print("tensorflow after a preset's save and load:", "tensorflow" in sys.modules)
"""
    + BPE_SCRIPT
)


def _run(backend, script=SCRIPT, **env):
    """Runs `script` with `KERAS_BACKEND=backend`, no `TF_CPP_MIN_LOG_LEVEL`
    unless given in `env`, and JAX's test settings (`contracts.toy_run_env`:
    on JAX, building the model SCRIPT saves compiles its initializers);
    returns (stdout, stderr). Only in the suite of that backend: the others
    would start the same process again."""
    if keras.config.backend() != backend:  # skip first: importing it takes seconds
        pytest.skip(f"runs in the {backend} suite")
    pytest.importorskip(backend)
    base = {k: v for k, v in toy_run_env().items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    base["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), base.get("PYTHONPATH")])
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        env={**base, "KERAS_BACKEND": backend, **env},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout, result.stderr


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_loading_tokenizers_prints_no_tensorflow_start_up_lines(backend):
    stdout, stderr = _run(backend)
    noisy = [
        line for line in stderr.splitlines() if any(n in line.lower() for n in NOISE)
    ]
    assert noisy == []
    assert "tensorflow after HFTokenizer: False" in stdout
    assert "tensorflow after a preset's save and load: False" in stdout
    assert "TF_CPP_MIN_LOG_LEVEL: 3" in stdout


@pytest.mark.parametrize("level", ["0", "1"])
def test_a_log_level_set_by_the_user_is_kept(level):
    backend = "jax" if level == "1" else "torch"
    stdout, _ = _run(backend, BPE_SCRIPT, TF_CPP_MIN_LOG_LEVEL=level)
    assert f"TF_CPP_MIN_LOG_LEVEL: {level}" in stdout


def test_only_the_import_is_silenced_and_its_warnings_still_show(tmp_path):
    (tmp_path / "noisy_module.py").write_text(
        "import os, warnings\n"
        "os.write(2, b'start-up noise\\n')\n"
        "warnings.warn('a warning of the import')\n"
    )
    script = (
        "import sys\n"
        "from keras_transformers._quiet import import_quietly\n"
        "import_quietly('noisy_module')\n"
        "print('after the import', file=sys.stderr)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    paths = [str(ROOT), str(tmp_path), env.get("PYTHONPATH")]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert "start-up noise" not in result.stderr
    assert "a warning of the import" in result.stderr
    assert "after the import" in result.stderr
