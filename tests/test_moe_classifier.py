"""`MixtralClassifier`: a sparse-MoE decoder pooled at each row's last real
token, then a bias-free `score` head. Logits match transformers'
`*ForSequenceClassification` (Mixtral, gpt-oss, Qwen2-MoE, Qwen3-MoE) on a
right-padded batch, and export back; a causal-LM checkpoint gets a new head;
`fit` adds the routers' losses and logs their statistics; a type without a
sequence classifier in transformers refuses the export, naming the fix."""

import json

import keras
import numpy as np
import pytest
from contracts import assert_close, run_saving_test

import keras_transformers as kt
from keras_transformers import registry
from keras_transformers.convert import export_hf, hf_preset_data
from keras_transformers.models import (
    GPTBackbone,
    MixtralCausalLM,
    MixtralClassifier,
)

VOCAB, LABELS = 96, 3
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    num_experts_per_tok=2,
    router_aux_loss_coef=0.01,
    bos_token_id=1,
    eos_token_id=1,
    pad_token_id=0,
)
ROPE = {"rope_type": "default", "rope_theta": 500.0}
HF_TINY = {
    "mixtral": dict(
        COMMON, intermediate_size=24, num_local_experts=4, rope_parameters=ROPE
    ),
    "gpt_oss": dict(
        COMMON,
        intermediate_size=24,
        head_dim=16,
        num_local_experts=4,
        sliding_window=4,  # layer 0 sliding, layer 1 full
        swiglu_limit=0.5,
        rope_parameters=dict(
            rope_type="yarn",
            rope_theta=500.0,
            factor=4.0,
            beta_fast=8.0,
            beta_slow=1.0,
            truncate=False,
            original_max_position_embeddings=16,
        ),
    ),
    "qwen2_moe": dict(
        COMMON,
        intermediate_size=48,
        num_experts=4,
        moe_intermediate_size=24,
        shared_expert_intermediate_size=40,
        mlp_only_layers=[0],
        rope_parameters=ROPE,
    ),
    "qwen3_moe": dict(
        COMMON,
        intermediate_size=48,
        num_experts=4,
        moe_intermediate_size=24,
        head_dim=16,
        norm_topk_prob=True,
        rope_parameters=ROPE,
    ),
}


