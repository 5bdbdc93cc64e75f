"""Hugging Face hub handles (`hf://org/name[@revision]`): offline from a hub
cache laid out by hand, downloads from a local stand-in for the hub (only
the files a model needs), and every error naming its fix. No network."""

import json
import shutil

import keras
import numpy as np
import pytest
from fake_hub import FakeHub

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
huggingface_hub = pytest.importorskip("huggingface_hub")

from huggingface_hub import constants  # noqa: E402

import keras_transformers  # noqa: E402
from keras_transformers import hub  # noqa: E402
from keras_transformers.models import (  # noqa: E402
    BertClassifier,
    GPTBackbone,
    GPTCausalLM,
)

TOKENS = np.array([[3, 17, 42, 5, 99, 8, 1, 64]], dtype="int32")
LLAMA = dict(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)
GPT2 = dict(
    vocab_size=128,
    n_embd=32,
    n_layer=2,
    n_head=4,
    n_positions=64,
    bos_token_id=0,
    eos_token_id=1,
)
BERT = dict(
    vocab_size=128,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
    num_labels=3,
)
# Beside the model's files: never to be fetched.
UNWANTED = {
    "pytorch_model.bin": b"not a pickle, and never to be read",
    "onnx/model.onnx": b"\0" * (2 << 20),
    "consolidated.safetensors": b"\0" * 64,
    "README.md": b"# tiny\n",
}


def _save(model, path):
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.1)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Hugging Face directories: llama (with a tokenizer), llama in
    shards, gpt2."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    root = tmp_path_factory.mktemp("hf")
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))
    dirs = {"llama": _save(llama, root / "llama")}
    vocab = {w: i for i, w in enumerate(["<unk>", "hello", "hub", "world"])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>"
    ).save_pretrained(dirs["llama"])
    dirs["sharded"] = root / "sharded"
    llama.save_pretrained(dirs["sharded"], max_shard_size="40KB")
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2))
    dirs["gpt2"] = _save(gpt2, root / "gpt2")
    bert = transformers.BertForSequenceClassification(transformers.BertConfig(**BERT))
    dirs["bert"] = _save(bert, root / "bert")
    return dirs


def _files(directory):
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in directory.rglob("*")
        if p.is_file()
    }


def _logits(model):
    return keras.ops.convert_to_numpy(model(TOKENS))


def _same(handle, directory, cls=GPTCausalLM):
    expected = _logits(cls.from_preset(str(directory)))
    np.testing.assert_allclose(_logits(cls.from_preset(handle)), expected, atol=1e-6)


def _use(monkeypatch, cache, endpoint="http://127.0.0.1:9", offline=False):
    """Points `huggingface_hub` at `endpoint` and `cache`, with no token.
    It reads these variables at import, so its constants change too."""
    for name, value in (
        ("HF_ENDPOINT", endpoint),
        ("HF_HUB_CACHE", str(cache)),
        ("HF_HUB_OFFLINE", "1" if offline else "0"),
    ):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    template = endpoint + "/{repo_id}/resolve/{revision}/{filename}"
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(cache / "no-token"))
    harnesses = str(cache / "agent_harnesses.json")  # a registry it may fetch
    monkeypatch.setattr(constants, "AGENT_HARNESSES_PATH", harnesses, raising=False)


@pytest.fixture
def fake_hub(tmp_path, monkeypatch, checkpoints):
    server = FakeHub(lifetime=120).start()
    _use(monkeypatch, tmp_path / "cache", endpoint=server.url)
    server.add("org/tiny-llama", {**_files(checkpoints["llama"]), **UNWANTED})
    server.tag("org/tiny-llama", "v1", _files(checkpoints["gpt2"]))
    server.add("org/sharded", {**_files(checkpoints["sharded"]), **UNWANTED})
    server.add("org/gated", _files(checkpoints["gpt2"]), gated=True)
    server.add("org/bert", _files(checkpoints["bert"]))
    server.add(
        "org/pickled",
        {
            "config.json": _files(checkpoints["gpt2"])["config.json"],
            "pytorch_model.bin": b"x",
        },
    )
    config = json.loads(_files(checkpoints["gpt2"])["config.json"])
    whisper = json.dumps({**config, "model_type": "whisper"}).encode()
    server.add("org/whisper", {"config.json": whisper, "model.safetensors": b"\0" * 64})
    server.add("org/no-config", {"README.md": b"hi"})
    yield server
    server.stop()


