"""Hugging Face Gemma 4 text (`gemma4_text`) conversion through the
per-layer seam: sliding and full layers with their own head size,
key/value heads and rotary ("proportional" partial rotary on full layers),
values taken from the keys, value norms, per-layer input embeddings, the
last layers reusing earlier layers' keys and values (and a twice-wide
feed-forward there), a constant scale on each block's output and
soft-capped logits. Logits on a right-padded batch longer than the window
and cached greedy generation match `transformers` (torch, float32, eager
attention) on tiny random-init models; export round-trips; bad configs
raise errors naming the option; the presets have the published parameter
counts."""

import json

import keras
import numpy as np
import pytest
from contracts import (
    compiled_cached_call,
    edited_hf_dir,
    randomize_weights,
    run_layer_test,
)

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
from keras_transformers import TransformerConfig, registry  # noqa: E402
from keras_transformers.config.layer_types import kv_sharing  # noqa: E402
from keras_transformers.convert import export_hf  # noqa: E402
from keras_transformers.layers import PerLayerInputGate, PerLayerInputs  # noqa: E402
from keras_transformers.rotary_scaling import rotary_frequencies  # noqa: E402

VOCAB, LENGTH, WINDOW = 96, 12, 4
S, F = "sliding_attention", "full_attention"
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=64,
    sliding_window=WINDOW,
    layer_types=[S, F, S, F],
    bos_token_id=0,
    eos_token_id=1,
    pad_token_id=0,
)
TINY = {
    # Everything on: full layers 32 wide with one key/value head shared by
    # keys and values, half of their pairs rotating; per-layer inputs; the
    # last two layers reuse layers 0 and 1's keys and values.
    "all": dict(
        global_head_dim=32,
        num_global_key_value_heads=1,
        attention_k_eq_v=True,
        rope_parameters={
            S: {"rope_type": "default", "rope_theta": 50.0},
            F: {
                "rope_type": "proportional",
                "partial_rotary_factor": 0.5,
                "rope_theta": 500.0,
            },
        },
        num_kv_shared_layers=2,
        use_double_wide_mlp=True,
        hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=VOCAB,
        final_logit_softcapping=3.0,
    ),
    # Everything off: one head size, plain rotaries, no per-layer inputs.
    "plain": dict(
        global_head_dim=16,
        rope_parameters={
            S: {"rope_type": "default", "rope_theta": 50.0},
            F: {"rope_type": "default", "rope_theta": 500.0},
        },
        hidden_size_per_layer_input=0,
    ),
    # The MoE block: a dense feed-forward beside 4 experts (top 2).
    "moe": dict(
        global_head_dim=32,
        num_global_key_value_heads=1,
        attention_k_eq_v=True,
        enable_moe_block=True,
        num_experts=4,
        top_k_experts=2,
        moe_intermediate_size=16,
        hidden_size_per_layer_input=0,
    ),
}
KINDS = sorted(TINY)
# The published text configs (text_config of google/gemma-4-E2B, -E4B, -31B
# and -26B-A4B) and transformers' parameter counts of Gemma4ForCausalLM.
PUBLISHED = {
    "gemma4_e2b": (
        dict(
            hidden_size=1536,
            num_hidden_layers=35,
            num_attention_heads=8,
            num_key_value_heads=1,
            intermediate_size=6144,
            hidden_size_per_layer_input=256,
            num_kv_shared_layers=20,
            use_double_wide_mlp=True,
            layer_types=([S] * 4 + [F]) * 7,
        ),
        4_628_569_344,
    ),
    "gemma4_e4b": (
        dict(
            hidden_size=2560,
            num_hidden_layers=42,
            num_attention_heads=8,
            num_key_value_heads=2,
            intermediate_size=10240,
            hidden_size_per_layer_input=256,
            num_kv_shared_layers=18,
            layer_types=([S] * 5 + [F]) * 7,
        ),
        7_463_013_376,
    ),
    "gemma4_31b": (
        dict(
            hidden_size=5376,
            num_hidden_layers=60,
            num_attention_heads=32,
            num_key_value_heads=16,
            num_global_key_value_heads=4,
            attention_k_eq_v=True,
            intermediate_size=21504,
            hidden_size_per_layer_input=0,
            sliding_window=1024,
            max_position_embeddings=262144,
            use_bidirectional_attention="vision",
            layer_types=([S] * 5 + [F]) * 10,
        ),
        30_697_345_280,
    ),
    "gemma4_26b_a4b": (
        dict(
            hidden_size=2816,
            num_hidden_layers=30,
            num_attention_heads=16,
            num_key_value_heads=8,
            num_global_key_value_heads=2,
            attention_k_eq_v=True,
            intermediate_size=2112,
            enable_moe_block=True,
            num_experts=128,
            top_k_experts=8,
            moe_intermediate_size=704,
            hidden_size_per_layer_input=0,
            sliding_window=1024,
            max_position_embeddings=262144,
            use_bidirectional_attention="vision",
            layer_types=([S] * 5 + [F]) * 5,
        ),
        25_233_141_760,
    ),
}


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root, dirs = tmp_path_factory.mktemp("hf_gemma4"), {}
    for kind in KINDS:
        config = transformers.AutoConfig.for_model(
            "gemma4_text", **COMMON, **TINY[kind]
        )
        model = randomize(transformers.AutoModelForCausalLM.from_config(config))
        with torch.no_grad():  # a buffer, not a parameter: randomize skips it
            for i, layer in enumerate(model.model.layers):
                layer.layer_scalar.fill_(0.5 + 0.25 * i)
        dirs[kind] = root / kind
        model.save_pretrained(dirs[kind])
    return dirs


