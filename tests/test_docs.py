"""The documentation runs as written: docstring examples, every Python block
of the README and of the guides in docs/, and the mkdocs site builds."""

import doctest
import importlib
import os
import re
import shutil
import subprocess
import sys
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
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# Pages a reader sees that must describe the code, not how it came to be.
PROSE = [*PAGES, ROOT / "benchmarks" / "RESULTS.md", ROOT / "benchmarks" / "README.md"]
HISTORY = re.compile(r"\bsession\b|\bstop \d+|issue[ #-]*\d+", re.IGNORECASE)
README_MAX_LINES = 260


def _blocks(path, language="python"):
    return re.findall(rf"```{language}\n(.*?)```", path.read_text(), re.S)


def _name(path):
    return path.relative_to(ROOT).as_posix()


# The examples run once, on PyTorch (eager: the cheapest backend for them;
# scripts/test_all.sh). What they do on each backend, the tests of each
# module check on all three.
@pytest.mark.once
@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples(module):
    mod = importlib.import_module(module)
    globs = {"keras": keras, "np": np, "keras_transformers": keras_transformers}
    result = doctest.testmod(
        mod, extraglobs=globs, optionflags=doctest.ELLIPSIS, verbose=False
    )
    assert result.failed == 0


@pytest.mark.once
@pytest.mark.parametrize("page", [p for p in PAGES if _blocks(p)], ids=_name)
def test_python_blocks_run(page, tmp_path, monkeypatch):
    """A page's ```python blocks run in order in one namespace (a block may
    use what an earlier block of the same page defined)."""
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__docs__"}
    for index, block in enumerate(_blocks(page)):
        exec(compile(block, f"{_name(page)} block {index}", "exec"), namespace)


def test_readme_is_short():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines"


def test_relative_links_of_the_readme_exist():
    text = (ROOT / "README.md").read_text()
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
        assert (ROOT / target).exists(), target


@pytest.mark.parametrize("path", PROSE, ids=_name)
def test_no_development_history(path):
    lines = [
        f"{number}: {line}"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if HISTORY.search(line)
    ]
    assert not lines, "\n".join(lines)


def test_readme_has_the_two_setup_commands():
    blocks = _blocks(ROOT / "README.md", "bash")
    assert any("keras-transformers train" in b and "pip install" in b for b in blocks)
    assert any("scripts/test_all.sh" in b for b in blocks)
    assert "scripts/test_all.sh" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.once
def test_docs_site_builds(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (tmp_path / "index.html").exists()
    assert (tmp_path / "api" / "models" / "index.html").exists()


@pytest.mark.once
def test_readme_main_job_command_runs_as_written():
    """The README's first command (install, train gpt_mini, generate)."""
    command = next(
        b
        for b in _blocks(ROOT / "README.md", "bash")
        if "keras-transformers train" in b
    )
    # The command's output directory, as a fresh checkout has it (an earlier
    # interrupted run would leave a backup that asks for --resume).
    shutil.rmtree(ROOT / "runs" / "gpt_mini", ignore_errors=True)
    # In a user's environment: without the test processes' own settings
    # (one thread per xdist worker, the allocator left alone; conftest.py).
    test_only = (
        "OMP_NUM_THREADS",
        "KERAS_TRANSFORMERS_RETAIN_MEMORY",
        "KERAS_BACKEND",
        "XLA_FLAGS",
    )
    env = {k: v for k, v in os.environ.items() if k not in test_only}
    result = subprocess.run(
        ["bash", "-c", command],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1500,
        env=env,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "val_loss" in result.stdout + result.stderr
    assert (ROOT / "runs" / "gpt_mini" / "model.weights.h5").exists()


def _prose_examples(docstring: str) -> bool:
    """Whether griffe (the docs site's parser) would show `>>>` lines of
    `docstring` as prose: outside an `Examples:` section, which renders
    them as code."""
    from griffe import Docstring

    sections = Docstring(docstring, parser="google").parse(warnings=False)
    return any(
        section.kind.value != "examples" and ">>>" in str(section.value)
        for section in sections
        if section.kind.value in ("text", "admonition")
    ) or any(
        section.kind.value == "admonition" and ">>>" in section.value.contents
        for section in sections
    )


def test_docstring_examples_render_as_code():
    """Every docstring with doctest lines keeps them in a Google-style
    `Examples:` section (indented under it), which the site renders as
    code blocks; `Example:` or loose `>>>` lines render as a paragraph."""
    pytest.importorskip("griffe")
    import ast

    prose = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(
                node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
            ):
                continue
            docstring = ast.get_docstring(node)
            if docstring and ">>>" in docstring and _prose_examples(docstring):
                prose.append(f"{_name(path)}:{getattr(node, 'name', '<module>')}")
    assert prose == [], prose
