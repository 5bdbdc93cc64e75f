"""GPT family: shapes, properties (causality, padding, cache), generation,
saving, mixed precision and input errors, for the GPT-2 and Llama layouts."""

import subprocess
import sys

import keras
import numpy as np
import pytest
from contracts import (
    assert_close,
    compiled_cached_call,
    compiled_forward,
    run_fit_test,
    run_saving_test,
    to_numpy,
    toy_run_env,
)

import keras_transformers as kt
from keras_transformers.models import GPTBackbone, GPTCausalLM

# The decoder contract, shared by the GPT-2 and Llama layouts and the
# Mixtral family (the same decoder with sparse MoE feed-forward layers).
PRESETS = ["gpt2_tiny", "gpt_llama_tiny", "mixtral_tiny"]


@pytest.fixture(params=PRESETS, scope="module")
def lm(request):
    keras.utils.set_random_seed(0)
    return kt.from_preset(request.param)


@pytest.fixture(params=PRESETS, scope="module")
def one_layer_lm(request):
    """The family at one layer, for the generation tests that check the
    loop's logic (stop tokens, streaming, samplers): each sampler and stop
    setting compiles a loop of its own on JAX and TensorFlow, at half the
    cost of two layers. `test_generate_greedy_matches_naive_loop_and_batches`
    decodes the two-layer `lm`."""
    keras.utils.set_random_seed(0)
    return kt.from_preset(request.param, num_layers=1)


def trainable_count(model):
    """Parameters as `num_params()` counts them (MoE layers also hold a few
    non-trainable router statistics)."""
    return sum(int(np.prod(w.shape)) for w in model.trainable_weights)


@pytest.fixture
def ids(rng):
    return rng.integers(1, 500, size=(2, 12)).astype("int32")


def test_backbone_shapes_and_param_count(lm, ids):
    hidden = lm.backbone({"token_ids": ids, "padding_mask": np.ones_like(ids)})
    assert tuple(hidden.shape) == (2, 12, lm.config.hidden_dim)
    assert tuple(lm(ids).shape) == (2, 12, lm.config.vocabulary_size)
    assert trainable_count(lm) == lm.config.num_params()


def test_keyword_construction_equals_config():
    model = GPTBackbone(
        vocabulary_size=64,
        num_layers=1,
        hidden_dim=16,
        num_heads=2,
        intermediate_dim=32,
    )
    assert model.config == kt.TransformerConfig(
        vocabulary_size=64,
        num_layers=1,
        hidden_dim=16,
        num_heads=2,
        intermediate_dim=32,
    )
    assert GPTBackbone.from_config(model.get_config()).config == model.config


def test_causality(lm, ids):
    changed = ids.copy()
    changed[:, 7:] = (changed[:, 7:] + 11) % 500
    assert_close(to_numpy(lm(ids))[:, :7], to_numpy(lm(changed))[:, :7], atol=1e-5)


def test_padding_invariance(lm, ids):
    mask = np.ones_like(ids, bool)
    mask[0, 8:] = False
    changed = ids.copy()
    changed[0, 8:] = 3
    a = to_numpy(lm({"token_ids": ids, "padding_mask": mask}))
    b = to_numpy(lm({"token_ids": changed, "padding_mask": mask}))
    assert_close(a[0, :8], b[0, :8], atol=1e-5)
    # A padded row equals the same sequence alone.
    alone = to_numpy(compiled_forward(lm, ids[:1, :8]))
    assert_close(a[0, :8], alone[0], atol=1e-5)


def test_cached_decoding_equals_full_forward(lm, ids):
    full = to_numpy(lm(ids))
    # On JAX one program for the prefill and one for every step (a traced
    # position, as generation's loop passes it); elsewhere the eager call.
    prefill = compiled_cached_call(lm, traced_index=False)
    step = compiled_cached_call(lm)
    cache = lm.backbone.init_cache(2, 16)
    logits, cache = prefill(ids[:, :5], cache, 0)  # a prefill chunk
    steps = [to_numpy(logits)]
    for i in range(5, 12):
        logits, cache = step(ids[:, i : i + 1], cache, i)
        steps.append(to_numpy(logits))
    assert_close(np.concatenate(steps, axis=1), full, atol=1e-5)


