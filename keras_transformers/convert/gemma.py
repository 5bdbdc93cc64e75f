"""Hugging Face Gemma (`model_type: "gemma"`, Gemma 1) <-> `GPTBackbone`.

Llama's layout and weight names (`keras_transformers.convert.llama`) with:

- token embeddings multiplied by sqrt(hidden_size) in the compute dtype:
  the config's `scale_embeddings`;
- a GeGLU feed-forward (gate activation `gelu_pytorch_tanh`):
  `activation="gelu_approximate"`;
- an explicit `head_dim` (256 for gemma-2b, which is not hidden / heads);
- RMSNorms computing `x * (1 + w)`: the checkpoint stores each norm weight
  `w` `[D]` as an offset from 1. This is a weight mapping only: loading
  adds 1 (in float32), export subtracts it, and our RMSNorm stays `x * w`.

Any rotary GPT model with `scale_embeddings` exports as Gemma.
`attention_bias` and `use_bidirectional_attention` are not supported.
"""

from __future__ import annotations

import numpy as np

from keras_transformers.convert import llama
from keras_transformers.convert.protocol import decoder
from keras_transformers.registry import register_converter

MODEL_TYPE = "gemma"
BASE_ARCHITECTURE = "GemmaModel"
ARCHITECTURE = "GemmaForCausalLM"
PREFIXES = llama.PREFIXES
PROBE = llama.PROBE
# GemmaConfig defaults where they differ from Llama's.
DEFAULTS = dict(
    vocab_size=256000,
    hidden_size=3072,
    intermediate_size=24576,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=16,
    head_dim=256,
    max_position_embeddings=8192,
    tie_word_embeddings=True,
    bos_token_id=2,
    eos_token_id=1,
    pad_token_id=0,
)
# transformers reads Gemma's "gelu" as the tanh form (the released configs).
GELU_TANH = ("gelu_pytorch_tanh", "gelu")


def _check(hf: dict) -> None:
    """Raises a ValueError naming the first option we cannot reproduce."""
    act, legacy = hf.get("hidden_act", GELU_TANH[0]), hf.get("hidden_activation")
    if act not in GELU_TANH or legacy not in (None, GELU_TANH[0]):
        shown = act if act not in GELU_TANH else legacy
        raise ValueError(
            f"Gemma hidden_act / hidden_activation={shown!r} is not supported; "
            "only 'gelu_pytorch_tanh' (GeGLU)."
        )
    for option in ("attention_bias", "use_bidirectional_attention"):
        if hf.get(option):
            raise ValueError(
                f"Gemma config has {option}=True, which keras_transformers cannot "
                f"represent; only {option}=false converts."
            )


def config_from_hf(hf: dict) -> dict:
    """TransformerConfig fields for an HF Gemma `config.json` dict.

    Raises:
        ValueError: an option we cannot reproduce (activation other than
            gelu_pytorch_tanh, `attention_bias`, `use_bidirectional_attention`,
            rope scaling other than linear, llama3, yarn
            or longrope).
    """
    _check(hf)
    # Llama's mapping checks a SwiGLU layout; Gemma's activation is set after.
    forced = dict(hidden_act="silu", attention_bias=False, mlp_bias=False)
    fields = llama.derived_config(hf, "Gemma", DEFAULTS, **forced)
    return {**fields, "activation": "gelu_approximate", "scale_embeddings": True}


def _is_norm(name: str) -> bool:
    return name.endswith("norm.weight")


class OffsetNorms:
    """A `Checkpoint` whose RMSNorm weights read as `1 + w` (float32)."""

    def __init__(self, checkpoint) -> None:
        self._checkpoint = checkpoint

    def __getattr__(self, name):
        return getattr(self._checkpoint, name)

    def __contains__(self, name: str) -> bool:
        return name in self._checkpoint

    def get(self, name: str) -> np.ndarray:
        value = self._checkpoint.get(name)
        return value.astype(np.float32) + 1.0 if _is_norm(name) else value


def load_weights(backbone, checkpoint, require_head: bool) -> None:
    """Copies a Gemma checkpoint into `backbone` (a `GPTBackbone`)."""
    llama.load_weights(
        backbone, OffsetNorms(checkpoint), require_head, model_type=MODEL_TYPE
    )


def export_weights(backbone) -> dict[str, np.ndarray]:
    """The backbone's weights under GemmaForCausalLM names (norm weights as
    offsets from 1)."""
    out = llama.export_weights(backbone)
    return {k: v - 1.0 if _is_norm(k) else v for k, v in out.items()}


def hf_config(config) -> dict:
    """The HF `config.json` dict (without `architectures`) for `config`."""
    hf = llama.hf_config(
        config,
        MODEL_TYPE,
        activation="gelu_approximate",
        scale_embeddings=True,
        use_bias=False,
    )
    del hf["mlp_bias"]
    return {**hf, "hidden_act": GELU_TANH[0], "hidden_activation": GELU_TANH[0]}


def exports(config) -> bool:
    """Whether a config of this family with no `model_type` asked for
    exports as gemma: scaled embeddings."""
    return bool(config.scale_embeddings)


CONVERTER = register_converter(
    decoder(
        MODEL_TYPE,
        architectures=(BASE_ARCHITECTURE, ARCHITECTURE),
        config_from_hf=config_from_hf,
        hf_config=hf_config,
        load_weights=load_weights,
        export_weights=export_weights,
        prefixes=PREFIXES,
        probe=PROBE,
        exports=exports,
        export_order=30,  # the family's default: registry.export_converter
    )
)

__all__ = ["config_from_hf", "export_weights", "hf_config", "load_weights"]
