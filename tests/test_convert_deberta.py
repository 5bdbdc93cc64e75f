"""Hugging Face DeBERTa-v2 / v3 conversion: backbone, masked-LM (both head
layouts), sequence and token classifier outputs match `transformers`
(torch, float32) on tiny random-init models and a right-padded batch, for
the v3 layout (log buckets, shared keys, normed relative embeddings) and the
v2 one (separate position projections, clipped distances, token types);
export round-trips; what we lack is refused by name."""

import json
import shutil

import keras
import numpy as np
import pytest
from contracts import edited_hf_dir, run_fit_test, run_saving_test

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from hf_parity import padded_batch, randomize, record, reference  # noqa: E402
from transformers.models.deberta_v2 import modeling_deberta_v2  # noqa: E402

import keras_transformers  # noqa: E402
from keras_transformers.convert import export_hf  # noqa: E402
from keras_transformers.layers.disentangled import log_buckets  # noqa: E402
from keras_transformers.models import (  # noqa: E402
    BertBackbone,
    BertClassifier,
    BertMaskedLM,
    BertTokenClassifier,
)

VOCAB = 100
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
    relative_attention=True,
    position_biased_input=False,
    num_labels=3,
)
LAYOUTS = {
    "v3": dict(  # length 12 reaches the log buckets past 8 // 2
        pos_att_type=["p2c", "c2p"],
        position_buckets=8,
        max_relative_positions=20,
        share_att_key=True,
        norm_rel_ebd="layer_norm",
        type_vocab_size=0,
    ),
    "v2": dict(  # distances past 5 are clipped
        pos_att_type="c2p|p2c",
        max_relative_positions=5,
        share_att_key=False,
        type_vocab_size=2,
        hidden_act="gelu_new",
        pooler_hidden_act="tanh",
    ),
}
# kind -> (HF class, its Auto class, our class)
KINDS = {
    "base": ("DebertaV2Model", "AutoModel", BertBackbone),
    "mlm": ("DebertaV2ForMaskedLM", "AutoModelForMaskedLM", BertMaskedLM),
    "seq": (
        "DebertaV2ForSequenceClassification",
        "AutoModelForSequenceClassification",
        BertClassifier,
    ),
    "token": (
        "DebertaV2ForTokenClassification",
        "AutoModelForTokenClassification",
        BertTokenClassifier,
    ),
}


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root, dirs = tmp_path_factory.mktemp("hf_deberta"), {}
    for layout, options in LAYOUTS.items():
        config = transformers.DebertaV2Config(**COMMON, **options)
        for kind, (name, _, _) in KINDS.items():
            dirs[layout, kind] = root / f"{layout}_{kind}"
            model = getattr(transformers, name)(config)
            randomize(model).save_pretrained(dirs[layout, kind])
    config = transformers.DebertaV2Config(**COMMON, **LAYOUTS["v3"], legacy=False)
    dirs["v3", "mlm_new"] = root / "v3_mlm_new"
    model = transformers.DebertaV2ForMaskedLM(config)
    randomize(model).save_pretrained(dirs["v3", "mlm_new"])
    return dirs


def _compare(model, path, kind, case):
    """Our outputs of `model` against HF's `kind` model saved in `path`."""
    ids, mask = padded_batch(VOCAB)
    segments = (np.arange(ids.shape[1]) >= 5).astype("int32")[None].repeat(2, 0)
    hf_model = reference(path, getattr(transformers, KINDS[kind][1]))
    extra = {}
    if hf_model.config.type_vocab_size:
        extra = {"token_type_ids": torch.tensor(segments).long()}
    with torch.no_grad():
        theirs = hf_model(
            input_ids=torch.tensor(ids).long(),
            attention_mask=torch.tensor(mask * 1),
            **extra,
        )
    inputs = {"token_ids": ids, "padding_mask": mask}
    if extra:
        inputs["segment_ids"] = segments
    if kind == "mlm":  # score every position, as transformers does
        inputs["mask_positions"] = np.tile(
            np.arange(ids.shape[1], dtype="int32"), (2, 1)
        )
    ours = model(inputs)
    if kind == "base":
        ours, theirs = ours["sequence_output"], theirs.last_hidden_state
    else:
        theirs = theirs.logits
    rows = mask if theirs.ndim == 3 else None
    ours = keras.ops.convert_to_numpy(ours)
    if rows is None:  # [B, C]: compare per example
        ours, theirs = ours[:, None], theirs[:, None]
    record(case, ours, theirs.numpy(), rows)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("kind", list(KINDS))
