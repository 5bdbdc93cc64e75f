"""sentence-transformers directories load as `TextEmbedder`s whose `encode`
equals `SentenceTransformer.encode` (1e-5): tiny random-init references
built with sentence-transformers' own modules and saved by it (bge-, e5-,
gte-, XLM-R- and ModernBERT-style, current and older file layouts), and the real
all-MiniLM-L6-v2. Pooling modes against sentence-transformers' `Pooling`,
the settings through `save_to_preset`, `hf://` handles, and the errors."""

import json
import shutil
import string

import keras
import numpy as np
import pytest
from contracts import run_layer_test
from fake_hub import FakeHub

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
st = pytest.importorskip("sentence_transformers")
huggingface_hub = pytest.importorskip("huggingface_hub")

from hf_parity import randomize, record  # noqa: E402
from test_hub import _files, _use  # noqa: E402

import keras_transformers  # noqa: E402
from keras_transformers.layers import TokenPooling  # noqa: E402
from keras_transformers.layers.pooling import POOLING_MODES  # noqa: E402
from keras_transformers.models import BertBackbone, TextEmbedder  # noqa: E402

st_models = pytest.importorskip("sentence_transformers.models")  # every version has it

TEXTS = [
    "The cat sat on the mat.",
    "a quick brown fox jumps over the lazy dog while the sun sets over the sea",
    "Hi!",
    "sentence embeddings",
]
SMALL = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
)
WORDS = ["the", "cat", "sat", "on", "mat", "fox", "sun", "over", "sea", "dog"]
# name -> (Hugging Face model, pooling mode, Normalize module, older layout)
KINDS = {
    "bge": ("bert", "cls", True, False),
    "e5": ("bert", "mean", False, False),
    "gte": ("bert", "mean", False, True),
    "xlmr": ("xlm-roberta", "mean", False, False),
    "modernbert": ("modernbert", "mean", True, False),
}


def _bert(path):
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    letters = list(string.ascii_lowercase + ".,!?")
    vocab = specials + WORDS + letters + ["##" + c for c in letters]
    path.mkdir()
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tokenizer = transformers.BertTokenizerFast(vocab_file=str(path / "vocab.txt"))
    config = transformers.BertConfig(vocab_size=len(vocab), **SMALL)
    return transformers.BertModel(config), tokenizer


def _xlm_roberta(path):
    pieces = [(t, 0.0) for t in ("<s>", "<pad>", "</s>", "<unk>")]
    pieces += [("▁" + w, -1.0) for w in WORDS] + [("▁", -2.0)]
    pieces += [(c, -3.0) for c in string.ascii_letters + ".,!?"]
    pieces += [("<mask>", 0.0)]
    tokenizer = transformers.XLMRobertaTokenizer(vocab=pieces)
    config = transformers.XLMRobertaConfig(
        vocab_size=len(pieces),
        pad_token_id=1,
        **{**SMALL, "max_position_embeddings": 66},
    )
    return transformers.XLMRobertaModel(config), tokenizer


def _modernbert(path):
    """A ModernBERT (alternating local / global attention, window 8) with
    `_bert`'s WordPiece vocabulary and its special ids."""
    _, tokenizer = _bert(path)
    config = transformers.ModernBertConfig(
        vocab_size=tokenizer.vocab_size,
        **{**SMALL, "num_hidden_layers": 3},
        global_attn_every_n_layers=2,
        local_attention=8,
        pad_token_id=0,
        cls_token_id=2,
        sep_token_id=3,
        bos_token_id=2,
        eos_token_id=3,
    )
    return transformers.ModernBertModel(config), tokenizer


BUILDERS = {"bert": _bert, "xlm-roberta": _xlm_roberta, "modernbert": _modernbert}