def _naive_greedy(lm, prompts, steps, width=12):
    """Greedy decoding of each prompt by full forward passes, without a
    cache: one pass per step over all rows, each right-padded to `width`
    (the model is causal: positions after a sequence change nothing before
    them), so eager JAX compiles each op once, for the `[2, 12]` shape the
    other tests' `ids` already use."""
    seqs = [list(prompt) for prompt in prompts]
    rows = np.zeros((len(seqs), width), "int32")
    for _ in range(steps):
        for row, seq in zip(rows, seqs):
            row[: len(seq)] = seq
        logits = to_numpy(lm(rows))
        for i, seq in enumerate(seqs):
            seq.append(int(logits[i, len(seq) - 1].argmax()))
    return seqs


def test_generate_greedy_matches_naive_loop_and_batches(lm):
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12]]
    out = lm.generate(prompts, max_new_tokens=6, stop_token_ids=None)
    for row, expected in zip(out, _naive_greedy(lm, prompts, 6)):
        assert row[: len(expected)].tolist() == expected
    assert out.shape == (2, 11)


@pytest.mark.skipif(
    keras.config.backend() != "torch",
    reason="counts steps of a Python decoding loop (XLA traces its loop once)",
)
@pytest.mark.parametrize("stream", [False, True])
def test_prefill_logits_choose_the_first_new_token(stream, monkeypatch):
    """No one-token step recomputes the last prompt token: the loop runs
    one step per position after the first new one."""
    keras.utils.set_random_seed(0)
    model = kt.from_preset("gpt2_tiny")
    calls = []
    step = model.call_with_cache
    monkeypatch.setattr(
        model, "call_with_cache", lambda *a: calls.append(a[2]) or step(*a)
    )
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12]]
    out = model.generate(
        prompts,
        max_new_tokens=6,
        stop_token_ids=None,
        stream=(lambda tokens: None) if stream else None,
    )
    assert calls == list(range(3, 10))  # positions 4..10 from 3..9
    for row, expected in zip(out, _naive_greedy(model, prompts, 6)):
        assert row[: len(expected)].tolist() == expected


@pytest.mark.skipif(keras.config.backend() != "torch", reason="PyTorch's eager prefill")
def test_eager_prefill_from_position_0_attends_causally_without_a_mask(
    monkeypatch, ids
):
    """An eager prefill at position 0 attends to exactly its own keys: the
    fused kernel's causal form (no `[T, S]` mask, the hidden half of the
    scores skipped), with the full forward's logits."""
    from keras_transformers import backend

    keras.utils.set_random_seed(0)
    lm = kt.from_preset("gpt_llama_tiny")
    calls, fused = [], backend.dot_product_attention

    def recording(q, k, v, mask=None, **kwargs):
        calls.append((mask is None, kwargs.get("is_causal")))
        return fused(q, k, v, mask=mask, **kwargs)

    monkeypatch.setattr(backend, "dot_product_attention", recording)
    logits, _ = lm.call_with_cache(ids, lm.backbone.init_cache(2, 16), 0)
    assert calls == [(True, True)] * lm.config.num_layers
    assert_close(to_numpy(logits), to_numpy(lm(ids)), atol=1e-5)


def test_generate_stop_tokens_and_streaming(one_layer_lm):
    lm = one_layer_lm
    prompt = [[5, 6, 7]]
    free = lm.generate(prompt, max_new_tokens=6, stop_token_ids=None)[0]
    stop = int(free[3])  # the first generated token
    programs = dict(lm._generate_functions)
    stopped = lm.generate(prompt, max_new_tokens=6, stop_token_ids=[stop, 0])[0]
    assert stopped.tolist() == free.tolist()[:4]
    as_array = lm.generate(prompt, max_new_tokens=6, stop_token_ids=np.array([stop, 0]))
    assert as_array[0].tolist() == stopped.tolist()
    # The stop ids are an input of the compiled loop: the free run's serves all.
    assert lm._generate_functions == programs
    streamed = []
    out = lm.generate(
        prompt,
        max_new_tokens=4,
        stop_token_ids=None,
        stream=lambda t: streamed.append(int(t[0])),
    )
    assert streamed == out[0, 3:].tolist()


