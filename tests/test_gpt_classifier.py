"""`GPTClassifier`: a decoder pooled at each row's last real token, then a
bias-free `score` head. Logits match transformers' `*ForSequenceClassification`
(Llama, Qwen2, GPT-2) on a right-padded batch, and export back; a causal-LM
checkpoint gets a new head; left and right padding agree; fit, saving and
LoRA work; bad inputs raise clear errors."""

import json

import keras
import numpy as np
import pytest
from contracts import assert_close, compiled_forward, run_saving_test, to_numpy

import keras_transformers as kt
from keras_transformers import registry
from keras_transformers.convert import export_hf, hf_preset_data
from keras_transformers.models import BertBackbone, GPTCausalLM, GPTClassifier

VOCAB, LABELS = 96, 3
LLAMA = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    bos_token_id=1,
    eos_token_id=1,
    pad_token_id=0,
)
HF_TINY = {
    "llama": dict(LLAMA, tie_word_embeddings=False),
    "qwen2": dict(LLAMA, use_sliding_window=False),
    "gpt2": dict(
        vocab_size=VOCAB,
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=64,
        bos_token_id=1,
        eos_token_id=1,
        pad_token_id=0,
    ),
}


def tiny(**overrides):
    """A one-block rotary classifier (fewer ops to compile per test)."""
    keras.utils.set_random_seed(0)
    return GPTClassifier.from_preset("gpt_llama_tiny", num_layers=1, **overrides)


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """A random-init transformers `*ForSequenceClassification` per type."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from hf_parity import randomize

    torch.manual_seed(0)
    root, dirs = tmp_path_factory.mktemp("hf_cls"), {}
    for kind, fields in HF_TINY.items():
        config = transformers.AutoConfig.for_model(kind, num_labels=LABELS, **fields)
        model = transformers.AutoModelForSequenceClassification.from_config(config)
        dirs[kind] = root / kind
        randomize(model).save_pretrained(dirs[kind])
    return dirs


def hf_logits(path, ids, mask):
    import transformers
    from hf_parity import hf_outputs, reference

    cls = transformers.AutoModelForSequenceClassification
    return hf_outputs(reference(path, cls), ids, mask)


@pytest.mark.parametrize("kind", sorted(HF_TINY))
def test_logits_match_transformers_and_export_back(hf_dirs, tmp_path, kind):
    from hf_parity import our_outputs, padded_batch, record

    ids, mask = padded_batch(VOCAB)  # row 1 right-padded with pad id 0
    assert hf_preset_data(hf_dirs[kind])["task"]["num_classes"] == LABELS
    model = kt.from_preset(hf_dirs[kind])
    assert isinstance(model, GPTClassifier) and model.num_classes == LABELS
    ours = our_outputs(model, ids, mask)
    assert ours.shape == (2, LABELS)
    record(f"{kind} classifier", ours, hf_logits(hf_dirs[kind], ids, mask), None, 1e-5)
    export_hf(model, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"] == [registry.converter(kind).sequence_classifier]
    assert len(saved["id2label"]) == LABELS
    record(f"{kind} export", ours, hf_logits(tmp_path, ids, mask), None, 1e-5)


@pytest.mark.filterwarnings("ignore:.*were not used")  # the unread score.weight
def test_causal_lm_checkpoint_gets_a_new_head(hf_dirs, tmp_path):
    lm = GPTCausalLM.from_preset("gpt_llama_tiny", num_layers=1)
    export_hf(lm, tmp_path / "lm")
    with pytest.warns(UserWarning, match="not a LlamaForSequenceClassification"):
        model = GPTClassifier.from_preset(tmp_path / "lm", num_classes=4)
    ids = np.array([[5, 6, 7, 8]], "int32")
    assert_close(model.backbone(ids), lm.backbone(ids), atol=1e-6)
    assert tuple(model(ids).shape) == (1, 4)
    # A classifier checkpoint asked for another number of classes: new head.
    with pytest.warns(UserWarning, match="3 classes, not 5"):
        other = GPTClassifier.from_preset(hf_dirs["llama"], num_classes=5)
    assert tuple(other.score.kernel.shape) == (32, 5)


def test_every_declared_classifier_exists_in_transformers():
    transformers = pytest.importorskip("transformers")
    declared = {
        name: c.sequence_classifier
        for name, c in registry.converters().items()
        if c.family == "gpt" and c.sequence_classifier
    }
    assert {"llama", "qwen2", "qwen3", "mistral", "gpt2", "gpt_neox"} <= set(declared)
    missing = {k: v for k, v in declared.items() if not hasattr(transformers, v)}
    assert not missing


def test_left_and_right_padding_give_the_same_logits():
    model = tiny(num_classes=3)
    right = np.array([[5, 6, 7, 0, 0], [9, 10, 11, 12, 13]], "int32")
    left = np.array([[0, 0, 5, 6, 7], [9, 10, 11, 12, 13]], "int32")
    out = [
        to_numpy(compiled_forward(model, {"token_ids": x, "padding_mask": x != 0}))
        for x in (right, left)
    ]
    assert out[0].shape == (2, 3)
    assert_close(out[0], out[1], atol=1e-5)
    alone = compiled_forward(model, np.array([[5, 6, 7]], "int32"))
    assert_close(out[0][:1], alone, atol=1e-5)


def test_fit_lowers_the_loss_on_a_separable_task():
    """The class is whether the last real token is in the upper half."""
    model = tiny(num_classes=2)
    rng = np.random.default_rng(0)
    ids = rng.integers(2, 60, (32, 6)).astype("int32")
    lengths = rng.integers(3, 7, 32)
    mask = np.arange(6)[None, :] < lengths[:, None]
    ids[~mask] = 0
    labels = (ids[np.arange(32), lengths - 1] >= 31).astype("int32")
    x = {"token_ids": ids, "padding_mask": mask}
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    unread = model.backbone.token_embedding.reverse_embeddings  # untied LM head
    assert id(unread) not in {id(v) for v in model.trainable_weights}
    history = model.fit(x, labels, batch_size=16, epochs=8, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < 0.7 * losses[0], losses


def test_saving_round_trips(tmp_path):
    model = tiny(num_classes=3, classifier_dropout=0.1)
    ids = np.array([[5, 6, 7, 0], [5, 6, 7, 8]], "int32")
    inputs = {"token_ids": ids, "padding_mask": ids != 0}
    reloaded = run_saving_test(model, inputs, tmp_path)
    assert (reloaded.num_classes, reloaded.classifier_dropout) == (3, 0.1)
    assert isinstance(kt.from_preset(tmp_path / "preset"), GPTClassifier)
    # A saved causal LM loads as a classifier (with a new head) and back.
    GPTCausalLM(model.backbone).save_to_preset(tmp_path / "lm")
    again = GPTClassifier.from_preset(tmp_path / "lm", num_classes=2)
    assert_close(again.backbone(ids), model.backbone(ids), atol=1e-6)


def test_lora_keeps_the_score_head_trainable():
    model = tiny()
    model.enable_lora(2)
    trainable = {id(v) for v in model.trainable_weights}
    assert id(model.score.kernel) in trainable
    assert id(model.backbone.token_embedding.embeddings) not in trainable
    assert len(trainable) == 1 + 2 * 2  # score + A, B of query and value


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="num_classes"):
        tiny(num_classes=0)
    model = tiny()
    with pytest.raises(ValueError, match="needs a GPTBackbone"):
        GPTClassifier(BertBackbone.from_preset("bert_tiny", num_layers=1))
    ids = np.array([[5, 6, 7], [5, 6, 7]], "int32")
    empty = np.array([[1, 1, 1], [0, 0, 0]], bool)
    with pytest.raises(ValueError, match="Row 1 of `padding_mask` has no real"):
        model({"token_ids": ids, "padding_mask": empty})
    with pytest.raises(ValueError, match="unknown key"):
        model({"token_ids": ids, "labels": np.zeros(2, "int32")})
    with pytest.raises(ValueError, match="shape"):
        model({"token_ids": ids, "padding_mask": np.ones((2, 4), bool)})
    with pytest.raises(ValueError, match="batch dimension"):
        model(np.array([5, 6, 7], "int32"))
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(ValueError, match="Label 2 is outside"):
        model.fit(ids, np.array([0, 2]), verbose=0)
    with pytest.raises(ValueError, match="no real token"):
        model.fit({"token_ids": ids, "padding_mask": empty}, np.zeros(2), verbose=0)
