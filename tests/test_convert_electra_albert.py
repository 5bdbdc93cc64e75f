"""Hugging Face ELECTRA and ALBERT conversion: factorised embeddings
(`embedding_dim`) and blocks shared across depth (`num_layer_groups`).
Backbone, discriminator, masked-LM, sequence and token classifier outputs
match `transformers` (torch, float32) on tiny random-init models and a
right-padded batch with both segments; exports load back in `transformers`
with equal outputs; shared blocks train as one set of weights; what the
formats lack is refused by name; the presets have the published counts."""

import json

import keras
import numpy as np
import pytest
from contracts import (
    edited_hf_dir,
    randomize_weights,
    run_fit_test,
    run_saving_test,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from hf_parity import padded_batch, randomize, record, reference  # noqa: E402

import keras_transformers  # noqa: E402
from keras_transformers import registry  # noqa: E402
from keras_transformers.convert import export_hf  # noqa: E402
from keras_transformers.models import (  # noqa: E402
    BertBackbone,
    BertClassifier,
    BertMaskedLM,
    BertTokenClassifier,
    ElectraDiscriminator,
)

VOCAB = 100
COMMON = dict(
    vocab_size=VOCAB,
    embedding_size=16,
    hidden_size=32,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
    type_vocab_size=2,
    num_labels=3,
)
SMALL = dict(embedding_dim=16, hidden_dim=32, num_heads=4, intermediate_dim=64)
TYPES = {  # ALBERT: 4 layers in 2 groups of shared weights
    "electra": dict(num_hidden_layers=2),
    "albert": dict(num_hidden_layers=4, num_hidden_groups=2, hidden_act="gelu_new"),
}
# (type, kind) -> (HF class, our class)
KINDS = {
    ("electra", "base"): ("ElectraModel", BertBackbone),
    ("electra", "discriminator"): ("ElectraForPreTraining", ElectraDiscriminator),
    ("electra", "mlm"): ("ElectraForMaskedLM", BertMaskedLM),
    ("electra", "seq"): ("ElectraForSequenceClassification", BertClassifier),
    ("electra", "token"): ("ElectraForTokenClassification", BertTokenClassifier),
    ("albert", "base"): ("AlbertModel", BertBackbone),
    ("albert", "pretraining"): ("AlbertForPreTraining", BertMaskedLM),
    ("albert", "mlm"): ("AlbertForMaskedLM", BertMaskedLM),
    ("albert", "seq"): ("AlbertForSequenceClassification", BertClassifier),
    ("albert", "token"): ("AlbertForTokenClassification", BertTokenClassifier),
}
EXPORTED = {"AlbertForPreTraining": "AlbertForMaskedLM"}  # no sentence-order head


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root, dirs = tmp_path_factory.mktemp("hf_electra_albert"), {}
    for (kind, task), (name, _) in KINDS.items():
        config = transformers.AutoConfig.for_model(kind, **COMMON, **TYPES[kind])
        dirs[kind, task] = root / f"{kind}_{task}"
        randomize(getattr(transformers, name)(config)).save_pretrained(dirs[kind, task])
    wide = dict(COMMON, embedding_size=32, num_hidden_layers=1)  # ELECTRA-base's
    dirs["electra", "wide"] = root / "electra_wide"
    model = transformers.ElectraForPreTraining(transformers.ElectraConfig(**wide))
    randomize(model).save_pretrained(dirs["electra", "wide"])
    return dirs


def _inputs(kind):
    ids, mask = padded_batch(VOCAB)
    segments = (np.arange(ids.shape[1]) >= 5).astype("int32")[None].repeat(2, 0)
    segments[~mask] = 0
    inputs = {"token_ids": ids, "padding_mask": mask, "segment_ids": segments}
    if kind in ("mlm", "pretraining"):  # every position, as transformers scores
        inputs["mask_positions"] = np.tile(
            np.arange(ids.shape[1], dtype="int32"), (2, 1)
        )
    return inputs


def _compare(model, path, inputs, case, ours=None):
    """Our outputs of `model` (`ours`: computed before) against those of the
    `transformers` model saved in `path` (its class from `architectures`),
    on `inputs`; a backbone's pooled output too when both have a pooler.
    Returns ours."""
    architecture = json.loads((path / "config.json").read_text())["architectures"]
    with torch.no_grad():
        out = reference(path, getattr(transformers, architecture[0]))(
            input_ids=torch.tensor(inputs["token_ids"]).long(),
            attention_mask=torch.tensor(inputs["padding_mask"] * 1),
            token_type_ids=torch.tensor(inputs["segment_ids"]).long(),
        )
    ours = model(inputs) if ours is None else ours
    result, mask = ours, inputs["padding_mask"]
    if isinstance(ours, dict):  # a backbone
        if model.pooler is not None and out.get("pooler_output") is not None:
            pooled = keras.ops.convert_to_numpy(ours["pooled_output"])
            record(
                case + " pooled", pooled[:, None], out.pooler_output[:, None].numpy()
            )
        ours, theirs = ours["sequence_output"], out.last_hidden_state
    else:
        theirs = out.get("prediction_logits", out.get("logits"))
    ours, theirs = keras.ops.convert_to_numpy(ours), theirs.numpy()
    if isinstance(model, BertClassifier):  # [B, C]: per example
        ours, theirs, mask = ours[:, None], theirs[:, None], None
    record(case, ours, theirs, mask)
    return result


@pytest.mark.parametrize("kind, task", list(KINDS))
def test_outputs_match_and_export_round_trips(hf_dirs, tmp_path, kind, task):
    path = hf_dirs[kind, task]
    name, cls = KINDS[kind, task]
    model = keras_transformers.from_preset(path)
    assert type(model) is cls
    backbone = getattr(model, "backbone", model)
    assert backbone.embedding_projection is not None
    assert len({id(b) for b in backbone.blocks}) == 2  # ALBERT: 4 layers, 2 groups
    inputs = _inputs(task)
    ours = _compare(model, path, inputs, f"{kind} {task}")
    if task == "base":  # the same parameters as transformers'
        theirs = sum(
            p.numel() for p in reference(path, transformers.AutoModel).parameters()
        )
        assert model.count_params() == model.config.num_params() == theirs
    export_hf(model, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert (saved["model_type"], saved["architectures"]) == (
        kind,
        [EXPORTED.get(name, name)],
    )
    _compare(model, tmp_path, inputs, f"{kind} {task} export", ours)
    again = keras_transformers.from_preset(tmp_path)
    assert type(again) is cls  # AlbertForMaskedLM: no pooler
    assert again.config == model.config.replace(pooler=again.config.pooler)


def test_electra_base_layout_has_no_projection(hf_dirs, tmp_path):
    """ELECTRA-base's embeddings are as wide as its blocks: no
    `embeddings_project`, none here, none exported."""
    path = hf_dirs["electra", "wide"]
    model = keras_transformers.from_preset(path)
    assert model.config.embedding_dim is None
    assert model.backbone.embedding_projection is None
    inputs = _inputs("discriminator")
    ours = _compare(model, path, inputs, "electra wide discriminator")
    export_hf(model, tmp_path)  # a GELU pooler's config: ELECTRA, not BERT
    config = json.loads((tmp_path / "config.json").read_text())
    assert (config["model_type"], config["embedding_size"]) == ("electra", 32)
    _compare(model, tmp_path, inputs, "electra wide discriminator export", ours)


def test_a_bert_model_exports_as_albert(tmp_path):
    """Without factorised embeddings or shared blocks a model still exports
    as ALBERT: an identity projection, one group per layer."""
    config = keras_transformers.load_config("bert_tiny").replace(
        vocabulary_size=VOCAB, num_layers=2, max_sequence_length=64
    )
    model = BertBackbone(config=config.replace(**{**SMALL, "embedding_dim": None}))
    randomize_weights(model)
    export_hf(model, tmp_path, model_type="albert")
    saved = json.loads((tmp_path / "config.json").read_text())
    assert (saved["num_hidden_groups"], saved["embedding_size"]) == (2, 32)
    _compare(model, tmp_path, _inputs("base"), "bert as albert export")


@pytest.mark.parametrize(
    "kind, task, changes, match",
    [
        ("albert", "base", dict(inner_group_num=2), "inner_group_num=2"),
        ("albert", "base", dict(num_hidden_groups=3), "num_hidden_groups=3"),
        ("electra", "mlm", dict(hidden_act="relu"), "hidden_act='relu'"),
    ],
)
def test_errors_name_the_problem(hf_dirs, tmp_path, kind, task, changes, match):
    path = edited_hf_dir(hf_dirs[kind, task], tmp_path / "edited", **changes)
    with pytest.raises(ValueError, match=match):
        keras_transformers.from_preset(path)


def test_exports_refuse_what_the_format_lacks(hf_dirs, tmp_path):
    with_pooler = BertBackbone.from_preset(hf_dirs["electra", "seq"])
    with pytest.raises(ValueError, match="a pooler outside BertClassifier"):
        export_hf(with_pooler, tmp_path / "a")
    wide = ElectraDiscriminator.from_preset(
        hf_dirs["electra", "discriminator"], embedding_dim=32, load_weights=False
    )
    with pytest.raises(ValueError, match="embedding_dim == hidden_dim"):
        export_hf(wide, tmp_path / "b")
    albert = keras_transformers.from_preset(hf_dirs["albert", "base"])
    with pytest.raises(ValueError, match="num_layer_groups"):
        export_hf(albert, tmp_path / "c", model_type="bert")


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(num_layer_groups=3), "a divisor of num_layers=4"),
        (dict(num_layer_groups=0), "num_layer_groups=0"),
        (dict(embedding_dim=8, stacks="decoder"), 'None unless stacks="encoder"'),
    ],
)
def test_bad_sharing_configs_name_the_fix(changes, match):
    config = keras_transformers.load_config("bert_tiny").replace(num_layers=4)
    with pytest.raises(ValueError, match=match):
        config.replace(**changes)


