"""Hugging Face BERT conversion: sequence / pooled outputs, masked-LM,
classifier and token-classifier logits match `transformers` (torch, float32,
eager attention) on tiny random-init models; export round-trips; errors
name the problem."""

import json
import shutil

import keras
import numpy as np
import pytest
from contracts import edited_hf_dir, randomize_weights

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from hf_parity import randomize  # noqa: E402

import keras_transformers  # noqa: E402
from keras_transformers import TransformerConfig  # noqa: E402
from keras_transformers.convert import export_hf, hf_preset_data  # noqa: E402
from keras_transformers.models import (  # noqa: E402
    BertBackbone,
    BertClassifier,
    BertMaskedLM,
    BertTokenClassifier,
)

TOLERANCE = 1e-4
VOCAB = 100
BERT = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
    type_vocab_size=2,
)
# kind -> (HF class, its Auto class, our class, num_labels)
KINDS = {
    "base": ("BertModel", "AutoModel", BertBackbone, 2),
    "mlm": ("BertForMaskedLM", "AutoModelForMaskedLM", BertMaskedLM, 2),
    "pretraining": ("BertForPreTraining", "AutoModelForPreTraining", BertMaskedLM, 2),
    "seq": (
        "BertForSequenceClassification",
        "AutoModelForSequenceClassification",
        BertClassifier,
        3,
    ),
    "token": (
        "BertForTokenClassification",
        "AutoModelForTokenClassification",
        BertTokenClassifier,
        5,
    ),
}
POSITIONS = np.array([[1, 4, 9], [0, 2, 6]], "int32")  # masked-LM positions


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root, dirs = tmp_path_factory.mktemp("hf_bert"), {}
    for kind, (name, _, _, labels) in KINDS.items():
        model = getattr(transformers, name)(
            transformers.BertConfig(**BERT, num_labels=labels)
        )
        dirs[kind] = root / kind
        randomize(model).save_pretrained(dirs[kind])
    return dirs


def _batch():
    """Two sequences, both segments, the second right-padded."""
    ids = np.random.default_rng(1).integers(1, VOCAB, (2, 12)).astype("int32")
    segments = np.zeros_like(ids)
    segments[:, 5:] = 1
    mask = np.ones_like(ids, bool)
    mask[1, 8:] = False
    ids[1, 8:], segments[1, 8:] = 0, 0
    return ids, segments, mask


def _hf(path, auto):
    """HF outputs on `_batch()` of the `auto` class (e.g. "AutoModel") at `path`."""
    model = getattr(transformers, auto).from_pretrained(
        path, attn_implementation="eager", dtype=torch.float32
    )
    ids, segments, mask = _batch()
    segments = segments * (model.config.type_vocab_size > 1)  # exported, no segments
    with torch.no_grad():
        return model.eval()(
            input_ids=torch.tensor(ids, dtype=torch.long),
            token_type_ids=torch.tensor(segments, dtype=torch.long),
            attention_mask=torch.tensor(mask.astype("int64")),
        )


def _ours(model):
    ids, segments, mask = _batch()
    segments = segments * (model.config.num_segments > 1)
    inputs = dict(
        token_ids=ids, segment_ids=segments, padding_mask=mask, mask_positions=POSITIONS
    )
    out = model(inputs)
    if isinstance(out, dict):
        return {k: keras.ops.convert_to_numpy(v) for k, v in out.items()}
    return keras.ops.convert_to_numpy(out)


def _gather(logits):
    return np.take_along_axis(logits, POSITIONS[:, :, None], axis=1)


def _check(case, ours, theirs, where=None):
    diff = np.abs(np.asarray(ours) - np.asarray(theirs))
    diff = float((diff if where is None else diff[where]).max())
    print(f"[{keras.config.backend()}] {case}: max |diff| = {diff:.2e}")
    assert diff <= TOLERANCE, f"{case}: max |diff| {diff} > {TOLERANCE}"


def _compare(model, path, kind, case):
    """Our outputs of `model` against HF's `kind` model in `path`."""
    ref, ours, mask = _hf(path, KINDS[kind][1]), _ours(model), _batch()[2]
    if kind == "base":
        _check(case + " sequence", ours["sequence_output"], ref.last_hidden_state, mask)
        _check(case + " pooled", ours["pooled_output"], ref.pooler_output)
    elif kind in ("mlm", "pretraining"):
        logits = ref.logits if kind == "mlm" else ref.prediction_logits
        _check(case + " masked-LM", ours, _gather(np.asarray(logits)))
    else:
        where = mask if kind == "token" else None
        _check(case + " logits", ours, ref.logits, where)


@pytest.mark.parametrize("kind", list(KINDS))
def test_outputs_match(hf_dirs, kind):
    model = keras_transformers.from_preset(hf_dirs[kind])
    assert type(model) is KINDS[kind][2]
    assert getattr(model, "num_classes", KINDS[kind][3]) == KINDS[kind][3]
    _compare(model, hf_dirs[kind], kind, kind)


def test_backbone_from_task_checkpoints(hf_dirs):
    mask = _batch()[2]
    for kind in ("mlm", "seq"):
        backbone = BertBackbone.from_preset(hf_dirs[kind])
        assert (backbone.pooler is None) == (kind == "mlm")  # BertForMaskedLM: none
        expected = _hf(hf_dirs[kind], "AutoModel").last_hidden_state
        _check(f"{kind} backbone", _ours(backbone)["sequence_output"], expected, mask)
    short = BertBackbone.from_preset(hf_dirs["seq"], max_sequence_length=32)
    assert short.position_embedding.embeddings.shape == (32, 32)  # table cut
    _check("32 positions", _ours(short)["sequence_output"], expected, mask)


