"""Vision Transformers: patch embedding and class token in front of the
shared pre-norm encoder blocks, and an image classifier on top."""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from keras_transformers.backend import call_layer
from keras_transformers.config.validation import check_dtype
from keras_transformers.layers import PatchEmbedding
from keras_transformers.layers.core import Dense, seeded_dropout
from keras_transformers.layers.patch_rotary import patch_coordinates
from keras_transformers.layers.patches import resize_grid
from keras_transformers.layers.serializable import serializable
from keras_transformers.models.base import (
    ConfiguredModel,
    TaskModel,
    initializer,
    make_blocks,
    resolve_config,
    run_blocks,
)
from keras_transformers.models.inputs import check_finite, check_not_empty
from keras_transformers.registry import register_model


def check_images(images, vision):
    """Validates channels-last float images; returns `[B, H, W, C]`.

    A grey image without a channel axis (`[B, H, W]`) gets one; grey images
    fed to an RGB model are repeated over the three channels.

    Raises:
        ValueError: wrong rank, an integer dtype, a channel count the model
            cannot take, or a size that is not a multiple of the patch size.
    """
    if not hasattr(images, "shape"):
        images = np.asarray(images)
    shape = tuple(images.shape)
    c, p = vision.num_channels, vision.patch_size
    if len(shape) == 3 and c == 1 and shape[-1] != 1:  # grey [B, H, W]
        images, shape = ops.expand_dims(images, -1), shape + (1,)
    if len(shape) != 4:
        raise ValueError(
            f"`images` must have shape [batch, height, width, channels] (channels "
            f"last). Received shape {shape}. Add a batch axis with `x[None]`."
        )
    check_not_empty("images", shape)
    dtype = keras.backend.standardize_dtype(images.dtype)
    if "float" not in dtype:
        raise ValueError(
            f"`images` must be floats. Received dtype {dtype}. Convert pixels with "
            "`images.astype('float32')`: the model rescales them itself "
            f"(vision.rescale={vision.rescale})."
        )
    if shape[-1] != c and not (shape[-1] == 1 and c == 3):
        raise ValueError(
            f"`images` have {shape[-1]} channels; the model takes {c} "
            f"(vision.num_channels). Convert the images (e.g. to {'RGB' if c == 3 else 'grey'}), "
            "or build the model with the matching num_channels."
        )
    for axis, size in zip(("height", "width"), shape[1:3]):
        if size is not None and size % p:
            raise ValueError(
                f"Image {axis} {size} is not a multiple of the patch size {p}. "
                f"Resize or pad the images to a multiple of {p} (e.g. {size - size % p + p})."
            )
    if shape[-1] != c:
        images = ops.repeat(images, c, axis=-1)
    return images


def normalize(images, vision):
    """`(images * rescale - mean) / std` in float32, per `vision`. The
    constants go through `ops` (a NumPy operand would make PyTorch hand the
    tensor to NumPy, which fails for a GPU tensor)."""
    x = ops.cast(images, "float32")
    if vision.rescale != 1.0:
        x = x * vision.rescale
    if vision.mean is not None:
        x = ops.subtract(x, np.asarray(vision.mean, "float32"))
    if vision.std is not None:
        x = ops.divide(x, np.asarray(vision.std, "float32"))
    return x


class _Resizable:
    """`with_image_size` as a method of the ViT models."""

    def with_image_size(self, image_size: int):
        """A copy of this model for `image_size` square images (see the
        module's `with_image_size`)."""
        return with_image_size(self, image_size)


