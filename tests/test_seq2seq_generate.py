"""Seq2seq generation: greedy equals an uncached argmax loop, batching
changes nothing, beam search equals a plain-Python reference beam search
(length penalty, end tokens, early stopping), stop tokens, sampling, text
inputs and errors."""

import numpy as np
import pytest
from contracts import to_numpy

from keras_transformers.models import Seq2SeqLM

PAD, START, EOS = 0, 1, 2
VOCAB = 16  # >= 2 * beams, so the first step expands the start token only
SOURCES = [[5, 6, 7, 2], [8, 9, 10, 11, 12, 13, 2], [3, 2], [9, 4, 4, 4, 5, 2]]


@pytest.fixture(scope="module")
def lm():
    """A tiny model with large NumPy-drawn weights (the same on every
    backend), so outputs depend on the source and log-probabilities are far
    from ties."""
    model = Seq2SeqLM.from_preset(
        "transformer_tiny",
        vocabulary_size=VOCAB,
        hidden_dim=16,
        num_heads=2,
        intermediate_dim=32,
        num_layers=1,
        num_decoder_layers=2,
        max_sequence_length=40,
    )
    rng = np.random.default_rng(0)
    for weight in model.weights:
        if not weight.path.endswith(("gamma", "beta")):
            weight.assign(rng.normal(0, 0.5, weight.shape).astype("float32"))
    return model


def _log_probs(lm, source, prefixes):
    """Uncached forward pass: next-token log-probs `[len(prefixes), V]` of
    each target prefix (start token excluded) for one source. Targets are
    padded to one fixed shape (the decoder is causal) and sources to another
    (right padding, masked), so each backend compiles the forward pass
    once."""
    targets = np.full((4, 8), PAD, "int32")
    for i, prefix in enumerate(prefixes):
        targets[i, : len(prefix) + 1] = [START] + list(prefix)
    sources = np.repeat(_padded([source], 8), len(targets), axis=0)
    logits = to_numpy(
        lm.predict_on_batch(
            {
                "encoder_token_ids": sources,
                "encoder_padding_mask": sources != PAD,
                "decoder_token_ids": targets,
            }
        )
    )
    rows = np.arange(len(prefixes))
    logits = logits[rows, [len(p) for p in prefixes]].astype("float64")
    return logits - np.log(np.exp(logits).sum(-1, keepdims=True))


def _naive_greedy(lm, source, steps, stop=(EOS,)):
    out = []
    for _ in range(steps):
        out.append(int(_log_probs(lm, source, [out])[0].argmax()))
        if out[-1] in stop:
            break
    return out


def _padded(rows, width=None):
    width = width or max(len(r) for r in rows)
    return np.array([list(r) + [PAD] * (width - len(r)) for r in rows], "int32")


def reference_beam_search(
    log_probs, beams, max_new, alpha, style, early_stopping, stop
):
    """Beam search in plain Python with Hugging Face's rules: the best
    `2 * beams` continuations of all beams are ranked; those among the best
    `beams` that end (stop token or last step) are offered to the finished
    set (score / penalty(length)); the best `beams` that do not end go on.
    Returns the finished `(score, tokens)` pairs, best first, and how many
    hypotheses ended with a stop token before the last step."""

    def normalise(score, length):
        base = (5 + length) / 6 if style == "gnmt" else length
        return score / base**alpha

    running, finished, stopped = [(0.0, [])], [], 0
    for step in range(1, max_new + 1):
        rows = log_probs([seq for _, seq in running])
        candidates = [
            (score + lp, seq + [token])
            for (score, seq), row in zip(running, rows)
            for token, lp in enumerate(row)
        ]
        candidates = sorted(candidates, key=lambda c: -c[0])[: 2 * beams]
        last = step == max_new
        ended = [(s, q) for s, q in candidates[:beams] if last or q[-1] in stop]
        stopped += 0 if last else len(ended)
        finished += [(normalise(s, step), q) for s, q in ended]
        finished = sorted(finished, key=lambda c: -c[0])[:beams]
        running = [(s, q) for s, q in candidates if q[-1] not in stop][:beams]
        if len(finished) == beams and not last:
            if early_stopping is True:
                break
            best = max_new if early_stopping == "never" and alpha > 0 else step
            if normalise(running[0][0], best) <= finished[-1][0]:
                break  # no running beam can still enter the finished set
    return finished, stopped


def test_greedy_equals_uncached_argmax_and_stops(lm):
    out = lm.generate(SOURCES, max_new_tokens=6)
    expected = [_naive_greedy(lm, s, 6) for s in SOURCES]
    np.testing.assert_array_equal(out, _padded(expected))
    assert any(len(r) < 6 and r[-1] == EOS for r in expected)  # a row stopped
    free = lm.generate(SOURCES, max_new_tokens=6, stop_token_ids=None)
    expected = [_naive_greedy(lm, s, 6, stop=()) for s in SOURCES]
    np.testing.assert_array_equal(free, _padded(expected))