def test_outputs_match_and_export_round_trips(hf_dirs, tmp_path, layout, kind):
    path = hf_dirs[layout, kind]
    model = keras_transformers.from_preset(path)
    assert type(model) is KINDS[kind][2]
    backbone = getattr(model, "backbone", model)
    assert backbone.position_embedding is None
    assert (backbone.pooler is not None) == (kind == "seq")
    _compare(model, path, kind, f"deberta {layout} {kind}")
    export_hf(model, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert (saved["model_type"], saved["architectures"]) == (
        "deberta-v2",
        [KINDS[kind][0]],
    )
    _compare(model, tmp_path, kind, f"deberta {layout} {kind} export")
    again = keras_transformers.from_preset(tmp_path)
    _compare(again, path, kind, f"deberta {layout} {kind} re-imported")


def test_masked_lm_head_of_either_layout_loads(hf_dirs, tmp_path):
    path = hf_dirs["v3", "mlm_new"]  # lm_predictions.lm_head.*
    model = keras_transformers.from_preset(path)
    _compare(model, path, "mlm", "deberta v3 mlm (legacy=False)")


def test_log_buckets_match_transformers():
    distance = torch.arange(-1023, 1024)[None]
    for buckets, longest in ((256, 512), (8, 20), (64, 128)):
        theirs = modeling_deberta_v2.make_log_bucket_position(
            distance, buckets, longest
        )
        ours = log_buckets(distance.numpy(), buckets, longest)
        np.testing.assert_array_equal(ours, theirs.long().numpy())


@pytest.mark.parametrize("layout, kind", [("v2", "seq"), ("v3", "mlm")])
def test_keras_and_preset_saving_round_trip(hf_dirs, tmp_path, layout, kind):
    model = keras_transformers.from_preset(hf_dirs[layout, kind])
    ids, mask = padded_batch(VOCAB)
    inputs = {"token_ids": ids, "padding_mask": mask}
    if kind == "mlm":
        inputs["mask_positions"] = np.array([[1, 3], [0, 6]], "int32")
    run_saving_test(model, inputs, tmp_path)


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(conv_kernel_size=3), "conv_kernel_size=3"),
        (dict(pos_att_type=["c2p", "p2p"]), r"pos_att_type has \['p2p'\]"),
        (dict(position_biased_input=True), "position_biased_input=True"),
        (dict(relative_attention=False), "relative_attention=False"),
        (dict(embedding_size=16), "embedding_size=16"),
        (dict(model_type="deberta"), "'deberta' is not supported"),
    ],
)
def test_errors_name_the_problem(hf_dirs, tmp_path, changes, match):
    path = edited_hf_dir(hf_dirs["v3", "base"], tmp_path / "edited", **changes)
    with pytest.raises(ValueError, match=match):
        keras_transformers.from_preset(path)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_classifier_fine_tunes(hf_dirs, layout):
    """`fit` runs (dropout on the relative embeddings too) and the loss is finite."""
    model = keras_transformers.from_preset(hf_dirs[layout, "seq"])
    ids, mask = padded_batch(VOCAB)
    inputs = {"token_ids": np.tile(ids, (2, 1)), "padding_mask": np.tile(mask, (2, 1))}
    before = keras.ops.convert_to_numpy(model.backbone.disentangled.embeddings)
    run_fit_test(model, inputs, np.array([0, 1, 2, 1]))
    after = keras.ops.convert_to_numpy(model.backbone.disentangled.embeddings)
    assert not np.allclose(before, after)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_param_count_matches_the_weights_and_transformers(hf_dirs, layout):
    path = hf_dirs[layout, "base"]
    model = keras_transformers.from_preset(path)
    theirs = reference(path, transformers.AutoModel)
    assert model.count_params() == model.config.num_params()
    assert model.count_params() == sum(p.numel() for p in theirs.parameters())


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(disentangled=dict(attention_terms=["c2p", "p2p"])), "attention_terms"),
        (dict(disentangled=dict(attention_terms="c2p")), "attention_terms"),
        (dict(disentangled=dict(position_buckets=2)), "position_buckets"),
        (dict(disentangled=dict(max_relative_positions=100)), ">= position_buckets"),
        (dict(position_embedding="learned"), "disentangled"),
        (dict(stacks="decoder"), 'stacks="encoder"'),
        (dict(pooler_activation="softmax"), "pooler_activation"),
    ],
)
def test_bad_disentangled_configs_name_the_fix(changes, match):
    config = keras_transformers.load_config("deberta_v3_xsmall")
    with pytest.raises(ValueError, match=match):
        config.replace(**changes)


def test_disentangled_defaults_and_attention_scale():
    config = keras_transformers.load_config("bert_tiny").replace(
        position_embedding="disentangled", pooler_activation="gelu"
    )
    assert config.disentangled.span == 256 and config.disentangled.scale_factor == 3
    assert config.resolved_attention_scale == (config.resolved_head_dim * 3) ** -0.5
    c2p = config.replace(disentangled={"attention_terms": ["c2p"]})
    assert c2p.resolved_attention_scale == (config.resolved_head_dim * 2) ** -0.5
    assert c2p.replace(attention_scale=0.5).resolved_attention_scale == 0.5


