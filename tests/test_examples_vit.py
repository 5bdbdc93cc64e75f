"""examples/train_vit.py end to end at toy size (a `once` test: CI runs it
once, on JAX)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from contracts import toy_run_env

from keras_transformers.data.images import FASHION_MNIST_DIR

SCRIPT = Path(__file__).parents[1] / "examples" / "train_vit.py"


@pytest.mark.once
@pytest.mark.skipif(
    not (FASHION_MNIST_DIR / "train-images-idx3-ubyte.gz").is_file(),
    reason="Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)",
)
def test_train_vit_example_runs(tmp_path):
    """Both parts run: Fashion-MNIST training with its plots, then (with
    scikit-learn) digits fine-tuned at 35x35 and trained from scratch."""
    args = "--epochs 1 --batch-size 32 --train-samples 256 --test-samples 64"
    args += " --finetune-epochs 1 --finetune-samples 80"
    run = subprocess.run(
        [sys.executable, str(SCRIPT), *args.split(), "--output", str(tmp_path)],
        env=toy_run_env(),
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "test accuracy: " in run.stdout and "training time: " in run.stdout
    results = json.loads((tmp_path / "results.json").read_text())
    assert 0.0 <= results["fashion_mnist"]["test_accuracy"] <= 1.0
    assert (tmp_path / "fashion_vit" / "config.json").is_file()
    if importlib.util.find_spec("matplotlib") is not None:
        for name in ("curves.png", "predictions.png"):
            assert (tmp_path / name).stat().st_size > 1000, name
    if importlib.util.find_spec("sklearn") is not None:
        digits = results["digits"]
        assert digits["image_size"] == 35 and digits["test"] == 24
        assert sorted(digits["accuracy"]) == [
            "fine-tuned at 28",
            "fine-tuned at 35",
            "from scratch at 35",
        ]
        assert all(0.0 <= a <= 1.0 for a in digits["accuracy"].values())
        assert (tmp_path / "finetune.png").is_file()
