"""examples/translate.py runs end to end on the generated numbers task (no
data needed), with T5's architecture and its span-corruption pretraining."""

import subprocess
import sys
from pathlib import Path

import keras
import pytest
from contracts import toy_run_env

EXAMPLE = Path(__file__).parents[1] / "examples" / "translate.py"


@pytest.mark.once
def test_t5_text_to_text_with_span_corruption_runs(tmp_path):
    tiny = "--num-layers 1 --hidden-dim 32 --num-heads 2 --intermediate-dim 64"
    command = (
        f"--task numbers --architecture t5 --span-corruption-epochs 1 --epochs 1 "
        f"--steps-per-epoch 3 --batch-size 16 --test-sentences 4 {tiny} "
        f"--output {tmp_path / 'model'}"
    ).split()
    env = toy_run_env(KERAS_BACKEND=keras.config.backend())
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), *command],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "Span corruption:" in out and "digits: " in out
    assert "Test, greedy: exact match" in out and "Saved to" in out
    assert (tmp_path / "model" / "config.json").exists()
