"""BERT-layout benchmark: masked-LM training step.

Contenders, all at the same configuration, in one process:

* ``ours``: ``keras_transformers.models.bert.BertMaskedLM`` on the current
  Keras backend (``KERAS_BACKEND``).
* ``kerashub``: ``keras_hub.models.BertMaskedLM(BertBackbone(...),
  preprocessor=None)`` on the same Keras backend.
* ``hf``: Hugging Face ``BertForMaskedLM`` in eager PyTorch (always torch,
  whatever the Keras backend).

Measured: steady-state seconds per masked-LM training step on a batch of
``batch`` sequences of ``sequence_length`` tokens, 15% of the positions masked
(the same positions, the same inputs and labels for every contender). Keras:
``train_on_batch(x, y)`` with ``x = {token_ids, segment_ids, padding_mask,
mask_positions [B, P]}``, ``y = [B, P]`` original ids, AdamW(lr=1e-4,
weight_decay=0.01), SparseCategoricalCrossentropy(from_logits=True), no
metrics, ``jit_compile`` left at the backend default; both Keras models
compute logits at the ``P`` masked positions only. HF: its standard API,
``model(input_ids, token_type_ids, attention_mask, labels).loss`` with labels
-100 except at the masked positions (logits at all ``T`` positions, loss over
the masked ones), backward, ``torch.optim.AdamW`` step. Dropout is 0 for all.

The first step of each contender (tracing/compilation included) is timed and
reported separately; then one more warm-up step is made, and the contenders
are timed in alternating rounds, the order rotated every round (A B C, B C A,
...). Each figure is the median over rounds.

Usage::

    KERAS_BACKEND=jax python benchmarks/bench_bert.py
    KERAS_BACKEND=torch python benchmarks/bench_bert.py --repeats 3 --json out.json
    python benchmarks/bench_bert.py --quick          # tiny smoke test
"""

from __future__ import annotations

import math
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


@dataclass(frozen=True)
class Sizes:
    vocabulary_size: int = 8192
    num_layers: int = 4
    hidden_dim: int = 256
    num_heads: int = 4
    intermediate_dim: int = 1024
    sequence_length: int = 256
    batch: int = 8
    mask_rate: float = 0.15

    @property
    def num_masked(self) -> int:
        """P: masked positions per sequence (ceil(15% of T); 39 at T=256)."""
        return math.ceil(self.mask_rate * self.sequence_length)


QUICK = Sizes(
    vocabulary_size=512,
    num_layers=2,
    hidden_dim=64,
    num_heads=2,
    intermediate_dim=256,
    sequence_length=64,
    batch=2,
)

MASK_TOKEN_ID = 3  # any id > 0; the same for every contender
PAD_TOKEN_ID = 0


def parse_args(argv=None):
    return parse_common_args(__doc__, argv)


