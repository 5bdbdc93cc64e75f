"""Hugging Face ModernBERT conversion: alternating global and bidirectional
sliding-window layers with their own rotary bases, a GeGLU feed-forward,
LayerNorms with or without bias, the first block without attention norm.
Backbone and masked-LM outputs match `transformers` (torch, float32, eager
and sdpa attention) on tiny random-init models and a right-padded batch
longer than the window; exports load back in `transformers` with equal
outputs; options we cannot reproduce are refused by name; the presets have
the published parameter counts."""

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
from keras_transformers.convert import export_hf, modernbert  # noqa: E402
from keras_transformers.layers.masks import attention_mask  # noqa: E402
from keras_transformers.models import BertBackbone, BertMaskedLM  # noqa: E402

VOCAB = 100
TINY = dict(  # 4 layers: global, sliding, global, sliding; windows of +-2
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=4,
    num_attention_heads=4,
    global_attn_every_n_layers=2,
    local_attention=4,
    global_rope_theta=1000.0,
    local_rope_theta=50.0,
    max_position_embeddings=64,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    cls_token_id=1,
    sep_token_id=2,
)
BIASED = dict(norm_bias=True, attention_bias=True, mlp_bias=True, classifier_bias=True)
# (case) -> (HF class, HF config changes, our class)
CASES = {
    "base": ("ModernBertModel", {}, BertBackbone),
    "mlm": ("ModernBertForMaskedLM", {}, BertMaskedLM),
    "mlm biased": ("ModernBertForMaskedLM", BIASED, BertMaskedLM),
}


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root, dirs = tmp_path_factory.mktemp("hf_modernbert"), {}
    for case, (name, changes, _) in CASES.items():
        config = transformers.ModernBertConfig(**TINY, **changes)
        dirs[case] = root / case.replace(" ", "_")
        randomize(getattr(transformers, name)(config)).save_pretrained(dirs[case])
    return dirs


def _inputs(mlm: bool):
    ids, mask = padded_batch(VOCAB)
    inputs = {"token_ids": ids, "padding_mask": mask}
    if mlm:  # every position, as transformers scores them
        inputs["mask_positions"] = np.tile(
            np.arange(ids.shape[1], dtype="int32"), (2, 1)
        )
    return inputs


def _theirs(path, inputs, attention="eager"):
    architecture = json.loads((path / "config.json").read_text())["architectures"][0]
    model = reference(path, getattr(transformers, architecture), attention)
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(inputs["token_ids"]).long(),
            attention_mask=torch.tensor(inputs["padding_mask"] * 1),
        )
    hidden = out.get("last_hidden_state")
    return (out.logits if hidden is None else hidden).numpy()


def _ours(model, inputs):
    out = model(inputs)
    out = out["sequence_output"] if isinstance(out, dict) else out
    return keras.ops.convert_to_numpy(out)


@pytest.mark.parametrize("case", list(CASES))
def test_outputs_match_and_export_round_trips(hf_dirs, tmp_path, case):
    path, (name, _, cls) = hf_dirs[case], CASES[case]
    model = keras_transformers.from_preset(path)
    assert type(model) is cls
    config = model.config
    assert config.layer_types == ("full_attention", "sliding_attention") * 2
    assert config.layer_settings == {"sliding_attention": {"rope_max_wavelength": 50.0}}
    inputs = _inputs(cls is BertMaskedLM)
    ours = _ours(model, inputs)
    record(f"modernbert {case}", ours, _theirs(path, inputs), inputs["padding_mask"])
    if case == "base":  # the same parameters as transformers', and sdpa too
        theirs = reference(path, transformers.AutoModel).parameters()
        assert (
            model.count_params()
            == config.num_params()
            == sum(p.numel() for p in theirs)
        )
        sdpa = _theirs(path, inputs, "sdpa")
        record("modernbert base sdpa", ours, sdpa, inputs["padding_mask"])
    export_hf(model, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert (saved["model_type"], saved["architectures"]) == ("modernbert", [name])
    theirs = _theirs(tmp_path, inputs)
    record(f"modernbert {case} export", ours, theirs, inputs["padding_mask"])
    assert keras_transformers.from_preset(tmp_path).config == config


def test_encoder_sliding_windows_are_symmetric():
    """A sliding layer of an encoder sees `window // 2` keys on either side
    (and padding is masked); a causal one the `window` most recent."""
    both = keras.ops.convert_to_numpy(attention_mask(6, 6, sliding_window=4))[0, 0]
    distance = np.abs(np.arange(6)[:, None] - np.arange(6)[None, :])
    np.testing.assert_array_equal(both, distance <= 2)
    causal = attention_mask(6, 6, causal=True, sliding_window=2)
    lower = (np.arange(6)[None, :] <= np.arange(6)[:, None]) & (distance < 2)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(causal)[0, 0], lower)


def test_the_published_layout_reads(hf_dirs):
    """The hub's `global_rope_theta` / `local_rope_theta` /
    `global_attn_every_n_layers` layout converts as transformers 5's."""
    from keras_transformers.convert.modernbert import config_from_hf

    hub = dict(TINY, num_hidden_layers=6, global_attn_every_n_layers=3)
    fields = config_from_hf(hub)
    assert fields["layer_types"][:3] == [
        "full_attention",
        "sliding_attention",
        "sliding_attention",
    ]
    assert fields["rope_max_wavelength"] == 1000.0
    assert fields["sliding_window"] == 4
    assert fields["norm_type"] == "layer_no_bias"


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(mlp_bias=True), "mlp_bias=True"),
        (dict(classifier_activation="relu"), "classifier_activation='relu'"),
        (dict(decoder_bias=False), "decoder_bias=False"),
        (dict(tie_word_embeddings=False), "tie_word_embeddings=False"),
        (dict(hidden_activation="tanh"), "hidden_activation='tanh'"),
        (
            dict(
                rope_parameters={
                    "full_attention": {"rope_type": "linear", "factor": 2.0}
                }
            ),
            "rope_parameters",
        ),
    ],
)
def test_errors_name_the_option(hf_dirs, tmp_path, changes, match):
    path = edited_hf_dir(hf_dirs["mlm"], tmp_path / "edited", **changes)
    with pytest.raises(ValueError, match=match):
        keras_transformers.from_preset(path)


def test_a_bert_model_does_not_export_as_modernbert(tmp_path):
    model = BertBackbone.from_preset("bert_tiny", num_layers=1)
    with pytest.raises(
        ValueError, match="cannot be exported as Hugging Face 'modernbert'"
    ):
        export_hf(model, tmp_path, model_type="modernbert")


@pytest.mark.parametrize("name", ["modernbert_base", "modernbert_large"])
def test_presets_have_the_published_counts(name):
    """transformers' ModernBertModel from the preset's published config.json
    values, built on the meta device, has the preset's parameter count."""
    preset = keras_transformers.load_config(name)
    hf = modernbert.hf_config(preset)
    with torch.device("meta"):
        model = transformers.ModernBertModel(transformers.ModernBertConfig(**hf))
    assert sum(p.numel() for p in model.parameters()) == preset.num_params()
