"""LoRA adapters (`enable_lora`, `merge_lora`, adapter files) and int8
quantisation (`quantize("int8")`, `generate()` on int8 models)."""

import os

import keras
import numpy as np
import pytest
from contracts import assert_close, compiled_forward, compiled_reading, to_numpy

import keras_transformers as kt
from keras_transformers.layers import SparseMoE, TokenEmbedding
from keras_transformers.models import BertClassifier

PROJECTIONS = (keras.layers.Dense, keras.layers.EinsumDense)


def lora_layers(model):
    return [
        layer
        for layer in model._flatten_layers()
        if isinstance(layer, PROJECTIONS) and layer.lora_enabled
    ]


def lora_weights(layer):
    return [layer.lora_kernel_a, layer.lora_kernel_b]


def randomize_lora(model, seed=0):
    """Non-zero `B` (a fresh adapter is an exact no-op)."""
    rng = np.random.default_rng(seed)
    for layer in lora_layers(model):
        for v in lora_weights(layer):
            v.assign(rng.normal(0, 0.1, v.shape).astype("float32"))


def twin(model):
    """A second model of the same class and config with the same weights."""
    other = type(model)(config=model.config)
    other.set_weights(model.get_weights())
    return other


@pytest.fixture
def ids(rng):
    return rng.integers(1, 500, size=(2, 10)).astype("int32")


def tiny(preset, **overrides):
    """A one-block model of `preset` (fewer ops to compile per test)."""
    keras.utils.set_random_seed(0)
    return kt.from_preset(preset, num_layers=1, **overrides)


@pytest.fixture
def lm():
    return tiny("gpt_llama_tiny")


# ------------------------------------------------------------------- LoRA
def test_fit_changes_only_lora_weights(lm, ids):
    lm.enable_lora(2)  # query and value
    assert {layer.name for layer in lora_layers(lm)} == {"query", "value"}
    lora_ids = {id(v) for layer in lora_layers(lm) for v in lora_weights(layer)}
    assert {id(v) for v in lm.trainable_weights} == lora_ids
    before = {v.path + str(i): to_numpy(v) for i, v in enumerate(lm.weights)}
    lm.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    lm.fit(ids[:, :-1], ids[:, 1:], batch_size=2, epochs=1, verbose=0)
    for i, v in enumerate(lm.weights):
        old, new = before[v.path + str(i)], to_numpy(v)
        if id(v) in lora_ids:
            if v.name == "lora_kernel_b":  # starts at zero
                assert np.abs(new).max() > 0, v.path
        else:
            np.testing.assert_array_equal(new, old, err_msg=v.path)


def test_classifier_head_stays_trainable():
    model = BertClassifier.from_preset("bert_tiny", num_classes=3, num_layers=1)
    model.enable_lora(2, target=["query", "key", "value", "attention_output"])
    head = {id(v) for v in model.classifier.weights}
    lora = {id(v) for layer in lora_layers(model) for v in lora_weights(layer)}
    assert {id(v) for v in model.trainable_weights} == head | lora
    assert len(lora_layers(model)) == 4 * model.config.num_layers


def test_lora_output_equals_base_plus_low_rank_update(lm, ids):
    # One compiled program for `plain`'s two forwards (its weights are
    # arguments) and one per structure of `lm` (eager JAX: one per op).
    plain = twin(lm)
    before = to_numpy(compiled_forward(plain, ids))
    target = ("query", "value", "attention_output", "gate", "output")
    lm.enable_lora(4, target=target, alpha=8)
    randomize_lora(lm)
    for layer, base in zip(
        lora_layers(lm),
        [
            p
            for p in plain._flatten_layers()
            if isinstance(p, PROJECTIONS) and p.name in target
        ],
    ):
        a, b = to_numpy(layer.lora_kernel_a), to_numpy(layer.lora_kernel_b)
        base._kernel.assign(to_numpy(base._kernel) + 2.0 * np.matmul(a, b))
    expected = to_numpy(compiled_forward(plain, ids))
    assert np.abs(expected - before).max() > 1e-3  # not a no-op
    assert_close(compiled_forward(lm, ids), expected, atol=1e-5)
    lm.merge_lora()
    assert not lora_layers(lm)
    assert len(lm.trainable_weights) == len(plain.trainable_weights)
    assert lm.count_params() == plain.count_params()
    assert_close(compiled_forward(lm, ids), expected, atol=1e-5)


def test_lora_weights_round_trip(lm, ids, tmp_path):
    base, plain = twin(lm), twin(lm)
    target = ("query", "value", "intermediate")
    lm.enable_lora(2, target=target)
    randomize_lora(lm)
    path = os.path.join(tmp_path, "adapter.lora.npz")
    lm.save_lora_weights(path)
    full = os.path.join(tmp_path, "full.weights.h5")
    lm.save_weights(full)
    assert os.path.getsize(path) * 5 < os.path.getsize(full)
    base.enable_lora(2, target=target)
    base.load_lora_weights(path)
    np.testing.assert_array_equal(
        to_numpy(compiled_forward(base, ids)), to_numpy(compiled_forward(lm, ids))
    )
    with pytest.raises(ValueError, match="enable_lora"):
        plain.load_lora_weights(path)
    plain.enable_lora(4, target=target)
    with pytest.raises(ValueError, match="rank=2"):
        plain.load_lora_weights(path)
    with pytest.raises(ValueError, match=".npz"):
        lm.save_lora_weights(os.path.join(tmp_path, "adapter.h5"))