def make_batch(sizes: Sizes, seed=0):
    """Masked-LM inputs shared by all contenders.

    Returns `(x, y, labels_full)`: `x` the Keras inputs (`token_ids` with the
    masked positions replaced by `MASK_TOKEN_ID`, `segment_ids` 0 for the first
    half and 1 for the second, `padding_mask` all ones, `mask_positions`
    `[B, P]` sorted, never position 0), `y` `[B, P]` the original ids there,
    and `labels_full` `[B, T]` the same labels in HF's layout (-100 elsewhere).
    """
    rng = np.random.default_rng(seed)
    b, t, p = sizes.batch, sizes.sequence_length, sizes.num_masked
    tokens = rng.integers(4, sizes.vocabulary_size, (b, t)).astype("int32")
    tokens[:, 0] = 2  # a [CLS]-like first token
    positions = np.stack(
        [np.sort(rng.choice(np.arange(1, t), p, replace=False)) for _ in range(b)]
    ).astype("int32")
    rows = np.arange(b)[:, None]
    y = tokens[rows, positions]
    token_ids = tokens.copy()
    token_ids[rows, positions] = MASK_TOKEN_ID
    segment_ids = np.zeros((b, t), "int32")
    segment_ids[:, t // 2 :] = 1
    x = {
        "token_ids": token_ids,
        "segment_ids": segment_ids,
        "padding_mask": np.ones((b, t), "int32"),
        "mask_positions": positions,
    }
    labels_full = np.full((b, t), -100, "int64")
    labels_full[rows, positions] = y
    return x, y, labels_full


# --------------------------------------------------------------- contenders
class Ours(KerasContender):
    name = "ours"

    def __init__(self, sizes: Sizes, x, y):
        from keras_transformers.models.bert import BertMaskedLM

        super().__init__(x, y)
        self.model = BertMaskedLM(
            vocabulary_size=sizes.vocabulary_size,
            num_layers=sizes.num_layers,
            hidden_dim=sizes.hidden_dim,
            num_heads=sizes.num_heads,
            intermediate_dim=sizes.intermediate_dim,
            max_sequence_length=sizes.sequence_length,
            stacks="encoder",
            norm_position="post",
            norm_epsilon=1e-12,
            final_norm=False,
            embedding_norm=True,
            pooler=True,
            num_segments=2,
            activation="gelu",
            dropout=0.0,
            attention_dropout=0.0,
            pad_token_id=PAD_TOKEN_ID,
        )
        self.model.compile(optimizer=keras_optimizer(), loss=keras_loss())


class KerasHub(KerasContender):
    name = "kerashub"

    def __init__(self, sizes: Sizes, x, y):
        import keras_hub

        super().__init__(x, y)
        backbone = keras_hub.models.BertBackbone(
            vocabulary_size=sizes.vocabulary_size,
            num_layers=sizes.num_layers,
            num_heads=sizes.num_heads,
            hidden_dim=sizes.hidden_dim,
            intermediate_dim=sizes.intermediate_dim,
            dropout=0.0,
            max_sequence_length=sizes.sequence_length,
            num_segments=2,
        )
        self.model = keras_hub.models.BertMaskedLM(backbone, preprocessor=None)
        # No metrics on either side (KerasHub's default adds an accuracy metric).
        self.model.compile(
            optimizer=keras_optimizer(), loss=keras_loss(), weighted_metrics=None
        )


class HuggingFace(HFContender):
    def __init__(self, sizes: Sizes, x, labels_full, torch):
        from transformers import BertConfig, BertForMaskedLM

        config = BertConfig(
            vocab_size=sizes.vocabulary_size,
            hidden_size=sizes.hidden_dim,
            num_hidden_layers=sizes.num_layers,
            num_attention_heads=sizes.num_heads,
            intermediate_size=sizes.intermediate_dim,
            hidden_act="gelu",
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            max_position_embeddings=sizes.sequence_length,
            type_vocab_size=2,
            layer_norm_eps=1e-12,
            pad_token_id=PAD_TOKEN_ID,
            tie_word_embeddings=True,
        )
        # No pooler (add_pooling_layer=False).
        super().__init__(BertForMaskedLM(config), torch)
        self.inputs = {
            "input_ids": self.long(x["token_ids"]),
            "token_type_ids": self.long(x["segment_ids"]),
            "attention_mask": self.long(x["padding_mask"]),
            "labels": self.long(labels_full),
        }


# --------------------------------------------------------------- main
def main(argv=None):
    args = parse_args(argv)
    sizes = QUICK if args.quick else Sizes()
    backend, torch = start(args)
    x, y, labels_full = make_batch(sizes)

    sizes_meta = {**asdict(sizes), "num_masked": sizes.num_masked}
    meta = run_meta(backend, torch, sizes_meta, args, argv)
    print_meta(meta)

    t0 = time.perf_counter()
    contenders, results = build_contenders(
        args,
        lambda: Ours(sizes, x, y),
        lambda: KerasHub(sizes, x, y),
        lambda: HuggingFace(sizes, x, labels_full, torch),
    )
    record_train(contenders, results, args, final_loss=True)
    return finish(args, meta, t0, results, report)


def report(results):
    return ratio_table(
        results,
        [("train s/step", "train_s_per_step", False, ".3f")],
        [("train 1st step s", "train_first_step_s")],
        [loss_row(results)],
    )


if __name__ == "__main__":
    main()
