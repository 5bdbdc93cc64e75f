"""Hugging Face conversion (gpt2, llama): logits, hidden states and greedy
generation match `transformers` (torch, float32, eager attention) on tiny
random-init models; export round-trips; errors name the problem."""

import json
import shutil

import numpy as np
import pytest
from contracts import edited_hf_dir, randomize_weights

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from hf_parity import (  # noqa: E402
    TOLERANCE,
    assert_greedy_matches,
    hf_outputs,
    our_outputs,
    padded_batch,
    randomize,
    record,
    reference,
)

import keras_transformers  # noqa: E402
from keras_transformers import TransformerConfig  # noqa: E402
from keras_transformers.convert import export_hf, hf_preset_data  # noqa: E402
from keras_transformers.models import GPTBackbone, GPTCausalLM  # noqa: E402

VOCAB = 128
GPT2 = dict(
    vocab_size=VOCAB,
    n_embd=32,
    n_layer=2,
    n_head=4,
    n_positions=64,
    bos_token_id=0,
    eos_token_id=1,
)
LLAMA = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    rope_theta=500.0,
    bos_token_id=0,
    eos_token_id=1,
)


def _hf_model(kind):
    if kind == "gpt2":
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2))
    config = transformers.LlamaConfig(**LLAMA, tie_word_embeddings=kind == "llama_tied")
    return transformers.LlamaForCausalLM(config)


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """HF checkpoint directories: gpt2, llama (GQA, untied), llama_tied,
    llama_sharded (many safetensors shards + index) and bf16 llama."""
    root, dirs = tmp_path_factory.mktemp("hf"), {}
    for kind in ("gpt2", "llama", "llama_tied"):
        model = randomize(_hf_model(kind))
        dirs[kind] = root / kind
        model.save_pretrained(dirs[kind])
        base = model.transformer if kind == "gpt2" else model.model
        dirs[kind + "_base"] = root / (kind + "_base")
        base.save_pretrained(dirs[kind + "_base"])
        if kind == "llama":
            dirs["llama_sharded"] = root / "llama_sharded"
            model.save_pretrained(dirs["llama_sharded"], max_shard_size="20KB")
            dirs["llama_bf16"] = root / "llama_bf16"
            model.to(torch.bfloat16).save_pretrained(dirs["llama_bf16"])
    return dirs


@pytest.mark.parametrize(
    "kind", ["gpt2", "llama", "llama_tied", "llama_sharded", "llama_bf16"]
)
def test_causal_lm_logits_match(hf_dirs, kind):
    ids, mask = padded_batch(VOCAB)
    expected = hf_outputs(reference(hf_dirs[kind]), ids, mask)
    lm = GPTCausalLM.from_preset(hf_dirs[kind])
    assert isinstance(lm, GPTCausalLM)
    record(f"{kind} logits", our_outputs(lm, ids, mask), expected, mask)
    same = keras_transformers.from_preset(hf_dirs[kind])
    assert isinstance(same, GPTCausalLM)
    np.testing.assert_allclose(
        our_outputs(same, ids, mask)[mask], our_outputs(lm, ids, mask)[mask], atol=1e-6
    )


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_backbone_hidden_states_match(hf_dirs, kind):
    ids, mask = padded_batch(VOCAB)
    hf_model = reference(hf_dirs[kind])
    expected = hf_outputs(hf_model.base_model, ids, mask, base=True)
    backbone = GPTBackbone.from_preset(hf_dirs[kind])  # from the causal-LM checkpoint
    record(f"{kind} backbone", our_outputs(backbone, ids, mask), expected, mask)
    # A base-model checkpoint (GPT2Model / LlamaModel: no prefix, no head).
    base = keras_transformers.from_preset(hf_dirs[kind + "_base"])
    assert isinstance(base, GPTBackbone)
    record(f"{kind} base checkpoint", our_outputs(base, ids, mask), expected, mask)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_greedy_generation_matches(hf_dirs, kind):
    prompt = np.array([[5, 17, 42, 99, 3]], "int32")
    assert_greedy_matches(hf_dirs[kind], prompt, max_new_tokens=8)


