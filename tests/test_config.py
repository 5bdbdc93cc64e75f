import dataclasses
import json

import pytest

from keras_transformers import MoEConfig, TransformerConfig, VisionConfig

BASE = dict(
    vocabulary_size=100, num_layers=2, hidden_dim=32, num_heads=4, intermediate_dim=64
)


def test_round_trip_and_frozen():
    config = TransformerConfig(**BASE, moe=MoEConfig(num_experts=4), vision=None)
    data = json.loads(json.dumps(config.to_dict()))
    assert TransformerConfig.from_dict(data) == config
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.hidden_dim = 8


def test_unknown_key_is_named():
    with pytest.raises(ValueError, match="hidden_size"):
        TransformerConfig.from_dict({**BASE, "hidden_size": 3})
    with pytest.raises(ValueError, match="num_expert"):
        TransformerConfig.from_dict({**BASE, "moe": {"num_expert": 3}})


@pytest.mark.parametrize(
    "field,value",
    [
        ("num_heads", 5),
        ("num_layers", 0),
        ("hidden_dim", -1),
        ("num_kv_heads", 3),
        ("norm_type", "batch"),
        ("norm_position", "middle"),
        ("position_embedding", "alibi"),
        ("activation", "tanh"),
        ("dropout", 1.5),
        ("use_bias", "yes"),
        ("eos_token_id", 100),
        ("vocabulary_size", 2.5),
        ("sliding_window", 0),
        ("qkv_bias", 1),
        ("qk_norm", "yes"),
    ],
)
def test_invalid_values_name_field_and_value(field, value):
    with pytest.raises(ValueError) as info:
        TransformerConfig(**{**BASE, field: value})
    assert field in str(info.value) and repr(value) in str(info.value)


def test_group_validation():
    with pytest.raises(ValueError, match="num_experts_per_token"):
        MoEConfig(num_experts=2, num_experts_per_token=3)
    with pytest.raises(ValueError, match="image_size"):
        VisionConfig(image_size=30, patch_size=16)
    with pytest.raises(ValueError, match="moe"):
        TransformerConfig(**BASE, moe={"num_experts": 2})


def test_replace_validates():
    config = TransformerConfig(**BASE)
    assert config.replace(dropout=0.1).dropout == 0.1
    with pytest.raises(ValueError, match="dropout"):
        config.replace(dropout=-0.1)
    with pytest.raises(ValueError, match="not_a_field"):
        config.replace(not_a_field=1)


def test_num_params_known_models():
    gpt2 = TransformerConfig(
        vocabulary_size=50257,
        num_layers=12,
        hidden_dim=768,
        num_heads=12,
        intermediate_dim=3072,
    )
    assert gpt2.num_params() == 124_439_808  # HF GPT2LMHeadModel, tied head
    llama = dict(
        norm_type="rms",
        position_embedding="rotary",
        activation="silu",
        gated_feed_forward=True,
        use_bias=False,
        tie_embeddings=False,
    )
    llama2_7b = TransformerConfig(
        vocabulary_size=32000,
        num_layers=32,
        hidden_dim=4096,
        num_heads=32,
        intermediate_dim=11008,
        **llama,
    )
    assert llama2_7b.num_params() == 6_738_415_616
    mixtral = TransformerConfig(
        vocabulary_size=32000,
        num_layers=32,
        hidden_dim=4096,
        num_heads=32,
        num_kv_heads=8,
        intermediate_dim=14336,
        moe=MoEConfig(num_experts=8, num_experts_per_token=2),
        **llama,
    )
    assert round(mixtral.num_params() / 1e9, 1) == 46.7
    assert round(mixtral.num_active_params() / 1e9, 1) == 12.9
    assert gpt2.num_active_params() == gpt2.num_params()


def test_qkv_bias_and_qk_norm_counted():
    """num_params() counts the query / key / value biases and the `[H]`
    query / key norm scales, as the built model holds them."""
    from keras_transformers.models import GPTBackbone

    for fields in (dict(qkv_bias=True), dict(qk_norm=True, head_dim=12)):
        config = TransformerConfig(
            **{**BASE, "use_bias": False, "num_kv_heads": 2}, **fields
        )
        off = config.replace(qkv_bias=False, qk_norm=False)
        assert config.num_params() > off.num_params()
        assert GPTBackbone(config=config).count_params() == config.num_params()


def test_derived_values():
    config = TransformerConfig(**BASE, num_kv_heads=2)
    assert config.resolved_head_dim == 8
    assert config.resolved_num_kv_heads == 2
    assert TransformerConfig(**BASE).resolved_num_kv_heads == 4
