"""Damaged Hugging Face checkpoints fail with errors that name the file and
the tensor: truncated or foreign files, tensors of the wrong shape or dtype,
missing and extra tensors, broken shard indexes, and a `model_type` that
disagrees with the weights (the list is in docs/reliability.md)."""

import json
import shutil

import numpy as np
import pytest
from contracts import edited_hf_dir

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

import keras_transformers  # noqa: E402

EMBED = "model.embed_tokens.weight"
QUERY = "model.layers.0.self_attn.q_proj.weight"
LLAMA = dict(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=32,
    bos_token_id=0,
    eos_token_id=1,
)


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """A tiny Llama checkpoint saved by `transformers`: one file, and sharded
    (several safetensors shards + `model.safetensors.index.json`)."""
    root = tmp_path_factory.mktemp("corrupt")
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))
    model.save_pretrained(root / "single")
    model.save_pretrained(root / "sharded", max_shard_size="4KB")
    gpt2 = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            vocab_size=64,
            n_embd=16,
            n_layer=1,
            n_head=2,
            bos_token_id=0,
            eos_token_id=1,
        )
    )
    gpt2.save_pretrained(root / "gpt2")
    return root


def _copy(hf_dirs, kind, tmp_path):
    return shutil.copytree(hf_dirs / kind, tmp_path / kind)


def _rewrite(path, change):
    """Rewrites `path/model.safetensors` with `change(tensors)` applied."""
    file = path / "model.safetensors"
    tensors = safetensors_numpy.load_file(str(file))
    change(tensors)
    safetensors_numpy.save_file(tensors, str(file), metadata={"format": "pt"})
    return path


def _index(path):
    return json.loads((path / "model.safetensors.index.json").read_text())


def _shards(path):
    return sorted(set(_index(path)["weight_map"].values()))


@pytest.mark.parametrize(
    "cut",
    [
        pytest.param(lambda data: data[:-7], id="data_cut_short"),
        pytest.param(lambda data: data[:20], id="header_cut_short"),
        pytest.param(lambda data: b"", id="empty_file"),
        pytest.param(lambda data: b"<html>404 Not Found</html>", id="not_safetensors"),
    ],
)
def test_truncated_file_names_the_file(hf_dirs, tmp_path, cut):
    path = _copy(hf_dirs, "single", tmp_path)
    file = path / "model.safetensors"
    file.write_bytes(cut(file.read_bytes()))
    with pytest.raises(
        ValueError, match="model.safetensors is not a valid safetensors"
    ):
        keras_transformers.from_preset(path)


def test_truncated_shard_names_the_shard(hf_dirs, tmp_path):
    path = _copy(hf_dirs, "sharded", tmp_path)
    shard = path / _shards(path)[-1]
    shard.write_bytes(shard.read_bytes()[:-3])
    with pytest.raises(ValueError, match=f"{shard.name} is not a valid safetensors"):
        keras_transformers.from_preset(path)


def test_index_points_at_missing_shard(hf_dirs, tmp_path):
    path = _copy(hf_dirs, "sharded", tmp_path)
    missing = _shards(path)[0]
    (path / missing).unlink()
    with pytest.raises(FileNotFoundError, match=f"index.json names shard.*{missing}"):
        keras_transformers.from_preset(path)


def test_index_and_shards_disagree(hf_dirs, tmp_path):
    path = _copy(hf_dirs, "sharded", tmp_path)
    index = _index(path)
    shards = _shards(path)
    wrong = next(s for s in shards if s != index["weight_map"][EMBED])
    index["weight_map"][EMBED] = wrong
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=f"puts tensor.*{EMBED}.*in .*{wrong}"):
        keras_transformers.from_preset(path)


@pytest.mark.parametrize(
    "text",
    ["{not json", json.dumps({"metadata": {}}), json.dumps([1, 2])],
    ids=["not_json", "no_weight_map", "a_list"],
)
def test_broken_index_names_the_index(hf_dirs, tmp_path, text):
    path = _copy(hf_dirs, "sharded", tmp_path)
    (path / "model.safetensors.index.json").write_text(text)
    with pytest.raises(ValueError, match="index.json is not a valid safetensors index"):
        keras_transformers.from_preset(path)


def test_wrong_shape_names_tensor_and_file(hf_dirs, tmp_path):
    path = _copy(hf_dirs, "single", tmp_path)
    _rewrite(path, lambda t: t.update({QUERY: t[QUERY][:, :8].copy()}))
    with pytest.raises(
        ValueError, match=f"{QUERY}.*shape.*stored in .*model.safetensors"
    ):
        keras_transformers.from_preset(path)


@pytest.mark.parametrize("dtype", ["int64", "int8", "bool"])
def test_wrong_dtype_names_tensor_and_file(hf_dirs, tmp_path, dtype):
    path = _copy(hf_dirs, "single", tmp_path)
    _rewrite(path, lambda t: t.update({EMBED: t[EMBED].astype(dtype)}))
    with pytest.raises(ValueError, match=f"{EMBED}.*dtype {dtype}.*model.safetensors"):
        keras_transformers.from_preset(path)


def test_missing_tensor_names_tensor_and_file(hf_dirs, tmp_path):
    path = _copy(hf_dirs, "single", tmp_path)
    _rewrite(path, lambda t: t.pop(QUERY))
    with pytest.raises(ValueError, match=f"{QUERY}.*missing from .*model.safetensors"):
        keras_transformers.from_preset(path)


def test_extra_tensors_are_listed_in_a_warning(hf_dirs, tmp_path):
    path = _copy(hf_dirs, "single", tmp_path)
    extra = {"model.layers.7.extra.weight", "vision_tower.proj.weight"}
    _rewrite(path, lambda t: t.update({n: np.ones(3, "float32") for n in extra}))
    with pytest.warns(UserWarning, match="2 tensor.*model.safetensors.*not used") as w:
        keras_transformers.from_preset(path)
    message = str(w[0].message)
    assert all(name in message for name in extra)


@pytest.mark.parametrize(
    "kind, model_type",
    [("single", "gpt2"), ("single", "bert"), ("gpt2", "llama")],
)
def test_model_type_disagreeing_with_weights(hf_dirs, tmp_path, kind, model_type):
    path = edited_hf_dir(hf_dirs / kind, tmp_path / "edited", model_type=model_type)
    with pytest.raises(ValueError, match=f"not look like a {model_type} checkpoint"):
        keras_transformers.from_preset(path)


def test_broken_config_json_names_the_file(hf_dirs, tmp_path):
    path = _copy(hf_dirs, "single", tmp_path)
    (path / "config.json").write_text('{"model_type": "llama", ')
    with pytest.raises(ValueError, match="config.json is not valid JSON"):
        keras_transformers.from_preset(path)
