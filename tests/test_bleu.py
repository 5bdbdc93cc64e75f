"""BLEU (`corpus_bleu`, `sentence_bleu`, `tokenize_13a`, `BleuScore` results)
against sacreBLEU (a test-only dependency; the package never
imports it): random corpora, edge cases, options, several references."""

import random

import numpy as np
import pytest
import sacrebleu
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

from keras_transformers.training import (
    BleuScore,
    corpus_bleu,
    sentence_bleu,
    tokenize_13a,
)

WORDS = (
    "the a cat dog sat on mat . , ! ? ; : it's don't l'homme été déjà garçon "
    "naïve Übermensch «bonjour» — -- 3.14 1,000 2-3 5,5 state-of-the-art e-mail "
    "U.S.A. ... (test) [1] {x} a/b $5 100% x+y=z &amp; &quot;quoted&quot; "
    "&lt;tag&gt; end. hello, world! 中文 naïveté ça « » ' \" `code` ~ ^ | @ # * "
    "Mr. 12. .5 3,"
).split()

EDGE_CASES = [
    ("", "The cat sat."),
    ("", ""),
    ("cat", "The cat sat on the mat."),
    ("The cat", "The cat sat on the mat."),
    ("The cat sat on the mat.", "The cat sat on the mat."),
    ("Le garçon a déjà mangé à l'école.", "Le garçon a mangé à l'école déjà."),
    ("Ça coûte 3,50 € (environ).", "Ça coûte 3,50 €, environ."),
    ("He said &quot;no&quot; &amp; left.", 'He said "no" & left.'),
    ("line one-\nline two\n", "line oneline two"),
    ("<skipped> skipped text", "skipped text"),
    ("Version 2.0-beta, 10-20 items.", "Version 2.0 - beta, 10 - 20 items."),
    ("   spaced    out   ", "spaced out"),
    ("completely different words here", "nothing in common at all"),
]


def sacre_streams(references):
    """Per-segment references -> sacreBLEU's reference streams (None padded)."""
    per_segment = [[r] if isinstance(r, str) else list(r) for r in references]
    width = max(len(r) for r in per_segment)
    return [
        [refs[j] if j < len(refs) else None for refs in per_segment]
        for j in range(width)
    ]


def assert_same(ours, theirs):
    assert isinstance(ours, BleuScore)
    np.testing.assert_allclose(ours.score, theirs.score, rtol=0, atol=1e-6)
    np.testing.assert_allclose(ours.precisions, theirs.precisions, atol=1e-9)
    np.testing.assert_allclose(ours.brevity_penalty, theirs.bp, atol=1e-12)
    assert ours.hypothesis_length == theirs.sys_len
    assert ours.reference_length == theirs.ref_len


def random_pairs(seed, count):
    """Reference sentences from WORDS and noisy hypotheses made from them."""
    rnd = random.Random(seed)
    pairs = []
    for _ in range(count):
        ref = [rnd.choice(WORDS) for _ in range(rnd.randint(1, 14))]
        hyp = list(ref)
        for _ in range(rnd.randint(0, 4)):
            op, i = rnd.random(), rnd.randrange(max(len(hyp), 1))
            if op < 0.3 and hyp:
                del hyp[i]
            elif op < 0.6 and hyp:
                hyp[i] = rnd.choice(WORDS)
            elif op < 0.8:
                hyp.insert(i, rnd.choice(WORDS))
            elif len(hyp) > 1:
                hyp = hyp[: rnd.randint(0, 3)]  # a very short hypothesis
        glue = "" if rnd.random() < 0.2 else " "  # sometimes no space
        pairs.append((glue.join(hyp) if len(hyp) < 3 else " ".join(hyp), " ".join(ref)))
    return pairs


def test_tokenize_13a_matches_sacrebleu():
    reference = Tokenizer13a()
    lines = [h for pair in EDGE_CASES + random_pairs(1, 200) for h in pair]
    lines += ["a.b,c 1.2,3 x.1 .y 1-a a-1 -1 1- (.) ,5 5, 'q' \"q\" \\ {|}~"]
    for line in lines:
        assert tokenize_13a(line) == reference(line), line