def test_config_mapping(hf_dirs):
    gpt2 = hf_preset_data(hf_dirs["gpt2"])
    assert gpt2["family"] == "gpt" and gpt2["class_name"] == "GPTCausalLM"
    assert gpt2["config"]["intermediate_dim"] == 128  # n_inner None -> 4 * n_embd
    assert gpt2["config"]["activation"] == "gelu_approximate"
    assert gpt2["config"]["pad_token_id"] == 1  # pad defaults to eos
    llama = keras_transformers.load_config(hf_dirs["llama"])
    assert (llama.num_kv_heads, llama.rope_max_wavelength, llama.tie_embeddings) == (
        2,
        500.0,
        False,
    )
    assert hf_preset_data(hf_dirs["llama_base"])["class_name"] == "GPTBackbone"


def test_overrides_and_no_weights(hf_dirs, tmp_path):
    ids, mask = padded_batch(VOCAB)
    expected = hf_outputs(reference(hf_dirs["gpt2"]), ids, mask)
    short = GPTCausalLM.from_preset(
        hf_dirs["gpt2"], max_sequence_length=32
    )  # table cut to 32 rows
    assert short.backbone.position_embedding.embeddings.shape == (32, 32)
    np.testing.assert_allclose(
        our_outputs(short, ids, mask)[mask], expected[mask], atol=TOLERANCE
    )
    shutil.copy(hf_dirs["gpt2"] / "config.json", tmp_path / "config.json")
    random = GPTCausalLM.from_preset(tmp_path, load_weights=False)
    assert random.config.num_layers == 2


def _random_keras_lm(**fields):
    config = TransformerConfig(
        vocabulary_size=VOCAB,
        num_layers=2,
        hidden_dim=32,
        num_heads=4,
        intermediate_dim=64,
        max_sequence_length=64,
        bos_token_id=0,
        eos_token_id=1,
        **fields,
    )
    lm = GPTCausalLM(config=config)
    randomize_weights(lm)
    return lm


