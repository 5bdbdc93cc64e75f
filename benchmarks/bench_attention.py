"""One attention layer's forward and backward pass, by length: the default
path (fused or explicit) against blockwise attention, on this backend, and
PyTorch's `scaled_dot_product_attention` on the same cores as a reference.

What sets the library's automatic choice (`attention_scores.LONG_CAUSAL`,
`LONG_SEQUENCE`, `BLOCK_SIZE`): a `MultiHeadAttention` with SmolLM2-135M's
heads (9 query heads, 3 K/V heads of 64, width 576, rotary positions) over
one sequence, the gradient of `sum(out ** 2)` with respect to the layer's
weights, compiled (`jax.jit`, `tf.function`; eager on PyTorch); the best of
5 calls after 2 warm-up calls. The reference column is the attention alone
(no projections): a floor, not a contender.

Usage::

    KERAS_BACKEND=jax python benchmarks/bench_attention.py --lengths 512,2048
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def best_ms(fn, repeats=5):
    """Milliseconds of the fastest of `repeats` calls, after two warm-ups."""
    fn()
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * min(times)


def layer_step(length, block_size, causal=True):
    """A function running one forward and backward pass of the layer."""
    import keras

    from keras_transformers.layers.attention import MultiHeadAttention

    layer = MultiHeadAttention(
        num_heads=9, num_kv_heads=3, head_dim=64, causal=causal, block_size=block_size
    )
    x = np.random.default_rng(0).normal(size=(1, length, 576)).astype("float32")
    layer.build(x.shape)
    backend = keras.config.backend()
    if backend == "jax":
        import jax

        frozen = [v.value for v in layer.non_trainable_variables]

        def loss(weights, x):
            return (layer.stateless_call(weights, frozen, x)[0] ** 2).sum()

        grad = jax.jit(jax.grad(loss))
        weights = [v.value for v in layer.trainable_variables]
        return lambda: jax.block_until_ready(grad(weights, x))
    if backend == "tensorflow":
        import tensorflow as tf

        x = tf.constant(x)

        @tf.function
        def grad(x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(layer(x) ** 2)
            return tape.gradient(loss, layer.trainable_variables)

        return lambda: [g.numpy() for g in grad(x)]
    import torch

    x = torch.tensor(x)
    return lambda: (layer(x) ** 2).sum().backward()


def sdpa_step(length):
    """PyTorch's fused attention alone (K/V heads repeated), forward and
    backward."""
    import torch

    q = torch.randn(1, 9, length, 64, requires_grad=True)
    k = torch.randn(1, 3, length, 64, requires_grad=True)
    v = torch.randn(1, 3, length, 64, requires_grad=True)

    def step():
        kr, vr = (x.repeat_interleave(3, dim=1) for x in (k, v))
        out = torch.nn.functional.scaled_dot_product_attention(
            q, kr, vr, is_causal=True
        )
        (out**2).sum().backward()

    return step


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="256,512,1024,2048")
    parser.add_argument("--blocks", default="64,128", help="blockwise block sizes")
    parser.add_argument("--no-torch", action="store_true", help="no SDPA column")
    args = parser.parse_args(argv)
    import keras

    blocks = [int(b) for b in args.blocks.split(",")]
    print(f"backend={keras.config.backend()}  causal, 9 / 3 heads of 64, batch 1")
    header = ["tokens", "default ms"] + [f"blocks of {b} ms" for b in blocks]
    if not args.no_torch:
        from _common import setup_torch
        from _machine import all_cores

        setup_torch(all_cores())  # every core, as JAX and TensorFlow use
        header.append("torch sdpa alone ms")
    print(" | ".join(header))
    for length in (int(n) for n in args.lengths.split(",")):
        row = [best_ms(layer_step(length, 0))]
        row += [best_ms(layer_step(length, b)) for b in blocks]
        if not args.no_torch:
            row.append(best_ms(sdpa_step(length)))
        print(" | ".join([str(length)] + [f"{ms:.1f}" for ms in row]), flush=True)


if __name__ == "__main__":
    main()
