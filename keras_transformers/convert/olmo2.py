"""Hugging Face OLMo 2 (`model_type: "olmo2"`) <-> `GPTBackbone`.

Llama's layout and tensor names (`keras_transformers.convert.llama`) with:

- each block's two norms on the sub-layers' outputs, `x + norm(attn(x))`
  and `x + norm(mlp(x))`: the config's `norm_position="output"`. The
  checkpoint names them after that place (`post_attention_layernorm`,
  `post_feedforward_layernorm`); Llama's name map calls them
  `input_layernorm` and `post_attention_layernorm`, so both directions go
  through one renaming;
- RMSNorms on queries and keys over the whole projection, before it is
  split into heads (`self_attn.q_norm.weight` `[N * H]`,
  `self_attn.k_norm.weight` `[K * H]`): `qk_norm="projection"`;
- no biases. `attention_bias=true` (biases on the attention projections
  only) is refused.
"""

from __future__ import annotations

from keras_transformers.convert import llama
from keras_transformers.convert.protocol import decoder
from keras_transformers.convert.renamed import Renamed
from keras_transformers.registry import register_converter

MODEL_TYPE = "olmo2"
NAME = "OLMo2"
BASE_ARCHITECTURE = "Olmo2Model"
ARCHITECTURE = "Olmo2ForCausalLM"
PREFIXES = llama.PREFIXES
PROBE = llama.PROBE
# Olmo2Config's defaults where they differ from Llama's.
DEFAULTS = dict(
    vocab_size=50304,
    rms_norm_eps=1e-5,
    bos_token_id=None,
    eos_token_id=50279,
    pad_token_id=1,
)
# Llama's name of a block's norm -> OLMo 2's.
NORMS = {
    "input_layernorm": "post_attention_layernorm",
    "post_attention_layernorm": "post_feedforward_layernorm",
}


def _renamed(name: str) -> str:
    """Llama's tensor `name` under OLMo 2's (the block norms differ)."""
    parts = name.split(".")
    return ".".join(NORMS.get(part, part) for part in parts)


def config_from_hf(hf: dict) -> dict:
    """TransformerConfig fields for an HF OLMo 2 `config.json` dict.

    Raises:
        ValueError: an option we cannot reproduce (`attention_bias`, an
            activation other than silu, a rotary scaling we lack).
    """
    if hf.get("attention_bias", False):
        raise ValueError(
            f"{NAME} config has attention_bias=true (biases on the attention "
            "projections, none in the MLP), which keras_transformers cannot "
            "represent; only attention_bias=false converts."
        )
    fields = llama.derived_config(
        hf, NAME, DEFAULTS, attention_bias=False, mlp_bias=False
    )
    return {**fields, "norm_position": "output", "qk_norm": "projection"}


def load_weights(backbone, checkpoint, require_head: bool) -> None:
    """Copies an OLMo 2 checkpoint into `backbone` (a `GPTBackbone`)."""
    view = Renamed(checkpoint, _renamed, (PREFIXES, PROBE, MODEL_TYPE))
    llama.load_weights(backbone, view, require_head, model_type=MODEL_TYPE)


def export_weights(backbone):
    """The backbone's weights under Olmo2ForCausalLM names."""
    return {_renamed(k): v for k, v in llama.export_weights(backbone).items()}


def hf_config(config) -> dict:
    """The HF `config.json` dict (without `architectures`) for `config`."""
    hf = llama.hf_config(
        config,
        MODEL_TYPE,
        norm_position="output",
        qk_norm="projection",
        use_bias=False,
    )
    del hf["mlp_bias"]
    return hf


def exports(config) -> bool:
    """Whether a config of this family with no `model_type` asked for
    exports as olmo2: norms on the sub-layers' outputs."""
    return bool(config.norm_position == "output")


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
