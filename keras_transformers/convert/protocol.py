"""The converter protocol: what one Hugging Face `model_type` declares.

Every converter module of `keras_transformers.convert` ends with one
declaration, `CONVERTER = register_converter(Converter(...))` (or a factory
below that fills the parts its family shares), and loading
(`keras_transformers.loading` through `convert.HFSource`), the hub's early
config check and `export_hf` call only the fields of that object: nothing
asks a module which functions it happens to define.

A converter's tensor names are one two-way map per module (`llama._layers`,
`bert._entries`, `seq2seq_common.entries`, `vit._entries`, `t5._entries`):
the same list of `(layer, Hugging Face name, kernel shape)` drives
`load_weights` and `export`, so the two directions cannot disagree.

Examples:
    A decoder with the Llama tensor names and its own config mapping
    (`keras_transformers/convert/mistral.py`):

    >>> CONVERTER = register_converter(  # doctest: +SKIP
    ...     decoder(
    ...         "mistral",
    ...         architectures=("MistralModel", "MistralForCausalLM"),
    ...         config_from_hf=config_from_hf,
    ...         hf_config=hf_config,
    ...         load_weights=llama.load_weights,
    ...         export_weights=llama.export_weights,
    ...         prefixes=llama.PREFIXES,
    ...         probe=llama.PROBE,
    ...         exports=exports,
    ...         export_order=60,
    ...     )
    ... )
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable

from keras_transformers.convert.common import assign, fetch, num_labels

SCORE = "score"  # the sequence classifier's head, in transformers and here
# family -> the names of its (backbone, causal LM, sequence classifier)
# classes, for the decoder families `decoder` builds converters of.
DECODER_CLASSES = {
    "gpt": ("GPTBackbone", "GPTCausalLM", "GPTClassifier"),
    "mixtral": ("MixtralBackbone", "MixtralCausalLM", "MixtralClassifier"),
}


def _same_fields(fields: dict, *context) -> dict:
    return fields


def _no_preprocessor(config, directory) -> None:
    return None


@dataclasses.dataclass(frozen=True)
class Converter:
    """One Hugging Face `model_type`'s converter.

    Attributes:
        model_type: the `model_type` of `config.json` it reads and writes.
        config_from_hf: `(hf config dict) -> TransformerConfig fields`.
            Raises ValueError naming an option that cannot convert.
        preset_data: `(hf config dict) -> {"family", "class_name",
            "config"}` (+ `"task"`: head arguments), the class picked
            from `architectures`.
        load_weights: `(model, checkpoint, hf config dict) -> None`: fills
            the built model (a backbone, or a task model's backbone and the
            heads the converter maps) from a `convert.Checkpoint`.
        export: `(model, model_type) -> (config.json dict, {name: array})`.
        family: the model family it builds ("gpt", "bert", "transformer",
            "mixtral", "vit").
        prefixes: the name prefixes a checkpoint may put before the
            backbone's tensors (e.g. `("model.", "")`).
        probe: a backbone tensor name (after the prefix) every checkpoint of
            the type holds; a checkpoint without it is of another type.
        fit_directory: `(config fields, directory) -> fields`: settings read
            from other files of the directory (e.g. ViT's
            `preprocessor_config.json`).
        fit_config: `(config fields, checkpoint or None, class) -> fields`:
            settings that follow the tensors saved or the class built (e.g.
            a BERT pooler only when the checkpoint has one).
        write_preprocessor: `(config, directory) -> None`: extra files
            `export_hf` writes beside the checkpoint.
        exports: `(config) -> bool`: whether a model of `family` with this
            config exports as this type when no `model_type` is asked for;
            None: only when asked for.
        export_order: the order `exports` is tried in within the family
            (lowest first; see `keras_transformers.registry.export_converter`).
        sequence_classifier: the type's sequence-classification class in
            transformers (e.g. "LlamaForSequenceClassification": its
            checkpoints load as the family's classifier, `GPTClassifier` or
            `MixtralClassifier`, with their `score` head, and such a
            classifier exports as it); None: the type has none.
    """

    model_type: str
    config_from_hf: Callable[[dict], dict]
    preset_data: Callable[[dict], dict]
    load_weights: Callable[..., None]
    export: Callable[..., tuple]
    family: str = "gpt"
    prefixes: tuple[str, ...] = ("",)
    probe: str = ""
    fit_directory: Callable[..., dict] = _same_fields
    fit_config: Callable[..., dict] = _same_fields
    write_preprocessor: Callable[..., None] = _no_preprocessor
    exports: Callable[..., bool] | None = None
    export_order: int = 100
    sequence_classifier: str | None = None

    def as_type(self, model_type: str) -> Converter:
        """The same converter registered under another `model_type` (e.g.
        RoBERTa's for "xlm-roberta" and "camembert")."""
        return dataclasses.replace(self, model_type=model_type)


def backbone_weights(load: Callable[..., None]) -> Callable[..., None]:
    """`load_weights` from a backbone loader `load(backbone, checkpoint,
    require_head)`: a task model's output layer is then required."""

    def load_weights(model, checkpoint, hf: dict) -> None:
        backbone = getattr(model, "backbone", model)
        load(backbone, checkpoint, require_head=backbone is not model)

    return load_weights


def one_layout(export: Callable[..., tuple]) -> Callable[..., tuple]:
    """`export` from `export(model)` of a converter with one layout (the
    `model_type` asked for is its own)."""

    def export_model(model, model_type: str) -> tuple:
        return export(model)

    return export_model


def decoder(
    model_type: str,
    *,
    architectures: tuple[str, str],
    config_from_hf: Callable[[dict], dict],
    hf_config: Callable,
    load_weights: Callable[..., None],
    export_weights: Callable,
    prefixes: tuple[str, ...],
    probe: str,
    exports: Callable[..., bool] | None = None,
    export_order: int = 100,
    sequence_classifier: bool = True,
    family: str = "gpt",
) -> Converter:
    """The converter of a decoder type of the GPT or the Mixtral family.

    Args:
        architectures: `(base model class, causal-LM class)` in
            transformers, e.g. `("LlamaModel", "LlamaForCausalLM")`: a
            checkpoint of the first loads as the family's backbone
            (`GPTBackbone`, `MixtralBackbone`), one of the type's sequence
            classifier (see below) as its classifier (`GPTClassifier`,
            `MixtralClassifier`), any other as its causal LM
            (`GPTCausalLM`, `MixtralCausalLM`), and exports write the
            matching one.
        hf_config: `(TransformerConfig) -> config.json dict`.
        load_weights: `(backbone, checkpoint, require_head) -> None`.
        export_weights: `(backbone) -> {name: array}` (with `lm_head`
            when untied).
        sequence_classifier: whether transformers has the type's sequence
            classifier, named after the base class (`LlamaModel` ->
            `LlamaForSequenceClassification`): the base model under its
            own prefix plus a bias-free `score` Linear `[num_labels, D]`.
        family: "gpt" (dense decoders) or "mixtral" (sparse MoE decoders).
        The other arguments are `Converter`'s.
    """
    base, causal = architectures
    classifier = base.removesuffix("Model") + "ForSequenceClassification"
    classifier = classifier if sequence_classifier else None
    backbone_class, causal_class, classifier_class = DECODER_CLASSES[family]

    def preset_data(hf: dict) -> dict:
        names = set(hf.get("architectures") or ())
        data = {"family": family, "config": config_from_hf(hf)}
        if names == {base}:
            return {**data, "class_name": backbone_class}
        if classifier in names:
            task = {"num_classes": num_labels(hf), "classifier_dropout": 0.0}
            return {**data, "class_name": classifier_class, "task": task}
        return {**data, "class_name": causal_class}

    def load(model, checkpoint, hf: dict) -> None:
        backbone = getattr(model, "backbone", model)
        head = getattr(model, SCORE, None)
        task = backbone is not model and head is None  # a causal LM: its head
        load_weights(backbone, checkpoint, require_head=task)
        if head is not None:
            load_score(head, checkpoint, hf, classifier, type(model).__name__)

    def export(model, model_type: str) -> tuple:
        backbone = getattr(model, "backbone", model)
        head = getattr(model, SCORE, None)
        if head is not None and classifier is None:
            raise ValueError(
                f"Hugging Face {model_type!r} has no sequence classifier, so "
                f"{type(model).__name__} cannot be exported as it. Export the "
                "backbone (`export_hf(model.backbone, ...)`) instead."
            )
        hf = hf_config(backbone.config)
        tensors = export_weights(backbone)
        if head is None:
            return {**hf, "architectures": [causal]}, tensors
        # The base model's tensors (the probe's prefix), without an LM head.
        prefix = next(k for k in tensors if k.endswith(probe))[: -len(probe)]
        tensors = {k: v for k, v in tensors.items() if k.startswith(prefix)}
        tensors[SCORE + ".weight"] = fetch(head.kernel, transpose=True)
        labels = {i: f"LABEL_{i}" for i in range(model.num_classes)}
        hf.update(id2label=labels, label2id={v: i for i, v in labels.items()})
        return {**hf, "architectures": [classifier]}, tensors

    return Converter(
        model_type,
        config_from_hf=config_from_hf,
        preset_data=preset_data,
        load_weights=load,
        export=export,
        family=family,
        prefixes=prefixes,
        probe=probe,
        exports=exports,
        export_order=export_order,
        sequence_classifier=classifier,
    )


def load_score(head, checkpoint, hf: dict, classifier, cls: str) -> None:
    """Loads a `score` head `[D, C]` from `score.weight` `[C, D]` when the
    checkpoint is a `classifier` with `C` labels; otherwise the head stays
    new, with a warning."""
    name = SCORE + ".weight"
    stored = classifier in (hf.get("architectures") or ()) and name in checkpoint
    if stored and num_labels(hf) == head.kernel.shape[-1]:
        assign(head.kernel, checkpoint.get(name), name, transpose=True)
        return
    reason = (
        f"its {name} has {num_labels(hf)} classes, not {head.kernel.shape[-1]}"
        if stored
        else f"it is not a {classifier or 'sequence classifier'} checkpoint"
    )
    warnings.warn(
        f"{checkpoint.directory} has no weights for the `score` head of {cls} "
        f"({reason}): newly initialised, train before use.",
        stacklevel=4,
    )


__all__ = ["Converter", "backbone_weights", "decoder", "load_score", "one_layout"]
