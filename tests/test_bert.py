"""BERT family: shapes, padding invariance, heads, saving, fit."""

import keras
import numpy as np
import pytest
from contracts import (
    assert_close,
    compiled_forward,
    run_fit_test,
    run_saving_test,
    to_numpy,
)

import keras_transformers as kt
from keras_transformers.models import (
    BertBackbone,
    BertClassifier,
    BertMaskedLM,
    BertTokenClassifier,
)

SMALL = dict(
    vocabulary_size=100,
    num_layers=2,
    hidden_dim=32,
    num_heads=4,
    intermediate_dim=64,
    max_sequence_length=32,
    stacks="encoder",
    norm_position="post",
    norm_epsilon=1e-12,
    final_norm=False,
    embedding_norm=True,
    pooler=True,
    num_segments=2,
)


@pytest.fixture(scope="module")
def backbone():
    keras.utils.set_random_seed(0)
    return BertBackbone(**SMALL)


@pytest.fixture
def inputs(rng):
    ids = rng.integers(5, 100, size=(2, 10)).astype("int32")
    mask = np.ones_like(ids, bool)
    mask[1, 7:] = False
    segments = np.zeros_like(ids)
    segments[:, 5:] = 1
    return {"token_ids": ids, "segment_ids": segments, "padding_mask": mask}


def test_outputs_and_params(backbone, inputs):
    out = backbone(inputs)
    assert tuple(out["sequence_output"].shape) == (2, 10, 32)
    assert tuple(out["pooled_output"].shape) == (2, 32)
    assert backbone.count_params() == backbone.config.num_params()


def test_padding_invariance(backbone, inputs):
    changed = dict(inputs, token_ids=inputs["token_ids"].copy())
    changed["token_ids"][1, 7:] = 3
    a, b = to_numpy(backbone(inputs)), to_numpy(backbone(changed))
    assert_close(a["sequence_output"][1, :7], b["sequence_output"][1, :7], atol=1e-5)
    assert_close(a["pooled_output"], b["pooled_output"], atol=1e-5)


def test_bidirectional_and_segments_matter(backbone, inputs):
    changed = dict(inputs, token_ids=inputs["token_ids"].copy())
    changed["token_ids"][:, -1] = 4
    a, b = to_numpy(backbone(inputs)), to_numpy(backbone(changed))
    assert np.abs(a["sequence_output"][0, 0] - b["sequence_output"][0, 0]).max() > 1e-4
    flipped = dict(inputs, segment_ids=1 - inputs["segment_ids"])
    c = to_numpy(backbone(flipped))
    assert np.abs(a["sequence_output"] - c["sequence_output"]).max() > 1e-4


def test_masked_lm_predicts_only_masked_positions(backbone, inputs):
    lm = BertMaskedLM(backbone)
    positions = np.array([[1, 4, 0], [2, 3, 6]], "int32")
    logits = to_numpy(lm({**inputs, "mask_positions": positions}))
    assert logits.shape == (2, 3, 100)
    # Same as the head applied to every position, then gathered.
    every = np.tile(np.arange(10, dtype="int32"), (2, 1))
    full = to_numpy(lm({**inputs, "mask_positions": every}))
    assert_close(
        logits, np.take_along_axis(full, positions[:, :, None], axis=1), atol=1e-5
    )
    with pytest.raises(ValueError, match="mask_positions"):
        lm(inputs)


def test_masked_lm_fit_and_saving(inputs, tmp_path):
    lm = BertMaskedLM(**SMALL)
    x = {**inputs, "mask_positions": np.array([[1, 2], [3, 4]], "int32")}
    y = np.array([[7, 8], [9, 10]], "int32")
    run_fit_test(lm, x, y)
    run_saving_test(lm, x, str(tmp_path))


def test_classifier_fit_save_and_reload_head(backbone, inputs, tmp_path):
    clf = BertClassifier(backbone, num_classes=3)
    assert tuple(clf(inputs).shape) == (2, 3)
    run_fit_test(clf, inputs, np.array([0, 2]))
    reloaded = run_saving_test(clf, inputs, str(tmp_path))
    assert reloaded.num_classes == 3
    # A saved backbone loads as a classifier with a new head of any size.
    backbone.save_to_preset(str(tmp_path / "bb"))
    five = BertClassifier.from_preset(str(tmp_path / "bb"), num_classes=5)
    assert tuple(five(inputs).shape) == (2, 5)
    assert_close(five.backbone(inputs), backbone(inputs), atol=1e-6)