def test_batched_and_dict_inputs_equal_one_at_a_time(lm):
    for kwargs in (dict(), dict(num_beams=3)):
        batched = lm.generate(SOURCES, max_new_tokens=6, **kwargs)
        alone = [lm.generate([s], max_new_tokens=6, **kwargs)[0] for s in SOURCES]
        np.testing.assert_array_equal(batched, _padded(alone, batched.shape[1]))
    ids = _padded(SOURCES)
    as_dict = {"encoder_token_ids": ids, "encoder_padding_mask": ids != PAD}
    np.testing.assert_array_equal(
        lm.generate(as_dict, max_new_tokens=6, num_beams=3), batched
    )
    # A 1-D array is one source.
    one = lm.generate(np.array(SOURCES[1]), max_new_tokens=6, num_beams=3)
    np.testing.assert_array_equal(one[0], alone[1])


def test_one_beam_equals_greedy(lm):
    for stop in ("auto", None):
        greedy = lm.generate(SOURCES, max_new_tokens=7, stop_token_ids=stop)
        beams, _ = lm.generate(
            SOURCES, max_new_tokens=7, stop_token_ids=stop, return_all_beams=True
        )
        np.testing.assert_array_equal(beams[:, 0], greedy)


@pytest.mark.parametrize(
    "style, alpha, early_stopping, beams",
    [
        ("gnmt", 0.6, True, 3),
        ("power", 1.0, False, 4),
        ("power", 0.0, "never", 3),
        ("gnmt", 2.0, "never", 2),
    ],
)
def test_beam_search_equals_reference(lm, style, alpha, early_stopping, beams):
    max_new = 7
    got, scores = lm.generate(
        SOURCES,
        max_new_tokens=max_new,
        num_beams=beams,
        length_penalty=alpha,
        length_penalty_style=style,
        early_stopping=early_stopping,
        return_all_beams=True,
    )
    best = lm.generate(
        SOURCES,
        max_new_tokens=max_new,
        num_beams=beams,
        length_penalty=alpha,
        length_penalty_style=style,
        early_stopping=early_stopping,
    )
    np.testing.assert_array_equal(best, got[:, 0, : best.shape[1]])
    stopped = 0
    for source, row, row_scores in zip(SOURCES, got, scores):
        expected, row_stopped = reference_beam_search(
            lambda prefixes, source=source: _log_probs(lm, source, prefixes),
            beams,
            max_new,
            alpha,
            style,
            early_stopping,
            stop=(EOS,),
        )
        np.testing.assert_array_equal(
            row, _padded([t for _, t in expected], row.shape[1])
        )
        np.testing.assert_allclose(row_scores, [s for s, _ in expected], atol=1e-4)
        stopped += row_stopped
    assert stopped > 0  # the end token mattered


def test_stop_tokens_end_rows(lm):
    free = lm.generate(SOURCES, max_new_tokens=6, stop_token_ids=None)
    rows_with = {int(t): sum(t in row for row in free) for t in np.unique(free)}
    stop = min(rows_with, key=lambda t: (rows_with[t], t))
    assert rows_with[stop] < len(free)  # it ends some rows only
    out = lm.generate(SOURCES, max_new_tokens=6, stop_token_ids=[stop])
    for row, free_row in zip(out, free):
        hits = np.flatnonzero(free_row == stop)
        end = hits[0] + 1 if len(hits) else len(free_row)
        np.testing.assert_array_equal(row[:end], free_row[:end])
        assert (row[end:] == PAD).all()
    assert out.shape == free.shape and (out == PAD).any()
    beams, _ = lm.generate(
        SOURCES,
        max_new_tokens=6,
        num_beams=3,
        stop_token_ids=[stop],
        return_all_beams=True,
    )
    for hypothesis in beams.reshape(-1, beams.shape[-1]):
        hits = np.flatnonzero(hypothesis == stop)
        assert len(hits) <= 1  # nothing after a stop token but padding
        if len(hits):
            assert (hypothesis[hits[0] + 1 :] == PAD).all()


def test_sampling_is_seeded_and_top_k_1_is_greedy(lm):
    kwargs = dict(max_new_tokens=6, stop_token_ids=None)
    a = lm.generate(SOURCES, sampler="random", seed=3, **kwargs)
    b = lm.generate(SOURCES, sampler="random", seed=3, **kwargs)
    np.testing.assert_array_equal(a, b)
    c = lm.generate(SOURCES, sampler="random", temperature=5.0, seed=4, **kwargs)
    assert not np.array_equal(a, c)
    greedy = lm.generate(SOURCES, **kwargs)
    np.testing.assert_array_equal(
        lm.generate(SOURCES, top_k=1, seed=1, **kwargs), greedy
    )


class LetterTokenizer:
    """Test double: one id per lowercase letter (a -> 3), no end token."""

    eos_token_id = EOS

    def encode(self, text):
        return [3 + (ord(c) - ord("a")) % (VOCAB - 3) for c in text]

    def decode(self, ids, skip_special_tokens=False):
        ids = [i for i in ids if not (skip_special_tokens and i < 3)]
        return "".join(chr(ord("a") + i - 3) for i in ids)


# Four texts and three beams: the shapes and settings of
# test_batched_and_dict_inputs_equal_one_at_a_time, whose compiled loops serve.
TEXTS = ["abc", "hello", "xyz", "keras"]


