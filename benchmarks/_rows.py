"""The rows of ``bench.py``: one (family, size) each, with its configuration,
its batch, the inputs every contender trains on, and its FLOP count.

A row's model is ours built from a preset plus overrides (``config()``); the
KerasHub and Hugging Face contenders translate the same resolved config into
their own classes (``_contenders.py``). Sizes: "tiny" (the host-overhead
check: small models whose GPU steps are launch-bound) and "published"
(GPT-2 small, SmolLM2-135M, BERT-base, ViT-B/16, the 2017 base Transformer,
T5-small, a Mixtral-layout MoE with SmolLM2's widths and its dense twin) and
"long" (SmolLM2-135M and Gemma 3 270M at 2,048 and 4,096 tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

FIRST_ID = 3  # random ids avoid 0..2 (pad, start and end in every preset here)


@dataclass(frozen=True)
class Row:
    """One benchmark row.

    `kind`: "causal" (GPT/Llama layouts), "moe" (Mixtral layout), "mlm" (BERT
    masked LM), "classify" (BERT sequence classification), "seq2seq"
    (encoder-decoder) or "vit" (image classification). `preset` +
    `overrides`: our config. `seq`: sequence length (source length for
    seq2seq); `target`: target length (seq2seq). `prompt`/`new_tokens`:
    generation (causal and moe rows only).
    """

    name: str
    kind: str
    size: str
    preset: str
    overrides: dict = field(default_factory=dict)
    batch: int = 8
    seq: int = 256
    target: int = 0
    num_classes: int = 0
    prompt: int = 32
    new_tokens: int = 64
    note: str = ""

    @property
    def generates(self) -> bool:
        """Greedy generation (causal rows) or beam search (seq2seq rows)."""
        return self.kind in ("causal", "moe", "seq2seq")

    def config(self):
        """Our resolved `TransformerConfig` (preset + overrides)."""
        from keras_transformers.config import TransformerConfig
        from keras_transformers.presets import load_config

        base = load_config(self.preset).to_dict()
        merged = {**base, **self.overrides}
        for group in ("moe", "vision"):  # nested groups merge field by field
            if isinstance(self.overrides.get(group), dict) and base.get(group):
                merged[group] = {**base[group], **self.overrides[group]}
        return TransformerConfig.from_dict(merged)

    def tokens_per_step(self) -> int:
        """Tokens (images for vit) a training step consumes, for throughput."""
        if self.kind == "vit":
            return self.batch
        if self.kind == "seq2seq":
            return self.batch * self.target
        return self.batch * self.seq


NO_DROPOUT = {"dropout": 0.0, "attention_dropout": 0.0}
SMOLLM2 = {  # SmolLM2-135M's Llama layout (HuggingFaceTB/SmolLM2-135M config)
    "vocabulary_size": 49152,
    "hidden_dim": 576,
    "num_heads": 9,
    "num_kv_heads": 3,
    "intermediate_dim": 1536,
    "max_sequence_length": 2048,
    "norm_epsilon": 1e-5,
    "rope_max_wavelength": 100000.0,
    **NO_DROPOUT,
}
TINY_TEXT = {  # the former per-family scripts' default sizes
    "vocabulary_size": 8192,
    "num_layers": 4,
    "hidden_dim": 256,
    "num_heads": 4,
    "intermediate_dim": 1024,
    "max_sequence_length": 256,
    **NO_DROPOUT,
}
TINY_MOE = {
    **TINY_TEXT,
    "num_kv_heads": 2,
    "intermediate_dim": 512,
    "norm_epsilon": 1e-6,
    "sliding_window": None,
    "tie_embeddings": False,
    "moe": {"num_experts": 8, "num_experts_per_token": 2},
}
NO_NORMALISATION = {"rescale": 1.0, "mean": None, "std": None}

ROWS = [
    # ---- tiny: host-overhead check
    Row("gpt2_tiny", "causal", "tiny", "gpt2_tiny", TINY_TEXT, 8, 256),
    Row(
        "llama_tiny",
        "causal",
        "tiny",
        "gpt_llama_tiny",
        {**TINY_TEXT, "num_kv_heads": 2},
        8,
        256,
    ),
    Row("bert_tiny", "mlm", "tiny", "bert_base", {**TINY_TEXT}, 8, 256),
    Row(
        "vit_tiny",
        "vit",
        "tiny",
        "vit_cifar_32",
        {"vision": NO_NORMALISATION, **NO_DROPOUT},
        64,
        num_classes=10,
    ),
    Row(
        "transformer_tiny",
        "seq2seq",
        "tiny",
        "transformer_tiny",
        {**TINY_TEXT, "num_layers": 3, "num_decoder_layers": 3},
        8,
        256,
        target=256,
        prompt=64,
    ),
    Row(
        "t5_tiny",
        "seq2seq",
        "tiny",
        "t5_small",
        {**TINY_TEXT, "num_layers": 3, "num_decoder_layers": 3, "head_dim": 64},
        8,
        256,
        target=256,
        prompt=64,
    ),
    Row("moe_tiny", "moe", "tiny", "mixtral_tiny", TINY_MOE, 8, 256),
    Row(
        "moe_tiny_dense",
        "causal",
        "tiny",
        "gpt_llama_tiny",
        {**TINY_MOE, "moe": None, "intermediate_dim": 1024},
        8,
        256,
        note="dense twin of moe_tiny (one SwiGLU of 2 x 512)",
    ),
    # ---- published sizes
    Row("gpt2_small", "causal", "published", "gpt2_small", NO_DROPOUT, 8, 512),
    Row(
        "smollm2_135m",
        "causal",
        "published",
        "gpt_llama_tiny",
        {**SMOLLM2, "num_layers": 30, "tie_embeddings": True},
        8,
        512,
    ),
    Row(
        "bert_base",
        "classify",
        "published",
        "bert_base",
        NO_DROPOUT,
        32,
        128,
        num_classes=2,
        note="fine-tuning step: sequence classification, 2 classes",
    ),
    Row(
        "vit_b16",
        "vit",
        "published",
        "vit_base_16",
        {"vision": NO_NORMALISATION, **NO_DROPOUT},
        8,
        num_classes=1000,
    ),
    Row(
        "transformer_base",
        "seq2seq",
        "published",
        "transformer_base",
        NO_DROPOUT,
        8,
        256,
        target=256,
        prompt=64,
    ),
    Row(
        "t5_small",
        "seq2seq",
        "published",
        "t5_small",
        NO_DROPOUT,
        8,
        512,
        128,
        prompt=64,
    ),
    Row(
        "moe_smollm2",
        "moe",
        "published",
        "mixtral_tiny",
        {
            **SMOLLM2,
            "num_layers": 8,
            "tie_embeddings": False,
            "sliding_window": None,
            "moe": {"num_experts": 8, "num_experts_per_token": 2},
        },
        8,
        512,
        note="Mixtral layout, SmolLM2 widths, 8 layers, 8 experts top-2",
    ),
    Row(
        "moe_smollm2_dense",
        "causal",
        "published",
        "gpt_llama_tiny",
        {
            **SMOLLM2,
            "num_layers": 8,
            "tie_embeddings": False,
            "intermediate_dim": 2 * 1536,
        },
        8,
        512,
        note="dense twin of moe_smollm2: one SwiGLU of 2 x 1536 (same active params)",
    ),
]
# ---- long sequences: one sequence per step; generation: the prompt's prefill
LONG = {  # name -> (preset, overrides)
    "smollm2": (
        "gpt_llama_tiny",
        {**SMOLLM2, "num_layers": 30, "tie_embeddings": True},
    ),
    "gemma3_270m": ("gemma3_270m", NO_DROPOUT),  # 262k vocabulary, window 512
}
for _name, (_preset, _overrides) in LONG.items():
    for _t in (2048, 4096):
        _overrides = {**_overrides, "max_sequence_length": max(_t + 64, 32768)}
        ROWS.append(
            Row(
                f"{_name}_{_t // 1024}k",
                "causal",
                "long",
                _preset,
                _overrides,
                1,
                _t,
                prompt=_t,
                new_tokens=1,
            )  # fmt: skip
        )
BY_NAME = {r.name: r for r in ROWS}


def select(names=None, size=None):
    """Rows by name (a list, or "tiny" / "published" / "long" / "all"; "all"
    leaves the long rows out)."""
    if not names:
        names = [size or "published"]
    out = []
    for name in names:
        if name in ("tiny", "published", "long", "all"):
            out += [
                r
                for r in ROWS
                if name == r.size or (name == "all" and r.size != "long")
            ]
        elif name in BY_NAME:
            out.append(BY_NAME[name])
        else:
            raise SystemExit(f"unknown row {name!r}; rows: {', '.join(BY_NAME)}")
    return out


def quick(row: Row) -> Row:
    """`--quick`: the row shrunk to a smoke-test size (same layout)."""
    o = dict(row.overrides)
    o.update(vocabulary_size=512, num_layers=2, hidden_dim=64, num_heads=4)
    o.update(intermediate_dim=128, max_sequence_length=64, **NO_DROPOUT)
    cfg = row.config()
    for i, key in enumerate(("pad_token_id", "bos_token_id", "eos_token_id")):
        if (getattr(cfg, key) or 0) >= 512:
            o[key] = i
    if cfg.num_kv_heads:
        o["num_kv_heads"] = 2
    if cfg.head_dim:
        o["head_dim"] = 16
    if cfg.num_decoder_layers:
        o["num_decoder_layers"] = 2
    if cfg.moe is not None:
        o["moe"] = {"num_experts": 4, "num_experts_per_token": 2}
    if cfg.vision is not None:
        o["vision"] = {**NO_NORMALISATION, "image_size": 16, "patch_size": 4}
    seq = 0 if row.kind == "vit" else 32
    return replace(
        row,
        overrides=o,
        batch=2,
        seq=seq,
        target=32 if row.target else 0,
        num_classes=min(row.num_classes, 10),
        prompt=8,
        new_tokens=8,
    )


# ------------------------------------------------------------------ inputs
@dataclass
class Batch:
    """One training batch: Keras `x`, `y`, and the Hugging Face keyword
    inputs as numpy arrays (`hf`; the contender moves them to its device)."""

    x: object
    y: np.ndarray
    hf: dict
    prompts: dict = field(default_factory=dict)  # {batch: [B, prompt] ids}


def make_batch(row: Row, cfg, seed=0) -> Batch:
    """The fixed inputs every contender of `row` trains on."""
    rng = np.random.default_rng(seed)
    b, t, v = row.batch, row.seq, max(cfg.vocabulary_size, FIRST_ID + 1)

    def ids(*shape):
        return rng.integers(FIRST_ID, v, shape).astype("int32")

    if row.kind in ("causal", "moe"):
        tokens = ids(b, t + 1)
        x = {"token_ids": tokens[:, :-1], "padding_mask": np.ones((b, t), bool)}
        hf = {"input_ids": tokens[:, :-1], "labels": tokens[:, :-1]}
        prompts = {n: tokens[:n, : row.prompt].copy() for n in sorted({1, b})}
        return Batch(x, tokens[:, 1:], hf, prompts)
    if row.kind in ("mlm", "classify"):
        tokens = ids(b, t)
        segments = np.zeros((b, t), "int32")
        segments[:, t // 2 :] = 1
        x = {
            "token_ids": tokens,
            "segment_ids": segments,
            "padding_mask": np.ones((b, t), "int32"),
        }
        hf = {
            "input_ids": tokens,
            "token_type_ids": segments,
            "attention_mask": x["padding_mask"],
        }
        if row.kind == "classify":
            y = rng.integers(0, row.num_classes, (b,)).astype("int32")
            return Batch(x, y, {**hf, "labels": y})
        # Masked LM: P = ceil(15% of T) positions per sequence, never position 0.
        p = math.ceil(0.15 * t)
        positions = np.stack(
            [np.sort(rng.choice(np.arange(1, t), p, replace=False)) for _ in range(b)]
        ).astype("int32")
        rows = np.arange(b)[:, None]
        y = tokens[rows, positions].copy()
        tokens[rows, positions] = FIRST_ID  # the mask id
        labels = np.full((b, t), -100, "int64")
        labels[rows, positions] = y
        return Batch({**x, "mask_positions": positions}, y, {**hf, "labels": labels})
    if row.kind == "seq2seq":
        source, target = ids(b, t), ids(b, row.target)
        start = np.full((b, 1), cfg.bos_token_id or 0, "int32")
        decoder_in = np.concatenate([start, target[:, :-1]], 1)
        x = {
            "encoder_token_ids": source,
            "encoder_padding_mask": np.ones(source.shape, bool),
            "decoder_token_ids": decoder_in,
            "decoder_padding_mask": np.ones(target.shape, bool),
        }
        hf = {
            "input_ids": source,
            "attention_mask": np.ones(source.shape, "int64"),
            "decoder_input_ids": decoder_in,
            "decoder_attention_mask": np.ones(target.shape, "int64"),
            "labels": target,
        }
        sources = {min(4, b): ids(min(4, b), row.prompt)}  # beam-search inputs
        return Batch(x, target, hf, sources)
    if row.kind == "vit":
        s, c = cfg.vision.image_size, cfg.vision.num_channels
        images = rng.standard_normal((b, s, s, c)).astype("float32")
        labels = rng.integers(0, row.num_classes, (b,)).astype("int32")
        nchw = np.ascontiguousarray(images.transpose(0, 3, 1, 2))
        return Batch(images, labels, {"pixel_values": nchw, "labels": labels})
    raise ValueError(f"unknown row kind {row.kind!r}")


# ------------------------------------------------------------------ FLOPs
def train_flops(params, tokens, layers, attention_width, context):
    """FLOPs of one training step: `6 * params * tokens` (forward 2, backward
    4 per parameter per token) plus attention's score and mix products,
    `12 * layers * attention_width * context` per token (forward 4, x3 with
    backward; no causal discount, as in the PaLM paper's count)."""
    return 6 * params * tokens + 12 * layers * attention_width * context * tokens


def step_flops(row: Row, cfg, params: int) -> float:
    """FLOPs of one training step of `row`, from its config and our model's
    trainable parameter count `params`. Counted as `train_flops` with the
    active parameters (MoE: only the routed top-k experts), leaving out
    lookup-only tables (an untied input embedding, or a tied one in a
    classifier, which computes no vocabulary logits); an encoder-decoder
    counts the encoder's layers on source tokens, the rest on target tokens,
    and cross-attention over the source."""
    d, f = cfg.hidden_dim, cfg.intermediate_dim
    width = cfg.num_heads * (cfg.head_dim or d // cfg.num_heads)
    active = params
    if cfg.vocabulary_size and (not cfg.tie_embeddings or row.kind == "classify"):
        # The input table is a lookup: untied, or tied but never multiplied
        # (a classifier computes no vocabulary logits).
        active -= cfg.vocabulary_size * d
    if cfg.moe is not None:
        ff = cfg.moe.expert_intermediate_dim or f
        unused = cfg.moe.num_experts - cfg.moe.num_experts_per_token
        active -= cfg.num_layers * unused * 3 * d * ff
    if row.kind == "vit":
        v = cfg.vision
        context = (v.image_size // v.patch_size) ** 2 + 1
        return train_flops(active, row.batch * context, cfg.num_layers, width, context)
    if row.kind != "seq2seq":
        return train_flops(active, row.batch * row.seq, cfg.num_layers, width, row.seq)
    kv = (cfg.num_kv_heads or cfg.num_heads) * (cfg.head_dim or d // cfg.num_heads)
    ff = (3 if cfg.gated_feed_forward else 2) * d * f
    encoder = cfg.num_layers * (2 * d * width + 2 * d * kv + ff)
    src, tgt, b = row.seq, row.target, row.batch
    decoder_layers = cfg.num_decoder_layers or cfg.num_layers
    return (
        train_flops(encoder, b * src, cfg.num_layers, width, src)
        + train_flops(active - encoder, b * tgt, decoder_layers, width, tgt)
        + 12 * decoder_layers * width * src * b * tgt  # cross-attention
    )
