"""ViT benchmark: image-classification training step.

Contenders, all at the same configuration, in one process:

* ``ours``: ``keras_transformers.models.ViTClassifier`` built from the
  ``vit_cifar_32`` preset on the current Keras backend (``KERAS_BACKEND``),
  with the preset's input normalisation switched off (``vision.rescale=1.0``,
  ``mean=None``, ``std=None``): every contender takes the same
  already-normalised float images and none does extra work on them.
* ``kerashub``: ``keras_hub.models.ViTImageClassifier(ViTBackbone(...),
  preprocessor=None, activation=None)`` on the same Keras backend.
* ``hf``: Hugging Face ``ViTForImageClassification`` in eager PyTorch (always
  torch, whatever the Keras backend).

Configuration: 32x32x3 images, 4x4 patches (64 patches + a class token), 6
pre-LayerNorm encoder layers (epsilon 1e-12), hidden 192, 3 heads, MLP 768
with exact (erf) GELU, a final LayerNorm, a linear classifier on the class
token's state over 10 classes, batch 64, dropout 0, float32. All three have
the same parameter count (2,693,578), printed and checked at start-up.
Differences that do not change the work per step: the patch projection is a
reshape + matmul in ours and a strided convolution in the others; our
classifier is zero-initialised (ViT's recipe; first loss exactly ln 10), the
others' randomly, so the reported losses differ.

Measured: steady-state seconds per training step on one fixed batch (the
same images and labels for every contender). Keras: ``train_on_batch(images,
labels)`` with ``images`` ``[B, 32, 32, 3]`` (channels last), AdamW(lr=1e-4,
weight_decay=0.01), SparseCategoricalCrossentropy(from_logits=True), no
metrics, ``jit_compile`` left at the backend default. HF: its standard API,
``model(pixel_values, labels).loss`` with the same images as ``[B, 3, 32,
32]`` (channels first, as HF takes them), backward, ``torch.optim.AdamW``
step.

The first step of each contender (tracing/compilation included) is timed and
reported separately; then one more warm-up step is made, and the contenders
are timed in alternating rounds (A, B, C, A, B, C, ...). Each figure is the
median over rounds.

Usage::

    KERAS_BACKEND=jax python benchmarks/bench_vit.py
    KERAS_BACKEND=torch python benchmarks/bench_vit.py --repeats 3 --json out.json
    python benchmarks/bench_vit.py --quick          # tiny smoke test
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np
from _common import (
    HFContender,
    KerasContender,
    build_contenders,
    finish,
    keras_loss,
    keras_optimizer,
    loss_row,
    parse_common_args,
    print_meta,
    ratio_table,
    record_train,
    run_meta,
    start,
)

PRESET = "vit_cifar_32"


@dataclass(frozen=True)
class Sizes:
    """The `vit_cifar_32` preset's architecture and the batch."""

    image_size: int = 32
    patch_size: int = 4
    num_channels: int = 3
    num_layers: int = 6
    hidden_dim: int = 192
    num_heads: int = 3
    intermediate_dim: int = 768
    num_classes: int = 10
    batch: int = 64
    norm_epsilon: float = 1e-12


QUICK = Sizes(
    image_size=16,
    num_layers=2,
    hidden_dim=64,
    num_heads=2,
    intermediate_dim=256,
    batch=8,
)


def parse_args(argv=None):
    return parse_common_args(__doc__, argv)


def make_batch(sizes: Sizes, seed=0):
    """`(images [B, H, W, C] float32, labels [B] int32)`: standard-normal
    pixels (as after a per-channel mean/std normalisation) and random
    classes."""
    rng = np.random.default_rng(seed)
    s, c = sizes.image_size, sizes.num_channels
    images = rng.standard_normal((sizes.batch, s, s, c)).astype("float32")
    labels = rng.integers(0, sizes.num_classes, (sizes.batch,)).astype("int32")
    return images, labels


