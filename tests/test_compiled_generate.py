"""Compiled generation: a model compiled with `jit_compile=True` generates
the same tokens as the eager reference.

PyTorch decodes each token with one `torch.compile`d step over a
fixed-size KV cache, its position a tensor: one compilation for the whole
generation (and for later ones of the same shapes), no graph break. JAX
and TensorFlow compile the whole decoding loop with XLA; their tokens are
checked against greedy decoding by full forward passes without a cache.

Compiling is slow on a small CPU: the PyTorch rotary (Llama) case carries
the `once` marker; GPT-2 and the sparse MoE (Mixtral) run everywhere. As
in tests/test_compiled.py, one family's decoding step (`INDUCTOR_FAMILY`,
the sparse MoE: norms, rotary, grouped-query attention and the router)
runs the full Inductor pipeline; the others compile with
`backend="aot_eager"` (the same Dynamo graph, guards and breaks, run by
eager kernels): Inductor's C++ code generation took 15-20 s of CPU per
case on 2 cores, `aot_eager` 5-10 s.
"""

import keras
import numpy as np
import pytest
from contracts import assert_same_greedy, without_inductor

from keras_transformers.models import GPTCausalLM, MixtralCausalLM, Seq2SeqLM

NEW_TOKENS = 6
INDUCTOR_FAMILY = "mixtral"
PRESETS = {
    "gpt2": (GPTCausalLM, "gpt2_tiny"),
    "llama": (GPTCausalLM, "gpt_llama_tiny"),
    "mixtral": (MixtralCausalLM, "mixtral_tiny"),
}


def _causal_lm(family):
    cls, preset = PRESETS[family]
    return cls.from_preset(preset, num_layers=1)


def _prompts(model, rng, lengths):
    vocabulary = model.config.vocabulary_size
    return [rng.integers(3, vocabulary, n).tolist() for n in lengths]


def _full_forward_greedy(model, prompts):
    """Greedy continuation of equal-length prompts, each token from a full
    forward pass over the sequence so far (no cache, no compilation). The
    passes read one fixed width (the model is causal: the zeros after the
    sequence change nothing before them), so eager JAX compiles each op
    once instead of once per length."""
    length = len(prompts[0])
    ids = np.zeros((len(prompts), length + NEW_TOKENS), "int32")
    ids[:, :length] = prompts
    for position in range(length, length + NEW_TOKENS):
        logits = keras.ops.convert_to_numpy(model(ids))[:, position - 1]
        ids[:, position] = logits.argmax(-1)
    return ids


def _seq2seq_full_forward_greedy(model, sources, start):
    """Greedy targets of a `Seq2SeqLM`, each token from a full decoder pass
    over the target so far (no cache, no compilation), padded to one width
    as in `_full_forward_greedy` (the decoder is causal)."""
    sources = np.asarray(sources, "int32")
    targets = np.zeros((len(sources), NEW_TOKENS), "int32")
    targets[:, 0] = start
    for position in range(1, NEW_TOKENS + 1):
        logits = model(
            {
                "encoder_token_ids": sources,
                "encoder_padding_mask": np.ones(sources.shape, bool),
                "decoder_token_ids": targets,
                "decoder_padding_mask": np.ones(targets.shape, bool),
            }
        )
        token = keras.ops.convert_to_numpy(logits)[:, position - 1].argmax(-1)
        if position < NEW_TOKENS:
            targets[:, position] = token
    return np.concatenate([targets[:, 1:], token[:, None].astype("int32")], 1)


@pytest.mark.parametrize("family", ["gpt2", "mixtral"])
def test_xla_generate_matches_full_forward(family, rng, backend):
    if backend == "torch":
        pytest.skip("PyTorch's compiled decoding step is tested below")
    model = _causal_lm(family)
    model.compile(jit_compile=True)
    prompts = _prompts(model, rng, [5, 5])
    expected = _full_forward_greedy(model, prompts)
    out = model.generate(prompts, max_new_tokens=NEW_TOKENS, stop_token_ids=None)
    np.testing.assert_array_equal(out, expected)


