"""GPT-2-layout benchmark: training step and greedy generation.

Contenders, all at the same configuration, in one process:

* ``ours``: ``keras_transformers.models.gpt.GPTCausalLM`` on the current
  Keras backend (``KERAS_BACKEND``).
* ``kerashub``: ``keras_hub.models.GPT2CausalLM`` (``preprocessor=None``) on
  the same Keras backend.
* ``hf``: Hugging Face ``GPT2LMHeadModel`` in eager PyTorch (always torch,
  whatever the Keras backend).

Measured:

* training: steady-state seconds per step (Keras: ``train_on_batch`` with
  AdamW(lr=1e-4, weight_decay=0.01) and SparseCategoricalCrossentropy
  (from_logits=True), ``jit_compile`` left at the backend default; HF: forward
  with labels, backward, ``torch.optim.AdamW`` step);
* generation: greedy decoding of ``new_tokens`` tokens after a
  ``prompt``-token prompt, no early stop, at batch 1 and ``batch``; tokens/s
  counts new tokens only (``batch * new_tokens / seconds``).

The first call of each contender (tracing/compilation included) is timed and
reported separately; then one more warm-up call is made, and the contenders
are timed in alternating rounds, the order rotated every round (A B C, B C A,
...). Each figure is the median over rounds.

Usage::

    KERAS_BACKEND=jax python benchmarks/bench_gpt.py
    KERAS_BACKEND=torch python benchmarks/bench_gpt.py --repeats 3 --json out.json
    python benchmarks/bench_gpt.py --quick          # tiny smoke test
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
    kerashub_generate,
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
    prompt: int = 32
    new_tokens: int = 64


QUICK = Sizes(
    vocabulary_size=512,
    num_layers=2,
    hidden_dim=64,
    num_heads=2,
    intermediate_dim=256,
    sequence_length=64,
    batch=2,
    prompt=8,
    new_tokens=8,
)


def parse_args(argv=None):
    skips = [("train", "generation only"), ("generate", "training only")]
    return parse_common_args(__doc__, argv, skips)


# --------------------------------------------------------------- contenders
class Ours(KerasContender):
    name = "ours"

    def __init__(self, sizes: Sizes, x, y):
        from keras_transformers.models.gpt import GPTCausalLM

        super().__init__(x, y)
        self.sizes = sizes
        self.model = GPTCausalLM(
            vocabulary_size=sizes.vocabulary_size,
            num_layers=sizes.num_layers,
            hidden_dim=sizes.hidden_dim,
            num_heads=sizes.num_heads,
            intermediate_dim=sizes.intermediate_dim,
            max_sequence_length=sizes.sequence_length,
            activation="gelu_approximate",
            position_embedding="learned",
            norm_type="layer",
            norm_position="pre",
            tie_embeddings=True,
            dropout=0.0,
            attention_dropout=0.0,
        )
        self.model.compile(optimizer=keras_optimizer(), loss=keras_loss())

    def generate(self, prompts):
        return self.model.generate(
            prompts, max_new_tokens=self.sizes.new_tokens, stop_token_ids=None
        )


class KerasHub(KerasContender):
    name = "kerashub"

    def __init__(self, sizes: Sizes, x, y):
        import keras_hub

        super().__init__(x, y)
        self.sizes = sizes
        backbone = keras_hub.models.GPT2Backbone(
            vocabulary_size=sizes.vocabulary_size,
            num_layers=sizes.num_layers,
            num_heads=sizes.num_heads,
            hidden_dim=sizes.hidden_dim,
            intermediate_dim=sizes.intermediate_dim,
            dropout=0.0,
            max_sequence_length=sizes.sequence_length,
        )
        self.model = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
        # No metrics on either side (KerasHub's default adds an accuracy metric).
        self.model.compile(
            optimizer=keras_optimizer(),
            loss=keras_loss(),
            weighted_metrics=None,
            sampler="greedy",
        )

    def generate(self, prompts):
        return kerashub_generate(self.model, prompts, self.sizes.new_tokens)


class HuggingFace(HFContender):
    def __init__(self, sizes: Sizes, x, torch):
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(
            vocab_size=sizes.vocabulary_size,
            n_positions=sizes.sequence_length,
            n_embd=sizes.hidden_dim,
            n_layer=sizes.num_layers,
            n_head=sizes.num_heads,
            n_inner=sizes.intermediate_dim,
            activation_function="gelu_new",
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            layer_norm_epsilon=1e-5,
            tie_word_embeddings=True,
            bos_token_id=0,
            eos_token_id=sizes.vocabulary_size - 1,
            pad_token_id=0,
        )
        super().__init__(GPT2LMHeadModel(config), torch)
        self.sizes = sizes
        ids = self.long(x["token_ids"])
        self.inputs = {"input_ids": ids, "labels": ids}

    def generate(self, prompts):
        torch = self.torch
        self.model.eval()
        ids = self.long(prompts)
        out = self.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=self.sizes.new_tokens,
            min_new_tokens=self.sizes.new_tokens,
            do_sample=False,
            use_cache=True,
            pad_token_id=0,
        )
        return out.cpu().numpy()


# --------------------------------------------------------------- harness
def check_generated(name, out, prompts, new_tokens):
    expected = (prompts.shape[0], prompts.shape[1] + new_tokens)
    if tuple(out.shape) != expected:
        raise RuntimeError(
            f"{name}: generate returned shape {tuple(out.shape)}, expected {expected}"
        )
    if not np.array_equal(out[:, : prompts.shape[1]], prompts):
        raise RuntimeError(f"{name}: generate did not keep the prompt")


def bench_generate(contenders, prompts, new_tokens, repeats, label):
    """Seconds per `generate` call on `prompts`."""
    return bench_calls(
        contenders,
        lambda c: c.generate(prompts),
        lambda name, out: check_generated(name, out, prompts, new_tokens),
        repeats,
        label,
    )


def main(argv=None):
    args = parse_args(argv)
    sizes = QUICK if args.quick else Sizes()
    backend, torch = start(args)
    rng = np.random.default_rng(0)
    tokens = rng.integers(
        1, sizes.vocabulary_size, (sizes.batch, sizes.sequence_length + 1)
    ).astype("int32")
    x = {
        "token_ids": tokens[:, :-1],
        "padding_mask": np.ones((sizes.batch, sizes.sequence_length), bool),
    }
    y = tokens[:, 1:]
    prompts = {
        1: tokens[:1, : sizes.prompt].copy(),
        sizes.batch: tokens[:, : sizes.prompt].copy(),
    }

    meta = run_meta(backend, torch, asdict(sizes), args, argv)
    print_meta(meta)

    t0 = time.perf_counter()
    contenders, results = build_contenders(
        args,
        lambda: Ours(sizes, x, y),
        lambda: KerasHub(sizes, x, y),
        lambda: HuggingFace(sizes, x, torch),
    )
    if not args.skip_train:
        record_train(contenders, results, args)
    if not args.skip_generate:
        for batch, p in prompts.items():
            label = f"gen b={batch}"
            first, samples = bench_generate(
                contenders, p, sizes.new_tokens, args.repeats, label
            )
            for c in contenders:
                med = statistics.median(samples[c.name])
                results[c.name][f"gen_b{batch}_first_call_s"] = first[c.name]
                results[c.name][f"gen_b{batch}_samples_s"] = samples[c.name]
                results[c.name][f"gen_b{batch}_s"] = med
                results[c.name][f"gen_b{batch}_tokens_per_s"] = (
                    batch * sizes.new_tokens / med
                )
    return finish(args, meta, t0, results, lambda r: report(r, sizes, args))


def report(results, sizes, args):
    rows = []  # (label, key, higher_is_better, format)
    if not args.skip_train:
        rows.append(("train s/step", "train_s_per_step", False, ".3f"))
    if not args.skip_generate:
        for batch in (1, sizes.batch):
            rows.append(
                (f"gen b={batch} tok/s", f"gen_b{batch}_tokens_per_s", True, ".1f")
            )
    firsts = []
    if not args.skip_train:
        firsts.append(("train 1st step s", "train_first_step_s"))
    if not args.skip_generate:
        for batch in (1, sizes.batch):
            firsts.append((f"gen b={batch} 1st call s", f"gen_b{batch}_first_call_s"))
    return ratio_table(results, rows, firsts)


if __name__ == "__main__":
    main()
