"""Encoder-decoder benchmark: training step and beam-search decoding.

Contenders, all at the same sizes, in one process:

* ``ours``: ``keras_transformers.models.Seq2SeqLM`` (the 2017 Transformer
  layout of the ``transformer_*`` presets) on the current Keras backend.
* ``kerashub``: ``keras_hub.models.BartSeq2SeqLM`` (``preprocessor=None``)
  over a ``BartBackbone`` of the same sizes, on the same Keras backend.
* ``hf``: Hugging Face ``MarianMTModel`` (the 2017 layout, as ours) in
  eager PyTorch, whatever the Keras backend.

Measured:

* training: steady-state seconds per step (Keras: ``train_on_batch`` with
  AdamW(lr=1e-4, weight_decay=0.01) and SparseCategoricalCrossentropy
  (from_logits=True), ``jit_compile`` left at the backend default; HF:
  forward with labels, backward, ``torch.optim.AdamW`` step);
* decoding: beam search (``num_beams`` beams, length penalty 0.6) of exactly
  ``new_tokens`` tokens after the start token for ``decode_batch`` sources of
  ``decode_source`` tokens, no early stop; tokens/s counts the new tokens of
  the returned (best) sequences, ``decode_batch * new_tokens / seconds``.

First calls (tracing/compilation included) are reported apart; then the
contenders run in alternating rounds and each figure is the median.

Usage::

    KERAS_BACKEND=jax python benchmarks/bench_seq2seq.py
    KERAS_BACKEND=torch python benchmarks/bench_seq2seq.py --json out.json
    python benchmarks/bench_seq2seq.py --quick       # tiny smoke test
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np
from _common import (
    HFContender,
    KerasContender,
    bench_calls,
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

PAD, BOS, EOS = 0, 1, 2  # the transformer presets' ids; HF and KerasHub use the same


@dataclass(frozen=True)
class Sizes:
    vocabulary_size: int = 8192
    num_layers: int = 3  # encoder layers; as many decoder layers
    hidden_dim: int = 256
    num_heads: int = 4
    intermediate_dim: int = 1024
    source_length: int = 256
    target_length: int = 256
    batch: int = 8
    decode_batch: int = 4
    decode_source: int = 64
    new_tokens: int = 64
    num_beams: int = 4
    length_penalty: float = 0.6

    @property
    def max_sequence_length(self) -> int:
        """Position table size (learned on KerasHub, sinusoidal elsewhere)."""
        return max(self.source_length, self.target_length, 1 + self.new_tokens)


QUICK = Sizes(
    vocabulary_size=512,
    num_layers=2,
    hidden_dim=64,
    num_heads=2,
    intermediate_dim=256,
    source_length=32,
    target_length=32,
    batch=2,
    decode_batch=2,
    decode_source=16,
    new_tokens=8,
)


def parse_args(argv=None):
    skips = [("train", "decoding only"), ("decode", "training only")]
    return parse_common_args(__doc__, argv, skips, ("--quick", "--tiny"))


def make_data(sizes: Sizes, seed=0):
    """Training batch `(x, y)` (all positions real: `y` is the target,
    `decoder_token_ids` the target shifted right after BOS) and the decoding
    sources `[decode_batch, decode_source]`. Ids avoid PAD, BOS and EOS."""
    rng = np.random.default_rng(seed)
    b, s, t, v = (
        sizes.batch,
        sizes.source_length,
        sizes.target_length,
        sizes.vocabulary_size,
    )
    source = rng.integers(3, v, (b, s)).astype("int32")
    target = rng.integers(3, v, (b, t)).astype("int32")
    decoder_in = np.concatenate([np.full((b, 1), BOS, "int32"), target[:, :-1]], 1)
    x = {
        "encoder_token_ids": source,
        "encoder_padding_mask": np.ones((b, s), bool),
        "decoder_token_ids": decoder_in,
        "decoder_padding_mask": np.ones((b, t), bool),
    }
    sources = rng.integers(3, v, (sizes.decode_batch, sizes.decode_source))
    return x, target, sources.astype("int32")


# --------------------------------------------------------------- contenders
class Ours(KerasContender):
    name = "ours"

    def __init__(self, sizes: Sizes, x, y):
        from keras_transformers.models import Seq2SeqLM

        super().__init__(x, y)
        self.sizes = sizes
        # The 2017 layout (post-norm, sinusoidal positions, embeddings scaled by
        # sqrt(D) and tied three ways, ReLU) at the benchmark's sizes.
        self.model = Seq2SeqLM.from_preset(
            "transformer_tiny",
            vocabulary_size=sizes.vocabulary_size,
            num_layers=sizes.num_layers,
            num_decoder_layers=sizes.num_layers,
            hidden_dim=sizes.hidden_dim,
            num_heads=sizes.num_heads,
            intermediate_dim=sizes.intermediate_dim,
            max_sequence_length=sizes.max_sequence_length,
            dropout=0.0,
            attention_dropout=0.0,
        )
        self.model.compile(optimizer=keras_optimizer(), loss=keras_loss())

    def decode(self, sources):
        s = self.sizes
        out = self.model.generate(
            sources,
            max_new_tokens=s.new_tokens,
            num_beams=s.num_beams,
            length_penalty=s.length_penalty,
            length_penalty_style="power",  # HF's score / length**alpha
            stop_token_ids=None,
        )
        # `generate` returns the new tokens only, `[B, new_tokens]`; put the
        # start token back so that every contender returns `[B, 1 + new]`.
        out = np.asarray(out)
        start = np.full((out.shape[0], 1), BOS, out.dtype)
        return np.concatenate([start, out], axis=1)


class KerasHub(KerasContender):
    name = "kerashub"

    def __init__(self, sizes: Sizes, x, y):
        import keras_hub

        super().__init__(x, y)
        self.sizes = sizes
        backbone = keras_hub.models.BartBackbone(
            vocabulary_size=sizes.vocabulary_size,
            num_layers=sizes.num_layers,
            num_heads=sizes.num_heads,
            hidden_dim=sizes.hidden_dim,
            intermediate_dim=sizes.intermediate_dim,
            dropout=0.0,
            max_sequence_length=sizes.max_sequence_length,
        )
        self.model = keras_hub.models.BartSeq2SeqLM(backbone, preprocessor=None)
        # No metrics on either side (KerasHub's default adds an accuracy metric).
        # KerasHub's BeamSampler has no length penalty; with every beam the same
        # length it would not change the work.
        self.model.compile(
            optimizer=keras_optimizer(),
            loss=keras_loss(),
            weighted_metrics=None,
            sampler=keras_hub.samplers.BeamSampler(num_beams=sizes.num_beams),
        )

    def decode(self, sources):
        # Without a preprocessor, KerasHub generates into the padded decoder
        # buffer: BOS then `new_tokens` slots whose mask is False.
        b, n = sources.shape[0], self.sizes.new_tokens
        decoder_ids = np.zeros((b, 1 + n), "int32")
        decoder_ids[:, 0] = BOS
        decoder_mask = np.zeros((b, 1 + n), bool)
        decoder_mask[:, 0] = True
        out = self.model.generate(
            {
                "encoder_token_ids": sources,
                "encoder_padding_mask": np.ones(sources.shape, bool),
                "decoder_token_ids": decoder_ids,
                "decoder_padding_mask": decoder_mask,
            },
            stop_token_ids=None,
        )
        return np.asarray(out["decoder_token_ids"])


class HuggingFace(HFContender):
    def __init__(self, sizes: Sizes, x, y, torch):
        from transformers import MarianConfig, MarianMTModel

        config = MarianConfig(
            vocab_size=sizes.vocabulary_size,
            d_model=sizes.hidden_dim,
            encoder_layers=sizes.num_layers,
            decoder_layers=sizes.num_layers,
            encoder_attention_heads=sizes.num_heads,
            decoder_attention_heads=sizes.num_heads,
            encoder_ffn_dim=sizes.intermediate_dim,
            decoder_ffn_dim=sizes.intermediate_dim,
            max_position_embeddings=sizes.max_sequence_length,
            activation_function="relu",
            dropout=0.0,
            attention_dropout=0.0,
            activation_dropout=0.0,
            scale_embedding=True,
            share_encoder_decoder_embeddings=True,
            tie_word_embeddings=True,
            pad_token_id=PAD,
            bos_token_id=BOS,
            eos_token_id=EOS,
            decoder_start_token_id=BOS,
            forced_eos_token_id=None,
        )
        super().__init__(MarianMTModel(config), torch)
        self.sizes = sizes
        self.inputs = {
            "input_ids": self.long(x["encoder_token_ids"]),
            "attention_mask": self.long(x["encoder_padding_mask"]),
            "decoder_input_ids": self.long(x["decoder_token_ids"]),
            "decoder_attention_mask": self.long(x["decoder_padding_mask"]),
            "labels": self.long(y),
        }

    def params(self):
        # Tied embeddings counted once; the frozen sinusoid tables are left out.
        return sum(p.numel() for p in self.model.parameters() if p.requires_grad)

    def decode(self, sources):
        torch, s = self.torch, self.sizes
        self.model.eval()
        ids = self.long(sources)
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                num_beams=s.num_beams,
                length_penalty=s.length_penalty,
                max_new_tokens=s.new_tokens,
                min_new_tokens=s.new_tokens,  # EOS masked out: no early stop
                do_sample=False,
                use_cache=True,
            )
        return out.cpu().numpy()


# --------------------------------------------------------------- harness
def check_decoded(name, out, sources, new_tokens):
    expected = (sources.shape[0], 1 + new_tokens)
    if tuple(out.shape) != expected:
        raise RuntimeError(
            f"{name}: decoding returned shape {tuple(out.shape)}, expected "
            f"{expected} (start token + {new_tokens} new tokens)"
        )
    if not np.all(out[:, 0] == BOS):
        raise RuntimeError(f"{name}: decoded sequences do not start with BOS={BOS}")


def bench_decode(contenders, sources, new_tokens, repeats):
    """Seconds per beam-search call on `sources`."""
    return bench_calls(
        contenders,
        lambda c: c.decode(sources),
        lambda name, out: check_decoded(name, out, sources, new_tokens),
        repeats,
        "beam decode",
    )


def print_config(sizes: Sizes):
    s = sizes
    print(
        "config (all contenders): "
        f"vocabulary {s.vocabulary_size}, {s.num_layers} encoder + {s.num_layers} "
        f"decoder layers, hidden {s.hidden_dim}, {s.num_heads} heads, "
        f"intermediate {s.intermediate_dim}, positions {s.max_sequence_length}, "
        "dropout 0, float32, tied embeddings (encoder, decoder, output)\n"
        f"  train: batch {s.batch}, source {s.source_length}, target "
        f"{s.target_length}, all positions real\n"
        f"  decode: batch {s.decode_batch}, source {s.decode_source}, beams "
        f"{s.num_beams}, length penalty {s.length_penalty}, exactly "
        f"{s.new_tokens} new tokens after BOS (no early stop)\n"
        "  layout: ours and hf = post-norm, sinusoidal positions, embeddings x "
        "sqrt(D), ReLU; kerashub (BART, fixed by KerasHub) = post-norm, learned "
        "positions, embedding LayerNorm, unscaled embeddings, GELU"
    )


def main(argv=None):
    args = parse_args(argv)
    sizes = QUICK if args.quick else Sizes()
    backend, torch = start(args)
    x, y, sources = make_data(sizes)
    meta = run_meta(
        backend,
        torch,
        {**asdict(sizes), "max_sequence_length": sizes.max_sequence_length},
        args,
        argv,
    )
    print_meta(meta)
    print_config(sizes)

    t0 = time.perf_counter()
    contenders, results = build_contenders(
        args,
        lambda: Ours(sizes, x, y),
        lambda: KerasHub(sizes, x, y),
        lambda: HuggingFace(sizes, x, y, torch),
    )
    if not args.skip_train:
        record_train(contenders, results, args, final_loss=True)
    if not args.skip_decode:
        first, samples = bench_decode(
            contenders, sources, sizes.new_tokens, args.repeats
        )
        for c in contenders:
            r = results[c.name]
            med = statistics.median(samples[c.name])
            r["decode_first_call_s"] = first[c.name]
            r["decode_samples_s"] = samples[c.name]
            r["decode_s"] = med
            r["decode_tokens_per_s"] = sizes.decode_batch * sizes.new_tokens / med
    return finish(args, meta, t0, results, lambda r: report(r, sizes, args))


def report(results, sizes, args):
    rows, firsts, extra = [], [], []
    if not args.skip_train:
        rows.append(("train s/step", "train_s_per_step", False, ".3f"))
        firsts.append(("train 1st step s", "train_first_step_s"))
        extra.append(loss_row(results))
    if not args.skip_decode:
        label = f"beam{sizes.num_beams} b={sizes.decode_batch} tok/s"
        rows.append((label, "decode_tokens_per_s", True, ".1f"))
        firsts.append(("decode 1st call s", "decode_first_call_s"))
    return ratio_table(results, rows, firsts, extra)


if __name__ == "__main__":
    main()