def tiny(**overrides):
    """A one-block sparse-MoE classifier (fewer ops to compile per test)."""
    keras.utils.set_random_seed(0)
    return MixtralClassifier.from_preset("mixtral_tiny", num_layers=1, **overrides)


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """A random-init transformers `*ForSequenceClassification` per type, and
    the Mixtral one's base model saved as a `MixtralForCausalLM`."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from hf_parity import randomize

    torch.manual_seed(0)
    root, dirs = tmp_path_factory.mktemp("hf_moe_cls"), {}
    for kind, fields in HF_TINY.items():
        config = transformers.AutoConfig.for_model(kind, num_labels=LABELS, **fields)
        model = transformers.AutoModelForSequenceClassification.from_config(config)
        dirs[kind] = root / kind
        randomize(model).save_pretrained(dirs[kind])
    config = transformers.MixtralConfig(**HF_TINY["mixtral"])
    dirs["mixtral lm"] = root / "mixtral_lm"
    randomize(transformers.MixtralForCausalLM(config)).save_pretrained(
        dirs["mixtral lm"]
    )
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
    data = hf_preset_data(hf_dirs[kind])
    assert data["class_name"] == "MixtralClassifier"
    assert data["task"]["num_classes"] == LABELS
    model = kt.from_preset(hf_dirs[kind])
    assert isinstance(model, MixtralClassifier) and model.num_classes == LABELS
    ours = our_outputs(model, ids, mask)
    assert ours.shape == (2, LABELS)
    theirs = hf_logits(hf_dirs[kind], ids, mask)
    record(f"{kind} classifier", ours, theirs, None, 1e-5)
    export_hf(model, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"] == [registry.converter(kind).sequence_classifier]
    assert saved["model_type"] == kind and len(saved["id2label"]) == LABELS
    record(f"{kind} export", ours, hf_logits(tmp_path, ids, mask), None, 1e-5)


@pytest.mark.filterwarnings("ignore:.*were not used")  # the unread lm_head
def test_causal_lm_checkpoint_gets_a_new_head(hf_dirs, tmp_path):
    ids = np.array([[5, 6, 7, 8]], "int32")
    with pytest.warns(UserWarning, match="not a MixtralForSequenceClassification"):
        model = MixtralClassifier.from_preset(hf_dirs["mixtral lm"], num_classes=4)
    lm = kt.from_preset(hf_dirs["mixtral lm"])
    assert isinstance(lm, MixtralCausalLM)
    assert_close(model.backbone(ids), lm.backbone(ids), atol=1e-6)
    assert tuple(model(ids).shape) == (1, 4)
    # A classifier checkpoint asked for another number of classes: new head.
    with pytest.warns(UserWarning, match="3 classes, not 5"):
        other = MixtralClassifier.from_preset(hf_dirs["mixtral"], num_classes=5)
    assert tuple(other.score.kernel.shape) == (32, 5)
    # A causal LM saved by us loads as a classifier too.
    lm.save_to_preset(tmp_path / "lm")
    again = MixtralClassifier.from_preset(tmp_path / "lm", num_classes=2)
    assert_close(again.backbone(ids), lm.backbone(ids), atol=1e-6)
    assert again.num_classes == 2


def test_fit_adds_router_losses_and_logs_router_statistics():
    model = tiny(num_classes=2)
    rng = np.random.default_rng(0)
    ids = rng.integers(2, 60, (4, 6)).astype("int32")
    ids[1, 4:] = 0
    x = {"token_ids": ids, "padding_mask": ids != 0}
    model(x, training=True)
    assert len(model.losses) == model.config.num_layers  # one term per MoE layer
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    unread = model.backbone.token_embedding.reverse_embeddings  # untied LM head
    assert id(unread) not in {id(v) for v in model.trainable_weights}
    before = keras.ops.convert_to_numpy(model.score.kernel).copy()
    history = model.fit(x, np.array([0, 1, 1, 0]), batch_size=4, verbose=0).history
    assert np.isfinite(history["loss"][0])
    assert history["router_aux_loss"][0] > 0
    loads = [history[f"expert_load_{e}"][0] for e in range(4)]
    assert abs(sum(loads) - 1) < 1e-5
    assert not np.allclose(keras.ops.convert_to_numpy(model.score.kernel), before)


def test_saving_round_trips(tmp_path):
    model = tiny(num_classes=3, classifier_dropout=0.1)
    ids = np.array([[5, 6, 7, 0], [5, 6, 7, 8]], "int32")
    inputs = {"token_ids": ids, "padding_mask": ids != 0}
    reloaded = run_saving_test(model, inputs, tmp_path)
    assert (reloaded.num_classes, reloaded.classifier_dropout) == (3, 0.1)
    assert isinstance(kt.from_preset(tmp_path / "preset"), MixtralClassifier)


def test_types_without_a_classifier_refuse_the_export(tmp_path):
    transformers = pytest.importorskip("transformers")
    mixtral = {
        name: c for name, c in registry.converters().items() if c.family == "mixtral"
    }
    declared = {k: c.sequence_classifier for k, c in mixtral.items()}
    assert {"mixtral", "gpt_oss", "qwen2_moe", "qwen3_moe"} <= {
        k for k, v in declared.items() if v
    }
    assert all(hasattr(transformers, v) for v in declared.values() if v)
    # The undeclared ones: transformers has none (a new version may add it).
    assert not hasattr(transformers, "Qwen3_5MoeTextForSequenceClassification")
    assert declared["qwen3_5_moe_text"] is None
    with pytest.raises(ValueError, match=r"no sequence classifier.*model\.backbone"):
        export_hf(tiny(), tmp_path / "out", model_type="qwen3_5_moe_text")
    assert not (tmp_path / "out").exists()


def test_needs_a_sparse_backbone():
    with pytest.raises(ValueError, match="needs a MixtralBackbone"):
        MixtralClassifier(GPTBackbone.from_preset("gpt_llama_tiny", num_layers=1))