# -- offline, from a cache laid out as Hugging Face lays it out -------------


def _hand_built_cache(root, checkpoints):
    """`models--org--tiny/refs/{main,v1}` and `snapshots/<commit>/`."""
    repo = root / "models--org--tiny"
    commits = {"main": "a" * 40, "v1": "b" * 40}
    for ref, kind in (("main", "llama"), ("v1", "gpt2")):
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commits[ref])
        shutil.copytree(checkpoints[kind], repo / "snapshots" / commits[ref])
    return commits


def test_offline_resolution_from_a_hand_built_cache(tmp_path, monkeypatch, checkpoints):
    cache = tmp_path / "cache"
    commits = _hand_built_cache(cache, checkpoints)
    _use(monkeypatch, cache, offline=True)
    snapshot = hub.resolve("hf://org/tiny")
    assert snapshot == cache / "models--org--tiny" / "snapshots" / commits["main"]
    _same("hf://org/tiny", checkpoints["llama"])
    expected = GPTCausalLM.from_preset(str(checkpoints["gpt2"]))
    for revision in ("v1", commits["v1"]):
        model = keras_transformers.from_preset(f"hf://org/tiny@{revision}")
        assert isinstance(model, GPTCausalLM)
        np.testing.assert_allclose(_logits(model), _logits(expected), atol=1e-6)
    assert keras_transformers.load_config(
        "hf://org/tiny"
    ) == keras_transformers.load_config(str(checkpoints["llama"]))


def test_offline_with_nothing_cached_says_so_and_where(
    tmp_path, monkeypatch, checkpoints
):
    cache = tmp_path / "cache"
    _hand_built_cache(cache, checkpoints)
    _use(monkeypatch, cache, offline=True)
    for handle in ("hf://org/absent", "hf://org/tiny@v2"):
        with pytest.raises(hub.HubAccessError, match="offline") as error:
            GPTCausalLM.from_preset(handle)
        assert str(cache) in str(error.value) and "HF_HUB_OFFLINE" in str(error.value)
        assert isinstance(error.value, FileNotFoundError)


def test_unreachable_hub_with_nothing_cached(tmp_path, monkeypatch):
    _use(monkeypatch, tmp_path / "cache", endpoint="http://127.0.0.1:9")
    with pytest.raises(hub.HubAccessError, match="could not be reached") as error:
        hub.resolve("hf://org/tiny")
    assert str(tmp_path / "cache") in str(error.value)


def test_malformed_handles():
    for handle in ("hf://", "hf://org/", "hf://a/b/c", "hf://org/name@"):
        with pytest.raises(hub.HubContentError, match="Malformed"):
            hub.resolve(handle)
    assert hub.parse_handle("hf://org/name@refs/pr/3") == ("org/name", "refs/pr/3")


# -- through a local stand-in for the hub ------------------------------------


def test_download_fetches_only_what_the_model_needs(fake_hub, checkpoints, monkeypatch):
    model = keras_transformers.from_preset("hf://org/tiny-llama")
    expected = GPTCausalLM.from_preset(str(checkpoints["llama"]))
    np.testing.assert_allclose(_logits(model), _logits(expected), atol=1e-6)
    wanted = {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    }
    assert wanted <= set(_files(checkpoints["llama"]))
    assert fake_hub.fetched() <= set(_files(checkpoints["llama"]))
    assert wanted <= fake_hub.fetched()
    assert not fake_hub.fetched() & set(UNWANTED)
    snapshot = hub.resolve("hf://org/tiny-llama")
    assert not {"pytorch_model.bin", "onnx", "README.md"} & {
        p.name for p in snapshot.iterdir()
    }
    assert (snapshot / "tokenizer.json").is_file()
    assert model.tokenizer.encode("hello hub") == [1, 2]
    # The cache now serves the same handle offline.
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    fake_hub.requests.clear()
    _same("hf://org/tiny-llama", checkpoints["llama"])
    assert fake_hub.requests == []


