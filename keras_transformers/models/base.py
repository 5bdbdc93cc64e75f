"""What every model shares: the config plumbing, input checks, block stacks.

A model is built from one `TransformerConfig`; its `get_config()` is that
config, so nothing can drift. Weights are created in `__init__` (all shapes
are known from the config), so a fresh model can load weights at once.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from keras_transformers import backend, loading, lora, preset_io, quantization
from keras_transformers._json import dtype_policy_json
from keras_transformers.backend import call_layer, concrete_numpy, in_shape_inference
from keras_transformers.backend.compiled import (
    BuildsBeforeTracing,
    prepare_tensorflow_step,
    train_function,
)
from keras_transformers.backend.jax_state import KeepsStateOnError
from keras_transformers.config import TransformerConfig
from keras_transformers.config.validation import check_argument_int
from keras_transformers.layers import make_norm
from keras_transformers.layers.core import Dense, seeded_dropout
from keras_transformers.models.block_spec import initializer, make_blocks  # noqa: F401
from keras_transformers.models.inputs import (
    ChecksDataIds,
    check_id_range,
    check_not_empty,
    host_inputs,
)
from keras_transformers.models.shared_rotary import shared_rotary_angles
from keras_transformers.training.random_state import SavesRandomState


def resolve_config(config, fields: dict) -> TransformerConfig:
    """`config` as a TransformerConfig, with keyword `fields` applied on top."""
    if config is None:
        return TransformerConfig.from_dict(fields)
    if isinstance(config, dict):
        config = TransformerConfig.from_dict(config)
    if not isinstance(config, TransformerConfig):
        raise ValueError(
            "`config` must be a TransformerConfig or a dict. "
            f"Received: {type(config).__name__}"
        )
    return config.replace(**fields) if fields else config


def token_initializer(config: TransformerConfig):
    """`initializer`, but std 1 (T5's) for a tied table whose output is
    scaled by `hidden_dim**-0.5` (`scale_logits`): first logits of unit
    scale, not of `initializer_range`'s (near-uniform for many steps)."""
    if config.scale_logits and config.tie_embeddings:
        return keras.initializers.TruncatedNormal(stddev=1.0)
    return initializer(config)


def check_token_ids(
    token_ids,
    config: TransformerConfig,
    name: str = "token_ids",
    check_values=True,
    limit: tuple[str, int] | None = None,
):
    """Validates `[B, T]` integer ids; returns them as an int32 tensor.

    Raises ValueError for a wrong rank or dtype, a length past
    `max_sequence_length`, and (when values are known, i.e. eagerly) ids
    outside `[0, limit)`; `limit` is `(name, value)`, by default
    `("vocabulary_size", config.vocabulary_size)`.
    """
    limit_name, limit_value = limit or ("vocabulary_size", config.vocabulary_size)
    if not hasattr(token_ids, "shape"):
        token_ids = np.asarray(token_ids)
    shape = tuple(token_ids.shape)
    if len(shape) != 2:
        raise ValueError(
            f"`{name}` must have shape [batch, length]. Received rank {len(shape)} "
            f"with shape {shape}. Add a batch dimension with `x[None]`."
        )
    check_not_empty(name, shape)
    if not hasattr(token_ids, "dtype"):
        token_ids = np.asarray(token_ids)
    dtype = keras.backend.standardize_dtype(token_ids.dtype)
    if "float" in dtype and in_shape_inference():
        token_ids, dtype = ops.cast(token_ids, "int32"), "int32"
    if "int" not in dtype:
        raise ValueError(
            f"`{name}` must be an integer tensor of token ids. Received dtype {dtype}. "
            "Tokenize text first (e.g. with the model's tokenizer)."
        )
    length = shape[1]
    if length is not None and length > config.max_sequence_length:
        raise ValueError(
            f"`{name}` has length {length}, longer than max_sequence_length="
            f"{config.max_sequence_length}. Truncate the input, or load the preset "
            "with a larger `max_sequence_length` (learned position tables then grow)."
        )
    hint = (
        "Check that the tokenizer matches the model."
        if limit is None
        else f"Use ids below {limit_value} or a config with a larger {limit_name}."
    )
    values = concrete_numpy(token_ids) if check_values else None
    check_id_range(values, name, limit_name, limit_value, hint)
    return ops.cast(token_ids, "int32")


def unpack_token_inputs(inputs, config: TransformerConfig, extra=(), check_values=True):
    """Splits `inputs` (a dict, or a bare `[B, T]` id tensor) into
    `(token_ids, padding_mask, *extra)`; a missing padding mask means all real."""
    if isinstance(inputs, dict):
        if "token_ids" not in inputs:
            raise ValueError(
                f"Inputs must contain 'token_ids'. Received keys {sorted(inputs)}."
            )
        token_ids = inputs["token_ids"]
        padding_mask = inputs.get("padding_mask")
        rest = [inputs.get(key) for key in extra]
    else:
        token_ids, padding_mask, rest = inputs, None, [None] * len(extra)
    token_ids = check_token_ids(token_ids, config, check_values=check_values)
    padding_mask = check_padding_mask(padding_mask, token_ids)
    if "segment_ids" in extra and rest[extra.index("segment_ids")] is not None:
        i = extra.index("segment_ids")
        if tuple(rest[i].shape) != tuple(token_ids.shape):
            raise ValueError(
                f"`segment_ids` shape {tuple(rest[i].shape)} does not match "
                f"`token_ids` shape {tuple(token_ids.shape)}."
            )
        rest[i] = check_token_ids(
            rest[i],
            config,
            "segment_ids",
            check_values,
            limit=("num_segments", max(config.num_segments, 1)),
        )
    return (token_ids, padding_mask, *rest)


def check_padding_mask(padding_mask, token_ids, name="padding_mask"):
    """`padding_mask` as bool, all True when None; its shape must be the ids'."""
    if padding_mask is None:
        return ops.ones_like(token_ids, dtype="bool")
    if not hasattr(padding_mask, "shape"):
        padding_mask = np.asarray(padding_mask)
    if tuple(padding_mask.shape) != tuple(token_ids.shape):
        ids_name = name.replace("padding_mask", "token_ids")
        raise ValueError(
            f"`{name}` shape {tuple(padding_mask.shape)} does not match "
            f"`{ids_name}` shape {tuple(token_ids.shape)}."
        )
    return ops.cast(padding_mask, "bool")


def run_blocks(
    blocks,
    x,
    padding_mask,
    cache=None,
    cache_index=None,
    training=None,
    cross_cache=None,
    per_layer_inputs=None,
    **kwargs,
):
    """Runs `x [B, T, D]` through `blocks`.

    With `cache` (one `(key, value)` pair per block, see `init_cache`) returns
    `(x, updated_cache)`; without, returns `x`. `cross_cache` holds one
    projected encoder `(key, value)` pair per block (encoder-decoder models);
    `per_layer_inputs` `[B, T, L, P]` gives block i its `[B, T, P]` input.
    Blocks with rotary self-attention get their setting's angles as
    `positions`, computed once per call (`shared_rotary_angles`). Other
    keyword arguments go to every block.
    """
    angles = shared_rotary_angles(blocks, x, kwargs.get("positions"), cache_index)

    def own(i):
        extra = {}
        if per_layer_inputs is not None:
            extra["per_layer_input"] = per_layer_inputs[:, :, i, :]
        if angles is not None and angles[i] is not None:
            extra["positions"] = angles[i]
        return {**kwargs, **extra} if extra else kwargs

    if cache is None:
        padding_mask = backend.none_if_all_true(padding_mask)
        with backend.direct_calls(blocks):
            for i, block in enumerate(blocks):
                x = backend.call_block(
                    block, x, padding_mask=padding_mask, training=training, **own(i)
                )
        return x
    caches = []
    for i, block in enumerate(blocks):
        if cross_cache is not None:
            kwargs["cross_cache"] = cross_cache[i]
        x, layer_cache = call_layer(
            block,
            x,
            padding_mask=padding_mask,
            cache=cache[i],
            cache_index=cache_index,
            training=training,
            **own(i),
        )
        caches.append(layer_cache)
    return x, tuple(caches)


class ConfiguredModel(
    SavesRandomState, ChecksDataIds, KeepsStateOnError, BuildsBeforeTracing, keras.Model
):
    """Base of every model: holds `config`, derives `get_config()` from it,
    and carries the preset entry points. Saved weights include the state of
    its dropout seed generators, so training resumes exactly."""

    family: str = ""

    def __new__(cls, *args, **kwargs):
        model = super().__new__(cls, *args, **kwargs)
        # Keras wraps every `quantize` in a check of the mode against its own
        # modes, which lack "nf4"; ours checks the mode itself.
        model.__dict__.pop("quantize", None)
        return model

    def __call__(self, *args, **kwargs):
        """Checks host inputs (lists, text, ids beyond int32) first; see
        `keras_transformers.models.inputs`."""
        if args:
            args = (host_inputs(args[0]), *args[1:])
        elif "inputs" in kwargs:
            kwargs["inputs"] = host_inputs(kwargs["inputs"])
        return super().__call__(*args, **kwargs)

    def make_train_function(self, force=False):
        """Keras' train function; with PyTorch's compiled path, one that
        traces the model fewer times and compiles once (`train_function`);
        on TensorFlow, one traced once and freed with the model
        (`prepare_tensorflow_step`; both in `backend.compiled`)."""
        prepare_tensorflow_step(self)
        function = train_function(self, force, check_inputs=host_inputs)
        return super().make_train_function(force) if function is None else function

    def _norm(self, name):
        """A built norm of the config's type over `hidden_dim` features."""
        c = self.config
        norm = make_norm(c.norm_type, c.norm_epsilon, self.dtype_policy, name)
        norm.build((None, None, c.hidden_dim))
        return norm

    def estimate_memory(self, batch_size, sequence_length=None, optimizer=None, **kw):
        """`keras_transformers.estimate_memory` for this model's config, its
        dtype policy and (None) its compiled optimizer, else "adamw"."""
        from keras_transformers.memory import estimate_memory

        optimizer = optimizer or getattr(self, "optimizer", None) or "adamw"
        kw.setdefault("dtype", self.dtype_policy.name)
        return estimate_memory(
            self.config, batch_size, sequence_length, optimizer=optimizer, **kw
        )

    def get_config(self):
        """The config, name and dtype policy; a quantized model adds its
        layers' quantization (`keras_transformers.quantization.spec`)."""
        config = {
            "config": self.config.to_dict(),
            "name": self.name,
            "dtype": dtype_policy_json(self.dtype_policy),
        }
        quantized = quantization.spec(self)
        return config if quantized is None else {**config, "quantization": quantized}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        quantized = config.pop("quantization", None)
        model = cls(config=TransformerConfig.from_dict(config.pop("config")), **config)
        quantization.restore(model, quantized)
        return model

    @classmethod
    def from_preset(cls, handle, **overrides):
        """Builds this model from a preset name, a saved preset directory, a
        Hugging Face model directory or a hub handle `hf://org/name[@rev]`
        (fetched into the Hugging Face cache first); `overrides` replace
        config values (e.g. `dropout=0.1`) or set `dtype`, `load_weights=False`
        (see `keras_transformers.loading.load_model`)."""
        return loading.load_model(handle, cls=cls, **overrides)

    def save_to_preset(self, directory):
        """Writes config.json, model.weights.h5, metadata.json and the tokenizer
        assets (if any) to `directory`; `from_preset(directory)` restores all.
        A LoRA model is saved merged (a plain preset); a quantized one is
        saved quantized (its modes in config.json), except with LoRA enabled."""
        quantization.check_savable(self)
        preset_io.save_model(self, directory)

    def push_to_hub(self, repo_id, format="preset", model_type=None, **kwargs):
        """Uploads the model to the Hugging Face hub repository `repo_id`
        ("org/name"), saved to a temporary directory as `format`: "preset"
        (`save_to_preset`), "hf" (`export_hf`, in `model_type`'s layout if
        given) or "adapter" (`save_adapter`). `kwargs`: `token`, `private`,
        `commit_message`, `revision`, `overwrite`; see
        `keras_transformers.hub_upload.push`. Returns the commit's info."""
        from keras_transformers.hub_upload import push_model

        return push_model(self, repo_id, format, model_type, **kwargs)

    def export(self, filepath, format="tf_saved_model", verbose=False, **kwargs):
        """Keras' `export` with a fixed input signature from the model's
        input names (`batch_size=`, `sequence_length=`, ...) and clear
        errors for what cannot export; see
        `keras_transformers.export.export_model`."""
        from keras_transformers.export import export_model

        return export_model(self, filepath, format=format, verbose=verbose, **kwargs)

    # ------------------ LoRA and quantization (see lora.py, quantization.py)
    def enable_lora(self, rank, target=("query", "value"), alpha=None):
        """Adds LoRA adapters (kernel + `alpha / rank * A @ B`; alpha defaults
        to rank) to the projections named in `target` ("query", "key",
        "value", "attention_output", "intermediate", "gate", "output") and
        freezes all other weights but a fresh classification head
        (`classifier`, or `score` of `GPTClassifier`). `compile()` again
        before `fit()`."""
        lora.enable_lora(self, rank, target, alpha)

    def merge_lora(self):
        """Folds the LoRA update into the kernels: a plain model again. Save
        the adapter first (`save_adapter`) to keep it apart."""
        lora.merge_lora(self)
        self._lora_merged = True

    def save_adapter(self, directory, base_model_name_or_path=None, model_type=None):
        """Writes the LoRA adapter in PEFT's format (`adapter_config.json` +
        `adapter_model.safetensors`) for `peft.PeftModel.from_pretrained`;
        `model_type` picks the Hugging Face layout (default: `export_hf`'s).
        See `keras_transformers.adapters`."""
        from keras_transformers import adapters

        adapters.save_adapter(self, directory, base_model_name_or_path, model_type)

    def load_adapter(self, directory_or_hf_handle):
        """Loads a PEFT LoRA adapter (a directory or `hf://org/name`),
        enabling LoRA with its rank, targets and scale if it is off."""
        from keras_transformers import adapters

        adapters.load_adapter(self, directory_or_hf_handle)

    def save_lora_weights(self, path):
        """Writes only the adapter (LoRA `A`, `B`, a trainable head) to `.npz`."""
        lora.save_lora_weights(self, path)

    def load_lora_weights(self, path):
        """Loads `save_lora_weights` output after the same `enable_lora`."""
        lora.load_lora_weights(self, path)

    def quantize(self, mode=None, config=None, filters=None, **kwargs):
        """Quantizes the model in place: "int8", "int4" (Keras' own) or "nf4"
        (QLoRA's 4-bit NormalFloat), MoE experts included; see
        `keras_transformers.quantization`. `enable_lora` afterwards trains
        float adapters on the frozen quantized weights (QLoRA)."""
        quantization.quantize(self, mode, config=config, filters=filters, **kwargs)


class TaskModel(ConfiguredModel):
    """Base of task models: a backbone of `backbone_cls` plus a head.

    Args:
        backbone: a built backbone; if None, one is made from `config` and
            the keyword config fields.
        config: a `TransformerConfig` or dict (when `backbone` is None).
        tokenizer: optional tokenizer (or preprocessor), saved with
            `save_to_preset`.

    Subclasses with head arguments (e.g. `num_classes`) list them in
    `task_arguments`; they are saved in `get_config()` and in presets.
    """

    # Classification heads are replicated (see keras_transformers.distribution).
    weight_axes = {"classifier/kernel": None, "classifier/bias": None}

    backbone_cls = None
    task_arguments: tuple = ()

    def __init__(
        self,
        backbone=None,
        *,
        config=None,
        tokenizer=None,
        dtype=None,
        name=None,
        **fields,
    ):
        if backbone is None:
            backbone = self.backbone_cls(config, dtype=dtype, **fields)
        elif config is not None or fields:
            raise ValueError(
                "Pass either `backbone` or `config`/config fields, not both."
            )
        elif not isinstance(backbone, self.backbone_cls):
            raise ValueError(
                f"{type(self).__name__} needs a {self.backbone_cls.__name__}. "
                f"Received: {type(backbone).__name__}"
            )
        super().__init__(dtype=backbone.dtype_policy, name=name)
        self.backbone = backbone
        self.config = backbone.config
        self.tokenizer = tokenizer
        self.built = True  # heads added by subclasses are built in their __init__

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.backbone_cls is not None:
            cls.family = cls.backbone_cls.family

    def _add_classifier(self, num_classes, dropout, kernel_initializer, width=None):
        """Sets `num_classes`, `classifier_dropout` and the built `dropout` +
        `classifier` (Dense over `width` features, default `hidden_dim`)
        layers of a classification head."""
        self.num_classes = check_argument_int("num_classes", num_classes, 1)
        self.classifier_dropout = dropout
        self.dropout = seeded_dropout(dropout, dtype=self.dtype_policy)
        self.classifier = self._dense_head("classifier", kernel_initializer, width)

    def _dense_head(self, name, kernel_initializer, width=None):
        """A built Dense layer from `width` features (default `hidden_dim`)
        to `num_classes`."""
        head = Dense(
            self.num_classes,
            kernel_initializer=kernel_initializer,
            dtype=self.dtype_policy,
            name=name,
        )
        head.build((None, width or self.config.hidden_dim))
        return head

    def task_config(self) -> dict:
        """The head arguments (`task_arguments`) and their values."""
        return {key: getattr(self, key) for key in self.task_arguments}

    def get_config(self):
        return {**super().get_config(), **self.task_config()}