def test_requested_class_gets_a_new_head(hf_dirs):
    with pytest.warns(UserWarning, match="classifier"):
        model = BertClassifier.from_preset(hf_dirs["base"], num_classes=4)
    assert model.num_classes == 4
    expected = _hf(hf_dirs["base"], "AutoModel").pooler_output
    _check(
        "base as classifier pooled", _ours(model.backbone)["pooled_output"], expected
    )
    with pytest.warns(UserWarning, match="classifier"):  # other width: new head
        model = BertClassifier.from_preset(hf_dirs["seq"], num_classes=4)
    assert model.num_classes == 4
    with pytest.warns(UserWarning, match="pooler and classifier"):
        model = BertClassifier.from_preset(hf_dirs["mlm"])  # HF: a new pooler too
    assert model.backbone.pooler is not None
    with pytest.warns(UserWarning, match="masked-LM head"):
        BertMaskedLM.from_preset(hf_dirs["base"])
    random = BertTokenClassifier.from_preset(hf_dirs["token"], load_weights=False)
    assert random.num_classes == 5 and random.backbone.pooler is None


def test_config_mapping(hf_dirs):
    data = hf_preset_data(hf_dirs["seq"])
    assert (data["family"], data["class_name"]) == ("bert", "BertClassifier")
    assert data["task"] == {"num_classes": 3, "classifier_dropout": 0.1}
    config = TransformerConfig.from_dict(data["config"])
    expected = dict(stacks="encoder", norm_position="post", num_segments=2)
    expected.update(pooler=True, final_norm=False, norm_epsilon=1e-12)
    assert {key: getattr(config, key) for key in expected} == expected
    assert not keras_transformers.load_config(hf_dirs["mlm"]).pooler


def _legacy(src, dst):
    """Old-style file: LayerNorm gamma/beta, a stored tied decoder, position_ids."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    for old, new in (
        ("LayerNorm.weight", "LayerNorm.gamma"),
        ("LayerNorm.bias", "LayerNorm.beta"),
    ):
        tensors = {k.replace(old, new): v for k, v in tensors.items()}
    embeddings = tensors["bert.embeddings.word_embeddings.weight"]
    tensors["cls.predictions.decoder.weight"] = embeddings
    tensors["bert.embeddings.position_ids"] = np.arange(64)[None]
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def test_legacy_names(hf_dirs, tmp_path, recwarn):
    model = BertMaskedLM.from_preset(_legacy(hf_dirs["mlm"], tmp_path / "legacy"))
    assert not [w for w in recwarn if "not used" in str(w.message)]
    _compare(model, hf_dirs["mlm"], "mlm", "legacy mlm")


def _random_keras(cls, **fields):
    config = keras_transformers.load_config("bert_tiny").replace(
        vocabulary_size=VOCAB,
        hidden_dim=32,
        num_heads=4,
        intermediate_dim=64,
        max_sequence_length=64,
        **fields,
    )
    task = {"num_classes": 3} if "Classifier" in cls.__name__ else {}
    model = cls(config=config, **task)
    randomize_weights(model)
    return model


@pytest.mark.parametrize(
    "kind, fields",
    [
        ("base", {}),
        ("mlm", dict(activation="gelu_approximate")),
        ("mlm", dict(tie_embeddings=False, activation="relu")),
        ("seq", {}),
        ("token", dict(num_segments=0)),
    ],
)
def test_export_round_trip(tmp_path, kind, fields):
    model = _random_keras(KINDS[kind][2], **fields)
    export_hf(model, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"] == [KINDS[kind][0]]
    _compare(model, tmp_path, kind, f"{kind} export {sorted(fields)}")
    back, ours = keras_transformers.from_preset(tmp_path), _ours(model)
    assert type(back) is type(model)
    again = _ours(back)
    for key in ours if isinstance(ours, dict) else [None]:
        a, b = (ours[key], again[key]) if key else (ours, again)
        np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(position_embedding_type="relative_key"), "relative_key"),
        (dict(is_decoder=True), "is_decoder"),
        (dict(add_cross_attention=True), "add_cross_attention"),
        (dict(hidden_act="gelu_10"), "gelu_10"),
        (dict(num_hidden_layers=3), "encoder.layer.2"),
        (dict(type_vocab_size=3), "token_type_embeddings"),
        (
            dict(model_type="funnel"),
            "\\['albert', 'bert', 'camembert', 'deberta-v2', 'distilbert', "
            "'electra', 'esm', 'modernbert', 'roberta', 'xlm-roberta'\\] "
            "\\(bert\\)",
        ),
        (dict(model_type="roberta"), "not look like a roberta checkpoint"),
    ],
)
def test_errors_name_the_problem(hf_dirs, tmp_path, changes, match):
    path = edited_hf_dir(hf_dirs["mlm"], tmp_path / "edited", **changes)
    with pytest.raises(ValueError, match=match):
        keras_transformers.from_preset(path)


def test_export_rejects_unrepresentable(tmp_path):
    with pytest.raises(ValueError, match="norm_position"):
        export_hf(_random_keras(BertBackbone, norm_position="pre"), tmp_path)
    with pytest.raises(ValueError, match="no pooler"):
        export_hf(_random_keras(BertClassifier, pooler=False), tmp_path)
