"""QA metrics: exact match, token F1, cover-EM and substring accuracy, over gold aliases.

Published tables in this field differ in how text is normalised before comparing, so the
normaliser is a named choice (see :data:`NORMALIZERS`):

``squad``
    Lower case, drop punctuation, drop the articles *a/an/the*, collapse whitespace. The
    SQuAD/HotpotQA convention, used by FlashRAG and most papers.
``r1searcher``
    As R1-Searcher's evaluation computes it: underscores and punctuation (including the quote
    marks ‘ ’ ´ `) become spaces instead of vanishing, and a bare ``True``/``False`` answer
    reads as ``yes``/``no`` (applied to prediction and gold alike, before normalising).

Metrics (each the max over the gold aliases, 0.0 or 1.0 except F1):

``em``        normalised prediction == normalised gold
``f1``        token-level F1; a yes/no/noanswer on either side that differs scores 0
``cover_em``  every normalised gold token occurs in the normalised prediction (R1-Searcher's ACC_R)
``acc``       normalised gold is a substring of the normalised prediction (FlashRAG's ``acc``)

>>> qa_scores("The Eiffel Tower!", ["Eiffel Tower"])
{'em': 1.0, 'f1': 1.0, 'cover_em': 1.0, 'acc': 1.0}
>>> round(f1_score("Paris, France", ["Paris"]), 4)
0.6667
>>> exact_match("True", ["yes"], normalization="r1searcher"), exact_match("True", ["yes"])
(1.0, 0.0)
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Callable, Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = frozenset(string.punctuation)
_PUNCT_R1 = frozenset(string.punctuation + "‘’´`")
_YES_NO = ("yes", "no", "noanswer")


def normalize_squad(text: str) -> str:
    """Lower case, remove punctuation, remove articles, collapse whitespace.

    >>> normalize_squad("  The  U.S. Open's  final ")
    'us opens final'
    """
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def normalize_r1searcher(text: str) -> str:
    """R1-Searcher's normaliser: punctuation, quote marks and underscores become spaces.

    >>> normalize_r1searcher("The U.S._Open's final")
    'u s open s final'
    >>> normalize_r1searcher("False")
    'no'
    """
    text = _bool_to_yes_no(text)
    text = text.replace("_", " ").lower()
    text = "".join(" " if ch in _PUNCT_R1 else ch for ch in text)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _bool_to_yes_no(text: str) -> str:
    return {"True": "yes", "False": "no"}.get(text, text)


NORMALIZERS: dict[str, Callable[[str], str]] = {
    "squad": normalize_squad,
    "r1searcher": normalize_r1searcher,
}


def get_normalizer(name: str) -> Callable[[str], str]:
    try:
        return NORMALIZERS[name]
    except KeyError:
        raise ValueError(f"unknown normalization {name!r}; choose one of {sorted(NORMALIZERS)}") from None


# ---- single-pair metrics on normalised strings ------------------------------------------------
def _em(pred: str, gold: str) -> float:
    return float(pred == gold)


def _f1(pred: str, gold: str) -> float:
    if (pred in _YES_NO or gold in _YES_NO) and pred != gold:
        return 0.0
    pred_tokens, gold_tokens = pred.split(), gold.split()
    common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision = common / len(pred_tokens)
    recall = common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _cover_em(pred: str, gold: str) -> float:
    pred_tokens = set(pred.split(" "))
    return float(all(tok in pred_tokens for tok in gold.split(" ")))


def _acc(pred: str, gold: str) -> float:
    return float(gold in pred)


_PAIR_METRICS: dict[str, Callable[[str, str], float]] = {
    "em": _em,
    "f1": _f1,
    "cover_em": _cover_em,
    "acc": _acc,
}
METRIC_NAMES: tuple[str, ...] = tuple(_PAIR_METRICS)


def _as_golds(golds: str | Sequence[str]) -> list[str]:
    return [golds] if isinstance(golds, str) else [str(g) for g in golds]


def _max_over_golds(metric: str, prediction: str, golds: str | Sequence[str], normalization: str) -> float:
    norm = get_normalizer(normalization)
    pred = norm(prediction or "")
    fn = _PAIR_METRICS[metric]
    return max((fn(pred, norm(g)) for g in _as_golds(golds)), default=0.0)


def exact_match(prediction: str, golds: str | Sequence[str], normalization: str = "squad") -> float:
    return _max_over_golds("em", prediction, golds, normalization)


def f1_score(prediction: str, golds: str | Sequence[str], normalization: str = "squad") -> float:
    return _max_over_golds("f1", prediction, golds, normalization)


def cover_em(prediction: str, golds: str | Sequence[str], normalization: str = "squad") -> float:
    return _max_over_golds("cover_em", prediction, golds, normalization)


def substring_acc(prediction: str, golds: str | Sequence[str], normalization: str = "squad") -> float:
    return _max_over_golds("acc", prediction, golds, normalization)


def qa_scores(prediction: str, golds: str | Sequence[str], normalization: str = "squad") -> dict[str, float]:
    """All four metrics for one prediction, each the max over the gold aliases."""
    return {m: _max_over_golds(m, prediction, golds, normalization) for m in METRIC_NAMES}


def batch_qa_scores(
    predictions: Sequence[str],
    golds: Sequence[str | Sequence[str]],
    normalization: str = "squad",
) -> dict[str, list[float]]:
    """Per-example metrics for a batch: ``{"em": [...], "f1": [...], ...}``."""
    if len(predictions) != len(golds):
        raise ValueError(f"{len(predictions)} predictions but {len(golds)} gold lists")
    rows = [qa_scores(p, g, normalization) for p, g in zip(predictions, golds)]
    return {m: [r[m] for r in rows] for m in METRIC_NAMES}


def mean_percent(values: Sequence[float]) -> float:
    """Mean of 0-1 scores in percent, rounded to 0.1 as the papers print it."""
    return round(100.0 * sum(values) / len(values), 1) if values else 0.0
