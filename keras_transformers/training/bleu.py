"""BLEU (Papineni et al., 2002) as reported by sacreBLEU, in pure Python.

`corpus_bleu` reproduces `sacrebleu.corpus_bleu` (version 2, default
settings: the `13a` tokenizer of WMT's `mteval-v13a.pl`, exponential
smoothing, 4-gram precisions, case-sensitive) to floating-point precision, so
scores are comparable with published WMT numbers without depending on
sacreBLEU. `sentence_bleu` is the per-sentence variant (effective order on,
as in `sacrebleu.sentence_bleu`).

Detokenized text goes in (what a model's detokenizer produces); the metric
does its own tokenization, so never pre-tokenize hypotheses or references.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
from collections import Counter
from collections.abc import Sequence

# mteval-v13a splits off every ASCII symbol except the apostrophe, the hyphen
# and the period / comma (handled by the rules that follow). The class is
# written as the code-point ranges of mteval: `{`-`~`, `[`-backtick,
# space-`&`, `(`-`+`, `:`-`@`, and `/`.
_SYMBOL = re.compile(r"([{-~\[-` -&(-+:-@/])")
_PERIOD_COMMA_AFTER_NON_DIGIT = re.compile(r"([^0-9])([.,])")
_PERIOD_COMMA_BEFORE_NON_DIGIT = re.compile(r"([.,])([^0-9])")
_DASH_AFTER_DIGIT = re.compile(r"([0-9])(-)")
_HTML_ENTITIES = (("&quot;", '"'), ("&amp;", "&"), ("&lt;", "<"), ("&gt;", ">"))

_SMOOTH_DEFAULTS = {"none": None, "floor": 0.1, "add-k": 1.0, "exp": None}
_TOKENIZERS = ("13a", "none")
# sacreBLEU's floor for log(0); any zero precision gives a score of 0.
_LOG_ZERO = -9999999999.0


def tokenize_13a(line: str) -> str:
    """Tokenizes one detokenized segment like `mteval-v13a.pl` (WMT).

    Removes `<skipped>`, joins lines broken after a hyphen, unescapes
    `&quot; &amp; &lt; &gt;`, splits off ASCII punctuation and symbols, splits
    periods and commas except inside numbers (`3.14`, `1,000` stay whole),
    splits a hyphen that follows a digit, and collapses whitespace. Letters,
    including accented and non-Latin ones, are never split.

    Args:
        line: one segment (a sentence), any unicode.

    Returns:
        The tokens joined by single spaces, with no leading or trailing space.

    Examples:
        >>> tokenize_13a("Hello, world! It's 3.14 (pi) -- l'été 2-3.")
        "Hello , world ! It's 3.14 ( pi ) -- l'été 2 - 3 ."
    """
    line = line.replace("<skipped>", "").replace("-\n", "").replace("\n", " ")
    if "&" in line:
        for entity, char in _HTML_ENTITIES:
            line = line.replace(entity, char)
    line = _SYMBOL.sub(r" \1 ", f" {line} ")
    line = _PERIOD_COMMA_AFTER_NON_DIGIT.sub(r"\1 \2 ", line)
    line = _PERIOD_COMMA_BEFORE_NON_DIGIT.sub(r" \1 \2", line)
    line = _DASH_AFTER_DIGIT.sub(r"\1 \2 ", line)
    return " ".join(line.split())


@dataclasses.dataclass(frozen=True)
class BleuScore:
    """The result of `corpus_bleu` / `sentence_bleu`.

    Attributes:
        score: BLEU in `[0, 100]`.
        precisions: the (smoothed) n-gram precisions in percent, one per order
            `1..max_ngram_order`; orders past the longest hypothesis are 0.
        brevity_penalty: `exp(1 - r / c)` when the hypotheses are shorter
            than the references (`c < r`), else 1; 0 when `c == 0`.
        hypothesis_length: `c`, the total number of hypothesis tokens.
        reference_length: `r`, the total of the closest reference lengths.
        counts: clipped n-gram matches per order (before any add-k smoothing).
        totals: hypothesis n-grams per order (before any add-k smoothing).
    """

    score: float
    precisions: tuple[float, ...]
    brevity_penalty: float
    hypothesis_length: int
    reference_length: int
    counts: tuple[int, ...]
    totals: tuple[int, ...]

    def __float__(self) -> float:
        return self.score


def _ngrams(tokens: list[str], max_order: int) -> Counter:
    """Counts every n-gram (as a tuple) of order `1..max_order`."""
    return Counter(
        tuple(tokens[i : i + n])
        for n in range(1, max_order + 1)
        for i in range(len(tokens) - n + 1)
    )


def _closest_length(hypothesis_length: int, lengths: list[int]) -> int:
    """The reference length closest to the hypothesis; the shorter on a tie."""
    return min(lengths, key=lambda r: (abs(hypothesis_length - r), r))


def _check_options(
    tokenize: str, smooth: str, smooth_value: float | None, max_ngram_order: int
) -> float | None:
    """Validates the shared options and returns the resolved smooth value."""
    if tokenize not in _TOKENIZERS:
        raise ValueError(
            f"`tokenize` must be one of {_TOKENIZERS}. Received: tokenize={tokenize!r}"
        )
    if smooth not in _SMOOTH_DEFAULTS:
        raise ValueError(
            f"`smooth` must be one of {tuple(_SMOOTH_DEFAULTS)}. "
            f"Received: smooth={smooth!r}"
        )
    if (
        isinstance(max_ngram_order, bool)
        or not isinstance(max_ngram_order, numbers.Integral)
        or max_ngram_order < 1
    ):
        raise ValueError(
            "`max_ngram_order` must be an integer >= 1. "
            f"Received: max_ngram_order={max_ngram_order!r}"
        )
    if smooth_value is None:
        return _SMOOTH_DEFAULTS[smooth]
    if (
        isinstance(smooth_value, bool)
        or not isinstance(smooth_value, numbers.Real)
        or not smooth_value > 0
    ):
        raise ValueError(
            "`smooth_value` must be a number > 0 or None. "
            f"Received: smooth_value={smooth_value!r}"
        )
    return float(smooth_value)


def _as_reference_list(index: int, references: str | Sequence[str]) -> list[str]:
    """One hypothesis' references as a non-empty list of strings."""
    refs = [references] if isinstance(references, str) else references
    ok = isinstance(refs, Sequence) and len(refs) > 0
    if not ok or not all(isinstance(r, str) for r in refs):
        raise ValueError(
            "Each element of `references` must be a string or a non-empty "
            f"sequence of strings. Received at index {index}: {references!r}"
        )
    return list(refs)