@pytest.mark.parametrize("kind", KINDS)
def test_causal_lm_logits_match(hf_dirs, kind):
    ids, mask = padded_batch(VOCAB, LENGTH)
    theirs = reference(hf_dirs[kind])
    expected = hf_outputs(theirs, ids, mask)
    lm = keras_transformers.from_preset(hf_dirs[kind])
    record(f"gemma4 {kind} logits", our_outputs(lm, ids, mask), expected, mask)
    assert lm.backbone.config.num_params() == sum(
        p.numel() for p in theirs.parameters()
    )
    # The constant block scales (and router statistics) are not parameters.
    trainable = sum(int(np.prod(w.shape)) for w in lm.trainable_weights)
    assert trainable == lm.backbone.config.num_params()


def test_greedy_generation_with_shared_key_values(hf_dirs):
    """Cached greedy decoding: the shared layers read the producers'
    rolling (sliding) and full caches, 13 positions for a window of 4."""
    prompt = np.array([[5, 17, 42, 90, 3]], "int32")
    assert_greedy_matches(hf_dirs["all"], prompt, max_new_tokens=8)


def test_cached_prefill_and_steps_equal_the_full_pass(hf_dirs):
    """A 9-token cached prefill across the window, then single steps: the
    shared layers read the producers' caches as the full pass reads their
    keys."""
    lm = keras_transformers.from_preset(hf_dirs["all"])
    ids, _ = padded_batch(VOCAB, LENGTH)
    cache = lm.backbone.init_cache(2, LENGTH)
    prefill = compiled_cached_call(lm, traced_index=False)
    logits, cache = prefill(ids[:, :9], cache, 0)
    step = compiled_cached_call(lm)  # JAX: one program for every position
    steps = [logits]
    for i in range(9, LENGTH):
        logits, cache = step(ids[:, i : i + 1], cache, i)
        steps.append(logits)
    steps = np.concatenate(
        [np.asarray(keras.ops.convert_to_numpy(x)) for x in steps], 1
    )
    record("gemma4 cached steps", steps, our_outputs(lm, ids))


