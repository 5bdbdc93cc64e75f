"""Train a small Mixtral-style mixture of experts beside a dense GPT: a tutorial.

    KERAS_BACKEND=jax python examples/train_mixtral.py        # KJV or Python docs
    KERAS_BACKEND=torch python examples/train_mixtral.py --experts 4 --top-k 1

A sparse mixture-of-experts (MoE) decoder replaces each feed-forward layer by
E experts and a router that sends every token to its top-k of them: the model
holds E experts' worth of parameters but each token uses only k. Is that worth
anything? This script trains two models on the same text, with the same
steps, data order and seed:

* MoE:   E experts of hidden size F, top-k routing (Mixtral's layout);
* dense: one feed-forward of hidden size k * F, so that both use the same
  number of *active* parameters per token (they differ only by the router).

It reports both validation perplexities, plots how the router spreads tokens
over the experts during training (`expert_load.png`), and writes the numbers
to `results.json`. It runs on JAX, TensorFlow and PyTorch; on two CPU cores
the defaults take about 5 minutes. The plot needs matplotlib
(`pip install matplotlib`); without it the script still trains and reports.

What to expect: the router learns to spread the load evenly within about a
hundred steps, but at this tiny scale the MoE does not beat its dense twin.
On the KJV with JAX, validation perplexity was 117 (MoE) vs 100 (dense)
after the default 120 steps, and 67 vs 63 after 300: each expert sees only
about k/E of the tokens, and the extra capacity pays off with more data,
more steps and wider models than two CPU cores allow.
"""

import argparse
import json
import os
import time

os.environ.setdefault("KERAS_BACKEND", "jax")  # pick the backend before Keras loads

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_transformers  # noqa: E402
from keras_transformers import MoEConfig, data  # noqa: E402
from keras_transformers.models import GPTCausalLM, MixtralCausalLM  # noqa: E402
from keras_transformers.tokenizer import train_bpe  # noqa: E402
from keras_transformers.training import (  # noqa: E402
    AdamW,
    MaskedAccuracy,
    MaskedSparseCategoricalCrossentropy,
    Perplexity,
    WarmupCosineDecay,
)

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--data", help="a UTF-8 text file (default: KJV, else Python docs)")
parser.add_argument("--max-chars", type=int, default=1_000_000)
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--steps-per-epoch", type=int, default=30)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--sequence-length", type=int, default=128)
parser.add_argument("--vocabulary-size", type=int, default=4096)
parser.add_argument("--experts", type=int, default=8, help="experts per MoE layer")
parser.add_argument("--top-k", type=int, default=2, help="experts per token")
parser.add_argument("--dispatch", choices=("sparse", "dense"), default="sparse")
parser.add_argument("--log-every", type=int, default=5, help="batches per load sample")
parser.add_argument("--output", default="runs/example_mixtral")
args = parser.parse_args()
os.makedirs(args.output, exist_ok=True)

# 1. Text, exactly as in train_gpt.py: a file, else the King James Bible
#    (`apt-get install bible-kjv`), else Python's own documentation.
if args.data:
    text = data.read_text(args.data, max_chars=args.max_chars)
else:
    text = (data.kjv_text() or data.default_text())[: args.max_chars]
print(f"{len(text):,} characters: {text[:60]!r}...")

# 2. A byte-level BPE tokenizer trained on the same text.
tokenizer = train_bpe([text], vocabulary_size=args.vocabulary_size)
token_ids = tokenizer.encode(text)
print(f"{len(token_ids):,} tokens, vocabulary {tokenizer.vocabulary_size}")

# 3. Next-token windows; the last 5% of the stream is held out. Each model
#    gets its own copy of the training set with the same shuffling seed, so
#    both see exactly the same batches in the same order.
train_ids, validation_ids = data.split_tokens(token_ids, validation_fraction=0.05)


def training_data():
    return data.lm_dataset(
        train_ids,
        args.sequence_length,
        args.batch_size,
        shuffle=True,
        seed=0,
        num_batches=args.steps_per_epoch,
    )


validation_data = data.lm_dataset(validation_ids, args.sequence_length, args.batch_size)