def _statistics(
    hypotheses: Sequence[str],
    references: Sequence[str | Sequence[str]],
    tokenize: str,
    lowercase: bool,
    max_order: int,
) -> tuple[int, int, list[int], list[int]]:
    """Corpus sufficient statistics: `(c, r, matches per order, totals)`."""
    if isinstance(hypotheses, str) or not isinstance(hypotheses, Sequence):
        raise ValueError(
            "`hypotheses` must be a sequence of strings (one per segment). "
            f"Received: {type(hypotheses).__name__}"
        )
    if not isinstance(references, Sequence) or len(references) != len(hypotheses):
        count = len(references) if isinstance(references, Sequence) else references
        raise ValueError(
            "`references` must hold one entry per hypothesis "
            f"({len(hypotheses)}). Received: {count!r}"
        )

    def prepare(text: str) -> list[str]:
        text = (text.lower() if lowercase else text).rstrip()
        return (tokenize_13a(text) if tokenize == "13a" else text).split()

    hyp_len = ref_len = 0
    matches, totals = [0] * max_order, [0] * max_order
    for index, (hypothesis, refs) in enumerate(zip(hypotheses, references)):
        if not isinstance(hypothesis, str):
            raise ValueError(
                "Each hypothesis must be a string. "
                f"Received at index {index}: {hypothesis!r}"
            )
        ref_counts: Counter = Counter()
        lengths = []
        for reference in _as_reference_list(index, refs):
            tokens = prepare(reference)
            lengths.append(len(tokens))
            for ngram, count in _ngrams(tokens, max_order).items():
                ref_counts[ngram] = max(ref_counts[ngram], count)
        tokens = prepare(hypothesis)
        hyp_len += len(tokens)
        ref_len += _closest_length(len(tokens), lengths)
        for ngram, count in _ngrams(tokens, max_order).items():
            totals[len(ngram) - 1] += count
            matches[len(ngram) - 1] += min(count, ref_counts[ngram])
    return hyp_len, ref_len, matches, totals