def test_sampling_is_seeded_and_top_k_1_is_greedy(one_layer_lm):
    lm = one_layer_lm  # its greedy loop is the stop-token test's free run
    prompt = [[5, 6, 7]]
    a = lm.generate(
        prompt, max_new_tokens=5, sampler="random", seed=3, stop_token_ids=None
    )
    b = lm.generate(
        prompt, max_new_tokens=5, sampler="random", seed=3, stop_token_ids=None
    )
    np.testing.assert_array_equal(a, b)
    greedy = lm.generate(prompt, max_new_tokens=5, stop_token_ids=None)
    top1 = lm.generate(prompt, max_new_tokens=5, top_k=1, seed=1, stop_token_ids=None)
    np.testing.assert_array_equal(greedy, top1)
    nucleus = lm.generate(
        prompt, max_new_tokens=5, top_p=1e-6, seed=1, stop_token_ids=None
    )
    np.testing.assert_array_equal(greedy, nucleus)


def test_saving_round_trips(lm, ids, tmp_path):
    run_saving_test(lm, ids, str(tmp_path))
    backbone_dir = str(tmp_path / "backbone")
    lm.backbone.save_to_preset(backbone_dir)
    # A backbone preset loads as a task model and vice versa.
    task_cls, backbone_cls = type(lm), type(lm.backbone)
    assert_close(task_cls.from_preset(backbone_dir)(ids), lm(ids), atol=1e-6)
    assert isinstance(backbone_cls.from_preset(str(tmp_path / "preset")), backbone_cls)
    assert isinstance(kt.from_preset(str(tmp_path / "preset")), task_cls)


def test_fit_reduces_loss(ids):
    lm = GPTCausalLM.from_preset("gpt_llama_tiny")
    x, y = ids[:, :-1], ids[:, 1:]
    lm.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    history = lm.fit(x, y, epochs=8, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0] * 0.7


def test_mixed_bfloat16_forward_and_fit(ids):
    keras.config.set_dtype_policy("mixed_bfloat16")
    lm = GPTCausalLM.from_preset("gpt_llama_tiny")
    assert lm.backbone.blocks[0].self_attention.query_dense.kernel.dtype == "float32"
    logits = to_numpy(keras.ops.cast(compiled_forward(lm, ids), "float32"))
    assert np.all(np.isfinite(logits))
    run_fit_test(lm, ids[:, :-1], ids[:, 1:])
    assert lm.generate([[1, 2]], max_new_tokens=3, stop_token_ids=None).shape == (1, 5)


# Saves a preset and its outputs in a process of another backend; on JAX
# its forward is one compiled program (eagerly, each op compiles alone).
SAVE_ELSEWHERE = """
import sys, keras, numpy as np
from keras_transformers.models import GPTCausalLM
preset, out, ids = sys.argv[1:]
lm = GPTCausalLM.from_preset("gpt_llama_tiny")
lm.save_to_preset(preset)
forward = lm
if keras.config.backend() == "jax":
    import jax
    call = jax.jit(lambda v, x: lm.stateless_call(*v, x)[0])
    values = [[v.value for v in w] for w in (lm.trainable_variables, lm.non_trainable_variables)]
    forward = lambda x: call(values, x)
np.save(out, keras.ops.convert_to_numpy(forward(np.load(ids))))
"""


def test_weights_load_across_backends(tmp_path, ids, backend):
    """A preset saved under another backend loads here with the same outputs."""
    other = {"jax": "torch", "tensorflow": "jax", "torch": "tensorflow"}[backend]
    np.save(tmp_path / "ids.npy", ids)
    paths = [str(tmp_path / name) for name in ("p", "out.npy", "ids.npy")]
    subprocess.run(
        [sys.executable, "-c", SAVE_ELSEWHERE, *paths],
        check=True,
        env=toy_run_env(KERAS_BACKEND=other),
        capture_output=True,
    )
    lm = GPTCausalLM.from_preset(str(tmp_path / "p"))
    assert_close(lm(ids), np.load(tmp_path / "out.npy"), atol=1e-5)


