"""Training prompts a policy can score on by guessing, and the option to leave them out of RL.

A yes/no question, or a two-way choice ("Which was founded first, A or B?") whose answer is one
of the options named in the question, pays a correct answer half the time to a policy that does
not reason at all. With group-normalised advantages such a question is seldom filtered as "every
sample scored the same" (four fair coin flips agree one time in eight), so it supplies a large
share of the kept groups, and what their advantages reward is whichever guess came up: the update
moves a shared answer prior ("yes" more often) rather than the reasoning behind it. Leaving them
out of the RL prompts is a data-curation choice several RL-with-verifiable-rewards recipes make for
the same reason (true/false and multiple-choice items dropped as guessable); evaluation keeps them.
On the world this halved the width of RL's paired interval and did not add accuracy (docs/results/rl.md).

>>> from r3rag.data.records import Question
>>> is_guessable(Question("a", "Were X and Y founded in the same country?", ["yes"]))
True
>>> is_guessable(Question("b", "Which novel came out first, The Rose or Ash Lane?", ["Ash Lane"]))
True
>>> is_guessable(Question("c", "Who founded the company that built Ash Lane?", ["Ada Crane"]))
False
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from r3rag.data.records import Question
from r3rag.metrics import normalize_squad

YES_NO = frozenset({"yes", "no"})


def is_guessable(q: Question) -> bool:
    """True when every gold answer is yes/no, or the question offers a choice (`` or ``) and a
    gold answer is one of the options written in it."""
    golds = [normalize_squad(g) for g in q.golden_answers if g.strip()]
    if not golds:
        return False
    if all(g in YES_NO for g in golds):
        return True
    text = f" {normalize_squad(q.question)} "
    return " or " in text and any(f" {g} " in text for g in golds)


def drop_guessable(questions: Sequence[Question]) -> tuple[list[Question], Counter[str]]:
    """``(kept, dropped_by_kind)``: the questions that are not guessable, and how many of each kind
    (``metadata['type']`` where the dataset has it, else ``"guessable"``) were left out."""
    kept: list[Question] = []
    dropped: Counter[str] = Counter()
    for q in questions:
        if is_guessable(q):
            dropped[str(q.metadata.get("type", "guessable"))] += 1
        else:
            kept.append(q)
    return kept, dropped
