"""Answer correctness: rule metrics (from :mod:`r3rag.metrics`) and rule-or-judge correctness.

``answer_scores`` gives the configured metric (em, f1, cover_em or acc, max over gold aliases)
of each trajectory's final answer; no answer scores 0.

Hedge guard (on by default): the containment metrics (cover_em, acc) pay for any prediction that
*contains* a gold answer, so listing many candidates would collect them (R1-Searcher's
ablation shows cover-EM rewards being gamed this way). With the guard, a containment match counts
only if the normalised prediction has at most ``max_extra_tokens`` tokens more than the matched
gold (default 1: "Paris, France" still matches "Paris") and does not hedge with the word "or"
(unless the gold itself has it). A two-candidate comma list ("Paris, Lyon") is indistinguishable
from a qualified answer by rule and still matches: the shipped recipes therefore reward em
(R3-RAG, with the judge as fallback) or f1 (R1-Searcher), whose precision term punishes lists.

``correctness`` is R3-RAG's outcome test: correct when the rule score reaches
``correct_threshold``; otherwise, with ``judge_fallback``, the LLM judge decides. A judge
failure leaves the value ``None`` with the failure status, for the recipe's failure policy.

>>> from r3rag.rollout.trajectory import Trajectory, Step
>>> t = Trajectory("q", "Capital?", "r3rag_steps", steps=[Step(0, answer="Paris, London, Rome")], golden_answers=["Paris"])
>>> answer_scores([t], AnswerConfig(metric="cover_em", hedge_guard=False)), answer_scores([t], AnswerConfig(metric="cover_em"))
([1.0], [0.0])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

from r3rag.config import Section
from r3rag.metrics import exact_match, f1_score, get_normalizer, qa_scores
from r3rag.rewards.judge.client import JudgeClient
from r3rag.rollout.trajectory import Trajectory

Metric = Literal["em", "f1", "cover_em", "acc"]
_CONTAINMENT = frozenset({"cover_em", "acc"})


class AnswerConfig(Section):
    metric: Metric = "em"
    normalization: Literal["squad", "r1searcher"] = "squad"
    hedge_guard: bool = True
    max_extra_tokens: int = 1
    correct_threshold: float = 1.0
    judge_fallback: bool = False


def is_hedged(prediction: str, gold: str, normalization: str = "squad", max_extra_tokens: int = 1) -> bool:
    """True when ``prediction`` is too long for ``gold`` or hedges with "or".

    >>> is_hedged("Paris, France", "Paris"), is_hedged("Paris or Lyon", "Paris"), is_hedged("Paris, Lyon, Nice", "Paris")
    (False, True, True)
    """
    norm = get_normalizer(normalization)
    pred, ref = norm(prediction).split(), norm(gold).split()
    if len(pred) > len(ref) + max_extra_tokens:
        return True
    return "or" in pred and "or" not in ref


def answer_score(prediction: str | None, golds: Sequence[str], cfg: AnswerConfig) -> float:
    """The configured metric for one prediction (0.0 for no answer)."""
    if prediction is None or not golds:
        return 0.0
    if cfg.metric == "em":
        return exact_match(prediction, golds, cfg.normalization)
    if cfg.metric == "f1":
        return f1_score(prediction, golds, cfg.normalization)
    best = 0.0
    for gold in golds:
        value = qa_scores(prediction, [gold], cfg.normalization)[cfg.metric]
        if value and cfg.hedge_guard and is_hedged(prediction, gold, cfg.normalization, cfg.max_extra_tokens):
            value = 0.0
        best = max(best, value)
    return best


def answer_scores(trajs: Sequence[Trajectory], cfg: AnswerConfig) -> list[float]:
    """Batched :func:`answer_score` of each trajectory's final answer against its gold answers."""
    return [answer_score(t.answer, t.golden_answers, cfg) for t in trajs]


@dataclass
class Correctness:
    """Whether the final answer is correct: ``value`` 1.0/0.0, or None when the judge failed."""

    value: float | None
    source: str  # "rule", "judge", "no_answer", or "rule" when no judge was asked
    status: str = "ok"  # the judge status when source == "judge"
    rule_score: float = 0.0


def correctness(
    trajs: Sequence[Trajectory], cfg: AnswerConfig, judge: JudgeClient | None = None
) -> list[Correctness]:
    """Rule match, else (``judge_fallback``) the judge, one batched judge call for the batch."""
    out: list[Correctness] = []
    ask: list[int] = []
    for t in trajs:
        if t.answer is None or not t.answer.strip():
            out.append(Correctness(0.0, "no_answer"))
            continue
        score = answer_score(t.answer, t.golden_answers, cfg)
        if score >= cfg.correct_threshold:
            out.append(Correctness(1.0, "rule", rule_score=score))
        else:
            out.append(Correctness(0.0, "rule", rule_score=score))
            if cfg.judge_fallback and judge is not None:
                ask.append(len(out) - 1)
    if ask and judge is not None:
        requests = [judge.correctness_request(trajs[i].question, trajs[i].answer or "", trajs[i].golden_answers) for i in ask]
        for i, res in zip(ask, judge.judge(requests)):
            out[i] = Correctness(res.value, "judge", res.status, out[i].rule_score)
    return out