# ------------------------------------------------------------------ errors
def test_bad_inputs_raise_clear_errors(lm):
    with pytest.raises(ValueError, match="rank 1"):
        lm(np.array([1, 2, 3], "int32"))
    with pytest.raises(ValueError, match="integer"):
        lm(np.ones((1, 3), "float32"))
    with pytest.raises(ValueError, match="outside"):
        lm(np.array([[1, 2, lm.config.vocabulary_size]], "int32"))
    with pytest.raises(ValueError, match="max_sequence_length"):
        lm(np.ones((1, lm.config.max_sequence_length + 1), "int32"))
    with pytest.raises(ValueError, match="token_ids"):
        lm({"ids": np.ones((1, 3), "int32")})
    with pytest.raises(ValueError, match="padding_mask"):
        lm({"token_ids": np.ones((1, 3), "int32"), "padding_mask": np.ones((1, 4))})


def test_generate_errors(lm):
    with pytest.raises(ValueError, match="outside"):
        lm.generate([[1, 10_000]], max_new_tokens=2)
    with pytest.raises(ValueError, match="max_sequence_length"):
        lm.generate([[1] * 120], max_new_tokens=20)
    with pytest.raises(ValueError, match="tokenizer"):
        lm.generate("hello", max_new_tokens=2)
    with pytest.raises(ValueError, match="empty"):
        lm.generate([[]], max_new_tokens=2)
    with pytest.raises(ValueError, match="top_p"):
        lm.generate([[1]], sampler="top_p", top_p=2.0)


def test_preset_directory_errors(lm, tmp_path):
    path = tmp_path / "p"
    lm.save_to_preset(str(path))
    (path / "model.weights.h5").write_bytes(b"not an h5 file")
    cls = type(lm)
    with pytest.raises(ValueError, match="corrupt"):
        cls.from_preset(str(path))
    (path / "model.weights.h5").unlink()
    with pytest.raises(FileNotFoundError, match="model.weights.h5"):
        cls.from_preset(str(path))
    (path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        cls.from_preset(str(path))
    (path / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        cls.from_preset(str(path))


def test_wrong_shape_weights_error(tmp_path):
    small = GPTCausalLM.from_preset("gpt2_tiny")
    small.save_to_preset(str(tmp_path / "p"))
    config = small.config.replace(hidden_dim=32)
    import json

    meta = json.loads((tmp_path / "p" / "config.json").read_text())
    meta["config"]["hidden_dim"] = config.hidden_dim
    (tmp_path / "p" / "config.json").write_text(json.dumps(meta))
    # metadata.json's record of the save notices the edited config first...
    with pytest.raises(ValueError, match="changed after the weights were saved"):
        GPTCausalLM.from_preset(str(tmp_path / "p"))
    # ...and without the record (older presets) the weights' shapes do.
    record = json.loads((tmp_path / "p" / "metadata.json").read_text())
    record.pop("files")
    (tmp_path / "p" / "metadata.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match="different architecture"):
        GPTCausalLM.from_preset(str(tmp_path / "p"))


def test_unknown_preset_and_overrides():
    with pytest.raises(ValueError, match="gpt2_small"):
        GPTCausalLM.from_preset("gpt3_giant")
    lm = GPTCausalLM.from_preset("gpt2_tiny", dropout=0.2, num_layers=1)
    assert lm.config.dropout == 0.2 and len(lm.backbone.blocks) == 1
    with pytest.raises(ValueError, match="num_heads"):
        GPTCausalLM.from_preset("gpt2_tiny", num_heads=7)


def test_left_padding_stays_finite(lm):
    """Fully masked query rows (left padding) must not turn real rows into NaN."""
    ids = np.array([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5]], "int32")
    mask = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], bool)
    logits = compiled_forward(lm, {"token_ids": ids, "padding_mask": mask})
    assert np.isfinite(to_numpy(logits)).all()