def test_xla_seq2seq_generate_matches_full_forward(rng, backend):
    if backend == "torch":
        pytest.skip("XLA compiles the seq2seq decoding loop on JAX and TensorFlow")
    model = Seq2SeqLM.from_preset("transformer_tiny", num_layers=1)
    model.compile(jit_compile=True)
    sources = _prompts(model, rng, [6, 6])
    start = model.config.bos_token_id
    expected = _seq2seq_full_forward_greedy(model, sources, start)
    out = model.generate(
        sources,
        max_new_tokens=NEW_TOKENS,
        start_token_id=start,
        stop_token_ids=None,
    )
    np.testing.assert_array_equal(out, expected)


def _torch_families():
    return [
        pytest.param("gpt2"),
        pytest.param("llama", marks=pytest.mark.once),
        pytest.param("mixtral"),
    ]


@pytest.mark.parametrize("family", _torch_families())
def test_torch_compiled_decoding_step_matches_eager(family, rng, backend, monkeypatch):
    if backend != "torch":
        pytest.skip("torch.compile is PyTorch's compiler")
    import torch
    from torch._dynamo.utils import counters

    if family != INDUCTOR_FAMILY:
        without_inductor(monkeypatch)

    model = _causal_lm(family)
    first = _prompts(model, rng, [5, 3])  # rows of different prompt lengths
    second = _prompts(model, rng, [4, 6])
    kwargs = dict(max_new_tokens=NEW_TOKENS, stop_token_ids=None)
    eager = [model.generate(p, **kwargs) for p in (first, second)]
    stream = []

    model.compile(jit_compile=True)
    torch._dynamo.reset()
    counters.clear()
    out = model.generate(first, **kwargs)
    # One graph serves every token: none added per position, no break.
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["graph_break"], list(counters["graph_break"])
    assert_same_greedy(model, out, eager[0])
    # Other prompts of the same shapes reuse it.
    assert_same_greedy(model, model.generate(second, **kwargs), eager[1])
    # Streaming runs the same compiled step a token at a time.
    model.generate(first, stream=stream.append, **kwargs)
    streamed = np.stack(stream)  # [steps, B]
    for row, prompt in enumerate(first):
        new = streamed[:, row][streamed[:, row] >= 0]
        np.testing.assert_array_equal(
            out[row, len(prompt) : len(prompt) + len(new)], new
        )
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["recompiles"], dict(counters["recompiles"])


def test_torch_decodes_eagerly_without_jit_compile(rng, backend):
    """A model compiled without `jit_compile` (PyTorch's default) decodes
    eagerly: nothing reaches `torch.compile`."""
    if backend != "torch":
        pytest.skip("torch.compile is PyTorch's compiler")
    import torch
    from torch._dynamo.utils import counters

    model = _causal_lm("gpt2")
    model.compile(jit_compile=False)
    torch._dynamo.reset()
    counters.clear()
    model.generate(_prompts(model, rng, [4]), max_new_tokens=2)
    assert counters["stats"]["unique_graphs"] == 0


@pytest.mark.parametrize("num_beams", [1, 3], ids=["greedy", "beam_search"])
def test_torch_compiled_seq2seq_step_matches_eager(
    num_beams, rng, backend, monkeypatch
):
    """Encoder-decoder decoding (greedy and beam search) on PyTorch with
    `jit_compile=True`: one compiled step for every target token and for
    later calls of the same shapes (the cross cache, source mask and
    position are inputs, not constants), the same tokens as eager
    decoding."""
    if backend != "torch":
        pytest.skip("torch.compile is PyTorch's compiler")
    import torch
    from torch._dynamo.utils import counters

    without_inductor(monkeypatch)
    model = Seq2SeqLM.from_preset("transformer_tiny", num_layers=1)
    first = _prompts(model, rng, [6, 3])  # padded sources
    second = _prompts(model, rng, [5, 4])
    kwargs = dict(max_new_tokens=NEW_TOKENS, num_beams=num_beams, stop_token_ids=None)
    eager = [model.generate(s, **kwargs) for s in (first, second)]

    model.compile(jit_compile=True)
    torch._dynamo.reset()
    counters.clear()
    np.testing.assert_array_equal(model.generate(first, **kwargs), eager[0])
    np.testing.assert_array_equal(model.generate(second, **kwargs), eager[1])
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["graph_break"], list(counters["graph_break"])
    assert not counters["recompiles"], dict(counters["recompiles"])
