"""Layouts for keras.distribution, and multi-device training.

The layout rules are checked here on every backend (no devices needed). The
real multi-device runs need the device set-up before the backend starts, so
each runs its case file in a pytest process of its own: JAX over 8 simulated
CPU devices (`tests/multidevice/jax_mesh_cases.py`), TensorFlow's
`MirroredStrategy` over 2 logical CPU devices
(`tests/multidevice/tf_mirrored_cases.py`).
"""

import os
import random
import subprocess
import sys
from pathlib import Path

import keras
import pytest

from keras_transformers import distribution as kd
from keras_transformers import load_config, registry
from keras_transformers.models import GPTBackbone, GPTCausalLM

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
    # 16 hosts of 4 devices: the model axis stays inside one host
    assert kd.mesh_shape(big, 64, "auto", per_host=4) == {"batch": 16, "model": 4}
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


def test_a_rule_that_matches_no_weight_raises():
    layouts = kd.layout_map(load_config("gpt2_tiny"), _mesh(batch=2, model=4))
    with pytest.raises(
        ValueError,
        match=r"'block_0/self_attention/querry/kernel' matches no weight of the "
        r"model\. Nearest weight paths: \['block_0/self_attention/query/kernel'",
    ):
        layouts["block_0/self_attention/querry/kernel"] = (None, "model", None)
    with pytest.raises(
        ValueError, match="both match 'block_1/self_attention/query/kernel"
    ):
        layouts["block_1/self_attention/query/kernel"] = (None, None, None)
    layouts["(.*/)?position_embedding/embeddings"] = (None, "model")  # a new rule
    assert _axes(layouts, "position_embedding/embeddings") == (None, "model")


class _Table(keras.layers.Layer):
    """A user's layer with one weight `[V, D]`."""

    def build(self, shape):
        self.table = self.add_weight(name="table", shape=(512, 64))

    def call(self, x):
        return x


class _DeclaredTable(_Table):
    weight_axes = {"table": ("vocab", "embed")}


def _with(layer_cls):
    """A one-block gpt2_tiny backbone with a `layer_cls` layer after it."""

    class WithTable(keras.Model):
        def __init__(self):
            super().__init__()
            self.backbone = GPTBackbone.from_preset("gpt2_tiny", num_layers=1)
            self.table_layer = layer_cls(name="table_layer")
            self.table_layer.build((None, None, 64))

        def call(self, x):
            return self.table_layer(self.backbone(x))

    return lambda: WithTable()  # a function that builds the model


def test_a_users_layer_declares_its_axes():
    mesh = _mesh(batch=2, model=4)
    with pytest.raises(ValueError, match="'table_layer/table' \\(in a _Table\\)"):
        kd.layout_map(None, mesh, model=_with(_Table))
    layouts = kd.layout_map(None, mesh, model=_with(_DeclaredTable))
    assert _axes(layouts, "table_layer/table") == ("model", None)
    assert _axes(layouts, "block_0/self_attention/query/kernel") == (
        None,
        "model",
        None,
    )

    class Wrong(_Table):
        weight_axes = {"table": ("vocabulary", "embed")}

    with pytest.raises(
        ValueError, match="Wrong.weight_axes\\['table'\\] names unknown"
    ):
        kd.layout_map(None, mesh, model=_with(Wrong))


def test_big_configs_are_laid_out_without_allocating_weights():
    state = random.getstate()
    layouts = kd.layout_map(load_config("mixtral_8x7b"), _mesh(expert=8, model=2))
    assert random.getstate() == state  # the seeds of the next model's layers
    assert _axes(layouts, "block_31/moe/expert_down") == ("expert", "model", None)
    assert _axes(layouts, "block_31/self_attention/key/kernel") == (None, "model", None)
    assert "block_31/moe/router" in layouts.weight_paths  # replicated


# Hugging Face configs that do not convert with the defaults of `transformers`.
HF_FIELDS = {
    "deberta-v2": dict(
        relative_attention=True,
        pos_att_type=["p2c", "c2p"],
        position_biased_input=False,
    ),
    "esm": dict(position_embedding_type="rotary", vocab_size=33),
}


def _shallow(config):
    """`config` with the fewest layers that still hold each layer type."""
    types = config.layer_types or ("",)
    if config.num_kv_shared_layers or config.num_layer_groups:
        return config  # layers that refer to others: all of them
    depth = max(types.index(kind) for kind in set(types)) + 1
    fields = {"num_layers": depth, "num_decoder_layers": None}
    if config.layer_types:
        fields["layer_types"] = config.layer_types[:depth]
    return config.replace(**fields)


@pytest.mark.skipif(keras.config.backend() != "jax", reason="layouts run on JAX")
@pytest.mark.parametrize("family", registry.FAMILIES)
def test_every_weight_of_every_model_type_is_declared(family):
    """Each Hugging Face type of `family` in every class of its family: each
    weight is split by a declared axis or declared replicated (`layout_map`
    raises otherwise), and attention or feed-forward weights are split."""
    transformers = pytest.importorskip("transformers")
    from keras_transformers import TransformerConfig

    types = [t for t, c in registry.converters().items() if c.family == family]
    assert types
    mesh = _mesh(batch=1, expert=2, model=4)
    for model_type in types:
        hf = transformers.AutoConfig.for_model(
            model_type, **HF_FIELDS.get(model_type, {})
        )
        data = registry.converter(model_type).preset_data(hf.to_dict())
        config = _shallow(TransformerConfig.from_dict(data["config"]))
        layouts = kd.layout_map(config, mesh)
        split = [p for p in layouts.weight_paths if _axes(layouts, p)]
        assert any("attention" in p or "feed_forward" in p for p in split), model_type


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
