"""Loading a Hugging Face checkpoint (or a saved preset) builds no
random-initialised copy of the weights: no random initializer runs for a
weight the checkpoint fills, the tensors are views of the memory-mapped file, and weights the
checkpoint lacks still get their initializer."""

import contextlib

import keras
import ml_dtypes
import numpy as np
import pytest
from keras.src.backend import random as backend_random

pytest.importorskip("safetensors")

import keras_transformers  # noqa: E402
from keras_transformers import TransformerConfig  # noqa: E402
from keras_transformers.convert import export_hf  # noqa: E402
from keras_transformers.convert.checkpoint import Checkpoint, write_checkpoint  # noqa: E402
from keras_transformers.deferred import deferred_initialization  # noqa: E402
from keras_transformers.models import GPTCausalLM  # noqa: E402

LLAMA = dict(
    num_kv_heads=2,
    norm_type="rms",
    position_embedding="rotary",
    activation="silu",
    gated_feed_forward=True,
    tie_embeddings=False,
)
GPT2 = dict(activation="gelu_approximate")


def _lm(**fields):
    config = TransformerConfig(
        vocabulary_size=64,
        num_layers=2,
        hidden_dim=16,
        num_heads=4,
        intermediate_dim=32,
        max_sequence_length=32,
        **fields,
    )
    return GPTCausalLM(config=config)


def _logits(lm):
    ids = np.arange(12, dtype="int32").reshape(2, 6) % 64
    inputs = {"token_ids": ids, "padding_mask": np.ones_like(ids, bool)}
    return keras.ops.convert_to_numpy(lm(inputs))


def _refuse_random(monkeypatch):
    """From now on, random draws raise (every Keras random initializer
    makes one); returns the list of draws attempted."""
    calls = []

    def refuse(name):
        def draw(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"a random initializer ran ({name})")

        return draw

    for name in ("normal", "truncated_normal", "uniform"):
        monkeypatch.setattr(backend_random, name, refuse(name))
    return calls


@pytest.mark.parametrize("fields", [LLAMA, GPT2], ids=["llama", "gpt2"])
def test_loading_runs_no_random_initializer(tmp_path, fields, monkeypatch):
    source = _lm(**fields)
    export_hf(source, tmp_path)
    draws = _refuse_random(monkeypatch)
    loaded = keras_transformers.from_preset(tmp_path)
    assert draws == []
    np.testing.assert_allclose(_logits(loaded), _logits(source), atol=1e-5)


def test_a_saved_preset_loads_without_random_initializers(tmp_path, monkeypatch):
    source = _lm(**LLAMA)
    source.save_to_preset(tmp_path / "preset")
    draws = _refuse_random(monkeypatch)
    loaded = keras_transformers.from_preset(tmp_path / "preset")
    assert draws == []
    np.testing.assert_array_equal(_logits(loaded), _logits(source))


def test_weights_the_checkpoint_lacks_are_initialized(tmp_path):
    source = _lm(**GPT2)
    export_hf(source, tmp_path)
    longer = GPTCausalLM.from_preset(tmp_path, max_sequence_length=64)
    table = keras.ops.convert_to_numpy(longer.backbone.position_embedding.embeddings)
    kept = keras.ops.convert_to_numpy(source.backbone.position_embedding.embeddings)
    np.testing.assert_array_equal(table[:32], kept)
    assert np.all(np.isfinite(table[32:])) and 0.005 < table[32:].std() < 0.1


def test_deferred_initialization_initializes_what_was_not_written():
    with deferred_initialization() as pending:
        dense = keras.layers.Dense(8, bias_initializer="ones")
        dense.build((None, 4))
        assert len(pending) == 2
    assert pending == {}
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(dense.bias), np.ones(8))
    kernel = keras.ops.convert_to_numpy(dense.kernel)
    assert np.all(np.isfinite(kernel)) and kernel.std() > 0.05
    again = keras.layers.Dense(2)  # outside the block: as usual
    again.build((None, 4))
    assert keras.ops.convert_to_numpy(again.kernel).std() > 0.05


def test_checkpoint_tensors_are_views_of_the_file(tmp_path):
    values = np.arange(12, dtype="float32").reshape(3, 4)
    write_checkpoint(tmp_path, {"model_type": "llama"}, {"w": values})
    checkpoint = Checkpoint(tmp_path)
    tensor = checkpoint.get("w")
    assert not tensor.flags.owndata
    # Writable (copy-on-write) only where variables may share it (PyTorch).
    assert tensor.flags.writeable == (keras.config.backend() == "torch")
    assert not checkpoint.get("w").flags.writeable  # a second reader never shares
    np.testing.assert_array_equal(tensor, values)
    checkpoint.close()
    np.testing.assert_array_equal(tensor, values)  # still readable


def _file_tensors(path):
    from safetensors.numpy import load_file

    return {k: v.copy() for k, v in load_file(str(path / "model.safetensors")).items()}