def test_shared_blocks_train_and_save_as_one_set_of_weights(tmp_path):
    """ALBERT's published layout (one block run by every layer): one set of
    weights, trained by `fit`, saved and restored once."""
    config = keras_transformers.load_config("albert_base_v2").replace(
        vocabulary_size=VOCAB, max_sequence_length=64, num_layers=2
    )
    config = config.replace(**SMALL)
    model = BertClassifier(config=config, num_classes=3)
    randomize_weights(model)
    blocks = model.backbone.blocks
    assert blocks[0] is blocks[1]
    weights = sum(int(np.prod(w.shape)) for w in model.backbone.trainable_weights)
    assert weights == config.num_params()
    inputs = _inputs("seq")
    before = keras.ops.convert_to_numpy(blocks[0].feed_forward.inner_dense.kernel)
    run_fit_test(model, inputs, np.array([0, 2]), steps=1)
    after = keras.ops.convert_to_numpy(blocks[1].feed_forward.inner_dense.kernel)
    assert not np.allclose(before, after)
    run_saving_test(model, inputs, tmp_path)


def test_discriminator_saves(hf_dirs, tmp_path):
    model = keras_transformers.from_preset(hf_dirs["electra", "discriminator"])
    run_saving_test(model, _inputs("discriminator"), tmp_path)


FULL = {  # preset -> (model_type, published config.json fields)
    "electra_small_discriminator": ("electra", dict(embedding_size=128)),
    "electra_base_discriminator": (
        "electra",
        dict(
            embedding_size=768,
            hidden_size=768,
            num_attention_heads=12,
            intermediate_size=3072,
        ),
    ),
    "albert_base_v2": (
        "albert",
        dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072),
    ),
    "albert_large_v2": (
        "albert",
        dict(
            hidden_size=1024,
            num_hidden_layers=24,
            num_attention_heads=16,
            intermediate_size=4096,
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(FULL))
def test_published_parameter_counts(name):
    """transformers' base model (ElectraModel; AlbertModel with its pooler)
    on the meta device, our count of the converted config and the preset
    all agree."""
    kind, fields = FULL[name]
    config = transformers.AutoConfig.for_model(kind, **fields)
    with torch.device("meta"):
        model = transformers.AutoModel.from_config(config)
    published = sum(p.numel() for p in model.parameters())
    converted = registry.converter(kind).config_from_hf(config.to_dict())
    converted["pooler"] = kind == "albert"
    config = keras_transformers.TransformerConfig.from_dict(converted)
    assert config.num_params() == published
    preset = keras_transformers.load_config(name)
    assert preset == config
