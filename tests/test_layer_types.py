"""Per-layer variety through one seam: `layer_types` and `layer_settings` in
the config, `block_spec(config, i)` for each block, each block's own cache
(a window-sized rolling cache on sliding layers, a full one on global
layers), an injectable token mixer, sandwich norms, soft-capping, and
rotary angles computed once per call for each rotary setting."""

import keras
import numpy as np
import pytest
from contracts import compiled_cached_call, compiled_forward, to_numpy

import keras_transformers as kt
from keras_transformers.config.layer_types import layer_settings, layer_type
from keras_transformers.layers import MultiHeadAttention, TransformerBlock
from keras_transformers.memory import training_flops_per_token
from keras_transformers.models import GPTCausalLM
from keras_transformers.models.block_spec import block_spec

WINDOW = 3
MIXED = dict(
    vocabulary_size=40,
    num_layers=3,
    hidden_dim=16,
    num_heads=4,
    num_kv_heads=2,
    intermediate_dim=24,
    max_sequence_length=32,
    norm_type="rms",
    position_embedding="rotary",
    rope_max_wavelength=1000.0,
    sliding_window=WINDOW,
    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    layer_settings={"sliding_attention": {"rope_max_wavelength": 20.0}},
    norm_position="sandwich",
    attention_softcap=3.0,
    logit_softcap=2.0,
    gated_feed_forward=True,
    activation="silu",
    use_bias=False,
)


@pytest.fixture(scope="module")
def mixed_lm():
    keras.utils.set_random_seed(3)
    return GPTCausalLM(config=kt.TransformerConfig(**MIXED))


def test_each_block_follows_its_layer_type(mixed_lm):
    config = mixed_lm.backbone.config
    attentions = [block.self_attention for block in mixed_lm.backbone.blocks]
    assert [a.sliding_window for a in attentions] == [WINDOW, None, WINDOW]
    assert [a.rope_max_wavelength for a in attentions] == [20.0, 1000.0, 20.0]
    assert [block_spec(config, i).layer_type for i in range(3)] == list(
        MIXED["layer_types"]
    )
    assert all(a.softcap == 3.0 for a in attentions)
    assert mixed_lm.count_params() == config.num_params()


def test_config_without_layer_types_keeps_one_kind():
    """Mistral's `sliding_window` alone: every layer slides; none: full."""
    fields = {
        k: v for k, v in MIXED.items() if k not in ("layer_types", "layer_settings")
    }
    sliding = kt.TransformerConfig(**fields)
    assert [layer_type(sliding, i) for i in range(3)] == ["sliding_attention"] * 3
    full = sliding.replace(sliding_window=None)
    assert {layer_settings(full, i)["sliding_window"] for i in range(3)} == {None}


def test_cached_decoding_equals_the_full_pass(mixed_lm):
    """Token by token through the per-layer caches (sliding layers keep
    only the window), 10 positions for a window of 3."""
    ids = np.random.default_rng(0).integers(1, 40, (2, 10)).astype("int32")
    full = to_numpy(compiled_forward(mixed_lm, ids))
    cache = mixed_lm.backbone.init_cache(2, 10)
    assert [tuple(c[0].shape)[1] for c in cache] == [WINDOW, 10, WINDOW]
    step = compiled_cached_call(mixed_lm)  # JAX: one program for every t
    steps = []
    for t in range(10):
        logits, cache = step(ids[:, t : t + 1], cache, t)
        steps.append(keras.ops.convert_to_numpy(logits)[:, 0])
    np.testing.assert_allclose(np.stack(steps, 1), full, atol=2e-5)
    assert np.abs(full).max() <= 2.0  # the output soft cap


def test_saved_preset_keeps_the_layer_types(mixed_lm, tmp_path):
    mixed_lm.save_to_preset(tmp_path / "mixed")
    back = kt.from_preset(tmp_path / "mixed")
    assert back.backbone.config == mixed_lm.backbone.config
    assert back.backbone.config.layer_types == tuple(MIXED["layer_types"])
    ids = np.arange(1, 9, dtype="int32")[None]
    np.testing.assert_allclose(
        to_numpy(compiled_forward(back, ids)),
        to_numpy(compiled_forward(mixed_lm, ids)),
        atol=1e-6,
    )


def test_flops_count_each_layers_context():
    config = kt.TransformerConfig(**MIXED)
    full = config.replace(layer_types=None, sliding_window=None, layer_settings=None)
    width = config.num_heads * config.resolved_head_dim
    saved = 12 * width * 2 * (16 - WINDOW)  # two sliding layers see WINDOW, not 16
    assert (
        training_flops_per_token(full, 16) - training_flops_per_token(config, 16)
        == saved
    )


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(layer_types=["full_attention"]), "layer_types.*num_layers=3"),
        (
            dict(layer_types=["full_attention", "local", "full_attention"]),
            "layer_types",
        ),
        (dict(sliding_window=None), "layer 0 is a 'sliding_attention' layer"),
        (dict(layer_settings={"full": {}}), "layer_settings.*keyed by layer types"),
        (
            dict(layer_settings={"full_attention": {"window": 4}}),
            "settings: sliding_window",
        ),
        (
            dict(layer_settings={"sliding_attention": {"sliding_window": 0}}),
            r"\['sliding_window'\]",
        ),
        (
            dict(
                layer_settings={
                    "sliding_attention": {"rope_scaling": {"rope_type": "yarn"}}
                }
            ),
            "Rotary scaling 'yarn' needs",
        ),
        (dict(attention_softcap=0.0), "attention_softcap"),
        (dict(norm_position="middle"), "norm_position"),
        (
            dict(norm_position="parallel", stacks="encoder_decoder"),
            'norm_position=.parallel.*with stacks="encoder_decoder"',
        ),
        (dict(qk_norm="head"), "qk_norm='head'.*'projection'"),
        (
            dict(
                layer_types=["no_rope_attention", "full_attention"] * 2,
                num_layers=4,
                layer_settings={"no_rope_attention": {"rotary": True}},
            ),
            r"\['no_rope_attention'\]\['rotary'\]=True.*'full_attention'",
        ),
    ],
)
def test_bad_layer_settings_name_the_field(changes, match):
    with pytest.raises(ValueError, match=match):
        kt.TransformerConfig(**{**MIXED, **changes})