def test_download_at_a_revision(fake_hub, checkpoints):
    _same("hf://org/tiny-llama@v1", checkpoints["gpt2"])
    commit = fake_hub.repos["org/tiny-llama"]["refs"]["v1"]
    fake_hub.tag("org/tiny-llama", "refs/pr/1", _files(checkpoints["gpt2"]))
    assert hub.resolve("hf://org/tiny-llama@refs/pr/1").name == commit
    assert hub.resolve(f"hf://org/tiny-llama@{commit}").name == commit
    assert "model.safetensors" in fake_hub.fetched()


def test_sharded_download_and_config_only(fake_hub, checkpoints):
    config = keras_transformers.load_config("hf://org/sharded")
    assert config == keras_transformers.load_config(str(checkpoints["sharded"]))
    assert not any(name.endswith(".safetensors") for name in fake_hub.fetched())
    _same("hf://org/sharded", checkpoints["sharded"])
    shards = {n for n in _files(checkpoints["sharded"]) if n.endswith(".safetensors")}
    assert len(shards) > 1 and shards <= fake_hub.fetched()
    assert "model.safetensors.index.json" in fake_hub.fetched()
    assert "consolidated.safetensors" not in fake_hub.fetched()


def test_other_classes_and_families(fake_hub, checkpoints):
    _same("hf://org/tiny-llama", checkpoints["llama"], cls=GPTBackbone)
    model = BertClassifier.from_preset("hf://org/bert")
    assert model.num_classes == 3
    inputs = {"token_ids": TOKENS, "padding_mask": np.ones_like(TOKENS)}
    expected = BertClassifier.from_preset(str(checkpoints["bert"]))
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(model(inputs)),
        keras.ops.convert_to_numpy(expected(inputs)),
        atol=1e-6,
    )


def test_a_repository_written_by_save_to_preset(fake_hub, tmp_path):
    model = keras_transformers.from_preset("gpt2_tiny")
    model.save_to_preset(tmp_path / "saved")
    fake_hub.add("org/saved", {**_files(tmp_path / "saved"), **UNWANTED})
    loaded = keras_transformers.from_preset("hf://org/saved")
    assert type(loaded) is type(model)
    np.testing.assert_allclose(_logits(loaded), _logits(model), atol=1e-6)
    assert "model.weights.h5" in fake_hub.fetched()
    assert not fake_hub.fetched() & set(UNWANTED)


def test_gated_repository_needs_a_token(fake_hub, checkpoints, monkeypatch):
    with pytest.raises(hub.HubAccessError, match="gated") as error:
        GPTCausalLM.from_preset("hf://org/gated")
    assert "HF_TOKEN" in str(error.value) and "terms" in str(error.value)
    monkeypatch.setenv("HF_TOKEN", fake_hub.token)
    _same("hf://org/gated", checkpoints["gpt2"])


@pytest.mark.parametrize(
    "handle, error, words",
    [
        (
            "hf://org/missing",
            hub.HubAccessError,
            ["'org/missing' not found", "spelling", "HF_TOKEN"],
        ),
        ("hf://org/tiny-llama@nope", hub.HubAccessError, ["revision 'nope' not found"]),
        (
            "hf://org/pickled",
            hub.HubContentError,
            ["pickle", "never", "safe_serialization=True", "refs/pr/"],
        ),
        (
            "hf://org/whisper",
            hub.HubContentError,
            ["'whisper' is not supported", "llama", "gpt2"],
        ),
        ("hf://org/no-config", hub.HubContentError, ["no config.json"]),
    ],
)
def test_errors_name_the_problem_and_the_fix(fake_hub, handle, error, words):
    with pytest.raises(error) as raised:
        keras_transformers.from_preset(handle)
    for word in words:
        assert word in str(raised.value)
    assert not fake_hub.fetched() - {"config.json"}  # failed before any weights


def test_error_classes():
    assert issubclass(hub.HubAccessError, (hub.HubError, FileNotFoundError))
    assert issubclass(hub.HubContentError, (hub.HubError, ValueError))


def test_command_line_generate_through_the_hub(fake_hub, capsys):
    from keras_transformers import cli

    argv = ["generate", "hf://org/tiny-llama@main", "--prompt", "hello hub"]
    assert cli.main(argv + ["--max-new-tokens", "3", "--sampler", "greedy"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("hello hub")
    assert "config.json" in fake_hub.fetched()
    assert not fake_hub.fetched() & set(UNWANTED)