# 4. Two configs that differ only in the feed-forward layers. Start from the
#    `mixtral_tiny` preset (GQA, RoPE, RMSNorm, SwiGLU experts, untied head)
#    and make it a little bigger. Every expert has hidden size F; the dense
#    twin's single feed-forward has hidden size k * F, the same number of
#    weights that each token passes through in the MoE.
expert_dim = 256
moe_config = keras_transformers.load_config(
    "mixtral_tiny",
    vocabulary_size=tokenizer.vocabulary_size,
    pad_token_id=tokenizer.pad_token_id,
    bos_token_id=tokenizer.bos_token_id,
    eos_token_id=tokenizer.eos_token_id,
    num_layers=4,
    hidden_dim=128,
    num_heads=4,
    num_kv_heads=2,
    intermediate_dim=expert_dim,
    max_sequence_length=args.sequence_length,
    moe=MoEConfig(
        num_experts=args.experts,
        num_experts_per_token=args.top_k,
        expert_intermediate_dim=expert_dim,
        # "sparse": sort the k assignments of every token by expert and
        # multiply only those rows (cost ~ k); "dense": run every expert on
        # every token and keep the chosen ones (cost ~ E; same outputs).
        dispatch=args.dispatch,
        router_aux_loss_coef=0.02,  # pushes the router towards balanced load
    ),
)
dense_config = moe_config.replace(moe=None, intermediate_dim=args.top_k * expert_dim)

# The config counts parameters in closed form. Active parameters = those a
# token uses: the same in both models except the MoE's routers (a D x E
# matrix per layer).
router_params = moe_config.num_layers * moe_config.hidden_dim * args.experts
params = {
    "moe": (moe_config.num_params(), moe_config.num_active_params()),
    "dense": (dense_config.num_params(), dense_config.num_active_params()),
}
assert params["moe"][1] - params["dense"][1] == router_params, params
for name, (total, active) in params.items():
    print(f"{name:>5}: {total:>10,} parameters, {active:>10,} active per token")
print(f"active difference: {router_params:,} (the routers, D x E per layer)")


# 5. Router statistics during training. MixtralCausalLM adds metrics to the
#    fit() logs: `router_aux_loss` (load-balancing loss; its minimum is k when
#    the load is balanced), `router_z_loss`, `dropped_tokens` (0 here: no
#    capacity limit) and `expert_load_<e>` (share of the routed assignments
#    that went to expert e, averaged over the MoE layers; 1/E when balanced).
#    Like every metric in the logs they are running means since the start of
#    the epoch. The callback turns them back into means over the last
#    `log_every` batches: if m_n is the mean of batches 1..n, the mean of
#    batches a+1..b is (b * m_b - a * m_a) / (b - a).
class RouterHistory(keras.callbacks.Callback):
    def __init__(self, num_experts, every):
        super().__init__()
        self.keys = ["router_aux_loss"]
        self.keys += [f"expert_load_{e}" for e in range(num_experts)]
        self.every = every
        self.steps, self.values = [], []  # global step, {key: window mean}
        self.step = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.last_n, self.last_means = 0, None  # batches seen, running means

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        n = batch + 1
        if n % self.every and n != self.params.get("steps"):
            return
        means = np.array([float(logs[key]) for key in self.keys])
        window = means
        if self.last_means is not None:
            window = (n * means - self.last_n * self.last_means) / (n - self.last_n)
        self.steps.append(self.step)
        self.values.append(dict(zip(self.keys, window.tolist())))
        self.last_n, self.last_means = n, means


