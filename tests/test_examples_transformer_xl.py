"""examples/train_transformer_xl.py runs end to end at a small size: both
models train, the longer evaluation memories and the speed comparison print."""

import re
import subprocess
import sys
from pathlib import Path

import keras
import pytest
from contracts import toy_run_env

EXAMPLE = Path(__file__).parents[1] / "examples" / "train_transformer_xl.py"


@pytest.mark.once
def test_memory_and_no_memory_models_train_and_report():
    args = "--max-chars 6000 --vocabulary-size 300 --segment 8 --memory 8"
    args += " --eval-memories 16 --batch-size 4 --epochs 1"
    env = toy_run_env(KERAS_BACKEND=keras.config.backend())
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), *args.split()],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    perplexities = re.findall(r"validation perplexity\s+([\d.]+)", out)
    assert len(perplexities) == 2 and all(float(p) > 1 for p in perplexities)
    assert "memory 8 model, eval memory   16:" in out
    assert "evaluation speed, context 16: with memory" in out
