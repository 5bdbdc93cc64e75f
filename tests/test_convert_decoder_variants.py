"""Hugging Face decoders whose blocks differ from Llama's, through the
per-layer seam: GPT-NeoX / Pythia (parallel residuals, partial rotary, a
fused per-head query / key / value projection, LayerNorm with biases),
OLMo 2 (norms on the sub-layers' outputs, q/k norms over the whole
projection) and SmolLM3 (layers without rotary positions: a layer type).
Logits on a right-padded batch and cached greedy generation match
`transformers` (torch, float32, eager attention) on tiny random-init
models; export round-trips through `from_pretrained`; options we cannot
represent raise errors that name them; the presets have the published
parameter counts."""

import json

import numpy as np
import pytest
from contracts import edited_hf_dir

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from hf_parity import (  # noqa: E402
    assert_greedy_matches,
    hf_outputs,
    our_outputs,
    padded_batch,
    randomize,
    record,
    reference,
)

import keras_transformers  # noqa: E402
from keras_transformers import registry  # noqa: E402
from keras_transformers.config.layer_types import layer_settings  # noqa: E402
from keras_transformers.convert import export_hf  # noqa: E402
from keras_transformers.models import GPTCausalLM  # noqa: E402

VOCAB, LENGTH = 96, 12
SMOLLM3 = dict(
    num_key_value_heads=2, rope_theta=500.0, no_rope_layer_interval=2, pad_token_id=0
)
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=64,
    bos_token_id=0,
    eos_token_id=1,
)
# case -> (model_type, its tiny config). Rotary on half of each head of 8
# features (GPT-NeoX), grouped-query attention (OLMo 2, SmolLM3), every
# second layer without rotary positions (SmolLM3; with a window shorter than
# the batch on those layers in "smollm3_sliding"), a rotary base other than
# the default everywhere.
TINY = {
    "gpt_neox": (
        "gpt_neox",
        dict(rotary_pct=0.5, rotary_emb_base=500.0, use_parallel_residual=True),
    ),
    "gpt_neox_sequential": (
        "gpt_neox",
        dict(rotary_pct=0.5, rotary_emb_base=500.0, use_parallel_residual=False),
    ),
    "olmo2": ("olmo2", dict(num_key_value_heads=2, rope_theta=500.0)),
    "smollm3": ("smollm3", dict(SMOLLM3)),
    "smollm3_sliding": (
        "smollm3",
        dict(SMOLLM3, use_sliding_window=True, sliding_window=4),
    ),
}
CASES = sorted(TINY)
# Cached greedy generation: one case per type (the others share its cache).
GREEDY = ["gpt_neox", "olmo2", "smollm3"]
# Published configs (the checkpoints' config.json, fields that differ from
# the config class's defaults) and transformers' meta-device counts.
PYTHIA = dict(
    vocab_size=50304,
    rotary_pct=0.25,
    rotary_emb_base=10000,
    tie_word_embeddings=False,
    use_parallel_residual=True,
    bos_token_id=0,
    eos_token_id=0,
)
OLMO2 = dict(
    vocab_size=100352,
    max_position_embeddings=4096,
    rope_theta=500000,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    pad_token_id=100277,
    eos_token_id=100257,
)
FULL = {
    "pythia_160m": (
        "gpt_neox",
        dict(
            PYTHIA,
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            intermediate_size=3072,
        ),
        162_322_944,
    ),
    "pythia_410m": (
        "gpt_neox",
        dict(
            PYTHIA,
            hidden_size=1024,
            num_hidden_layers=24,
            num_attention_heads=16,
            intermediate_size=4096,
        ),
        405_334_016,
    ),
    "olmo2_1b": (
        "olmo2",
        dict(
            OLMO2,
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=16,
            num_key_value_heads=16,
        ),
        1_484_916_736,
    ),
    "olmo2_7b": (
        "olmo2",
        dict(
            OLMO2,
            hidden_size=4096,
            intermediate_size=11008,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=32,
        ),
        7_298_617_344,
    ),
    "smollm3_3b": (
        "smollm3",
        dict(
            vocab_size=128256,
            hidden_size=2048,
            intermediate_size=11008,
            num_hidden_layers=36,
            num_attention_heads=16,
            num_key_value_heads=4,
            max_position_embeddings=65536,
            rope_theta=5000000.0,
            rms_norm_eps=1e-6,
            bos_token_id=None,
            eos_token_id=128012,
            pad_token_id=128004,
        ),
        3_075_098_624,
    ),
}


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root, dirs = tmp_path_factory.mktemp("hf_variants"), {}
    for case, (kind, fields) in TINY.items():
        config = transformers.AutoConfig.for_model(kind, **{**COMMON, **fields})
        model = randomize(transformers.AutoModelForCausalLM.from_config(config))
        dirs[case] = root / case
        model.save_pretrained(dirs[case])
    return dirs


@pytest.fixture(scope="module")
def lms(hf_dirs):
    """Our causal LM of each case, loaded once."""
    return {case: keras_transformers.from_preset(hf_dirs[case]) for case in CASES}