def test_save_to_preset_with_lora_saves_merged_model(lm, ids, tmp_path):
    lm.enable_lora(2)
    randomize_lora(lm)
    expected = to_numpy(compiled_forward(lm, ids))
    lm.save_to_preset(os.path.join(tmp_path, "preset"))
    restored = kt.from_preset(os.path.join(tmp_path, "preset"))
    assert not lora_layers(restored)
    assert_close(compiled_forward(restored, ids), expected, atol=1e-5)
    # Loading the preset onto a LoRA model gives the merged kernels, zero LoRA.
    again = twin(restored)
    again.enable_lora(2)
    again.load_weights(os.path.join(tmp_path, "preset", "model.weights.h5"))
    assert_close(compiled_forward(again, ids), expected, atol=1e-5)


def test_lora_argument_errors(lm):
    with pytest.raises(ValueError, match="'query'"):
        lm.enable_lora(2, target=("qkv",))
    for rank in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="rank"):
            lm.enable_lora(rank)
    with pytest.raises(ValueError, match="rank <= 16"):
        lm.enable_lora(64)  # query kernel [D, N, H=16]: A [D, N, r] @ B [r, H]
    with pytest.raises(ValueError, match="alpha"):
        lm.enable_lora(2, alpha=-1)
    with pytest.raises(ValueError, match="enable_lora"):
        lm.merge_lora()
    lm.enable_lora(2)
    with pytest.raises(ValueError, match="already enabled"):
        lm.enable_lora(2)
    with pytest.raises(ValueError, match="merge_lora"):
        lm.quantize("int8")


# ------------------------------------------------------------------- int8
def text_inputs(model, ids):
    if model.config.stacks == "encoder_decoder":
        return {"encoder_token_ids": ids, "decoder_token_ids": ids}
    if model.config.stacks == "encoder":  # BertMaskedLM: tied masked-LM head
        return {"token_ids": ids, "mask_positions": ids[:, :3] % ids.shape[1]}
    return {"token_ids": ids}


def quantize_and_compare(model, x, tolerance=0.08):
    """Quantizes `model` to int8; returns float and int8 outputs for `x`
    after checking that every projection, embedding and MoE layer is int8
    and that the outputs differ by less than `tolerance` of their scale."""
    expected = to_numpy(compiled_forward(model, x))
    model.quantize("int8")
    kinds = (*PROJECTIONS, TokenEmbedding, SparseMoE)
    layers = [layer for layer in model._flatten_layers() if isinstance(layer, kinds)]
    assert layers and all(layer.quantization_mode == "int8" for layer in layers)
    out = to_numpy(compiled_forward(model, x))
    error = np.abs(out - expected).max() / np.abs(expected).max()
    assert error < tolerance, error
    return expected, out


@pytest.mark.parametrize("preset", ["gpt_llama_tiny", "bert_tiny"])
def test_int8_forward_close_to_float(preset, ids):
    model = tiny(preset)
    quantize_and_compare(model, text_inputs(model, ids))


def test_int8_causal_lm_generate(ids):
    # Untied head, rotary GQA attention, MoE experts.
    lm = tiny("mixtral_tiny")
    expected, logits = quantize_and_compare(lm, ids)
    moe = lm.backbone.blocks[0].feed_forward
    assert isinstance(moe, SparseMoE) and moe.dispatch == "sparse"
    assert keras.backend.standardize_dtype(moe.expert_down.dtype) == "int8"
    embed = compiled_reading(lm.backbone.embed, lm.backbone.variables)
    hidden = to_numpy(embed(ids))  # 20 tokens
    # One compiled program per dispatch (a new one reads `dispatch` again).
    sparse = to_numpy(compiled_reading(moe, moe.variables)(hidden))  # block layout
    moe.dispatch = "dense"  # the reference: every expert on every token
    assert_close(compiled_reading(moe, moe.variables)(hidden), sparse, atol=1e-5)
    moe.dispatch = "sparse"
    agree = np.mean(logits.argmax(-1) == expected.argmax(-1))
    assert agree > 0.75, agree
    # int8 `generate` (cached decoding) makes the int8 model's own greedy
    # choices (those of a full forward pass).
    out = lm.generate(ids[:, :7], max_new_tokens=3, stop_token_ids=None)
    greedy = to_numpy(compiled_forward(lm, out)).argmax(-1)  # [B, 10]
    assert np.mean(out[:, 7:] == greedy[:, 6:9]) > 0.9
    # Saving and LoRA on quantized models: tests/test_qlora.py.


def test_int8_seq2seq_generate(rng, ids):
    lm = tiny("transformer_tiny")  # tied, scaled (sqrt(D)) embeddings
    lm.__dict__["_generate_functions"] = {"compiled for float": None}
    quantize_and_compare(lm, text_inputs(lm, ids))
    assert "_generate_functions" not in lm.__dict__  # recompiled on next use
    out = lm.generate(ids[:, :5], max_new_tokens=3)
    assert out.shape[0] == 2
