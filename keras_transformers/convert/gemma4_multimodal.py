"""Hugging Face Gemma 4 multimodal checkpoints (`model_type: "gemma4"`,
`Gemma4ForConditionalGeneration`) -> their text model, a `GPTCausalLM`.

Only the language model loads: its config is the checkpoint's
`text_config` (`keras_transformers.convert.gemma4`) and its tensors those
under `model.language_model.`. The vision and audio towers and their
embedders are not loaded (the loader warns that their tensors went unused),
so images and audio cannot be given to the model. Export writes the text
model as `gemma4_text` (`export_hf(lm, path)`); asking for "gemma4" raises.
"""

from __future__ import annotations

from keras_transformers.convert import gemma4
from keras_transformers.convert.gemma4_weights import load_weights as _load
from keras_transformers.convert.protocol import decoder
from keras_transformers.registry import register_converter

MODEL_TYPE = "gemma4"
ARCHITECTURE = "Gemma4ForConditionalGeneration"
PREFIXES = ("model.language_model.", "language_model.")
PROBE = gemma4.PROBE


def config_from_hf(hf: dict) -> dict:
    """TransformerConfig fields of the `text_config` of an HF Gemma 4
    multimodal `config.json` dict (vision and audio configs ignored).

    Raises:
        ValueError: no `text_config`, or an option of it we cannot reproduce.
    """
    text = hf.get("text_config")
    if not isinstance(text, dict):
        raise ValueError(
            "Gemma4 multimodal config has no text_config dict; only its text model "
            "converts (vision and audio towers are not loaded)."
        )
    tie = {"tie_word_embeddings": hf.get("tie_word_embeddings", True)}
    return gemma4.config_from_hf({**tie, **text, "model_type": gemma4.MODEL_TYPE})


def load_weights(backbone, checkpoint, require_head: bool) -> None:
    """Copies the language model of a Gemma 4 multimodal checkpoint into
    `backbone` (the towers' tensors stay unused)."""
    _load(backbone, checkpoint, require_head, PREFIXES, MODEL_TYPE)


def hf_config(config) -> dict:
    """Refuses: only the text model exports (as `gemma4_text`)."""
    raise ValueError(
        "A Gemma 4 text model cannot be exported as Hugging Face 'gemma4' (the "
        "multimodal wrapper, whose vision and audio towers it lacks); export it "
        "with model_type='gemma4_text'."
    )


CONVERTER = register_converter(
    decoder(
        MODEL_TYPE,
        architectures=("Gemma4Model", ARCHITECTURE),
        config_from_hf=config_from_hf,
        hf_config=hf_config,
        load_weights=load_weights,
        export_weights=gemma4.export_weights,
        prefixes=PREFIXES,
        probe=PROBE,
        exports=None,
        sequence_classifier=False,  # transformers has none for Gemma 4
    )
)

__all__ = ["config_from_hf", "hf_config", "load_weights"]
