"""Image patches as tokens (ViT): patch projection, class token and learned
position embeddings that follow the image size by bicubic interpolation."""

from __future__ import annotations

import math

import keras
import numpy as np
from keras import ops

from keras_transformers import backend
from keras_transformers.layers.serializable import serializable

CUBIC_A = -0.75  # PyTorch's (and so Hugging Face ViT's) bicubic kernel


def _cubic(t: np.ndarray) -> np.ndarray:
    """Keys' cubic convolution kernel with a = -0.75 at distances `t`."""
    t = np.abs(t)
    a = CUBIC_A
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


def bicubic_matrix(in_size: int, out_size: int) -> np.ndarray:
    """`[out_size, in_size]` matrix of 1-D bicubic resampling.

    Same numbers as `torch.nn.functional.interpolate(mode="bicubic",
    align_corners=False)` (source index `(i + 0.5) * in/out - 0.5`, edges
    replicated). At `out_size == in_size` it is the identity.
    """
    if in_size == out_size:
        return np.eye(in_size, dtype="float64")
    source = (np.arange(out_size) + 0.5) * (in_size / out_size) - 0.5
    base = np.floor(source)
    frac = source - base
    matrix = np.zeros((out_size, in_size))
    for k in range(-1, 3):
        index = np.clip(base + k, 0, in_size - 1).astype(int)
        np.add.at(matrix, (np.arange(out_size), index), _cubic(frac - k))
    return matrix


def resize_grid(table, old_grid: tuple, new_grid: tuple, prefix: int):
    """Resamples a position table `[prefix + h*w, D]` to another patch grid.

    The first `prefix` rows (the class token's) are kept; the `h x w` patch
    rows are resized bicubically to `new_grid`. Works on NumPy arrays and on
    backend tensors (a pair of matrix products, so it is differentiable).

    Returns:
        `[prefix + H*W, D]`.
    """
    (h, w), (nh, nw) = old_grid, new_grid
    if (h, w) == (nh, nw):
        return table
    rows = bicubic_matrix(h, nh).astype("float32")  # [nh, h]
    cols = bicubic_matrix(w, nw).astype("float32")  # [nw, w]
    if isinstance(table, np.ndarray):
        grid = table[prefix:].reshape(h, w, -1)
        grid = np.einsum("ah,bw,hwd->abd", rows, cols, grid)
        return np.concatenate([table[:prefix], grid.reshape(nh * nw, -1)], axis=0)
    dim = table.shape[-1]
    grid = ops.reshape(table[prefix:], (h, w, dim))
    grid = ops.einsum("ah,bw,hwd->abd", rows, cols, ops.cast(grid, "float32"))
    grid = ops.cast(ops.reshape(grid, (nh * nw, dim)), table.dtype)
    return ops.concatenate([table[:prefix], grid], axis=0)