LLAMA_FIELDS = dict(
    num_kv_heads=2,
    norm_type="rms",
    position_embedding="rotary",
    activation="silu",
    gated_feed_forward=True,
    use_bias=True,
    tie_embeddings=False,
    rope_scaling_factor=2.0,
)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_export_round_trip(tmp_path, kind):
    fields = dict(activation="gelu_approximate") if kind == "gpt2" else LLAMA_FIELDS
    lm = _random_keras_lm(**fields)
    export_hf(lm, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == kind and saved["torch_dtype"] == "float32"
    ids, mask = padded_batch(VOCAB)
    ours = our_outputs(lm, ids, mask)
    record(f"{kind} export", ours, hf_outputs(reference(tmp_path), ids, mask), mask)
    back = keras_transformers.from_preset(tmp_path)
    np.testing.assert_allclose(
        our_outputs(back, ids, mask)[mask], ours[mask], atol=1e-6
    )


def test_export_rejects_unrepresentable(tmp_path):
    lm = _random_keras_lm(sliding_window=8, **LLAMA_FIELDS)
    with pytest.raises(ValueError, match="sliding_window"):
        export_hf(lm, tmp_path)


@pytest.mark.parametrize(
    "kind, changes, match",
    [
        (
            "gpt2",
            dict(scale_attn_by_inverse_layer_idx=True),
            "scale_attn_by_inverse_layer_idx",
        ),
        ("gpt2", dict(add_cross_attention=True), "add_cross_attention"),
        ("gpt2", dict(activation_function="gelu_10"), "gelu_10"),
        (
            "gpt2",
            dict(model_type="gpt3"),
            "Supported model types: \\['gemma', 'gemma2', 'gemma3_text', 'gemma4', "
            "'gemma4_text', 'gpt2', 'gpt_neox', "
            "'llama', 'mistral', 'olmo2', 'phi3', 'qwen2', 'qwen3', 'qwen3_5', "
            "'qwen3_5_text', 'smollm3'\\] \\(gpt\\)",
        ),
        ("llama", dict(hidden_act="gelu"), "hidden_act"),
        ("llama", dict(attention_bias=True), "mlp_bias"),
        (
            "llama",
            dict(rope_parameters={"rope_type": "llama3", "factor": 8.0}),
            "'llama3' needs low_freq_factor, high_freq_factor",
        ),
        (
            "llama",
            dict(rope_parameters={"rope_type": "dynamic_ntk", "factor": 2.0}),
            "'dynamic_ntk' is not supported; supported: default, linear, llama3",
        ),
        ("gpt2", dict(n_inner=64), "transformer.h.0.mlp.c_fc.weight"),
        ("llama", dict(num_hidden_layers=3), "model.layers.2"),
        (
            "llama",
            dict(tie_word_embeddings=True, vocab_size=VOCAB + 1),
            "model.embed_tokens.weight",
        ),
    ],
)
def test_errors_name_the_problem(hf_dirs, tmp_path, kind, changes, match):
    path = edited_hf_dir(hf_dirs[kind], tmp_path / "edited", **changes)
    with pytest.raises(ValueError, match=match):
        keras_transformers.from_preset(path)


def test_missing_and_pickled_weights(hf_dirs, tmp_path):
    shutil.copy(hf_dirs["gpt2"] / "config.json", tmp_path / "config.json")
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        GPTCausalLM.from_preset(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"never unpickled")
    with pytest.raises(FileNotFoundError, match="safe_serialization=True"):
        GPTCausalLM.from_preset(tmp_path)


def test_untied_head_required_for_causal_lm(hf_dirs):
    with pytest.raises(ValueError, match="lm_head.weight"):
        GPTCausalLM.from_preset(hf_dirs["llama_base"])


def test_tokenizer_travels_with_the_model(hf_dirs, tmp_path):
    pytest.importorskip("keras_transformers.tokenizer")
    path = shutil.copytree(hf_dirs["gpt2"], tmp_path / "with_tokenizer")
    vocab = {chr(c): i for i, c in enumerate(range(33, 133))}
    vocab.update({'!"': 100, "<|endoftext|>": 101})
    (path / "vocab.json").write_text(json.dumps(vocab))
    (path / "merges.txt").write_text('#version: 0.2\n! "\n')
    lm = keras_transformers.from_preset(path)
    assert list(lm.tokenizer.encode('!"#')) == [100, 2]
    export_hf(lm, tmp_path / "exported")
    assert (tmp_path / "exported" / "merges.txt").exists()
    again = keras_transformers.from_preset(tmp_path / "exported")
    assert list(again.tokenizer.encode('!"#')) == [100, 2]


def test_a_converter_declared_outside_the_package(hf_dirs, tmp_path):
    """A model type is one `Converter` registered from anywhere: loading and
    export_hf call only its declared fields."""
    import dataclasses

    from keras_transformers import registry
    from keras_transformers.convert.protocol import Converter

    llama = registry.converter("llama")
    assert all(isinstance(c, Converter) for c in registry.converters().values())

    def export(model, model_type):
        hf, tensors = llama.export(model, model_type)
        return {**hf, "model_type": model_type}, tensors

    fork = dataclasses.replace(llama, model_type="llama_fork", export=export)
    registry.register_converter(fork)
    try:
        directory = edited_hf_dir(
            hf_dirs["llama"], tmp_path / "in", model_type="llama_fork"
        )
        lm = keras_transformers.from_preset(directory)
        export_hf(lm, tmp_path / "out", model_type="llama_fork")
        saved = json.loads((tmp_path / "out" / "config.json").read_text())
        assert saved["model_type"] == "llama_fork"
    finally:
        registry._CONVERTERS.pop("llama_fork")
    with pytest.raises(ValueError, match="'llama_fork' is not supported"):
        keras_transformers.from_preset(directory)