@pytest.mark.parametrize("case", CASES)
def test_causal_lm_logits_match(hf_dirs, lms, case):
    ids, mask = padded_batch(VOCAB, LENGTH)
    expected = hf_outputs(reference(hf_dirs[case]), ids, mask)
    assert isinstance(lms[case], GPTCausalLM)
    assert lms[case].count_params() == lms[case].config.num_params()
    record(f"{case} logits", our_outputs(lms[case], ids, mask), expected, mask)


@pytest.mark.parametrize("case", GREEDY)
def test_greedy_generation_matches(hf_dirs, case):
    prompt = np.array([[5, 17, 42, 90, 3]], "int32")
    assert_greedy_matches(hf_dirs[case], prompt, max_new_tokens=8)


@pytest.mark.parametrize("case", CASES)
def test_export_round_trip(hf_dirs, lms, tmp_path, case):
    """`export_hf` without a `model_type` writes the type back; transformers
    loads it with the same outputs, and it loads back to the same config."""
    lm = lms[case]
    export_hf(lm, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == TINY[case][0]
    ids, mask = padded_batch(VOCAB, LENGTH)
    theirs = hf_outputs(reference(tmp_path), ids, mask)
    record(f"{case} export", our_outputs(lm, ids, mask), theirs, mask)
    assert keras_transformers.load_config(tmp_path) == lm.config


def test_config_mapping(hf_dirs):
    neox = keras_transformers.load_config(hf_dirs["gpt_neox"])
    assert (neox.norm_position, neox.rotary_fraction) == ("parallel", 0.5)
    assert (neox.rope_max_wavelength, neox.norm_type) == (500.0, "layer")
    assert neox.use_bias and not neox.tie_embeddings
    sequential = keras_transformers.load_config(hf_dirs["gpt_neox_sequential"])
    assert sequential.norm_position == "pre"
    olmo2 = keras_transformers.load_config(hf_dirs["olmo2"])
    assert (olmo2.norm_position, olmo2.qk_norm) == ("output", "projection")
    assert (olmo2.norm_type, olmo2.use_bias, olmo2.num_kv_heads) == ("rms", False, 2)
    smollm3 = keras_transformers.load_config(hf_dirs["smollm3"])
    assert smollm3.layer_types == ("full_attention", "no_rope_attention")
    assert [layer_settings(smollm3, i)["rope_max_wavelength"] for i in (0, 1)] == [
        500.0,
        None,
    ]
    sliding = keras_transformers.load_config(hf_dirs["smollm3_sliding"])
    assert sliding.layer_types == ("full_attention", "sliding_attention")
    assert sliding.layer_settings == {"sliding_attention": {"rotary": False}}
    assert [layer_settings(sliding, i)["sliding_window"] for i in (0, 1)] == [None, 4]


def test_smollm3_no_rope_layers_list_wins(hf_dirs, tmp_path):
    """An explicit `no_rope_layers` (1: rotary) decides over the interval."""
    path = edited_hf_dir(hf_dirs["smollm3"], tmp_path / "listed", no_rope_layers=[0, 1])
    config = keras_transformers.load_config(path)
    assert config.layer_types == ("no_rope_attention", "full_attention")


@pytest.mark.parametrize(
    "case, changes, match",
    [
        ("gpt_neox", dict(attention_bias=False), "GPT-NeoX config has attention_bias"),
        ("gpt_neox", dict(hidden_act="gelu_10"), "GPT-NeoX hidden_act='gelu_10'"),
        (
            "gpt_neox",
            dict(rope_parameters={"rope_type": "mrope", "rope_theta": 1e4}),
            "GPT-NeoX config's rope_scaling is invalid",
        ),
        ("olmo2", dict(attention_bias=True), "OLMo2 config has attention_bias"),
        ("olmo2", dict(hidden_act="gelu"), "OLMo2 hidden_act='gelu'"),
        (
            "smollm3",
            dict(no_rope_layers=[1, 1, 0]),
            "3 no_rope_layers for num_hidden_layers=2",
        ),
        (
            "smollm3_sliding",
            dict(layer_types=["sliding_attention"] * 2, no_rope_layers=[1, 0]),
            "sliding-window layers both with and without rotary",
        ),
    ],
)
def test_errors_name_the_problem(hf_dirs, tmp_path, case, changes, match):
    path = edited_hf_dir(hf_dirs[case], tmp_path / "edited", **changes)
    with pytest.raises(ValueError, match=match):
        keras_transformers.load_config(path)


@pytest.mark.parametrize("name", sorted(FULL))
def test_published_parameter_counts(name):
    """transformers' model on the meta device, our count of the converted
    config and the preset all give the published figure."""
    kind, fields, published = FULL[name]
    config = transformers.AutoConfig.for_model(kind, **fields)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == published
    converted = registry.converter(kind).config_from_hf(config.to_dict())
    config = keras_transformers.TransformerConfig.from_dict(converted)
    assert config.num_params() == published
    assert keras_transformers.load_config(name) == config
