"""Test set-up shared by every test file.

The backend is chosen by `KERAS_BACKEND` (jax, tensorflow or torch) before
Keras is imported; `.ci/run` runs the whole suite once per backend.
"""

import os

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

if keras.config.backend() == "jax":
    import jax

    # On GPUs with TF32 (Ampere and later) JAX's default float32 matmul
    # rounds its inputs to 10 mantissa bits; the parity tests (~1e-5 in
    # float32) need full float32, as PyTorch and TensorFlow compute it by
    # default. A no-op on CPU. (README: "GPUs and TPUs".)
    jax.config.update("jax_default_matmul_precision", "highest")


@pytest.fixture(autouse=True)
def _seed_and_reset():
    """Every test starts from the same seeds and the float32 policy."""
    keras.utils.set_random_seed(1234)
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")


@pytest.fixture
def backend():
    return keras.config.backend()


@pytest.fixture
def rng():
    return np.random.default_rng(0)