def test_training_a_loaded_model_never_writes_the_checkpoint(tmp_path):
    export_hf(_lm(**LLAMA), tmp_path)
    before = _file_tensors(tmp_path)
    lm = keras_transformers.from_preset(tmp_path)
    kernel = lm.backbone.blocks[0].self_attention.query_dense.kernel
    kernel.assign(keras.ops.zeros(kernel.shape))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    lm.compile(optimizer=keras.optimizers.SGD(0.5), loss=loss)
    ids = np.arange(12, dtype="int32").reshape(2, 6) % 64
    lm.fit({"token_ids": ids, "padding_mask": np.ones_like(ids, bool)}, ids, verbose=0)
    assert not np.any(keras.ops.convert_to_numpy(kernel) == 0)
    after = _file_tensors(tmp_path)
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)


def test_a_tensor_read_twice_fills_two_independent_weights(tmp_path):
    from keras_transformers.convert.common import write

    values = np.arange(12, dtype="float32").reshape(3, 4)
    write_checkpoint(tmp_path, {"model_type": "llama"}, {"w": values})
    checkpoint = Checkpoint(tmp_path)
    first, second = (keras.Variable(np.zeros((4, 3), "float32")) for _ in range(2))
    write(first, checkpoint.get("w").T)
    write(second, checkpoint.get("w").T)
    checkpoint.close()
    first.assign(keras.ops.ones((4, 3)))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(second), values.T)


def test_bfloat16_checkpoints_load_without_float32_detour(tmp_path):
    from safetensors.numpy import save_file

    values = np.linspace(-2, 2, 12).reshape(3, 4).astype(ml_dtypes.bfloat16)
    save_file({"w": values}, str(tmp_path / "model.safetensors"))
    tensor = Checkpoint(tmp_path).get("w")
    assert tensor.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(tensor.astype("float32"), values.astype("float32"))


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_bfloat16_checkpoint_loads_into_any_dtype(tmp_path, dtype):
    from safetensors.numpy import load_file, save_file

    source = _lm(**LLAMA)
    export_hf(source, tmp_path)
    file = str(tmp_path / "model.safetensors")
    tensors = {k: v.astype(ml_dtypes.bfloat16) for k, v in load_file(file).items()}
    save_file(tensors, file, metadata={"format": "pt"})
    loaded = keras_transformers.from_preset(tmp_path, dtype=dtype)
    embeddings = loaded.backbone.token_embedding.embeddings
    assert embeddings.dtype == (dtype or "float32")
    query = loaded.backbone.blocks[0].self_attention.query_dense.kernel
    expected = tensors["model.layers.0.self_attn.q_proj.weight"].astype("float32")
    got = keras.ops.convert_to_numpy(keras.ops.cast(query, "float32"))
    np.testing.assert_array_equal(got.reshape(expected.shape[::-1]), expected.T)
    table = tensors["model.embed_tokens.weight"].astype("float32")
    got = keras.ops.convert_to_numpy(keras.ops.cast(embeddings, "float32"))
    np.testing.assert_array_equal(got, table)


@pytest.mark.parametrize("staged", [True, False])
@pytest.mark.parametrize("source_dtype", ["float32", "bfloat16"])
def test_large_transposed_matrix_loads_into_a_reshaped_kernel(source_dtype, staged):
    """A checkpoint's `[out, in]` matrix large enough to be copied on every
    core (in strips whose last one is partial) reaches a `[in, heads,
    head_dim]` kernel transposed, reshaped and cast exactly; a second
    matrix loaded next (TensorFlow reuses its scratch buffer) leaves the
    first variable as it was, and leaving `staging()` frees that buffer."""
    from keras_transformers.backend import loading

    rows, cols = 1024, 1031  # [out, in]: over 1M elements, 1031 = 64 * 16 + 7
    rng = np.random.default_rng(0)
    dtype = ml_dtypes.bfloat16 if source_dtype == "bfloat16" else "float32"
    matrices = [rng.standard_normal((rows, cols)).astype(dtype) for _ in range(2)]
    variables = [
        keras.Variable(np.zeros((cols, 16, rows // 16), "float32")) for _ in range(2)
    ]
    with loading.staging() if staged else contextlib.nullcontext():
        for variable, matrix in zip(variables, matrices):
            loading.assign_array(variable, matrix.T)
    assert not loading._SCRATCH
    for variable, matrix in zip(variables, matrices):
        expected = matrix.astype("float32").T.reshape(cols, 16, rows // 16)
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(variable), expected)


def test_loaded_variable_owns_its_memory_and_trains():
    """A weight copied into a fresh host array (adopted by JAX, and by
    TensorFlow through DLPack) can be updated in place afterwards, and the
    checkpoint's (read-only, as a file mapping is) array is left unchanged."""
    from keras_transformers.backend.loading import assign_array

    table = np.arange(2 * 1024 * 1024, dtype="float32").reshape(2048, 1024)
    table.flags.writeable = False
    variable = keras.Variable(np.zeros(table.shape, "float32"))
    assign_array(variable, table)
    variable.assign_add(keras.ops.ones(table.shape))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(variable), table + 1)
    assert table[0, 0] == 0 and table[-1, -1] == table.size - 1
