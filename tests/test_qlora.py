"""QLoRA: 4-bit (int4, NF4) frozen weights with float LoRA adapters, and
quantized models that save and load (int8, int4, NF4).

NumPy references: NF4 (`nf4_reference`: the 16 levels of QLoRA, abs-max
per block of 64 inputs, nearest level) and Keras' int4 (`int4_reference`:
blocks of 128 inputs, a scale and a zero point each). Tolerances: a
quantized layer equals the float layer with the reference's dequantized
kernel to 1e-5; a whole 4-bit tiny model's logits are within 15% (relative
RMS) of the float model's (measured 7-13%).
"""

import json
import os

import keras
import numpy as np
import pytest
from contracts import assert_close, compiled_forward, to_numpy

import keras_transformers as kt
from keras_transformers.layers.core import Dense, EinsumDense
from keras_transformers.layers.nf4 import (
    NF4_LEVELS,
    nf4_codes,
    nf4_dequantize,
    nf4_quantize,
)
from keras_transformers.quantization import NF4QuantizationConfig, restore

PROJECTIONS = (keras.layers.Dense, keras.layers.EinsumDense)


def nf4_reference(w, block=64):
    """NumPy NF4 of `w [C, O]`: (codes [C, O], dequantized [C, O])."""
    c, o = w.shape
    codes, out = np.zeros((c, o), np.uint8), np.zeros((c, o), np.float32)
    for start in range(0, c, block):
        rows = w[start : start + block]  # [<=64, O]
        absmax = np.abs(rows).max(axis=0)  # [O]
        scaled = rows / np.where(absmax == 0, 1, absmax)
        idx = np.abs(scaled[..., None] - NF4_LEVELS).argmin(-1)
        codes[start : start + block] = idx
        out[start : start + block] = NF4_LEVELS[idx] * absmax
    return codes, out


def int4_reference(w, block=128):
    """Keras' default int4 of `w [C, O]` (asymmetric, per block of inputs)."""
    out = np.zeros_like(w)
    for start in range(0, w.shape[0], block):
        rows = w[start : start + block]
        low, high = rows.min(0), rows.max(0)
        scale = (high - low + keras.config.epsilon()) / 15
        zero = np.clip(np.round(-low / scale) - 8, -8, 7)
        q = np.clip(np.round(rows / scale) + zero, -8, 7)
        out[start : start + block] = (q - zero) * scale
    return out


def tiny(preset="gpt_llama_tiny", **overrides):
    keras.utils.set_random_seed(0)
    return kt.from_preset(preset, num_layers=1, **overrides)


@pytest.fixture
def ids(rng):
    return rng.integers(1, 500, size=(2, 10)).astype("int32")


def quantized_layers(model):
    return [
        layer
        for layer in model._flatten_layers(include_self=False)
        if layer.quantization_mode is not None
    ]


# --------------------------------------------------------------- numerics
def test_nf4_codes_and_dequantization_match_numpy(rng):
    w = rng.normal(0, 0.05, (130, 7)).astype("float32")  # 3 blocks, the last of 2
    w[64:128, 1] = 0  # a block of zeros: absmax 0, code of 0.0
    codes, want = nf4_reference(w)
    got_codes, absmax = nf4_codes(w)
    np.testing.assert_array_equal(got_codes, codes)
    assert absmax.shape == (3, 7) and absmax[1, 1] == 0
    packed, absmax = nf4_quantize(w)
    assert packed.dtype == np.uint8 and packed.shape == (130, 4)  # 7 codes: 4 bytes
    np.testing.assert_array_equal(packed & 15, codes[:, 0::2])  # low nibble first
    np.testing.assert_array_equal(packed[:, :3] >> 4, codes[:, 1::2])
    got = nf4_dequantize(keras.ops.convert_to_tensor(packed), absmax, 64)
    np.testing.assert_array_equal(to_numpy(got), want)
    assert np.all(to_numpy(got)[64:128, 1] == 0)


def test_lookup_equals_take(rng):
    from keras_transformers.backend.lookup import lookup

    table = rng.normal(size=(256, 2)).astype("float32")
    indices = rng.integers(0, 256, size=(5, 3)).astype("int32")
    expected = to_numpy(keras.ops.take(table, indices, axis=0))  # [5, 3, 2]
    got = lookup(
        keras.ops.convert_to_tensor(table), keras.ops.convert_to_tensor(indices)
    )
    np.testing.assert_array_equal(to_numpy(got), expected)