def test_text_inputs_append_the_end_token_and_decode(lm):
    lm.tokenizer = LetterTokenizer()
    try:
        texts = lm.generate(TEXTS, max_new_tokens=5, num_beams=3)
        single = lm.generate("abc", max_new_tokens=5, num_beams=3)
    finally:
        lm.tokenizer = None
    tokenizer = LetterTokenizer()
    sources = [tokenizer.encode(t) + [EOS] for t in TEXTS]
    ids = lm.generate(sources, max_new_tokens=5, num_beams=3)
    assert texts == [tokenizer.decode(r, skip_special_tokens=True) for r in ids]
    assert single == texts[0]


def test_generate_errors(lm):
    cases = [
        (dict(inputs=[]), "empty"),
        (dict(inputs=[[]]), "empty"),
        (dict(inputs=[[3, 10_000]]), "outside"),
        (dict(inputs=[[3] * 41]), "max_sequence_length"),
        (dict(max_new_tokens=40), "max_sequence_length"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(num_beams=0), "num_beams"),
        (dict(inputs="hello"), "tokenizer"),
        (dict(num_beams=2, sampler="random"), "num_beams=2"),
        (dict(num_beams=2, top_p=0.9), "Beam search"),
        (dict(num_beams=2, length_penalty_style="linear"), "length_penalty_style"),
        (dict(num_beams=2, early_stopping="sometimes"), "early_stopping"),
        (dict(start_token_id=VOCAB), "start_token_id"),
        (dict(inputs={"token_ids": np.ones((1, 3), "int32")}), "encoder_token_ids"),
        (dict(sampler="top_p", top_p=2.0), "top_p"),
    ]
    for overrides, match in cases:
        kwargs = dict(inputs=[[3, 4, EOS]], max_new_tokens=4) | overrides
        with pytest.raises(ValueError, match=match):
            lm.generate(kwargs.pop("inputs"), **kwargs)


def test_generation_functions_are_cached_on_the_model(lm):
    lm.generate(SOURCES[:1], max_new_tokens=3, num_beams=3)
    count = len(lm._generate_functions)
    lm.generate(SOURCES, max_new_tokens=4, num_beams=3)  # same buckets
    assert len(lm._generate_functions) == count


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    """A random `MarianMTModel` (vocab 100, pad 99 = decoder start, eos 0)
    and its conversion (saved with `save_pretrained`, loaded with
    `Seq2SeqLM.from_preset`). Weights are larger than HF's init, so the
    distributions are far from ties, and the end token's logit bias is
    raised, so that hypotheses end at different lengths."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.MarianConfig(
        vocab_size=100,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        pad_token_id=99,
        eos_token_id=0,
        decoder_start_token_id=99,
        activation_function="relu",
        scale_embedding=True,
    )
    torch.manual_seed(0)
    model = transformers.MarianMTModel(config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" not in name:  # fixed sinusoidal tables
                noise = torch.randn(p.shape, generator=generator)
                is_scale = "layer_norm.weight" in name
                p.copy_(1 + 0.2 * noise if is_scale else 0.3 * noise)
        model.final_logits_bias[0, 0] = 6.0
    directory = tmp_path_factory.mktemp("marian")
    model.eval().save_pretrained(directory)
    return model, Seq2SeqLM.from_preset(str(directory))


@pytest.mark.parametrize(
    "alpha, early_stopping", [(1.0, True), (1.0, False), (1.0, "never"), (0.6, True)]
)
def test_beam_search_matches_hugging_face_marian(marian, alpha, early_stopping):
    torch = pytest.importorskip("torch")
    hf, ours = marian
    assert ours.config.bos_token_id == 99  # Marian starts from the pad id
    rng = np.random.default_rng(0)
    sources = [list(rng.integers(1, 98, n)) + [0] for n in (3, 9, 5, 12, 1, 7)]
    ids = np.full((len(sources), 13), 99)
    for i, source in enumerate(sources):
        ids[i, : len(source)] = source
    # Marian's generation config forces the end token at the last position
    # (`forced_eos_token_id`), on both sides; every other logits processor
    # (bad words, min length, repetition penalties, ...) is off by default.
    assert ours.generation_config.forced_eos_token_id == 0
    expected = hf.generate(
        torch.tensor(ids),
        attention_mask=torch.tensor(ids != 99),
        num_beams=4,
        max_new_tokens=10,
        length_penalty=alpha,
        early_stopping=early_stopping,
        do_sample=False,
        num_return_sequences=1,
    ).numpy()[:, 1:]  # drop the start token
    got = ours.generate(
        sources,
        num_beams=4,
        max_new_tokens=10,
        length_penalty=alpha,
        length_penalty_style="power",
        early_stopping=early_stopping,
    )
    np.testing.assert_array_equal(got, expected)
    lengths = (expected != 99).sum(axis=1)
    assert (expected[:, -1] == 0).any() or lengths.min() < 10  # forced or early ends
    if early_stopping != "never":  # "never" may run every row to the limit
        assert lengths.min() < 10  # some beams ended early
