"""Shared pieces of the Hugging Face parity tests (`tests/test_convert*.py`).

A parity test builds a tiny random-init `transformers` model, gives it
weights large enough that a mapping mistake shows (`randomize`), saves it,
loads it here, runs both on the same right-padded batch (`padded_batch`,
`hf_outputs`, `our_outputs`) and compares with `record`, which prints each
case's max |difference| (`pytest -s`) and fails above the tolerance.
Decoders also compare cached greedy generation (`assert_greedy_matches`).

Import this only after `pytest.importorskip("torch")` and
`pytest.importorskip("transformers")`.
"""

import json

import keras
import numpy as np
import torch
import transformers
from contracts import compiled

import keras_transformers

TOLERANCE = 1e-4
MAX_DIFF = {}  # (backend, case) -> max |diff|


def is_norm_scale(name: str, parameter) -> bool:
    """Whether `parameter` is a normalisation scale (kept near 1)."""
    return parameter.ndim == 1 and "norm" in name.lower() and name.endswith("weight")


def randomize(model, skip: tuple[str, ...] = ()):
    """Sets every parameter of torch `model` to seeded noise: norm scales
    `1 + 0.2 * N(0, 1)`, everything else `0.1 * N(0, 1)`; parameters whose
    name contains one of `skip` (e.g. fixed position tables) are left.
    Returns the model in eval mode."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(part in name for part in skip):
                continue
            noise = torch.randn(p.shape, generator=generator)
            p.copy_(1 + 0.2 * noise if is_norm_scale(name, p) else 0.1 * noise)
    return model.eval()


def reference(path, cls=None, attention: str = "eager"):
    """The `transformers` model saved at `path`, float32, in eval mode
    (`cls` defaults to `AutoModelForCausalLM`)."""
    cls = cls or transformers.AutoModelForCausalLM
    return cls.from_pretrained(
        path, attn_implementation=attention, dtype=torch.float32
    ).eval()


def padded_batch(vocab: int, length: int = 12, real: int = 7):
    """Token ids `[2, length]` (ids in `[2, vocab)`) and a bool mask; the
    second row is right-padded with id 0 after `real` tokens."""
    ids = np.random.default_rng(1).integers(2, vocab, (2, length)).astype("int32")
    mask = np.ones_like(ids, bool)
    mask[1, real:] = False
    ids[1, real:] = 0
    return ids, mask


def hf_outputs(model, ids, mask=None, base: bool = False) -> np.ndarray:
    """Logits `[B, T, V]` of a `transformers` causal LM, or the last hidden
    states `[B, T, C]` of a base model (`base=True`)."""
    kwargs = {} if mask is None else {"attention_mask": torch.tensor(mask * 1)}
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids, dtype=torch.long), **kwargs)
    return (out.last_hidden_state if base else out.logits).numpy()


_FORWARDS = {}  # JAX: architecture -> compiled stateless forward pass


def our_outputs(model, ids, mask=None) -> np.ndarray:
    """Our model's output for `ids` (`[B, T]`) with an optional padding mask.
    On JAX from one compiled forward pass, shared by the models of one
    architecture (class, config, dtype policy and variable shapes): the
    parity tests load several copies of each (eager JAX would compile each
    op instead)."""
    inputs = ids if mask is None else {"token_ids": ids, "padding_mask": mask}
    if keras.config.backend() != "jax":
        return np.asarray(keras.ops.convert_to_numpy(model(inputs)))
    variables = model.trainable_variables, model.non_trainable_variables
    key = (
        type(model),
        json.dumps(model.get_config(), sort_keys=True, default=str),
        model.dtype_policy.name,
        tuple(tuple((tuple(v.shape), v.dtype) for v in vs) for vs in variables),
    )
    if key not in _FORWARDS:
        _FORWARDS[key] = compiled(model.stateless_call)
    values = [[v.value for v in vs] for vs in variables]
    return np.asarray(_FORWARDS[key](*values, inputs)[0])


def record(case: str, ours, theirs, mask=None, tolerance: float = TOLERANCE):
    """Asserts max |ours - theirs| over the real positions (`mask`, `[B, T]`;
    None: all) is at most `tolerance`, and records it in `MAX_DIFF`."""
    mask = np.ones(np.shape(ours)[:2], bool) if mask is None else mask
    diff = float(np.abs(ours - theirs)[mask].max())
    MAX_DIFF[(keras.config.backend(), case)] = diff
    print(f"[{keras.config.backend()}] {case}: max |diff| = {diff:.2e}")
    assert diff <= tolerance, f"{case}: max |diff| {diff} > {tolerance}"


def assert_greedy_matches(path, prompt, max_new_tokens: int = 8):
    """Our cached greedy decoding of `prompt` (`[1, T]` int32) from the
    checkpoint at `path` equals `transformers`' `generate(do_sample=False)`;
    neither stops at an end token."""
    model = reference(path)
    model.generation_config.eos_token_id = None  # never stop early, like ours
    with torch.no_grad():
        expected = model.generate(
            torch.tensor(prompt, dtype=torch.long),
            attention_mask=torch.ones(prompt.shape, dtype=torch.long),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            pad_token_id=0,
        ).numpy()
    lm = keras_transformers.from_preset(path)
    ours = lm.generate(prompt, max_new_tokens=max_new_tokens, stop_token_ids=None)
    np.testing.assert_array_equal(np.asarray(ours), expected)


def seq2seq_batch(low, high, start, pad, shape=(9, 7), real=(6, 5)):
    """`(source, source_mask, target, target_mask)`: sources `[2, S]` and
    targets `[2, T]` (`shape`) of ids in `[low, high)`, targets starting
    with the decoder start id `start`; the second pair is right-padded with
    `pad` after `real` source and target tokens."""
    rng = np.random.default_rng(1)
    source = rng.integers(low, high, (2, shape[0])).astype("int32")
    target = rng.integers(low, high, (2, shape[1])).astype("int32")
    target[:, 0] = start
    source_mask, target_mask = np.ones_like(source, bool), np.ones_like(target, bool)
    source_mask[1, real[0] :], target_mask[1, real[1] :] = False, False
    source[1, real[0] :], target[1, real[1] :] = pad, pad
    return source, source_mask, target, target_mask


def seq2seq_outputs(path, cls: str, batch) -> dict:
    """Outputs (NumPy, by name: `logits`, `last_hidden_state`, ...) of the
    `transformers` class named `cls` saved at `path` on a `seq2seq_batch`."""
    source, source_mask, target, target_mask = (
        torch.tensor(x.astype("int64")) for x in batch
    )
    with torch.no_grad():
        out = reference(path, getattr(transformers, cls))(
            input_ids=source,
            attention_mask=source_mask,
            decoder_input_ids=target,
            decoder_attention_mask=target_mask,
        )
    return {k: v.numpy() for k, v in out.items() if isinstance(v, torch.Tensor)}