def test_bad_block_layouts_name_the_argument():
    with pytest.raises(ValueError, match="parallel.*cross_attention=True"):
        TransformerBlock(
            num_heads=2,
            intermediate_dim=8,
            norm_position="parallel",
            cross_attention=True,
        )
    with pytest.raises(ValueError, match="qk_norm='heads'"):
        MultiHeadAttention(num_heads=2, head_dim=4, qk_norm="heads")


def test_layer_types_are_for_decoders_and_encoders():
    with pytest.raises(ValueError, match='layer_types.*stacks="decoder" or "encoder"'):
        kt.TransformerConfig(**{**MIXED, "stacks": "encoder_decoder"})


def test_an_injected_token_mixer_serializes():
    mixer = MultiHeadAttention(
        num_heads=2, head_dim=4, causal=True, sliding_window=2, name="mixer"
    )
    block = TransformerBlock(
        num_heads=2, intermediate_dim=8, token_mixer=mixer, causal=True
    )
    x = keras.random.normal((1, 5, 8), seed=1)
    out = keras.ops.convert_to_numpy(block(x))
    assert block.self_attention is mixer
    again = TransformerBlock.from_config(block.get_config())
    again.build((1, 5, 8))
    again.set_weights(block.get_weights())
    assert again.self_attention.sliding_window == 2
    np.testing.assert_allclose(keras.ops.convert_to_numpy(again(x)), out, atol=1e-6)
    assert [tuple(c.shape) for c in block.init_cache(1, 6, "float32")] == [
        (1, 2, 2, 4)
    ] * 2


@pytest.mark.parametrize("cls", [TransformerBlock, MultiHeadAttention])
def test_every_constructor_argument_is_in_the_config(cls):
    """Arguments are written once, in the signature: the layer keeps and
    serialises each of them."""
    import inspect

    layer = cls(
        num_heads=2,
        **({"head_dim": 4} if cls is MultiHeadAttention else {"intermediate_dim": 8}),
    )
    names = set(inspect.signature(cls.__init__).parameters) - {"self", "kwargs"}
    assert names <= set(layer.get_config())


def test_partial_rotary_leaves_the_other_features_unrotated():
    """`rotary_fraction=0.5`: the first half of each head rotates; the
    second half of queries and keys is the same at every position."""
    from keras_transformers.layers import RotaryEmbedding

    rotary = RotaryEmbedding(100.0, rotary_dim=4)
    x = keras.ops.ones((1, 5, 2, 8))
    y = keras.ops.convert_to_numpy(rotary(x))
    np.testing.assert_allclose(y[..., 4:], 1.0)
    assert np.abs(y[0, 1:, :, :4] - y[0, :1, :, :4]).max() > 0.1
    with pytest.raises(ValueError, match="rotary_fraction"):
        kt.TransformerConfig(**{**MIXED, "rotary_fraction": 0.1})


def test_rotary_angles_are_computed_once_per_setting(mixed_lm):
    """One `RotaryAngles` per rotary setting for a call (the sliding
    layers' base and the full layer's), none for a no-rope layer; a layer
    rotates by them as by the positions they hold (bitwise), and by its own
    angles when given another setting's."""
    from keras_transformers.models.shared_rotary import shared_rotary_angles

    x = keras.ops.zeros((1, 5, 16))
    first, full, third = shared_rotary_angles(mixed_lm.backbone.blocks, x)
    assert first is third and first.setting != full.setting
    kinds = ["sliding_attention", "no_rope_attention"]
    no_rope = GPTCausalLM(
        config=kt.TransformerConfig(**{**MIXED, "num_layers": 2, "layer_types": kinds})
    )
    angles = shared_rotary_angles(no_rope.backbone.blocks, x)
    assert angles[0] is not None and angles[1] is None
    q = keras.random.normal((1, 5, 4, 4), seed=0)
    k = keras.random.normal((1, 5, 2, 4), seed=1)
    positions = keras.ops.arange(5)
    for block, shared in zip(mixed_lm.backbone.blocks, (first, full, third)):
        other = full if shared is first else first
        rotary = block.self_attention.rotary
        own = [to_numpy(t) for t in rotary.rotate((q, k), positions)]
        for given in (shared, other):
            for a, b in zip(rotary.rotate((q, k), given), own, strict=True):
                np.testing.assert_array_equal(to_numpy(a), b)