def test_config_mapping(hf_dirs):
    config = keras_transformers.load_config(hf_dirs["all"])
    assert config.layer_types == (S, F, S, F)
    assert config.layer_settings[F] == dict(
        value_from_key=True, head_dim=32, num_kv_heads=1
    )
    assert config.layer_settings[S]["rope_max_wavelength"] == 50.0
    assert config.rope_max_wavelength == 500.0
    assert config.rope_scaling == {
        "rope_type": "proportional",
        "partial_rotary_factor": 0.5,
    }
    assert (config.attention_scale, config.logit_softcap) == (1.0, 3.0)
    assert config.value_norm and config.qk_norm and config.layer_output_scale
    assert (config.per_layer_input_dim, config.per_layer_vocabulary_size) == (8, 96)
    assert (config.num_kv_shared_layers, config.kv_shared_intermediate_dim) == (2, 96)
    sharing = [kv_sharing(config, i) for i in range(4)]
    assert sharing == [(S, None), (F, None), (None, S), (None, F)]
    plain = keras_transformers.load_config(hf_dirs["plain"])
    assert plain.per_layer_input_dim is None and not plain.num_kv_shared_layers
    assert plain.layer_settings[F] == {"value_from_key": False}
    assert plain.rope_scaling is None


def test_hub_keys_load_as_per_layer_config(hf_dirs, tmp_path):
    """The hub's `global_head_dim` / `num_global_key_value_heads` give the
    config transformers 5's `per_layer_config` does; without `layer_types`
    every sixth layer is full and the last one too (as transformers sets)."""
    path = edited_hf_dir(
        hf_dirs["all"],
        tmp_path / "hub",
        per_layer_config=None,
        global_head_dim=32,
        num_global_key_value_heads=1,
    )
    hub = json.loads((path / "config.json").read_text())
    hub.pop("per_layer_config")
    convert = registry.converter("gemma4_text").config_from_hf
    assert convert(hub) == convert(
        json.loads((hf_dirs["all"] / "config.json").read_text())
    )
    derived = convert({**hub, "layer_types": None, "num_hidden_layers": 8})
    assert derived["layer_types"] == [S] * 5 + [F, S, F]


@pytest.mark.parametrize("kind", ["all", "moe"])
def test_export_round_trip(hf_dirs, tmp_path, kind):
    lm = randomize_weights(keras_transformers.from_preset(hf_dirs[kind]), seed=1)
    export_hf(lm, tmp_path)  # gemma4_text by default (value norms, block scales)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "gemma4_text"
    ids, mask = padded_batch(VOCAB, LENGTH)
    ours = our_outputs(lm, ids, mask)
    record(
        f"gemma4 {kind} export", ours, hf_outputs(reference(tmp_path), ids, mask), mask
    )
    back = keras_transformers.from_preset(tmp_path)
    assert back.config == lm.config


def test_multimodal_checkpoint_loads_its_text_model(hf_dirs, tmp_path):
    """A `gemma4` (Gemma4ForConditionalGeneration) directory: its
    `text_config` and the tensors under `model.language_model.` load; a
    vision tower's tensors are left (with a warning)."""
    from safetensors.numpy import load_file, save_file

    src = hf_dirs["plain"]
    tensors = {
        "model.language_model." + k.removeprefix("model."): v
        for k, v in load_file(src / "model.safetensors").items()
    }
    tensors["model.vision_tower.patch.weight"] = np.zeros((2, 2), "float32")
    tmp_path.mkdir(exist_ok=True)
    save_file(tensors, tmp_path / "model.safetensors")
    text = json.loads((src / "config.json").read_text())
    wrapper = dict(
        model_type="gemma4",
        architectures=["Gemma4ForConditionalGeneration"],
        text_config=text,
    )
    (tmp_path / "config.json").write_text(json.dumps(wrapper))
    with pytest.warns(UserWarning, match="vision_tower"):
        lm = keras_transformers.from_preset(tmp_path)
    ids, mask = padded_batch(VOCAB, LENGTH)
    expected = hf_outputs(reference(src), ids, mask)
    record("gemma4 multimodal text", our_outputs(lm, ids, mask), expected, mask)
    with pytest.raises(ValueError, match="model_type='gemma4_text'"):
        export_hf(lm, tmp_path / "out", model_type="gemma4")