def test_token_classifier_ignores_padding_in_loss(backbone, inputs):
    from keras_transformers.training import (
        MaskedAccuracy,
        MaskedSparseCategoricalCrossentropy,
    )

    tagger = BertTokenClassifier(backbone, num_classes=4, classifier_dropout=0.0)
    assert tuple(tagger(inputs).shape) == (2, 10, 4)
    labels = np.where(inputs["padding_mask"], 1, -100).astype("int32")
    tagger.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=MaskedSparseCategoricalCrossentropy(ignore_class=-100),
        metrics=[MaskedAccuracy(ignore_class=-100)],
    )
    history = tagger.fit(inputs, labels, epochs=5, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert history.history["masked_accuracy"][-1] == 1.0


def test_presets_and_errors():
    assert kt.list_presets("bert")["bert_base"]["params"] == 109_482_240
    assert kt.load_config("bert_large").num_params() == 335_141_888
    with pytest.raises(ValueError, match="stacks"):
        BertBackbone(**{**SMALL, "stacks": "decoder"})
    with pytest.raises(ValueError, match="num_classes"):
        BertClassifier(**SMALL, num_classes=0)
    with pytest.raises(ValueError, match="gpt"):
        BertBackbone.from_preset("gpt2_tiny")


def test_tiny_preset_and_mixed_precision(inputs):
    keras.config.set_dtype_policy("mixed_bfloat16")
    # bert_tiny's layout with the inputs' 100-token vocabulary: its 30,522
    # rows (3.9M parameters, trained by the fit below) check nothing here.
    clf = BertClassifier.from_preset("bert_tiny", num_classes=2, vocabulary_size=100)
    assert clf.backbone.config.num_layers == 2 and clf.compute_dtype == "bfloat16"
    logits = to_numpy(keras.ops.cast(compiled_forward(clf, inputs), "float32"))
    assert np.isfinite(logits).all()
    run_fit_test(clf, inputs, np.array([0, 1]))


def test_reloading_with_new_dropout_keeps_trained_head(backbone, inputs, tmp_path):
    clf = BertClassifier(backbone, num_classes=3, classifier_dropout=0.1)
    clf.save_to_preset(str(tmp_path / "c"))
    again = BertClassifier.from_preset(str(tmp_path / "c"), classifier_dropout=0.3)
    assert again.classifier_dropout == 0.3
    assert_close(again(inputs), clf(inputs), atol=1e-6)


def test_fine_tuning_reaches_full_train_accuracy(backbone, inputs):
    clf = BertClassifier(
        backbone, num_classes=2, classifier_dropout=0.0, pooling="token"
    )
    clf.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    history = clf.fit(inputs, np.array([0, 1]), epochs=15, verbose=0)
    assert history.history["accuracy"][-1] == 1.0


def test_masked_lm_loss_ignores_unmasked_slots(inputs):
    """Prediction slots with sample weight 0 (padding) do not change the loss."""
    from keras_transformers.training import MaskedSparseCategoricalCrossentropy

    lm = BertMaskedLM(**SMALL)
    x = {**inputs, "mask_positions": np.array([[1, 2, 0], [3, 4, 0]], "int32")}
    weights = np.array([[1, 1, 0], [1, 1, 0]], "float32")
    loss = MaskedSparseCategoricalCrossentropy()
    logits = lm(x)
    a = loss(np.array([[7, 8, 9], [9, 10, 11]]), logits, sample_weight=weights)
    b = loss(np.array([[7, 8, 50], [9, 10, 60]]), logits, sample_weight=weights)
    assert_close(a, b, atol=1e-6)


def test_bad_bert_inputs(backbone, inputs):
    with pytest.raises(ValueError, match="num_segments"):
        backbone(dict(inputs, segment_ids=np.full_like(inputs["token_ids"], 2)))
    with pytest.raises(ValueError, match="padding_mask"):
        backbone(dict(inputs, padding_mask=np.ones((2, 3), bool)))
    clf = BertClassifier(backbone, num_classes=2)
    clf.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    with pytest.raises(ValueError, match="num_classes=2"):
        clf.fit(inputs, np.array([0, 2]), verbose=0)
    tagger = BertTokenClassifier(backbone, num_classes=3)
    tagger.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    with pytest.raises(ValueError, match="num_classes=3"):
        tagger.fit(inputs, np.full((2, 10), 3), verbose=0)
    with pytest.raises(ValueError, match="pooling"):
        BertClassifier(backbone, pooling="max")


def test_token_classifier_saving(backbone, inputs, tmp_path):
    tagger = BertTokenClassifier(backbone, num_classes=4)
    reloaded = run_saving_test(tagger, inputs, str(tmp_path))
    assert reloaded.num_classes == 4


def test_hugging_face_directory_brings_its_vocab(tmp_path):
    """A HF BERT directory with vocab.txt loads with a WordPiece preprocessor."""
    transformers = pytest.importorskip("transformers")
    from keras_transformers.preprocessing import BertPreprocessor, train_wordpiece

    tokenizer = train_wordpiece(
        ["a fine day", "a terrible day"] * 5, vocabulary_size=40
    )
    config = transformers.BertConfig(
        vocab_size=tokenizer.vocabulary_size,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
        architectures=["BertForSequenceClassification"],
        num_labels=3,
    )
    transformers.BertForSequenceClassification(config).save_pretrained(str(tmp_path))
    tokenizer.save_assets(str(tmp_path))
    clf = kt.from_preset(str(tmp_path))
    assert isinstance(clf, BertClassifier) and clf.num_classes == 3
    assert isinstance(clf.tokenizer, BertPreprocessor)
    assert tuple(clf(clf.tokenizer(["a fine day"])).shape) == (1, 3)