@pytest.mark.parametrize("kind", ["dense", "einsum"])
def test_nf4_layer_equals_float_layer_with_reference_kernel(kind, rng):
    if kind == "dense":
        layer, x = Dense(6, use_bias=True, bias_initializer="ones"), (3, 4, 130)
    else:  # the query projection's layout [D, N, H]
        layer, x = EinsumDense("btd,dnh->btnh", (None, 2, 3)), (3, 4, 130)
    layer.build(x)
    x = rng.normal(size=x).astype("float32")
    kernel = to_numpy(layer.kernel)
    _, want = nf4_reference(kernel.reshape(130, -1))
    float_kernel = layer._kernel
    layer.quantize_nf4(64)
    assert layer.quantization_mode == "nf4"
    assert layer.dtype_policy.name == "nf4/64_from_float32"
    assert keras.backend.standardize_dtype(layer._kernel.dtype) == "uint8"
    assert layer._kernel.shape == (130, 3) and layer.kernel_absmax.shape == (3, 6)
    assert not any(v is float_kernel for v in layer.weights)
    assert_close(layer.kernel, want.reshape(kernel.shape), atol=0)
    reference = np.einsum("btd,do->bto", x, want).reshape(to_numpy(layer(x)).shape)
    if kind == "dense":
        reference = reference + 1
    assert_close(layer(x), reference, atol=1e-5)
    assert_close(layer.call(x), reference, atol=1e-5)  # a direct call too


def test_int4_layer_matches_numpy_reference(rng):
    layer = Dense(6)
    layer.build((None, 200))
    want = int4_reference(to_numpy(layer.kernel))
    layer.quantize("int4")  # Keras' own: blocks of 128 with zero points
    x = rng.normal(size=(3, 200)).astype("float32")
    assert_close(layer(x), x @ want, atol=1e-5)
    assert layer._kernel.shape == (200, 3)  # two int4 values per int8 byte


# ------------------------------------------------------------- models
def nf4_kernel_bytes(model):
    """(bytes of NF4 codes, of their scales, of the float32 kernels)."""
    layers = [
        layer for layer in quantized_layers(model) if isinstance(layer, PROJECTIONS)
    ]
    codes = sum(to_numpy(layer._kernel).nbytes for layer in layers)
    scales = sum(to_numpy(layer.kernel_absmax).nbytes for layer in layers)
    floats = sum(4 * int(np.prod(layer.kernel_shape)) for layer in layers)
    return codes, scales, floats


def test_nf4_model_is_the_float_model_with_dequantized_kernels(ids):
    lm, plain = tiny(), tiny()
    lm.quantize("nf4")
    projections = [
        layer for layer in lm._flatten_layers() if isinstance(layer, PROJECTIONS)
    ]
    assert projections and all(p.quantization_mode == "nf4" for p in projections)
    assert lm.backbone.token_embedding.quantization_mode is None  # as in QLoRA
    for layer, twin in zip(
        projections,
        [p for p in plain._flatten_layers() if isinstance(p, PROJECTIONS)],
    ):
        kernel = to_numpy(twin.kernel)
        rows = int(np.prod(kernel.shape[: layer._contracted]))
        twin._kernel.assign(
            nf4_reference(kernel.reshape(rows, -1))[1].reshape(kernel.shape)
        )
    assert_close(compiled_forward(lm, ids), compiled_forward(plain, ids), atol=1e-5)
    codes, scales, floats = nf4_kernel_bytes(lm)
    assert codes * 8 == floats and scales * 64 == floats  # 4 + 0.5 bits a weight


@pytest.mark.parametrize("mode", ["int4", "nf4"])
def test_4bit_model_close_to_float(mode, ids):
    lm = tiny()
    expected = to_numpy(compiled_forward(lm, ids))
    lm.quantize(mode)
    got = to_numpy(compiled_forward(lm, ids))
    error = np.linalg.norm(got - expected) / np.linalg.norm(expected)
    assert error < 0.15, error
    if mode == "int4":
        return  # Keras' int4 decodes as its int8 does (tests/test_lora_quantize.py)
    out = lm.generate(ids[:, :7], max_new_tokens=3, stop_token_ids=None)
    greedy = to_numpy(compiled_forward(lm, out)).argmax(-1)  # the quantized model's own
    assert np.mean(out[:, 7:] == greedy[:, 6:9]) > 0.9