def test_corpus_bleu_matches_sacrebleu_on_random_corpora():
    pairs = random_pairs(0, 300)
    for start in range(0, 300, 30):  # ten corpora of 30 segments
        hyps, refs = zip(*pairs[start : start + 30])
        assert_same(corpus_bleu(hyps, refs), sacrebleu.corpus_bleu(hyps, [refs]))
    hyps, refs = zip(*pairs)
    ours = corpus_bleu(list(hyps), list(refs))
    assert_same(ours, sacrebleu.corpus_bleu(hyps, [refs]))
    assert 5 < ours.score < 95  # a realistic, non-degenerate corpus


def test_sentence_bleu_matches_sacrebleu():
    for hyp, ref in random_pairs(2, 150) + EDGE_CASES:
        assert_same(sentence_bleu(hyp, ref), sacrebleu.sentence_bleu(hyp, [ref]))
        assert_same(
            sentence_bleu(hyp, [ref], effective_order=False),
            sacrebleu.sentence_bleu(hyp, [ref], use_effective_order=False),
        )


def test_edge_cases_and_options_match_sacrebleu():
    hyps, refs = zip(*EDGE_CASES)
    assert_same(corpus_bleu(hyps, refs), sacrebleu.corpus_bleu(hyps, [refs]))
    all_empty = corpus_bleu(["", ""], ["a b", "c"])
    assert all_empty.score == 0.0 and all_empty.brevity_penalty == 0.0
    pairs = random_pairs(3, 40)
    hyps, refs = zip(*pairs)
    options = [
        {"lowercase": True},
        {"tokenize": "none"},
        {"smooth_method": "none"},
        {"smooth_method": "floor"},
        {"smooth_method": "floor", "smooth_value": 0.3},
        {"smooth_method": "add-k"},
        {"smooth_method": "add-k", "smooth_value": 2},
        {"use_effective_order": True},
    ]
    for theirs in options:
        ours = dict(theirs)
        if "smooth_method" in ours:
            ours["smooth"] = ours.pop("smooth_method")
        if "use_effective_order" in ours:
            ours["effective_order"] = ours.pop("use_effective_order")
        for subset in (slice(0, 3), slice(None)):
            assert_same(
                corpus_bleu(hyps[subset], refs[subset], **ours),
                sacrebleu.corpus_bleu(hyps[subset], [refs[subset]], **theirs),
            )


def test_multiple_references_match_sacrebleu():
    rnd = random.Random(4)
    pairs = random_pairs(5, 60)
    hyps = [h for h, _ in pairs]
    refs = []
    for _, ref in pairs:  # 1 to 3 references per segment
        extra = [" ".join(rnd.sample(WORDS, rnd.randint(1, 8))) for _ in range(2)]
        refs.append([ref] + extra[: rnd.randint(0, 2)])
    assert_same(
        corpus_bleu(hyps, refs), sacrebleu.corpus_bleu(hyps, sacre_streams(refs))
    )
    # Closest reference length, ties going to the shorter one.
    result = corpus_bleu(["a b c"], [["a b c d", "a b"]])
    assert result.reference_length == 2
    assert_same(result, sacrebleu.corpus_bleu(["a b c"], [["a b c d"], ["a b"]]))


def test_bleu_validation():
    with pytest.raises(ValueError, match="sequence of strings"):
        corpus_bleu("a b", ["a b"])
    with pytest.raises(ValueError, match="one entry per hypothesis"):
        corpus_bleu(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="index 1"):
        corpus_bleu(["a", "b"], ["a", []])
    with pytest.raises(ValueError, match="index 0"):
        corpus_bleu([None], ["a"])
    with pytest.raises(ValueError, match="Received: tokenize='intl'"):
        corpus_bleu(["a"], ["a"], tokenize="intl")
    with pytest.raises(ValueError, match="Received: smooth='add-one'"):
        corpus_bleu(["a"], ["a"], smooth="add-one")
    with pytest.raises(ValueError, match="Received: max_ngram_order=0"):
        corpus_bleu(["a"], ["a"], max_ngram_order=0)
    with pytest.raises(ValueError, match="Received: smooth_value=0"):
        corpus_bleu(["a"], ["a"], smooth="floor", smooth_value=0)
    with pytest.raises(ValueError, match="Received: hypothesis=3"):
        sentence_bleu(3, "a")
    assert float(sentence_bleu("a b c d", "a b c d")) == pytest.approx(100.0)
