"""Layouts for keras.distribution, and multi-device training.

The layout rules are checked here on every backend (no devices needed). The
real multi-device runs need the device set-up before the backend starts, so
each runs its case file in a pytest process of its own: JAX over 8 simulated
CPU devices (`tests/multidevice/jax_mesh_cases.py`), TensorFlow's
`MirroredStrategy` over 2 logical CPU devices
(`tests/multidevice/tf_mirrored_cases.py`).
"""

import os
import subprocess
import sys
from pathlib import Path

import keras
import pytest

from keras_transformers import distribution as kd
from keras_transformers import load_config
from keras_transformers.models import GPTCausalLM

CASES = Path(__file__).parent / "multidevice"


def _mesh(**axes):
    n = 1
    for size in axes.values():
        n *= size
    return keras.distribution.DeviceMesh(
        shape=tuple(axes.values()),
        axis_names=tuple(axes),
        devices=[f"cpu:{i}" for i in range(n)],
    )


def _axes(layout_map, path):
    layout = layout_map[path]
    return None if layout is None else tuple(layout.axes)


def test_layout_map_splits_heads_mlp_vocab_and_experts():
    config = load_config("mixtral_tiny")  # 4 heads, 2 KV heads, 4 experts
    layouts = kd.layout_map(config, _mesh(batch=1, expert=4, model=2))
    assert _axes(layouts, "block_1/self_attention/query/kernel") == (
        None,
        "model",
        None,
    )
    assert _axes(layouts, "block_0/self_attention/key/kernel") == (None, "model", None)
    assert _axes(layouts, "block_0/self_attention/attention_output/kernel") == (
        "model",
        None,
        None,
    )
    assert _axes(layouts, "block_0/moe/expert_down") == ("expert", "model", None)
    assert _axes(layouts, "block_0/moe/expert_gate_up") == ("expert", None, None)
    assert _axes(layouts, "token_embedding/embeddings") == ("model", None)
    assert _axes(layouts, "token_embedding/reverse_embeddings") == (None, "model")
    for replicated in (
        "final_norm/scale",
        "block_0/moe/router",
        "block_0/self_attention_norm/scale",
    ):
        assert _axes(layouts, replicated) is None


def test_layout_map_replicates_what_does_not_divide():
    # Two KV heads cannot split four ways: K/V projections are replicated,
    # the four query heads are split.
    config = load_config("mixtral_tiny")
    layouts = kd.layout_map(config, _mesh(batch=2, model=4))
    assert _axes(layouts, "block_0/self_attention/key/kernel") is None
    assert _axes(layouts, "block_0/self_attention/query/kernel") == (
        None,
        "model",
        None,
    )
    # No expert axis in the mesh: experts are not split over it.
    assert _axes(layouts, "block_0/moe/expert_down") == (None, "model", None)
    odd = load_config("gpt2_tiny", vocabulary_size=514)  # 514 = 2 * 257
    assert (
        _axes(kd.layout_map(odd, _mesh(model=4)), "token_embedding/embeddings") is None
    )


def test_layout_map_rejects_unknown_mesh_axes():
    with pytest.raises(ValueError, match="Unknown mesh axis names \\['data'\\]"):
        kd.layout_map(load_config("gpt2_tiny"), _mesh(data=2, model=4))


def test_mesh_shapes():
    gpt = load_config("gpt2_tiny")  # 4 heads, intermediate 256
    assert kd.mesh_shape(gpt, 8, "data") == {"batch": 8}
    assert kd.mesh_shape(gpt, 8, "model") == {"batch": 2, "model": 4}
    assert kd.mesh_shape(gpt, 8, "auto") == {"batch": 2, "model": 4}
    big = load_config("llama2_7b")  # 32 heads: the auto model axis stops at 8
    assert kd.mesh_shape(big, 64, "model") == {"batch": 2, "model": 32}
    assert kd.mesh_shape(big, 64, "auto") == {"batch": 8, "model": 8}
    moe = load_config("mixtral_8x7b")  # 8 experts, 32 heads, 8 KV heads
    assert kd.mesh_shape(moe, 16, "auto") == {"batch": 1, "expert": 8, "model": 2}
    with pytest.raises(ValueError, match="one of"):
        kd.mesh_shape(gpt, 8, "pipeline")


@pytest.mark.skipif(
    keras.config.backend() == "jax", reason="the error is for other backends"
)
def test_other_backends_get_a_clear_error():
    with pytest.raises(ValueError, match="JAX backend only.*MirroredStrategy"):
        GPTCausalLM.from_preset("gpt2_tiny", distribution="auto")
    assert keras.distribution.distribution() is None


def _run_cases(name, backend, **env):
    env = {**os.environ, "KERAS_BACKEND": backend, **env}
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        str(CASES / name),
    ]
    result = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=1200
    )
    tail = (result.stdout + result.stderr)[-6000:]
    assert result.returncode == 0, tail
    assert " passed" in result.stdout and "skipped" not in result.stdout, tail


@pytest.mark.skipif(keras.config.backend() != "jax", reason="JAX meshes")
def test_jax_eight_simulated_devices():
    # Simulated devices are host (CPU) devices: on a GPU machine JAX would
    # otherwise pick its one GPU and the cases would skip.
    _run_cases(
        "jax_mesh_cases.py",
        "jax",
        # After the suite's compile-time flags (conftest.py).
        XLA_FLAGS=os.environ.get("XLA_FLAGS", "")
        + " --xla_force_host_platform_device_count=8",
        JAX_PLATFORMS="cpu",
    )


@pytest.mark.skipif(keras.config.backend() != "tensorflow", reason="tf.distribute")
def test_tensorflow_mirrored_strategy():
    _run_cases("tf_mirrored_cases.py", "tensorflow")
