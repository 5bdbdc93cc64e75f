"""Docstring examples and the README's Python snippets run as written."""

import doctest
import importlib
import re
from pathlib import Path

import keras
import numpy as np
import pytest

import keras_transformers

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "keras_transformers"
MODULES = sorted(
    ".".join(p.relative_to(ROOT).with_suffix("").parts)
    for p in PACKAGE.rglob("*.py")
    if ">>>" in p.read_text()
)


@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples(module):
    mod = importlib.import_module(module)
    globs = {"keras": keras, "np": np, "keras_transformers": keras_transformers}
    result = doctest.testmod(
        mod, extraglobs=globs, optionflags=doctest.ELLIPSIS, verbose=False
    )
    assert result.failed == 0


def _readme_python_blocks():
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, re.S)


@pytest.mark.parametrize("index", range(len(_readme_python_blocks())))
def test_readme_python_snippets(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(_readme_python_blocks()[index], f"README block {index}", "exec"), {})


def test_readme_has_the_two_setup_commands():
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    assert any("keras-transformers train" in b and "pip install" in b for b in blocks)
    assert any("scripts/test_all.sh" in b for b in blocks)
    assert "scripts/test_all.sh" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.large
def test_readme_main_job_command_runs_as_written():
    """The README's first command (install, train gpt_mini, generate)."""
    import subprocess

    text = (ROOT / "README.md").read_text()
    command = next(
        b
        for b in re.findall(r"```bash\n(.*?)```", text, re.S)
        if "keras-transformers train" in b
    )
    result = subprocess.run(
        ["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=1500
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "val_loss" in result.stdout + result.stderr
    assert (ROOT / "runs" / "gpt_mini" / "model.weights.h5").exists()
