"""Hugging Face ESM-2 conversion: a pre-norm BERT with rotary positions, a
final norm and token dropout (mask-token embeddings zeroed, the others
rescaled by the masked fraction of the real tokens). Backbone (with its
pooler) and masked-LM outputs match `transformers` (torch, float32) on tiny
random-init models and a right-padded batch holding mask tokens; exports
load back in `transformers` with equal outputs; `EsmTokenizer` gives
transformers' ids; options we cannot reproduce are refused by name; the
presets have the published parameter counts."""

import json
import random

import keras
import numpy as np
import pytest
from contracts import edited_hf_dir

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from hf_parity import padded_batch, randomize, record, reference  # noqa: E402
from transformers.models.esm.configuration_esm import (  # noqa: E402
    get_default_vocab_list,
)

import keras_transformers  # noqa: E402
from keras_transformers.convert import esm, export_hf  # noqa: E402
from keras_transformers.models import BertBackbone, BertMaskedLM  # noqa: E402
from keras_transformers.tokenizer.esm import EsmTokenizer  # noqa: E402

VOCAB, MASK, PAD = 33, 32, 1
TINY = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=64,
    layer_norm_eps=1e-5,
    position_embedding_type="rotary",
    rope_theta=100.0,
    token_dropout=True,
    mask_token_id=MASK,
    pad_token_id=PAD,
)
# case -> (HF class, HF config changes, our class)
CASES = {
    "base": ("EsmModel", {}, BertBackbone),
    "mlm": ("EsmForMaskedLM", {}, BertMaskedLM),
    "base norm before": ("EsmModel", dict(emb_layer_norm_before=True), BertBackbone),
}
PROTEINS = ["MKTAYIAKQR", "M<mask>KT AY", "mkTJ<masK>A.-", "<cls>MK<eos><pad>", ""]


def _contact_head(config) -> int:
    """Parameters of transformers' contact head (not converted)."""
    return config.num_hidden_layers * config.num_attention_heads + 1


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root, dirs = tmp_path_factory.mktemp("hf_esm"), {}
    vocab = root / "vocab.txt"
    vocab.write_text("\n".join(get_default_vocab_list()))
    for case, (name, changes, _) in CASES.items():
        config = transformers.EsmConfig(**TINY, **changes)
        dirs[case] = root / case.replace(" ", "_")
        randomize(getattr(transformers, name)(config)).save_pretrained(dirs[case])
        transformers.EsmTokenizer(str(vocab)).save_pretrained(dirs[case])
    return dirs


def _inputs(mlm: bool):
    ids, mask = padded_batch(VOCAB)
    ids[0, [3, 5]], ids[1, 2] = MASK, MASK  # token dropout: 2/12 and 1/7 masked
    ids[1, ~mask[1]] = PAD
    inputs = {"token_ids": ids, "padding_mask": mask}
    if mlm:  # every position, as transformers scores them
        inputs["mask_positions"] = np.tile(
            np.arange(ids.shape[1], dtype="int32"), (2, 1)
        )
    return inputs


def _theirs(path, inputs):
    architecture = json.loads((path / "config.json").read_text())["architectures"][0]
    with torch.no_grad():
        out = reference(path, getattr(transformers, architecture))(
            input_ids=torch.tensor(inputs["token_ids"]).long(),
            attention_mask=torch.tensor(inputs["padding_mask"] * 1),
        )
    return out


def _compare(model, path, inputs, case):
    out, theirs = model(inputs), _theirs(path, inputs)
    mask = inputs["padding_mask"]
    if isinstance(out, dict):  # a backbone with its pooler
        hidden = keras.ops.convert_to_numpy(out["sequence_output"])
        record(case, hidden, theirs.last_hidden_state.numpy(), mask)
        pooled = keras.ops.convert_to_numpy(out["pooled_output"])[:, None]
        record(case + " pooled", pooled, theirs.pooler_output.numpy()[:, None])
    else:
        record(case, keras.ops.convert_to_numpy(out), theirs.logits.numpy(), mask)