def test_per_layer_input_layers():
    """The per-layer input layers serialise completely."""
    x = np.ones((2, 3, 32), "float32")
    run_layer_test(
        PerLayerInputs,
        dict(vocabulary_size=VOCAB, num_layers=4, dim=8, norm_epsilon=1e-5),
        (np.ones((2, 3), "int32"), x),
        (2, 3, 4, 8),
    )
    run_layer_test(
        PerLayerInputGate,
        dict(dim=8, activation="gelu", norm_epsilon=1e-5),
        (x, np.ones((2, 3, 8), "float32")),
        (2, 3, 32),
    )


def test_proportional_rotary_frequencies():
    """transformers' "proportional" inverse frequencies: the first pairs of
    the whole head at the default frequencies, the rest 0."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.AutoConfig.for_model("gemma4_text", **COMMON, **TINY["all"])
    theirs, _ = ROPE_INIT_FUNCTIONS["proportional"](config, layer_type=F)
    ours, factor = rotary_frequencies(32, 500.0, TINY["all"]["rope_parameters"][F])
    # float32 powers may differ in the last place between CPUs' vector code
    np.testing.assert_allclose(ours, theirs.numpy(), rtol=3e-7, atol=0)
    assert factor == 1.0 and (ours[8:] == 0).all() and (ours[:8] > 0).all()


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(text_config={}), "multimodal.*not converted"),
        (dict(enable_moe_block=True, num_experts=4), "top_k_experts"),
        (dict(use_bidirectional_attention="all"), "use_bidirectional_attention"),
        (dict(attention_bias=True), "attention_bias"),
        (dict(hidden_activation="relu"), "hidden_activation"),
        (
            dict(rope_parameters={F: {"rope_type": "yarn", "rope_theta": 1e4}}),
            r"rope_parameters\['full_attention'\]\['rope_type'\]",
        ),
        (dict(per_layer_config={"1": {"head_dim": 32}}), "per_layer_config"),
        (dict(layer_types=[S]), "1 layer_types for num_hidden_layers=4"),
        # Layers 1-3 shared: no full-attention layer before them to share.
        (dict(num_kv_shared_layers=3), "num_kv_shared_layers"),
    ],
)
def test_errors_name_the_option(hf_dirs, tmp_path, changes, match):
    path = edited_hf_dir(hf_dirs["all"], tmp_path / "edited", **changes)
    with pytest.raises(ValueError, match=match):
        keras_transformers.from_preset(path)


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(num_kv_shared_layers=1, remat=True), "num_kv_shared_layers"),
        (dict(kv_shared_intermediate_dim=64), "kv_shared_intermediate_dim"),
        (dict(per_layer_input_dim=0), "per_layer_input_dim"),
        (dict(layer_settings={F: {"num_kv_heads": 3}}), "num_kv_heads"),
        (dict(layer_settings={F: {"value_from_key": 1}}), "value_from_key"),
    ],
)
def test_config_errors_name_the_field(fields, match):
    base = dict(
        vocabulary_size=VOCAB,
        num_layers=2,
        hidden_dim=32,
        num_heads=4,
        intermediate_dim=48,
        position_embedding="rotary",
        sliding_window=WINDOW,
        layer_types=[S, F],
    )
    with pytest.raises(ValueError, match=match):
        TransformerConfig(**{**base, **fields})


def test_other_sandwich_types_refuse_gemma4_models(hf_dirs, tmp_path):
    lm = keras_transformers.from_preset(hf_dirs["plain"])
    with pytest.raises(ValueError, match="'gemma3_text'.*value_norm"):
        export_hf(lm, tmp_path, model_type="gemma3_text")


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_parameter_counts(name):
    """transformers' Gemma4ForCausalLM on the meta device (text only), our
    count of the converted config and the preset give the same figure."""
    fields, published = PUBLISHED[name]
    config = transformers.AutoConfig.for_model("gemma4_text", **fields)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == published
    converted = registry.converter("gemma4_text").config_from_hf(config.to_dict())
    assert TransformerConfig.from_dict(converted).num_params() == published
    preset = keras_transformers.load_config(name)
    assert preset.num_params() == published
    assert preset == TransformerConfig.from_dict(converted)
