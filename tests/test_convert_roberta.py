"""Hugging Face RoBERTa / XLM-RoBERTa / CamemBERT conversion: backbone,
masked-LM, sequence and token classifier outputs match `transformers`
(torch, float32, eager attention) on tiny random-init models and a
right-padded batch; export round-trips; errors name the problem."""

import json

import keras
import numpy as np
import pytest
from contracts import edited_hf_dir

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from hf_parity import randomize, record, reference  # noqa: E402

import keras_transformers  # noqa: E402
from keras_transformers.convert import export_hf, hf_preset_data  # noqa: E402
from keras_transformers.models import (  # noqa: E402
    BertBackbone,
    BertClassifier,
    BertMaskedLM,
    BertTokenClassifier,
)

VOCAB, PAD = 100, 1
ROBERTA = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=66,  # 64 positions after pad_token_id + 1 rows
    type_vocab_size=1,
    pad_token_id=PAD,
)
# kind -> (HF config class, HF model class, its Auto class, our class)
KINDS = {
    "base": ("RobertaConfig", "RobertaModel", "AutoModel", BertBackbone),
    "mlm": (
        "RobertaConfig",
        "RobertaForMaskedLM",
        "AutoModelForMaskedLM",
        BertMaskedLM,
    ),
    "seq": (
        "RobertaConfig",
        "RobertaForSequenceClassification",
        "AutoModelForSequenceClassification",
        BertClassifier,
    ),
    "token": (
        "RobertaConfig",
        "RobertaForTokenClassification",
        "AutoModelForTokenClassification",
        BertTokenClassifier,
    ),
    "xlm_mlm": (
        "XLMRobertaConfig",
        "XLMRobertaForMaskedLM",
        "AutoModelForMaskedLM",
        BertMaskedLM,
    ),
}
LABELS = 3


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root, dirs = tmp_path_factory.mktemp("hf_roberta"), {}
    for kind, (config, name, _, _) in KINDS.items():
        hf_config = getattr(transformers, config)(**ROBERTA, num_labels=LABELS)
        dirs[kind] = root / kind
        randomize(getattr(transformers, name)(hf_config)).save_pretrained(dirs[kind])
    return dirs


def _batch():
    """Ids `[2, 12]` that avoid the pad id; the second row is right-padded
    with it after 7 tokens."""
    ids = np.random.default_rng(1).integers(2, VOCAB, (2, 12)).astype("int32")
    mask = np.ones_like(ids, bool)
    mask[1, 7:] = False
    ids[1, 7:] = PAD
    return ids, mask


def _hf(path, auto):
    """HF outputs on `_batch()` of the `auto` class (e.g. "AutoModel") at `path`."""
    ids, mask = _batch()
    model = reference(path, getattr(transformers, auto))
    with torch.no_grad():
        return model(
            input_ids=torch.tensor(ids).long(), attention_mask=torch.tensor(mask * 1)
        )


def _ours(model):
    """Our outputs on `_batch()` (a masked LM scores every position)."""
    ids, mask = _batch()
    inputs = {"token_ids": ids, "padding_mask": mask}
    if isinstance(model, BertMaskedLM):
        inputs["mask_positions"] = np.tile(
            np.arange(ids.shape[1], dtype="int32"), (2, 1)
        )
    return keras.tree.map_structure(keras.ops.convert_to_numpy, model(inputs))


def _compare(model, path, kind, case):
    """Our outputs of `model` against HF's `kind` model saved in `path`."""
    theirs, ours, mask = _hf(path, KINDS[kind][2]), _ours(model), _batch()[1]
    if kind == "base":
        record(
            case + " sequence",
            ours["sequence_output"],
            theirs.last_hidden_state.numpy(),
            mask,
        )
        record(
            case + " pooled",
            ours["pooled_output"][:, None],
            theirs.pooler_output.numpy()[:, None],
        )
    elif kind == "seq":
        record(case + " logits", ours[:, None], theirs.logits.numpy()[:, None])
    else:  # per-token logits
        record(case + " logits", ours, theirs.logits.numpy(), mask)


@pytest.mark.parametrize("kind", list(KINDS))
def test_outputs_match(hf_dirs, kind):
    model = keras_transformers.from_preset(hf_dirs[kind])
    assert type(model) is KINDS[kind][3]
    assert getattr(model, "backbone", model).config.max_sequence_length == 64
    _compare(model, hf_dirs[kind], kind, kind)


def test_backbone_from_task_checkpoint(hf_dirs):
    backbone = BertBackbone.from_preset(hf_dirs["mlm"])
    assert backbone.pooler is None  # RobertaForMaskedLM has none
    theirs = _hf(hf_dirs["mlm"], "AutoModel").last_hidden_state.numpy()
    ours = _ours(backbone)["sequence_output"]
    record("mlm backbone", ours, theirs, _batch()[1])


def test_config_mapping(hf_dirs):
    data = hf_preset_data(hf_dirs["seq"])
    assert (data["family"], data["class_name"]) == ("bert", "BertClassifier")
    assert data["task"]["num_classes"] == LABELS
    config = data["config"]
    assert (config["max_sequence_length"], config["num_segments"]) == (64, 1)
    assert (config["pad_token_id"], config["pooler"]) == (PAD, True)
    assert hf_preset_data(hf_dirs["xlm_mlm"])["class_name"] == "BertMaskedLM"


@pytest.mark.parametrize(
    "kind, model_type",
    [
        ("base", "roberta"),
        ("mlm", "xlm-roberta"),
        ("seq", "camembert"),
        ("token", "roberta"),
    ],
)
def test_export_round_trip(hf_dirs, tmp_path, kind, model_type):
    model = keras_transformers.from_preset(hf_dirs[kind])
    export_hf(model, tmp_path, model_type=model_type)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == model_type
    assert saved["max_position_embeddings"] == 66
    prefix = {
        "roberta": "Roberta",
        "xlm-roberta": "XLMRoberta",
        "camembert": "Camembert",
    }
    assert saved["architectures"] == [
        KINDS[kind][1].replace("Roberta", prefix[model_type])
    ]
    _compare(model, tmp_path, kind, f"{kind} export as {model_type}")
    back = keras_transformers.from_preset(tmp_path)
    assert type(back) is type(model)
    _compare(back, hf_dirs[kind], kind, f"{kind} re-imported {model_type}")


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(position_embedding_type="relative_key"), "relative_key"),
        (dict(is_decoder=True), "is_decoder"),
        (dict(hidden_act="gelu_10"), "gelu_10"),
        (dict(max_position_embeddings=2), "max_position_embeddings=2"),
        (dict(model_type="bert"), "not look like a bert checkpoint"),
    ],
)
def test_errors_name_the_problem(hf_dirs, tmp_path, changes, match):
    path = edited_hf_dir(hf_dirs["mlm"], tmp_path / "edited", **changes)
    with pytest.raises(ValueError, match=match):
        keras_transformers.from_preset(path)


def test_export_rejects_other_types(hf_dirs, tmp_path):
    model = keras_transformers.from_preset(hf_dirs["base"])
    with pytest.raises(ValueError, match="'llama' is not a BERT-family"):
        export_hf(model, tmp_path, model_type="llama")
