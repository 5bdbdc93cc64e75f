"""Hugging Face checkpoints <-> keras_transformers models.

A Hugging Face model directory (`config.json` with `model_type`, plus
`model.safetensors` or sharded safetensors) loads with any `from_preset`,
and `export_hf` writes one that
`transformers.AutoModelForCausalLM.from_pretrained` loads.

One small module per `model_type` (see `CONVERTERS`) maps the config and the
weights both ways; nothing is ever unpickled. Each declares one
`keras_transformers.convert.protocol.Converter` (its config mapping, its
loader and export over one two-way tensor-name map, and which configs of
its family it exports by default) and registers it with
`keras_transformers.registry.register_converter`; this package imports
every module in it.

Examples:
    >>> lm = keras_transformers.from_preset("path/to/hf/gpt2")  # doctest: +SKIP
    >>> export_hf(lm, "out/")  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import pkgutil
import warnings
from pathlib import Path

from keras_transformers import registry
from keras_transformers._atomic import atomic_directory
from keras_transformers._json import read_json_object
from keras_transformers.convert.checkpoint import Checkpoint, write_checkpoint
from keras_transformers.preset_io import load_assets

# Every module of this package is imported: each converter module registers
# its model type(s) (`keras_transformers.registry.register_converter`), so a
# new type is a new module here and edits no shared file.
for _module in pkgutil.iter_modules([str(Path(__file__).parent)]):
    importlib.import_module(f"keras_transformers.convert.{_module.name}")

# model_type -> converter (`keras_transformers.convert.protocol.Converter`).
CONVERTERS = registry.converters()


def _read(path: Path):
    """The HF config dict of a directory and its converter."""
    file = Path(path) / "config.json"
    if not file.exists():
        raise FileNotFoundError(
            f"{path} has no config.json: not a Hugging Face model directory."
        )
    hf = read_json_object(file, fix="Download or write it again.")
    return hf, registry.converter(hf.get("model_type"))


def _preset_data(hf: dict, converter, path: Path) -> dict:
    data = converter.preset_data(hf)
    return {**data, "config": converter.fit_directory(data["config"], path)}


def hf_preset_data(path) -> dict:
    """The preset data of a Hugging Face model directory.

    Args:
        path: directory with a `config.json` holding `model_type`.

    Returns:
        `{"family", "class_name", "config": {TransformerConfig fields}}`
        (+ `"task"`: head arguments such as `num_classes`). GPT: the class
        is `GPTBackbone` for a base-model checkpoint (`architectures:
        ["GPT2Model"]`, `["LlamaModel"]`, `["MistralModel"]`,
        `["Qwen2Model"]`, `["Qwen3Model"]`, `["GemmaModel"]` or
        `["Phi3Model"]`), `GPTClassifier` for the type's sequence
        classifier (`LlamaForSequenceClassification`,
        `GPT2ForSequenceClassification`, ...: `Converter.sequence_classifier`),
        else `GPTCausalLM`; BERT: see
        `keras_transformers.convert.bert` (RoBERTa types:
        `keras_transformers.convert.roberta`; DistilBERT:
        `keras_transformers.convert.distilbert`); Marian: `Seq2SeqBackbone` for
        `MarianModel` / `BartModel` / `T5Model`, else `Seq2SeqLM`; Mixtral:
        `MixtralBackbone` for `MixtralModel` (`Qwen2MoeModel`,
        `Qwen3MoeModel`, ...), `MixtralClassifier` for the type's sequence
        classifier (`MixtralForSequenceClassification`, ...), else
        `MixtralCausalLM`; ViT: `ViTClassifier` for
        `ViTForImageClassification`, else `ViTBackbone` (input
        normalisation from `preprocessor_config.json`, see
        `keras_transformers.convert.vit`; DeiT and DINOv2:
        `keras_transformers.convert.deit`, `.dinov2`).

    Raises:
        ValueError: unknown `model_type`, or an option we cannot convert.
    """
    path = Path(path)
    return _preset_data(*_read(path), path)


def _load_tokenizer(path: Path):
    """The directory's tokenizer (an `HFTokenizer` for its `tokenizer.json`
    or, without one, its SentencePiece model; a WordPiece preprocessor for
    BERT's `vocab.txt`; or byte-level BPE), or None: when the directory has
    no tokenizer files, or (with a warning naming the file and the fix) one
    we cannot read, so that the weights still load."""
    try:
        return load_assets(path)
    except (ValueError, FileNotFoundError, KeyError) as error:
        warnings.warn(f"The tokenizer in {path} was not loaded: {error}", stacklevel=3)
        return None


class HFSource:
    """The Hugging Face pieces of a load (`keras_transformers.loading`
    builds the model): a directory's preset data, tokenizer and, with
    `load_weights`, its safetensors checkpoint.

    Args:
        path: the model directory (`config.json` with `model_type`).
        load_weights: open the checkpoint (its tensors of another model
            type fail here, before anything is built).

    Raises:
        FileNotFoundError: no config.json, or no safetensors weights (e.g.
            only a pickled `pytorch_model.bin`).
        ValueError: an unsupported `model_type` or option.
    """

    def __init__(self, path, load_weights: bool = True):
        self.path = Path(path)
        self.hf, self.converter = _read(self.path)
        self.data = _preset_data(self.hf, self.converter, self.path)
        self.checkpoint = Checkpoint(self.path) if load_weights else None
        if self.checkpoint is not None:
            converter = self.converter
            self.checkpoint.prefix(
                converter.prefixes, converter.probe, self.hf["model_type"]
            )
        self.tokenizer = _load_tokenizer(self.path)

    def fit_config(self, fields: dict, target) -> dict:
        """`fields` as the converter fits them to the checkpoint and the
        class built (e.g. a BERT pooler only when the checkpoint has one)."""
        return self.converter.fit_config(fields, self.checkpoint, target)

    def load_weights(self, model) -> None:
        """Converts the checkpoint into `model` (a backbone, or a task model
        whose backbone, and head where the converter maps one, it fills),
        then closes it and warns about tensors nothing used."""
        try:
            self.converter.load_weights(model, self.checkpoint, self.hf)
        except ValueError as error:
            raise self.checkpoint.located(error) from None
        self.checkpoint.close()
        self.checkpoint.warn_unused()


def _converter_of_family(model_type: str, family: str):
    """The converter registered for `model_type`, which must build `family`."""
    converter = registry.converter(model_type)
    if converter.family != family:
        types = sorted(
            name
            for name, other in registry.converters().items()
            if other.family == family
        )
        name = family.upper()
        raise ValueError(
            f"model_type={model_type!r} is not a {name}-family checkpoint type; "
            f"a {name}-family model exports as one of {types}."
        )
    return converter


def _converter(family: str, config, model_type=None):
    """The converter a `family` model with `config` exports with:
    `model_type`'s when given, else the family's default for the config
    (each converter says which configs it takes: `exports`)."""
    if model_type is not None:
        return _converter_of_family(model_type, family)
    return registry.export_converter(family, config)


def export_hf(model, directory, model_type=None) -> None:
    """Writes `model` as a Hugging Face checkpoint directory.

    Writes `config.json` (with `model_type`, `architectures` and
    `torch_dtype: float32`), `model.safetensors` and, when the model has a
    tokenizer, its files, so that
    `transformers.AutoModelForCausalLM.from_pretrained(directory)` loads it
    (`AutoModel`, `AutoModelForMaskedLM`, ...`SequenceClassification`,
    ...`TokenClassification` for BERT; `AutoModelForSeq2SeqLM` / `MarianMTModel`
    for seq2seq; `AutoModel` / `AutoModelForImageClassification` for ViT).
    Without `model_type`, each family's converters say which configs they
    take (`exports(config)`, tried by `export_order`; see
    `keras_transformers.convert.protocol.Converter`): GPT models with
    learned positions as "gpt2"; rotary ones as "gpt_neox" (LayerNorm),
    "phi3" (partial rotary), "gemma4_text" (value norms and per-layer
    output scales), "gemma3_text" (sandwich norms and q/k norms),
    "gemma2" (sandwich norms), "gemma" (`scale_embeddings`), "olmo2" (norms
    on the sub-layers' outputs), "smollm3" (layers without rotary), "qwen3"
    (`qk_norm`), "qwen2" (`qkv_bias`), "mistral" (a sliding window) or
    "llama"; BERT-family models as "modernbert" (pre-norm, rotary, gated,
    first block without attention norm), "esm" (pre-norm, rotary, plain
    feed-forward), "deberta-v2" (disentangled attention),
    "albert" (blocks shared across depth), "electra" (a GELU pooler, as
    ELECTRA's classifier head) or "bert" (or, asked for, "roberta",
    "xlm-roberta", "camembert", "distilbert"); seq2seq models as "t5"
    (relative position bias), "bart" (learned positions) or "marian";
    Mixtral-family models as "gpt_oss" (attention sinks), "qwen3_moe"
    (`qk_norm`), "qwen2_moe" (a gated shared expert or `qkv_bias`) or
    "mixtral"; ViT-family models as "deit" (a distillation token),
    "dinov3_vit" (2-D rotary patch positions), "dinov2" (`layer_scale`) or
    "vit",
    plus a `preprocessor_config.json` when the model normalises its inputs.
    `model_type` picks another layout of the family the config fits (e.g.
    "phi3", which a config cannot tell from "llama").

    The export is atomic, as `save_to_preset` is: the files go to a fresh
    sibling directory that replaces `directory` once complete, so a killed
    export leaves the previous directory or the new one, whole, and the
    directory holds only this export's files.

    Args:
        model: a `GPTCausalLM`, `GPTClassifier` (as the type's
            `*ForSequenceClassification`) or `GPTBackbone`; a `BertBackbone`,
            `BertMaskedLM`, `BertClassifier` or `BertTokenClassifier`; a
            `Seq2SeqLM` or `Seq2SeqBackbone` (Marian, BART or T5 layout); a
            `MixtralCausalLM`, `MixtralClassifier` (as the type's
            `*ForSequenceClassification`) or `MixtralBackbone`; a
            `ViTBackbone` or `ViTClassifier`.
        directory: output directory (created if needed; an existing one
            must be empty or hold a `config.json`).
        model_type: for a GPT-, BERT-, Mixtral- or ViT-family model, the
            Hugging Face `model_type` to write (None: chosen from the config
            as above).

    Raises:
        ValueError: the model has options the target format cannot express,
            or `directory` holds files that are not a checkpoint's.
    """
    backbone = getattr(model, "backbone", model)
    family = getattr(backbone, "family", None)
    if model_type is not None and family not in ("gpt", "bert", "mixtral", "vit"):
        raise ValueError(
            f"model_type={model_type!r} applies to GPT-, BERT-, Mixtral- and ViT-family "
            "models only; "
            f"{type(model).__name__} exports in its own format (model_type=None)."
        )
    if family not in registry.FAMILIES:
        raise ValueError(
            "export_hf supports GPT-family (GPT-2 / Llama / Mistral / Qwen / Gemma / "
            "Phi-3 layouts), "
            "BERT-family, "
            "seq2seq (Marian), Mixtral (Mixtral / Qwen-MoE layouts) and ViT models. "
            f"Received: {type(model).__name__}."
        )
    converter = _converter(family, backbone.config, model_type)
    hf, tensors = converter.export(model, converter.model_type)
    tokenizer = getattr(model, "tokenizer", None)
    with atomic_directory(directory, markers=("config.json",)) as path:
        write_checkpoint(path, {**hf, "torch_dtype": "float32"}, tensors)
        converter.write_preprocessor(backbone.config, path)  # e.g. ViT's
        if tokenizer is not None and hasattr(tokenizer, "save_assets"):
            tokenizer.save_assets(str(path))


__all__ = ["CONVERTERS", "HFSource", "export_hf", "hf_preset_data"]
