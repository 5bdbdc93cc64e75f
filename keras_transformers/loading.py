"""From a handle to a model in one pass: resolve the handle, read the
config, build the model, load its weights and tokenizer.

`load_model` serves every `from_preset`. The class to build comes from
`keras_transformers.registry`, the files from `keras_transformers.preset_io`,
and a Hugging Face model directory (or the snapshot of an `hf://` handle)
loads through `keras_transformers.convert`.
"""

from __future__ import annotations

from pathlib import Path

from keras_transformers import preset_io, registry, sentence_embedding
from keras_transformers.config import TransformerConfig


def preset_data(handle) -> dict:
    """The data of any preset: `family`, `config` (and `class_name`, `task`,
    `metadata` where known). A hub handle fetches only config and tokenizer
    files."""
    directory = preset_io.resolve(handle, weights=False)
    return _read(directory, preset_io.kind(directory))


def _read(handle, kind: str) -> dict:
    """The data of a resolved handle of `kind` (see `preset_io.kind`)."""
    if kind == "huggingface":
        from keras_transformers.convert import hf_preset_data

        return hf_preset_data(Path(handle))
    return preset_io.read_preset(handle, kind)


def _config(data: dict, handle, overrides: dict) -> TransformerConfig:
    if "config" not in data:
        raise ValueError(f"Preset {handle!r} has no 'config' entry.")
    config = TransformerConfig.from_dict(data["config"])
    return config.replace(**overrides) if overrides else config


def load_config(name_or_path, **overrides) -> TransformerConfig:
    """The `TransformerConfig` of a preset, with `overrides` applied.

    Args:
        name_or_path: a built-in preset name, a preset JSON file, a saved
            preset directory, a Hugging Face model directory or a hub handle
            `hf://org/name[@revision]` (only its config and tokenizer files
            are fetched).
        **overrides: config fields to change, e.g. `max_sequence_length=256`.

    Raises:
        ValueError: unknown preset, invalid config, or (`HubContentError`) a
            hub repository we cannot load.
        FileNotFoundError: missing files, or (`HubAccessError`) a hub
            repository or revision that cannot be reached.
    """
    return _config(preset_data(name_or_path), name_or_path, overrides)


def load_model(
    handle,
    cls=None,
    load_weights: bool = True,
    dtype=None,
    distribution=None,
    **overrides,
):
    """Builds the model a preset describes (used by every `from_preset`).

    Args:
        handle: built-in name, saved preset directory, Hugging Face directory
            or hub handle `hf://org/name[@revision]` (fetched into the
            Hugging Face cache first, see `keras_transformers.hub`).
        cls: the class asked for (None: the preset's own class).
        load_weights: load the saved or converted weights (built-in presets
            have none: random initialisation).
        dtype: dtype policy, e.g. "bfloat16" or "mixed_bfloat16".
        distribution: JAX only: `"auto"`, `"data"`, `"model"`, a dict of mesh
            axis sizes or a `keras.distribution` `DataParallel` / `ModelParallel` (see
            `keras_transformers.distribution.make_distribution`). It is set as
            the global distribution (what `fit()` and `generate()` then use)
            and the weights are created sharded by its layout.
        **overrides: config fields to change.

    Raises:
        ValueError: unknown preset or class mismatch, invalid config, or
            (`keras_transformers.hub.HubContentError`) a hub repository with
            only pickle weights or an unsupported `model_type`.
        FileNotFoundError: missing files, or
            (`keras_transformers.hub.HubAccessError`) a hub repository or
            revision not found, gated, or offline with nothing cached.
    """
    handle = preset_io.resolve(handle, weights=load_weights)
    # A sentence-transformers directory: its transformer, as a TextEmbedder.
    handle, cls, overrides = sentence_embedding.redirect(handle, cls, overrides)
    kind = preset_io.kind(handle)
    source = None  # a Hugging Face directory's pieces (`convert.HFSource`)
    if kind == "huggingface":
        from keras_transformers.convert import HFSource

        source = HFSource(handle, load_weights)
        data = source.data
    else:  # a built-in or saved preset
        data = preset_io.read_preset(handle, kind)
    if distribution is not None:
        _activate_distribution(handle, data, cls, distribution, overrides)
    cls, saved_cls = registry.resolve_class(data, cls)
    task_args = preset_io.split_task_arguments(cls, overrides)
    if saved_cls is cls:
        task_args = {**data.get("task", {}), **task_args}
    if source is not None:
        data = {**data, "config": source.fit_config(data["config"], cls)}
    config = _config(data, handle, overrides)
    tokenizer = None  # built-in presets have neither tokenizer nor weights
    if source is not None:
        tokenizer = source.tokenizer
    elif kind == "saved":
        tokenizer = preset_io.saved_tokenizer(handle, config, weights=load_weights)
    if kind in ("builtin", "file") or not load_weights:
        return preset_io.instantiate(cls, config, dtype, tokenizer, task_args)
    if source is not None:
        model = _converted_model(source, cls, config, dtype, tokenizer, task_args)
    else:
        model = _saved_model(handle, data, saved_cls, config, dtype, tokenizer)
        model = _convert_between(model, cls, tokenizer, task_args)
    from keras_transformers.generation.config import attach_generation_config

    attach_generation_config(model, handle)  # generation_config.json, if any
    return model