# Wall time of a training step, without compilation and validation: the
# median gap between consecutive batch ends within an epoch.
class StepTimer(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.gaps = []

    def on_epoch_begin(self, epoch, logs=None):
        self.last = None

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        if self.last is not None:
            self.gaps.append(now - self.last)
        self.last = now

    @property
    def seconds_per_step(self):
        return float(np.median(self.gaps)) if self.gaps else float("nan")


# 6. compile() and fit() each model exactly as train_gpt.py does: AdamW with
#    warmup and cosine decay, cross-entropy on logits, perplexity. For the
#    MoE the training loss also holds 0.02 x the load-balancing loss; the
#    validation loss (training=False) is the cross-entropy alone.
total_steps = args.epochs * args.steps_per_epoch


def compile_model(model):
    schedule = WarmupCosineDecay(
        peak_learning_rate=2e-3,
        warmup_steps=max(total_steps // 10, 1),
        decay_steps=total_steps,
        min_learning_rate=2e-4,
    )
    model.compile(
        optimizer=AdamW(schedule, beta_2=0.95, global_clipnorm=1.0),
        loss=MaskedSparseCategoricalCrossentropy(from_logits=True),
        metrics=[Perplexity(from_logits=True), MaskedAccuracy(name="accuracy")],
    )


results = {}
router_history = RouterHistory(args.experts, args.log_every)
for name, model_cls, config in (
    ("moe", MixtralCausalLM, moe_config),
    ("dense", GPTCausalLM, dense_config),
):
    print(f"\n--- {name}: {model_cls.__name__} ---")
    keras.utils.set_random_seed(0)  # same initial weights where shapes agree
    model = model_cls(config=config)
    # The closed form counts the weights; count_params() would also count the
    # MoE layers' non-trainable router statistics (3 + E numbers per layer).
    assert sum(int(np.prod(w.shape)) for w in model.trainable_weights) == (
        config.num_params()
    )
    compile_model(model)
    timer = StepTimer()
    callbacks = [timer, router_history] if name == "moe" else [timer]
    start = time.perf_counter()  # includes compiling and validation
    history = model.fit(
        training_data(),
        validation_data=validation_data,
        epochs=args.epochs,
        callbacks=callbacks,
        verbose=2,  # one line per epoch: the MoE logs 3 + E router statistics
    )
    seconds = time.perf_counter() - start
    evaluation = model.evaluate(validation_data, return_dict=True, verbose=0)
    results[name] = {
        "validation_loss": float(evaluation["loss"]),
        "validation_perplexity": float(evaluation["perplexity"]),
        "params": params[name][0],
        "active_params": params[name][1],
        "fit_seconds": round(seconds, 1),
        "seconds_per_step": round(timer.seconds_per_step, 3),
    }
    if name == "moe":
        # History holds the last epoch's means of the router statistics.
        last = {key: float(values[-1]) for key, values in history.history.items()}
        router = {
            key: last[key]
            for key in ("router_aux_loss", "router_z_loss", "dropped_tokens")
        }
        router["expert_load"] = [last[f"expert_load_{e}"] for e in range(args.experts)]
        results[name]["router_last_epoch"] = router
        loads = " ".join(f"{x:.3f}" for x in router["expert_load"])
        print(
            f"router, last epoch: aux loss {router['router_aux_loss']:.3f} "
            f"(balanced: {args.top_k}), z-loss {router['router_z_loss']:.2f}, "
            f"dropped {router['dropped_tokens']:.3f}"
        )
        print(f"expert load (balanced: {1 / args.experts:.3f} each): {loads}")

# 7. The comparison.
print(f"\n{'':>24}{'MoE':>12}{'dense':>12}")
rows = (
    ("validation loss", "validation_loss", "{:.3f}"),
    ("validation perplexity", "validation_perplexity", "{:.1f}"),
    ("parameters", "params", "{:,}"),
    ("active parameters", "active_params", "{:,}"),
    ("fit wall time (s)", "fit_seconds", "{:.1f}"),
    ("time per step (s)", "seconds_per_step", "{:.3f}"),
)
for label, key, spec in rows:
    moe, dense = (spec.format(results[m][key]) for m in ("moe", "dense"))
    print(f"{label:>24}{moe:>12}{dense:>12}")

results["setup"] = {
    "backend": keras.backend.backend(),
    "characters": len(text),
    "tokens": len(token_ids),
    "steps": total_steps,
    **{k: v for k, v in vars(args).items() if k != "output"},
    "moe_config": moe_config.to_dict(),
    "dense_config": dense_config.to_dict(),
}
results["moe"]["expert_load_curve"] = {
    "steps": router_history.steps,
    "values": router_history.values,
}
with open(os.path.join(args.output, "results.json"), "w") as f:
    json.dump(results, f, indent=2)
print(f"results written to {os.path.join(args.output, 'results.json')}")


# 8. Plot the expert load over training, one line per expert, against the
#    balanced share 1/E; below it the load-balancing loss against its minimum k.
def plot_router_history(path):
    try:
        import matplotlib

        matplotlib.use("Agg")  # write files, no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install matplotlib): no plot")
        return
    steps, values = router_history.steps, router_history.values
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(8, 6.5), sharex=True, gridspec_kw={"height_ratios": [3, 1.3]}
    )
    colors = plt.get_cmap("tab10" if args.experts <= 10 else "tab20")
    for e in range(args.experts):
        load = [v[f"expert_load_{e}"] for v in values]
        top.plot(steps, load, color=colors(e % colors.N), lw=1.5, label=f"expert {e}")
    top.axhline(1 / args.experts, color="black", ls="--", lw=1, label="balanced 1/E")
    top.set_ylabel("share of routed assignments")
    top.set_title(
        f"Expert load, mean over {moe_config.num_layers} MoE layers "
        f"(E={args.experts}, top-{args.top_k}, {keras.backend.backend()})"
    )
    top.set_ylim(bottom=0)
    top.grid(alpha=0.3)
    top.legend(ncol=2 if args.experts > 4 else 1, fontsize=8, loc="upper right")
    aux = [v["router_aux_loss"] for v in values]
    bottom.plot(steps, aux, color="tab:gray", lw=1.5, label="load-balancing loss")
    bottom.axhline(args.top_k, color="black", ls="--", lw=1, label="balanced (k)")
    bottom.set_xlabel(f"training step (each point: mean of {args.log_every} batches)")
    bottom.set_ylabel("aux loss")
    bottom.grid(alpha=0.3)
    bottom.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"expert load plot written to {path}")


plot_router_history(os.path.join(args.output, "expert_load.png"))