def _score(
    hyp_len: int,
    ref_len: int,
    matches: list[int],
    totals: list[int],
    smooth: str,
    smooth_value: float | None,
    effective_order: bool,
) -> BleuScore:
    """BLEU from sufficient statistics, with sacreBLEU's smoothing rules."""
    order = len(matches)
    if hyp_len < ref_len:
        bp = math.exp(1.0 - ref_len / hyp_len) if hyp_len > 0 else 0.0
    else:
        bp = 1.0
    precisions = [0.0] * order
    score = 0.0
    if any(matches):
        used, halvings = order, 1.0
        for n in range(order):
            match, total = float(matches[n]), float(totals[n])
            if smooth == "add-k" and n > 0:
                match, total = match + smooth_value, total + smooth_value
            if total == 0:
                break
            if effective_order:
                used = n + 1
            if match > 0:
                precisions[n] = 100.0 * match / total
            elif smooth == "exp":
                halvings *= 2.0
                precisions[n] = 100.0 / (halvings * total)
            elif smooth == "floor":
                precisions[n] = 100.0 * smooth_value / total
        logs = [math.log(p) if p > 0 else _LOG_ZERO for p in precisions[:used]]
        score = bp * math.exp(sum(logs) / used)
    return BleuScore(
        score=score,
        precisions=tuple(precisions),
        brevity_penalty=bp,
        hypothesis_length=hyp_len,
        reference_length=ref_len,
        counts=tuple(matches),
        totals=tuple(totals),
    )


def corpus_bleu(
    hypotheses: Sequence[str],
    references: Sequence[str | Sequence[str]],
    tokenize: str = "13a",
    lowercase: bool = False,
    smooth: str = "exp",
    smooth_value: float | None = None,
    max_ngram_order: int = 4,
    effective_order: bool = False,
) -> BleuScore:
    """Corpus-level BLEU, equal to `sacrebleu.corpus_bleu` with the same options.

    n-gram matches and lengths are summed over all segments before the
    precisions and brevity penalty are taken (this is not an average of
    sentence scores). With several references, each n-gram's count is
    clipped by its largest count in any one reference, and the reference
    length is the one closest to the hypothesis length (the shorter on ties).

    Args:
        hypotheses: `N` detokenized system outputs.
        references: `N` entries; entry `i` is the reference string of
            `hypotheses[i]`, or a non-empty sequence of reference strings
            (the number may vary per segment). Note this is per-segment:
            sacreBLEU's `[refs_1, refs_2]` streams are the transpose.
        tokenize: `"13a"` (default, `tokenize_13a`) or `"none"` (split on
            whitespace only).
        lowercase: compare lowercased text.
        smooth: `"exp"` (default; mteval's: the k-th order with no match
            gets precision `1 / (2**k * total)`), `"floor"` (zero matches
            count as `smooth_value`, default 0.1), `"add-k"` (add
            `smooth_value`, default 1, to matches and totals of orders >= 2)
            or `"none"`.
        smooth_value: the value for `"floor"` / `"add-k"`; None for defaults.
        max_ngram_order: highest n-gram order (default 4).
        effective_order: average only the orders up to the longest n-gram
            the hypotheses contain (for very short segments).

    Returns:
        A `BleuScore`; `score` is in `[0, 100]`.

    Examples:
        >>> result = corpus_bleu(["The cat sat on the mat."],
        ...                      ["The cat sat on the red mat."])
        >>> round(result.score, 2), result.hypothesis_length, result.reference_length
        (61.3, 7, 8)
    """
    smooth_value = _check_options(tokenize, smooth, smooth_value, max_ngram_order)
    stats = _statistics(
        hypotheses, references, tokenize, bool(lowercase), int(max_ngram_order)
    )
    return _score(*stats, smooth, smooth_value, bool(effective_order))


def sentence_bleu(
    hypothesis: str,
    references: str | Sequence[str],
    tokenize: str = "13a",
    lowercase: bool = False,
    smooth: str = "exp",
    smooth_value: float | None = None,
    max_ngram_order: int = 4,
    effective_order: bool = True,
) -> BleuScore:
    """BLEU of one segment, equal to `sacrebleu.sentence_bleu`.

    BLEU is a corpus metric: averaging sentence scores does not give the
    corpus score. Use this for per-example inspection, and `corpus_bleu` to
    report results. Effective order is on by default, as in sacreBLEU.

    Args:
        hypothesis: one detokenized system output.
        references: its reference string, or a non-empty sequence of them.
        tokenize, lowercase, smooth, smooth_value, max_ngram_order,
            effective_order: as in `corpus_bleu`.

    Returns:
        A `BleuScore`.

    Examples:
        >>> result = sentence_bleu("the quick brown fox",
        ...                        ["the quick fox jumped", "a brown fox"])
        >>> round(result.score, 2), result.counts
        (45.18, (4, 2, 0, 0))
    """
    if not isinstance(hypothesis, str):
        raise ValueError(
            f"`hypothesis` must be a string. Received: hypothesis={hypothesis!r}"
        )
    return corpus_bleu(
        [hypothesis],
        [references],
        tokenize=tokenize,
        lowercase=lowercase,
        smooth=smooth,
        smooth_value=smooth_value,
        max_ngram_order=max_ngram_order,
        effective_order=effective_order,
    )