def test_bert_models_do_not_export_as_deberta_nor_deberta_as_bert(hf_dirs, tmp_path):
    bert = BertBackbone(config=keras_transformers.load_config("bert_tiny"))
    with pytest.raises(ValueError, match="position_embedding='disentangled'"):
        export_hf(bert, tmp_path / "a", model_type="deberta-v2")
    deberta = keras_transformers.from_preset(hf_dirs["v3", "base"])
    with pytest.raises(ValueError, match="position_embedding"):
        export_hf(deberta, tmp_path / "b", model_type="bert")


def test_deberta_v3_style_unigram_tokenizer_loads_with_the_model(hf_dirs, tmp_path):
    """A SentencePiece-derived Unigram `tokenizer.json` as DeBERTa-v3 ships
    it (Metaspace, `[CLS] ... [SEP]` template) loads with the checkpoint and
    encodes and decodes as `transformers` does."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
    )

    specials = ["[PAD]", "[CLS]", "[SEP]", "[UNK]"]
    pieces = ["▁", "▁the", "▁hello", "▁world", "lo", "he", "ll", "o", "wor", "ld"]
    pieces += list("abcdefghijklmnopqrstuvwxyz,.!")
    vocab = [(t, 0.0) for t in specials]
    vocab += [(p, -1.0 - i / 10) for i, p in enumerate(pieces)] + [("[MASK]", 0.0)]
    tok = Tokenizer(models.Unigram(vocab, unk_id=3, byte_fallback=False))
    tok.normalizer = normalizers.Sequence(
        [normalizers.Replace("``", '"'), normalizers.Replace("''", '"')]
    )
    tok.pre_tokenizer = pre_tokenizers.Metaspace("▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace("▁", prepend_scheme="always")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 1), ("[SEP]", 2)],
    )
    tok.add_special_tokens(specials + ["[MASK]"])
    named = dict(cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]")
    named.update(unk_token="[UNK]", mask_token="[MASK]")
    path = tmp_path / "deberta"
    shutil.copytree(hf_dirs["v3", "mlm"], path)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **named).save_pretrained(
        path
    )
    model = keras_transformers.from_preset(path)
    ref = transformers.AutoTokenizer.from_pretrained(str(path))
    ours = model.tokenizer
    assert ours.model_type == "Unigram"
    for text in ["Hello world!", "the  world, hello.", "zz ``quoted''", "ünïcode"]:
        ids = ref(text)["input_ids"]
        assert ours.encode(text, add_special_tokens=True) == ids, text
        assert ids[0] == ref.cls_token_id and ids[-1] == ref.sep_token_id
        assert ours.decode(ids, skip_special_tokens=True) == ref.decode(
            ids, skip_special_tokens=True
        )
    assert (ours.mask_token_id, ours.pad_token_id) == (ref.mask_token_id, 0)


def test_disentangled_attention_layer_serializes():
    layer = keras_transformers.layers.DisentangledAttention(
        num_layers=2, num_heads=2, head_dim=4, max_length=16, share_att_key=False
    )
    layer.build((None, None, 8))
    revived = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(layer)
    )
    assert revived.built  # from its build config
    assert revived.get_config() == layer.get_config()
    assert len(revived.position_keys) == len(revived.position_queries) == 2
    np.testing.assert_array_equal(revived.rows, layer.rows)
    assert layer.rows.shape == (31,) and layer.rows.min() >= 0
    assert layer.rows.max() < 2 * layer.span


def test_long_inputs_match_with_published_buckets(tmp_path):
    """DeBERTa-v3's 256 buckets up to distance 512 on a 300-token input
    (distances past 128 in log buckets), one narrow layer."""
    options = {**COMMON, **LAYOUTS["v3"], "position_buckets": 256}
    options.update(max_relative_positions=-1, max_position_embeddings=512)
    options.update(num_hidden_layers=1, hidden_size=16, intermediate_size=32)
    config = transformers.DebertaV2Config(**options)
    randomize(transformers.DebertaV2Model(config)).save_pretrained(tmp_path)
    model = keras_transformers.from_preset(tmp_path)
    assert model.config.disentangled.max_relative_positions == 512
    ids, mask = padded_batch(VOCAB, length=300, real=200)
    with torch.no_grad():
        theirs = reference(tmp_path, transformers.AutoModel)(
            input_ids=torch.tensor(ids).long(), attention_mask=torch.tensor(mask * 1)
        ).last_hidden_state.numpy()
    ours = model({"token_ids": ids, "padding_mask": mask})["sequence_output"]
    record("deberta v3 300 tokens", keras.ops.convert_to_numpy(ours), theirs, mask)