# --------------------------------------------------------------- contenders
class Ours(KerasContender):
    name = "ours"

    def __init__(self, sizes: Sizes, x, y):
        from keras_transformers.models import ViTClassifier

        super().__init__(x, y)
        self.model = ViTClassifier.from_preset(
            PRESET,
            num_classes=sizes.num_classes,
            num_layers=sizes.num_layers,
            hidden_dim=sizes.hidden_dim,
            num_heads=sizes.num_heads,
            intermediate_dim=sizes.intermediate_dim,
            norm_epsilon=sizes.norm_epsilon,
            dropout=0.0,
            attention_dropout=0.0,
            # The inputs are already normalised: no rescale / mean / std work.
            vision={
                "image_size": sizes.image_size,
                "patch_size": sizes.patch_size,
                "num_channels": sizes.num_channels,
                "rescale": 1.0,
                "mean": None,
                "std": None,
            },
        )
        self.model.compile(optimizer=keras_optimizer(), loss=keras_loss())


class KerasHub(KerasContender):
    name = "kerashub"

    def __init__(self, sizes: Sizes, x, y):
        import keras_hub

        super().__init__(x, y)
        s = sizes.image_size
        backbone = keras_hub.models.ViTBackbone(
            image_shape=(s, s, sizes.num_channels),
            patch_size=sizes.patch_size,
            num_layers=sizes.num_layers,
            num_heads=sizes.num_heads,
            hidden_dim=sizes.hidden_dim,
            mlp_dim=sizes.intermediate_dim,
            dropout_rate=0.0,
            attention_dropout=0.0,
            layer_norm_epsilon=sizes.norm_epsilon,
        )
        self.model = keras_hub.models.ViTImageClassifier(
            backbone,
            num_classes=sizes.num_classes,
            preprocessor=None,
            activation=None,  # logits
        )
        # No metrics on either side (KerasHub's default adds an accuracy metric).
        self.model.compile(optimizer=keras_optimizer(), loss=keras_loss(), metrics=None)


class HuggingFace(HFContender):
    def __init__(self, sizes: Sizes, x, y, torch):
        from transformers import ViTConfig, ViTForImageClassification

        config = ViTConfig(
            hidden_size=sizes.hidden_dim,
            num_hidden_layers=sizes.num_layers,
            num_attention_heads=sizes.num_heads,
            intermediate_size=sizes.intermediate_dim,
            hidden_act="gelu",
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            layer_norm_eps=sizes.norm_epsilon,
            image_size=sizes.image_size,
            patch_size=sizes.patch_size,
            num_channels=sizes.num_channels,
            qkv_bias=True,
            num_labels=sizes.num_classes,
        )
        # No pooler (ViTForImageClassification builds ViTModel without one).
        super().__init__(ViTForImageClassification(config), torch)
        self.inputs = {
            "pixel_values": self.float32(np.ascontiguousarray(x.transpose(0, 3, 1, 2))),
            "labels": self.long(y),
        }


def check_params(results):
    """Prints whether every contender has the same parameter count."""
    counts = {name: r["params"] for name, r in results.items()}
    if len(set(counts.values())) == 1:
        print(f"parameter counts match: {next(iter(counts.values())):,}")
    else:
        print(f"WARNING: parameter counts differ: {counts}")


# --------------------------------------------------------------- main
def main(argv=None):
    args = parse_args(argv)
    sizes = QUICK if args.quick else Sizes()
    backend, torch = start(args)
    x, y = make_batch(sizes)

    meta = run_meta(backend, torch, {"preset": PRESET, **asdict(sizes)}, args, argv)
    print_meta(meta)

    t0 = time.perf_counter()
    contenders, results = build_contenders(
        args,
        lambda: Ours(sizes, x, y),
        lambda: KerasHub(sizes, x, y),
        lambda: HuggingFace(sizes, x, y, torch),
    )
    check_params(results)
    record_train(contenders, results, args, final_loss=True, first_loss=True)
    return finish(args, meta, t0, results, report)


def report(results):
    return ratio_table(
        results,
        [("train s/step", "train_s_per_step", False, ".3f")],
        [("train 1st step s", "train_first_step_s")],
        [
            loss_row(results, "first_loss", "loss of 1st step"),
            loss_row(results),
        ],
    )


if __name__ == "__main__":
    main()