@serializable
class PatchEmbedding(keras.layers.Layer):
    """Splits images into patches and embeds them as tokens.

    Each non-overlapping `patch_size x patch_size` patch is flattened and
    projected to `hidden_dim` (the same numbers as a strided convolution
    with kernel `[p, p, C, D]`, computed as one matrix product); a learned
    class token (and DeiT's distillation token after it) is prepended and
    learned position embeddings are added. Images of another size
    (divisible by the patch size) get position embeddings resized
    bicubically from the `image_size` grid, the prefix tokens' rows kept,
    as Hugging Face's `interpolate_pos_encoding=True` does.

    Args:
        hidden_dim: D.
        patch_size: p.
        image_size: the size (square) the position table is learned for.
        num_channels: C.
        class_token: prepend a class token.
        distillation_token: a second learned token after the class token
            (DeiT); needs `class_token`.
        register_tokens: learned register tokens after those (DINOv3).
        position_table: learned position embeddings; False for none (the
            blocks then place the patches, e.g. `PatchRotaryAttention`).
        kernel_initializer: initializer of the projection, class token and
            position embeddings.

    Call arguments:
        images: `[B, H, W, C]` floats; H and W multiples of `patch_size`.

    Returns:
        `[B, num_prefix_tokens + (H/p)*(W/p), D]`.

    Examples:
        >>> layer = PatchEmbedding(8, patch_size=4, image_size=8, num_channels=1)
        >>> tuple(layer(np.zeros((2, 8, 8, 1), "float32")).shape)
        (2, 5, 8)
    """

    # Logical axes of each weight (see keras_transformers.distribution).
    weight_axes = dict.fromkeys(
        ("kernel", "bias", "class_token", "distillation_token", "register_tokens")
        + ("position_embeddings",)
    )  # all replicated

    def __init__(
        self,
        hidden_dim,
        patch_size,
        image_size,
        num_channels=3,
        class_token=True,
        kernel_initializer="glorot_uniform",
        distillation_token=False,
        register_tokens=0,
        position_table=True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if image_size % patch_size:
            raise ValueError(
                f"`image_size`={image_size} must be a multiple of `patch_size`={patch_size}."
            )
        self.hidden_dim = hidden_dim
        self.patch_size = patch_size
        self.image_size = image_size
        self.num_channels = num_channels
        if distillation_token and not class_token:
            raise ValueError("`distillation_token=True` needs `class_token=True`.")
        self.class_token = class_token
        self.distillation_token = distillation_token
        self.register_tokens = int(register_tokens)
        self.position_table = bool(position_table)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

    @property
    def grid(self) -> tuple[int, int]:
        side = self.image_size // self.patch_size
        return side, side

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patches: class, distillation, registers."""
        tokens = int(self.class_token) + int(self.distillation_token)
        return tokens + self.register_tokens

    def build(self, input_shape=None):
        p, c, d = self.patch_size, self.num_channels, self.hidden_dim
        self.kernel = self.add_weight(
            name="kernel", shape=(p, p, c, d), initializer=self.kernel_initializer
        )
        self.bias = self.add_weight(name="bias", shape=(d,), initializer="zeros")
        if self.class_token:
            self.class_embedding = self.add_weight(
                name="class_token", shape=(d,), initializer=self.kernel_initializer
            )
        if self.distillation_token:
            self.distillation_embedding = self.add_weight(
                name="distillation_token",
                shape=(d,),
                initializer=self.kernel_initializer,
            )
        if self.register_tokens:
            self.register_embeddings = self.add_weight(
                name="register_tokens",
                shape=(self.register_tokens, d),
                initializer=self.kernel_initializer,
            )
        self.position_embeddings = None
        if not self.position_table:
            self.built = True
            return
        length = math.prod(self.grid) + self.num_prefix_tokens
        self.position_embeddings = self.add_weight(
            name="position_embeddings",
            shape=(length, d),
            initializer=self.kernel_initializer,
        )
        self.built = True

    def call(self, images):
        p, d = self.patch_size, self.hidden_dim
        _, height, width, channels = images.shape
        h, w = height // p, width // p
        x = ops.reshape(images, (-1, h, p, w, p, channels))
        x = ops.transpose(x, (0, 1, 3, 2, 4, 5))  # [B, h, w, p, p, C]
        x = ops.reshape(x, (-1, h * w, p * p * channels))
        kernel = ops.reshape(backend.value(self.kernel), (p * p * channels, d))
        projected = backend.linear(x, kernel, self.bias, 1)  # [B, h*w, D]
        x = ops.matmul(x, kernel) + self.bias if projected is None else projected
        tokens = [self.class_embedding] if self.class_token else []
        tokens += [self.distillation_embedding] if self.distillation_token else []
        tokens += [self.register_embeddings] if self.register_tokens else []
        if tokens:
            prefix = ops.concatenate([ops.reshape(t, (1, -1, d)) for t in tokens], 1)
            count = self.num_prefix_tokens
            prefix = ops.broadcast_to(prefix, (ops.shape(x)[0], count, d))
            x = ops.concatenate([ops.cast(prefix, x.dtype), x], axis=1)
        if self.position_embeddings is None:
            return x
        positions = resize_grid(
            self.position_embeddings, self.grid, (h, w), self.num_prefix_tokens
        )
        return x + ops.cast(positions, x.dtype)[None]

    def compute_output_shape(self, input_shape):
        b, height, width, _ = input_shape
        p = self.patch_size
        length = None
        if height is not None and width is not None:
            length = (height // p) * (width // p) + self.num_prefix_tokens
        return (b, length, self.hidden_dim)

    def get_config(self):
        config = super().get_config()
        config.update(
            hidden_dim=self.hidden_dim,
            patch_size=self.patch_size,
            image_size=self.image_size,
            num_channels=self.num_channels,
            class_token=self.class_token,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            distillation_token=self.distillation_token,
            register_tokens=self.register_tokens,
            position_table=self.position_table,
        )
        return config
