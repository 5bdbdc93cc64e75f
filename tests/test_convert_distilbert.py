"""Hugging Face DistilBERT conversion: backbone, masked-LM and token
classifier outputs match `transformers` (torch, float32, eager attention)
on tiny random-init models and a right-padded batch; export round-trips;
what DistilBERT cannot express is refused by name."""

import json

import keras
import numpy as np
import pytest
from contracts import edited_hf_dir

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from hf_parity import padded_batch, randomize, record, reference  # noqa: E402

import keras_transformers  # noqa: E402
from keras_transformers.convert import export_hf  # noqa: E402
from keras_transformers.models import (  # noqa: E402
    BertBackbone,
    BertClassifier,
    BertMaskedLM,
    BertTokenClassifier,
)

VOCAB = 100
DISTILBERT = dict(
    vocab_size=VOCAB,
    dim=32,
    n_layers=2,
    n_heads=4,
    hidden_dim=64,
    max_position_embeddings=64,
    num_labels=3,
)
REFUSED = "DistilBertForSequenceClassification"
# kind -> (HF class, its Auto class, our class)
KINDS = {
    "base": ("DistilBertModel", "AutoModel", BertBackbone),
    "mlm": ("DistilBertForMaskedLM", "AutoModelForMaskedLM", BertMaskedLM),
    "token": (
        "DistilBertForTokenClassification",
        "AutoModelForTokenClassification",
        BertTokenClassifier,
    ),
}


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root, dirs = tmp_path_factory.mktemp("hf_distilbert"), {}
    config = transformers.DistilBertConfig(**DISTILBERT)
    for kind, (name, _, _) in {**KINDS, "seq": (REFUSED, 0, 0)}.items():
        dirs[kind] = root / kind
        randomize(getattr(transformers, name)(config)).save_pretrained(dirs[kind])
    return dirs


def _compare(model, path, kind, case):
    """Our outputs of `model` against HF's `kind` model saved in `path`."""
    ids, mask = padded_batch(VOCAB)
    with torch.no_grad():
        theirs = reference(path, getattr(transformers, KINDS[kind][1]))(
            input_ids=torch.tensor(ids).long(), attention_mask=torch.tensor(mask * 1)
        )
    inputs = {"token_ids": ids, "padding_mask": mask}
    if kind == "mlm":  # score every position, as transformers does
        inputs["mask_positions"] = np.tile(
            np.arange(ids.shape[1], dtype="int32"), (2, 1)
        )
    ours = model(inputs)
    if kind == "base":
        ours, theirs = ours["sequence_output"], theirs.last_hidden_state
    else:
        theirs = theirs.logits
    record(case, keras.ops.convert_to_numpy(ours), theirs.numpy(), mask)


@pytest.mark.parametrize("kind", list(KINDS))
def test_outputs_match_and_export_round_trips(hf_dirs, tmp_path, kind):
    model = keras_transformers.from_preset(hf_dirs[kind])
    assert type(model) is KINDS[kind][2]
    backbone = getattr(model, "backbone", model)
    assert backbone.pooler is None and backbone.segment_embedding is None
    _compare(model, hf_dirs[kind], kind, kind)
    export_hf(model, tmp_path, model_type="distilbert")
    saved = json.loads((tmp_path / "config.json").read_text())
    assert (saved["model_type"], saved["architectures"]) == (
        "distilbert",
        [KINDS[kind][0]],
    )
    _compare(model, tmp_path, kind, f"{kind} export")
    _compare(
        keras_transformers.from_preset(tmp_path),
        hf_dirs[kind],
        kind,
        f"{kind} re-imported",
    )


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(sinusoidal_pos_embds=True), "sinusoidal_pos_embds"),
        (dict(activation="gelu_10"), "gelu_10"),
        (dict(n_layers=3), "transformer.layer.2"),
        (dict(model_type="bert"), "not look like a bert checkpoint"),
    ],
)
def test_errors_name_the_problem(hf_dirs, tmp_path, changes, match):
    path = edited_hf_dir(hf_dirs["mlm"], tmp_path / "edited", **changes)
    with pytest.raises(ValueError, match=match):
        keras_transformers.from_preset(path)


def test_sequence_classifier_refused(hf_dirs, tmp_path):
    with pytest.raises(ValueError, match=REFUSED):
        keras_transformers.from_preset(hf_dirs["seq"])
    bert = BertClassifier(config=keras_transformers.load_config("bert_tiny"))
    with pytest.raises(ValueError, match="BertClassifier, pooler=True, num_segments=2"):
        export_hf(bert, tmp_path, model_type="distilbert")