def _converted_model(source, cls, config, dtype, tokenizer, task_args):
    """`cls` built without random draws for the weights the checkpoint of
    `source` (a `convert.HFSource`) then fills."""
    from keras_transformers.backend.loading import staging
    from keras_transformers.deferred import deferred_initialization

    with deferred_initialization(), staging():
        model = preset_io.instantiate(cls, config, dtype, tokenizer, task_args)
        source.load_weights(model)
    return model


def _saved_model(directory, data: dict, saved_cls, config, dtype, tokenizer):
    """The saved class with the saved weights, at the image size of `config`."""
    weights = Path(directory) / preset_io.WEIGHTS_FILE
    if not weights.exists():
        raise FileNotFoundError(
            f"{weights} is missing. Save the model again with `save_to_preset`, or pass "
            "`load_weights=False` for a randomly initialised model."
        )
    from keras_transformers.deferred import deferred_initialization, loaded

    saved_size = _image_size(TransformerConfig.from_dict(data["config"]))
    resize = saved_size is not None and saved_size != _image_size(config)
    at_saved = config.replace(image_size=saved_size) if resize else config
    # Built without random draws: a successful load fills every variable
    # (Keras raises when one is missing from the file).
    with deferred_initialization():
        model = preset_io.instantiate(
            saved_cls, at_saved, dtype, tokenizer, data.get("task")
        )
        from keras_transformers import quantization  # imports Keras

        quantization.restore(model, data.get("quantization"))  # a quantized save
        preset_io.load_weights(model, weights)
        for variable in model.weights:
            loaded(variable)
    if resize:  # e.g. a ViT fine-tuned at another resolution
        model = model.with_image_size(config.vision.image_size)
    return model


def _activate_distribution(handle, data: dict, cls, distribution, overrides):
    """Makes `distribution` (for the config of preset `data` with
    `overrides`) the global `keras.distribution`."""
    import keras

    from keras_transformers.distribution import make_distribution

    if isinstance(distribution, (str, dict)):
        target, _ = registry.resolve_class(data, cls)
        task = preset_io.cls_task_arguments(target)
        fields = {k: v for k, v in overrides.items() if k not in task}
        config = _config(data, handle, fields)
        distribution = make_distribution(config, distribution, model=target)
    keras.distribution.set_distribution(distribution)


def _image_size(config):
    return config.vision.image_size if config.vision is not None else None


def _convert_between(model, cls, tokenizer, task_args=None):
    """A task preset loads as its backbone, a backbone preset as any task of
    its family (with a new head), and a task with other head arguments keeps
    its backbone, and its head weights wherever their shapes still fit."""
    task_args = task_args or {}
    if isinstance(model, cls) and all(
        getattr(model, k) == v for k, v in task_args.items()
    ):
        return model
    backbone = getattr(model, "backbone", model)
    if isinstance(backbone, cls):
        return backbone
    if getattr(cls, "backbone_cls", None) is None or not isinstance(
        backbone, cls.backbone_cls
    ):
        raise ValueError(
            f"A {type(model).__name__} preset cannot be loaded as {cls.__name__}."
        )
    new = cls(
        backbone, tokenizer=tokenizer or getattr(model, "tokenizer", None), **task_args
    )
    if type(model) is cls:  # same head, other arguments (e.g. dropout)
        _copy_head_weights(model, new)
    return new


def _copy_head_weights(source, target):
    backbone_ids = {id(v) for v in source.backbone.weights}
    old = [v for v in source.weights if id(v) not in backbone_ids]
    new = [
        v
        for v in target.weights
        if id(v) not in {id(w) for w in target.backbone.weights}
    ]
    for a, b in zip(old, new):
        if tuple(a.shape) == tuple(b.shape):
            b.assign(a.value)