@pytest.mark.parametrize("case", list(CASES))
def test_outputs_match_and_export_round_trips(hf_dirs, tmp_path, case):
    path, (name, _, cls) = hf_dirs[case], CASES[case]
    model = keras_transformers.from_preset(path)
    assert type(model) is cls
    assert model.config.token_dropout_mask_id == MASK
    inputs = _inputs(cls is BertMaskedLM)
    _compare(model, path, inputs, f"esm {case}")
    if cls is BertBackbone:  # transformers' parameters, less the contact head
        hf = reference(path, transformers.EsmModel)
        theirs = sum(p.numel() for p in hf.parameters()) - _contact_head(hf.config)
        assert model.count_params() == model.config.num_params() == theirs
    export_hf(model, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert (saved["model_type"], saved["architectures"]) == ("esm", [name])
    _compare(model, tmp_path, inputs, f"esm {case} export")
    assert keras_transformers.from_preset(tmp_path).config == model.config


def test_tokenizer_gives_transformers_ids(hf_dirs, tmp_path):
    """The checkpoint's `EsmTokenizer` files load as ours, with
    transformers' ids on protein strings (special tokens written in the
    text, spaces, unknown letters) and its decoding; saved assets load back
    in both."""
    model = keras_transformers.from_preset(hf_dirs["mlm"])
    ours = model.tokenizer
    assert isinstance(ours, EsmTokenizer)
    theirs = transformers.AutoTokenizer.from_pretrained(hf_dirs["mlm"])
    rng = random.Random(0)
    letters = [*"LAGVSERTIDPKQNFYMHWCXBUZO.-", "<mask>", "<cls>", " ", "j", "<"]
    texts = PROTEINS + ["".join(rng.choices(letters, k=20)) for _ in range(50)]
    for text in texts:
        assert ours.encode(text) == theirs.encode(text, add_special_tokens=False)
        assert ours.encode(text, add_special_tokens=True) == theirs.encode(text)
    ids = theirs.encode(PROTEINS[1])
    assert ours.decode(ids) == theirs.decode(ids)
    assert ours.decode(ids, skip_special_tokens=True) == theirs.decode(
        ids, skip_special_tokens=True
    )
    batch = ours.encode(["MK", "M<mask>"], sequence_length=8, add_special_tokens=True)
    assert batch.shape == (2, 8) and batch[0, -1] == PAD
    ours.save_assets(tmp_path)
    again = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert again.encode(PROTEINS[1]) == ours.encode(
        PROTEINS[1], add_special_tokens=True
    )


@pytest.mark.parametrize(
    "changes, match",
    [
        (
            dict(position_embedding_type="absolute"),
            "position_embedding_type='absolute'",
        ),
        (dict(is_decoder=True), "is_decoder=True"),
        (dict(is_folding_model=True), "is_folding_model=True"),
        (dict(mask_token_id=None), "token_dropout=True but no mask_token_id"),
        (dict(tie_word_embeddings=False), "tie_word_embeddings=False"),
    ],
)
def test_errors_name_the_option(hf_dirs, tmp_path, changes, match):
    path = edited_hf_dir(hf_dirs["mlm"], tmp_path / "edited", **changes)
    with pytest.raises(ValueError, match=match):
        keras_transformers.from_preset(path)


def test_a_bert_model_does_not_export_as_esm(tmp_path):
    model = BertBackbone.from_preset("bert_tiny", num_layers=1)
    with pytest.raises(ValueError, match="cannot be exported as Hugging Face 'esm'"):
        export_hf(model, tmp_path, model_type="esm")


@pytest.mark.parametrize("name", ["esm2_t6_8m", "esm2_t12_35m", "esm2_t33_650m"])
def test_presets_have_the_published_counts(name):
    """transformers' EsmModel (no pooler) from the preset's published
    config.json values, built on the meta device, less its contact head, has
    the preset's parameter count."""
    preset = keras_transformers.load_config(name)
    config = transformers.EsmConfig(**esm.hf_config(preset))
    with torch.device("meta"):
        model = transformers.EsmModel(config, add_pooling_layer=False)
    count = sum(p.numel() for p in model.parameters()) - _contact_head(config)
    assert count == preset.num_params()