def _older_layout(directory):
    """`directory` rewritten as sentence-transformers 2 saved models: the
    transformer in `0_Transformer/`, `pooling_mode_*` flags, old type names."""
    inner = directory / "0_Transformer"
    inner.mkdir()
    for path in list(directory.iterdir()):
        if path.is_file() and path.name not in ("modules.json", "README.md"):
            shutil.move(str(path), inner / path.name)
    (inner / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": 12, "do_lower_case": False})
    )
    modules = json.loads((directory / "modules.json").read_text())
    for module in modules:
        name = module["type"].rsplit(".", 1)[-1]
        module["type"] = f"sentence_transformers.models.{name}"
    modules[0]["path"] = "0_Transformer"
    (directory / "modules.json").write_text(json.dumps(modules))
    pooling = directory / "1_Pooling" / "config.json"
    mode = json.loads(pooling.read_text())["pooling_mode"]
    flags = {f"pooling_mode_{m}": m == mode for m in ("cls_token", "max_tokens")}
    flags["pooling_mode_mean_tokens"] = mode == "mean"
    pooling.write_text(json.dumps({"word_embedding_dimension": 32, **flags}))


@pytest.fixture(scope="session")
def st_dirs(tmp_path_factory):
    """`{kind: directory}` written by `SentenceTransformer.save`."""
    root = tmp_path_factory.mktemp("sentence_transformers")
    out = {}
    for name, (model_type, mode, normalize, older) in KINDS.items():
        hf = root / f"{name}_hf"
        model, tokenizer = BUILDERS[model_type](hf)
        shutil.rmtree(hf, ignore_errors=True)
        torch.manual_seed(0)
        randomize(model).save_pretrained(hf)
        tokenizer.save_pretrained(hf)
        transformer = st_models.Transformer(str(hf), max_seq_length=16)
        modules = [transformer, st_models.Pooling(32, pooling_mode=mode)]
        modules += [st_models.Normalize()] if normalize else []
        out[name] = root / name
        st.SentenceTransformer(modules=modules, device="cpu").save(str(out[name]))
        if older:
            _older_layout(out[name])
    return out


def _load(handle, cls=keras_transformers, compiled=False, **overrides):
    """`cls.from_preset(handle)`; its `encode` runs the model uncompiled
    unless `compiled` (XLA compiles cost seconds per model on 2 cores)."""
    embedder = cls.from_preset(str(handle), **overrides)
    if not compiled:  # else Keras' default: XLA on JAX and TensorFlow
        embedder.jit_compile = False
    return embedder


def _reference(directory, texts=TEXTS):
    model = st.SentenceTransformer(str(directory), device="cpu")
    return model.encode(texts, convert_to_numpy=True)


@pytest.mark.parametrize("kind", list(KINDS))
def test_encode_equals_sentence_transformers(st_dirs, kind):
    embedder = _load(st_dirs[kind], compiled=kind == "bge")  # one compiled
    assert isinstance(embedder, TextEmbedder)
    _, mode, normalize, older = KINDS[kind]
    assert (embedder.pooling, embedder.normalize) == (mode, normalize)
    assert embedder.max_length == (12 if older else 16)
    ours = embedder.encode(TEXTS, batch_size=8)
    assert ours.shape == (len(TEXTS), 32) and ours.dtype == np.float32
    record(f"sentence-transformers {kind}", ours, _reference(st_dirs[kind]), None, 1e-5)


def test_real_minilm_equals_sentence_transformers(minilm_dir):
    embedder = _load(minilm_dir, TextEmbedder)
    assert (embedder.pooling, embedder.normalize, embedder.max_length) == (
        "mean",
        True,
        256,
    )
    texts = [*TEXTS, "word " * 300]  # past max_seq_length: truncated as there
    ours = embedder.encode(texts, batch_size=8)
    record("all-MiniLM-L6-v2", ours, _reference(minilm_dir, texts), None, 1e-5)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-6)


def test_settings_save_and_load(st_dirs, tmp_path):
    # max_length 12, gte's: the encoder's eager JAX programs are gte's.
    embedder = _load(
        st_dirs["e5"], pooling=["cls", "max"], normalize=True, max_length=12
    )
    embedder.save_to_preset(tmp_path / "saved")
    task = json.loads((tmp_path / "saved" / "config.json").read_text())["task"]
    assert task == {
        "pooling": ["cls", "max"],
        "normalize": True,
        "max_length": 12,
        "lowercase": False,
    }
    loaded = _load(tmp_path / "saved")
    assert isinstance(loaded, TextEmbedder) and loaded.embedding_dim == 64
    assert (loaded.pooling, loaded.normalize, loaded.max_length) == (
        ["cls", "max"],
        True,
        12,
    )
    np.testing.assert_allclose(
        loaded.encode(TEXTS, batch_size=8),
        embedder.encode(TEXTS, batch_size=8),
        atol=1e-6,
    )