@register_model("backbone")
@serializable
class ViTBackbone(_Resizable, ConfiguredModel):
    """Vision Transformer encoder (ViT).

    Images are normalised as the config says (`vision.rescale`, `mean`,
    `std`), cut into patches, embedded (`PatchEmbedding`: projection, class
    token, DeiT's distillation token with `vision.distillation_token`,
    `vision.register_tokens` register tokens, learned positions), run
    through pre-norm encoder blocks (with LayerScale when the config has
    `layer_scale`, as DINOv2) and a final norm. With
    `position_embedding="rotary"` there is no position table: the blocks'
    attention rotates queries and keys of the patches by their 2-D grid
    coordinates (`PatchRotaryAttention`, DINOv3), for any image size.

    Args:
        config: a `TransformerConfig` (or dict) with `stacks="encoder"` and a
            `vision` group; keyword fields override it.

    Call arguments:
        inputs: `{"images": [B, H, W, C]}` or the images alone; channels-last
            floats. H and W may differ from `vision.image_size` if they are
            multiples of the patch size (positions are then interpolated).

    Returns:
        `[B, num_prefix_tokens + (H/p)*(W/p), D]` final hidden states.

    Examples:
        >>> vit = ViTBackbone.from_preset("vit_tiny_28")
        >>> tuple(vit(np.zeros((1, 28, 28, 1), "float32")).shape)
        (1, 17, 32)
    """

    weight_axes = {"pooler/kernel": None, "pooler/bias": None}  # replicated

    family = "vit"

    def __init__(self, config=None, *, dtype=None, name=None, **fields):
        config = resolve_config(config, fields)
        if (
            config.stacks != "encoder"
            or config.vision is None
            or config.position_embedding not in ("learned", "rotary")
        ):
            raise ValueError(
                "ViTBackbone needs stacks='encoder', position_embedding='learned' "
                "(or 'rotary': 2-D rotary patch positions) "
                f"and a `vision` group. Received: stacks={config.stacks!r}, "
                f"position_embedding={config.position_embedding!r}, vision={config.vision!r}."
            )
        if config.pooler and config.vision.pooling == "token_and_mean":
            raise ValueError(
                "ViTBackbone's pooler (config.pooler=True) takes one `[D]` state; "
                "vision.pooling='token_and_mean' gives `[2 * D]`. Set pooler=False "
                "or use pooling 'token' / 'mean'."
            )
        super().__init__(dtype=check_dtype(dtype), name=name)
        self.config = config
        v, d = config.vision, config.hidden_dim
        self.patch_embedding = PatchEmbedding(
            d,
            v.patch_size,
            v.image_size,
            v.num_channels,
            class_token=v.class_token,
            distillation_token=v.distillation_token,
            register_tokens=v.register_tokens,
            position_table=not config.rotary,
            kernel_initializer=initializer(config),
            dtype=self.dtype_policy,
            name="patch_embedding",
        )
        self.patch_embedding.build((None, v.image_size, v.image_size, v.num_channels))
        self.embedding_dropout = seeded_dropout(config.dropout, dtype=dtype)
        self.blocks = make_blocks(
            config, config.num_layers, "block", self.dtype_policy, causal=False
        )
        self.final_norm = self._norm("final_norm") if config.final_norm else None
        self.pooler = None
        if config.pooler:  # the paper's pre-logits layer (HF ViTModel's pooler)
            self.pooler = Dense(
                d,
                activation="tanh",
                kernel_initializer=initializer(config),
                dtype=self.dtype_policy,
                name="pooler",
            )
            self.pooler.build((None, d))
        self.built = True

    def call(self, inputs, training=None):
        if isinstance(inputs, dict) and "images" not in inputs:
            raise ValueError(
                f"Inputs must contain 'images'. Received keys {sorted(inputs)}."
            )
        images = inputs["images"] if isinstance(inputs, dict) else inputs
        vision = self.config.vision
        images = check_images(images, vision)
        if not training:  # training steps skip the device-to-host sync
            check_finite("images", images)
        images = normalize(images, vision)
        x = call_layer(self.patch_embedding, ops.cast(images, self.compute_dtype))
        if training and self.config.dropout > 0:
            x = self.embedding_dropout(x, training=training)
        positions = {}
        if self.config.rotary:  # [P, 2] patch centres of this image grid
            p = vision.patch_size
            sides = [n or vision.image_size for n in images.shape[1:3]]
            grid = (sides[0] // p, sides[1] // p)
            positions["positions"] = patch_coordinates(*grid)
        x = run_blocks(self.blocks, x, None, training=training, **positions)
        return call_layer(self.final_norm, x) if self.final_norm is not None else x

    @property
    def pooled_dim(self) -> int:
        """The width of `pool`'s output (what a classifier head takes)."""
        pair = self.config.vision.pooling == "token_and_mean"
        return self.config.hidden_dim * (2 if pair else 1)

    def pool(self, hidden):
        """`[B, L, D]` hidden states -> `[B, pooled_dim]`: the class token's
        state (`vision.pooling="token"`), the mean over patch tokens
        ("mean"; the class and distillation tokens left out) or both
        concatenated ("token_and_mean", `[B, 2 * D]`), then the pre-logits
        layer when the config has `pooler=True`."""
        pooling = self.config.vision.pooling
        start = self.config.vision.num_prefix_tokens
        mean = None if pooling == "token" else ops.mean(hidden[:, start:, :], axis=1)
        if pooling == "mean":
            pooled = mean
        elif pooling == "token":
            pooled = hidden[:, 0, :]
        else:
            pooled = ops.concatenate([hidden[:, 0, :], mean], axis=-1)
        return self.pooler(pooled) if self.pooler is not None else pooled


@register_model("classifier", default=True)
@serializable
class ViTClassifier(_Resizable, TaskModel):
    """Image classification with a ViT backbone.

    The head is a dense layer over the pooled state (`ViTBackbone.pool`:
    `[2 * D]` wide with `vision.pooling="token_and_mean"`, as DINOv2's).

    Args:
        backbone: a `ViTBackbone` (or one is built from `config`).
        num_classes: number of labels.
        classifier_dropout: dropout before the classifier.
        distillation_head: a second head, `distillation_classifier`, on the
            distillation token's final state; the logits are the mean of
            both heads' (DeiT's classifier with teacher). Needs
            `vision.distillation_token`.

    Call arguments:
        inputs: the backbone's inputs.

    Returns:
        `[B, num_classes]` logits.
    """

    backbone_cls = ViTBackbone
    task_arguments = ("num_classes", "classifier_dropout", "distillation_head")

    def __init__(
        self,
        backbone=None,
        *,
        num_classes=1000,
        classifier_dropout=0.0,
        distillation_head=False,
        **kwargs,
    ):
        super().__init__(backbone, **kwargs)
        if distillation_head and not self.config.vision.distillation_token:
            raise ValueError(
                "`distillation_head=True` needs a distillation token "
                "(config.vision.distillation_token=True)."
            )
        # ViT's zero-initialised heads.
        width = self.backbone.pooled_dim
        self._add_classifier(num_classes, classifier_dropout, "zeros", width)
        self.distillation_head = bool(distillation_head)
        self.distillation_classifier = None
        if distillation_head:
            self.distillation_classifier = self._dense_head(
                "distillation_classifier", "zeros"
            )

    def call(self, inputs, training=None):
        hidden = self.backbone(inputs, training=training)
        pooled = self.dropout(self.backbone.pool(hidden), training=training)
        logits = self.classifier(pooled)
        if self.distillation_classifier is None:
            return logits
        distilled = self.dropout(hidden[:, 1, :], training=training)
        return (logits + self.distillation_classifier(distilled)) / 2


def with_image_size(model, image_size: int):
    """A copy of a ViT model (backbone or classifier) for `image_size` square
    images, same weights, position embeddings resized bicubically over the
    patch grid (class / distillation tokens kept). At the same size the copy
    is identical.

    Examples:
        >>> small = ViTClassifier.from_preset("vit_tiny_28", num_classes=10)
        >>> big = with_image_size(small, 56)
        >>> tuple(big(np.zeros((1, 56, 56, 1), "float32")).shape)
        (1, 10)
    """
    backbone = getattr(model, "backbone", model)
    config = backbone.config.replace(vision={"image_size": image_size})
    if model is backbone:
        new = type(model)(config=config, dtype=model.dtype_policy)
    else:
        new = type(model)(
            config=config,
            dtype=model.dtype_policy,
            tokenizer=model.tokenizer,
            **model.task_config(),
        )
    copy_resized_weights(model, new)
    return new


def copy_resized_weights(source, target) -> None:
    """Copies every weight of `source` into `target` (same class, same
    config but the image size), resizing the position table."""
    old = getattr(source, "backbone", source).patch_embedding
    new = getattr(target, "backbone", target).patch_embedding
    resized = None
    if old.position_embeddings is not None:  # none with 2-D rotary positions
        table = ops.convert_to_numpy(ops.cast(old.position_embeddings, "float32"))
        resized = resize_grid(table, old.grid, new.grid, old.num_prefix_tokens)
    for a, b in zip(source.weights, target.weights):
        value = resized if a is old.position_embeddings else a.value
        b.assign(ops.cast(value, b.dtype))