@pytest.mark.parametrize(
    "preset, mode",
    [
        ("gpt_llama_tiny", "nf4"),
        ("gpt_llama_tiny", "int8"),
        ("gpt2_tiny", "int4"),
        ("mixtral_tiny", "nf4"),
        ("mixtral_tiny", "int4"),
    ],
)
def test_quantized_model_saves_and_loads_bitwise(preset, mode, ids, tmp_path):
    lm = tiny(preset)
    lm.quantize(mode)
    if preset.startswith("mixtral"):  # 4-bit experts, stored packed
        moe = lm.backbone.blocks[0].feed_forward
        assert moe.quantization_mode == mode
        e, d, f2 = moe.num_experts, lm.config.hidden_dim, 2 * moe.intermediate_dim
        packed = (e, d, f2 // 2) if mode == "nf4" else (e, d // 2, f2)
        assert tuple(moe.expert_gate_up.shape) == packed
    expected = to_numpy(compiled_forward(lm, ids))
    preset_dir = os.path.join(tmp_path, "preset")
    lm.save_to_preset(preset_dir)
    with open(os.path.join(preset_dir, "config.json")) as f:
        saved = json.load(f)["quantization"]["layers"]
    assert saved and all(name.split("/")[0] == mode for name in saved.values())
    restored = kt.from_preset(preset_dir)
    assert [layer.path for layer in quantized_layers(restored)] == [
        layer.path for layer in quantized_layers(lm)
    ]
    np.testing.assert_array_equal(to_numpy(compiled_forward(restored, ids)), expected)
    path = os.path.join(tmp_path, "model.keras")
    lm.save(path)
    np.testing.assert_array_equal(
        to_numpy(compiled_forward(keras.saving.load_model(path), ids)), expected
    )


def test_quantized_weights_release_the_checkpoint_file(backend, tmp_path):
    """PyTorch shares a loaded checkpoint's file mapping with the variables
    (`backend.loading.assign_array`); after quantizing, the float weights
    left get their own memory, so the mapping can be unmapped."""
    if backend != "torch":
        pytest.skip("only PyTorch variables view the checkpoint file")
    from keras_transformers.backend.loading import assign_array

    lm = tiny()
    embeddings = lm.backbone.token_embedding.embeddings
    array = np.zeros(tuple(embeddings.shape), "float32")  # writable: shared, not copied
    assign_array(embeddings, array)
    assert not embeddings.value.untyped_storage().resizable()
    lm.quantize("nf4")
    assert all(v.value.untyped_storage().resizable() for v in lm.weights)
    array[:] = 1  # no longer the embeddings' memory
    assert float(to_numpy(embeddings).max()) == 0


@pytest.mark.parametrize("mode", ["nf4", "int4"])
def test_qlora_trains_only_the_adapters(mode, rng):
    lm = tiny()
    lm.quantize(mode)
    frozen = {id(v): to_numpy(v) for v in lm.weights}
    lm.enable_lora(4, target=("query", "value", "gate", "output"))
    trainable = {id(v) for v in lm.trainable_weights}
    adapters = {
        id(v)
        for layer in lm._flatten_layers()
        if getattr(layer, "lora_enabled", False)
        for v in (layer.lora_kernel_a, layer.lora_kernel_b)
    }
    assert trainable == adapters and len(adapters) == 8
    assert all(
        keras.backend.standardize_dtype(v.dtype) == "float32"
        for v in lm.trainable_weights
    )
    lm.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    x = rng.integers(1, 40, size=(8, 13)).astype(
        "int32"
    )  # a small vocabulary: learnable
    losses = lm.fit(x[:, :-1], x[:, 1:], batch_size=8, epochs=4, verbose=0).history[
        "loss"
    ]
    assert losses[-1] < losses[0] - 0.05, losses
    for v in lm.weights:
        if id(v) in frozen:
            np.testing.assert_array_equal(to_numpy(v), frozen[id(v)], err_msg=v.path)


def test_qlora_adapter_files_round_trip(ids, tmp_path):
    lm = tiny()
    lm.quantize("nf4")
    lm.enable_lora(2, target=("query", "value", "gate"), alpha=4)
    for layer in lm._flatten_layers():
        if getattr(layer, "lora_enabled", False):  # a trained adapter
            b = layer.lora_kernel_b
            b.assign(np.random.default_rng(1).normal(0, 0.1, b.shape).astype("float32"))
    expected = to_numpy(compiled_forward(lm, ids))
    lm.save_adapter(os.path.join(tmp_path, "adapter"))
    lm.save_lora_weights(os.path.join(tmp_path, "a.lora.npz"))
    peft, npz = tiny(), tiny()
    for model in (peft, npz):
        model.quantize("nf4")
    peft.load_adapter(os.path.join(tmp_path, "adapter"))
    npz.enable_lora(2, target=("query", "value", "gate"), alpha=4)
    npz.load_lora_weights(os.path.join(tmp_path, "a.lora.npz"))
    assert_close(compiled_forward(peft, ids), expected, atol=1e-5)
    np.testing.assert_array_equal(to_numpy(compiled_forward(npz, ids)), expected)


def test_errors(ids, tmp_path):
    lm = tiny()
    for bad in ("int2", "fp4", None):
        with pytest.raises(ValueError, match="'int8', 'int4'.*'nf4'"):
            lm.quantize(bad)
    with pytest.raises(ValueError, match="contradicts"):
        lm.quantize("int4", config=NF4QuantizationConfig())
    for size in (0, 63, 1.5):
        with pytest.raises(ValueError, match="block_size"):
            NF4QuantizationConfig(block_size=size)
    lm.enable_lora(2)
    with pytest.raises(ValueError, match="merge_lora"):
        lm.quantize("nf4")
    lm.merge_lora()
    lm.quantize(config=NF4QuantizationConfig(block_size=32))
    assert lm.backbone.blocks[
        0
    ].self_attention.query_dense.dtype_policy.name.startswith("nf4/32")
    lm.enable_lora(2)
    with pytest.raises(ValueError, match="save_adapter"):
        lm.save_to_preset(os.path.join(tmp_path, "preset"))
    with pytest.raises(ValueError, match="float kernels"):
        lm.merge_lora()
    with pytest.raises(ValueError, match="lacks"):
        restore(tiny(), {"layers": {"no/such/layer": "nf4/64"}})