def test_other_classes_load_the_transformer(st_dirs):
    backbone = BertBackbone.from_preset(str(st_dirs["gte"]), load_weights=False)
    assert isinstance(backbone, BertBackbone) and backbone.config.hidden_dim == 32


def test_hub_handles(st_dirs, tmp_path, monkeypatch):
    """Fetched through a local stand-in for the hub (the modules' settings
    with the model's files), then from the cache offline."""
    server = FakeHub(lifetime=120).start()
    try:
        _use(monkeypatch, tmp_path / "cache", endpoint=server.url)
        files = _files(st_dirs["bge"])
        server.add("org/tiny-bge", {**files, "onnx/model.onnx": b"\0" * 64})
        embedder = keras_transformers.from_preset("hf://org/tiny-bge")
        assert isinstance(embedder, TextEmbedder) and embedder.pooling == "cls"
        assert {"modules.json", "1_Pooling/config.json"} <= server.fetched()
        assert server.fetched() <= set(files)
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
        server.requests.clear()
        offline = TextEmbedder.from_preset("hf://org/tiny-bge", load_weights=False)
        assert offline.normalize and server.requests == []
    finally:
        server.stop()


@pytest.mark.parametrize("mode", [*POOLING_MODES, ("cls", "mean", "lasttoken")])
def test_pooling_equals_sentence_transformers_pooling(mode):
    rng = np.random.default_rng(0)
    hidden = rng.normal(size=(3, 6, 8)).astype("float32")
    mask = np.array([[1] * 6, [1] * 4 + [0] * 2, [1] + [0] * 5], "int32")
    pooling = st_models.Pooling(8, pooling_mode=mode)
    features = {
        "token_embeddings": torch.tensor(hidden),
        "attention_mask": torch.tensor(mask),
    }
    theirs = pooling(features)["sentence_embedding"].numpy()
    ours = keras.ops.convert_to_numpy(TokenPooling(mode)(hidden, mask))
    np.testing.assert_allclose(ours, theirs, atol=1e-6)


def test_pooling_layer_contract():
    hidden, mask = np.ones((2, 5, 8), "float32"), np.ones((2, 5), "int32")
    run_layer_test(
        TokenPooling,
        {"pooling": ["mean", "max"], "normalize": True},
        (hidden, mask),
        (2, 16),
    )


def _edited(src, dst, path, edit):
    shutil.copytree(src, dst)
    file = dst / path
    file.write_text(json.dumps(edit(json.loads(file.read_text()))))
    return dst


def test_errors_name_the_problem(st_dirs, tmp_path):
    dense = {
        "idx": 3,
        "name": "3",
        "path": "3_Dense",
        "type": "sentence_transformers.models.Dense",
    }
    bad = _edited(
        st_dirs["bge"], tmp_path / "dense", "modules.json", lambda m: m + [dense]
    )
    with pytest.raises(ValueError, match="sentence_transformers.models.Dense.*3_Dense"):
        keras_transformers.from_preset(str(bad))
    unknown = {"embedding_dimension": 32, "pooling_mode": "median"}
    bad = _edited(
        st_dirs["e5"], tmp_path / "mode", "1_Pooling/config.json", lambda _: unknown
    )
    with pytest.raises(ValueError, match="'median'.*Valid modes"):
        TextEmbedder.from_preset(str(bad))
    embedder = TextEmbedder.from_preset(str(st_dirs["bge"]), load_weights=False)
    with pytest.raises(ValueError, match="normalize=False"):
        embedder.encode(TEXTS, normalize_embeddings=False)
    with pytest.raises(ValueError, match="needs the model's tokenizer"):
        TextEmbedder(embedder.backbone).encode(TEXTS)
    with pytest.raises(ValueError, match="Unknown pooling mode 'sum'"):
        TextEmbedder(embedder.backbone, pooling="sum")
