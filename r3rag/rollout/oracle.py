"""A scripted policy that follows each question's gold decomposition through real retrieval.

It is a :class:`~r3rag.rollout.backends.base.PolicyBackend` like the model backends and reads only
the context it is given:

1. it finds which question the context is about (the question text in the prompt);
2. it counts the documents blocks after the question: ``i`` blocks means ``i`` queries have been
   answered by the environment;
3. if ``i > 0`` it checks that the answer of the sub-question just asked appears
   (case-insensitively) in the documents shown so far (all blocks: with de-duplication a passage
   retrieved again is not shown twice), i.e. in what retrieval actually returned; if not, it gives
   up honestly and answers ``unknown``;
4. otherwise it asks the next sub-question verbatim (the world fills earlier answers into later
   sub-questions), or, when every sub-answer has been seen, writes the gold final answer.

Its accuracy through a retriever is therefore the share of questions whose every gold hop is
retrievable with the literal sub-question: the retrieval upper bound of the world for a policy that
copies the decomposition. Turns are written with the format's :meth:`render_turn`, so the oracle
works in every format and mode.

**Teacher variety** (``variety=OracleVariety(...)``, what cold-start data uses): a student trained on
one fixed script learns the string, not the skill, so the oracle then behaves like a real teacher:

- queries are paraphrased (verbatim, keyword form, lower-case statement);
- the analysis is written in one of several wordings per situation;
- sometimes (``waste_prob``) it spends a step on a wasted query (the whole question, too broad)
  or a redundant one (re-checking the previous fact), then says so and asks the right one;
- with ``plan`` (the default) its first analysis says how many facts the question needs, and
  every found fact is counted off ("That is 1 of 2."), as a teacher that decomposes the question
  before searching does: the student learns to decide from the question how far to go, instead of
  making the same number of searches for every question; ``plan_style: relations`` first names
  what each lookup finds ("To find: the author -> the birthplace -> the country. That is 3
  facts."), words the student can read off the question, so the number it then writes follows
  from a list it has just written instead of from the whole question at once;
- with ``grounding``, each analysis after a search first restates the sub-question and gives
  what the documents say to it, or that they do not say it ("Who wrote X? -> Y." / "Who wrote
  X? -> not in these documents. Let me rephrase the search."): the student then decides "found or
  not" at one token, right after a question it can match against the passages, instead of
  choosing between a found-it and a retry wording before it has named what it looks for;
- with ``compare``, the final analysis of a comparison or yes/no question states the comparison
  the answer rests on ("1922 is later than 1919, so the answer is Jerkgylgrad Railway." /
  "Upper Paenmouth and Starkvale are different, so the answer is no.") instead of only listing
  the facts (without it the answer is one token that must compare two facts at once, and the
  SmolLM2 student answers such questions at chance). Measured, it made SFT worse: the student
  writes the sentence but compares the dates at chance (docs/results/coldstart_sft.md, 5.0.4), so it is off;
- when the sub-answer is not in the documents it rephrases and searches again
  (``max_retries`` per sub-question; de-duplication then shows the next passages of the ranking)
  before giving up, as long as the remaining steps (``max_steps``) still allow an answer.

It stays deterministic and stateless: each step's choices come from a random generator seeded by
``(seed, question id, trajectory key, step)``, where the trajectory key is the sampling seed at
step 0 (fixed for temperature 0, so the greedy attempt is reproducible) and the text of the
oracle's own first turn afterwards. To know where it is, the oracle *replays* its decisions for
steps ``0..i-1`` from the documents in the context (the same pure function), so no state is kept
between calls and a resumed run writes the same text.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from r3rag.config import Section
from r3rag.data.records import Question
from r3rag.rollout.backends.base import GenerationOutput, GenerationRequest, PolicyBackend
from r3rag.rollout.formats.base import TrajectoryFormat
from r3rag.rollout.tokens import encode

UNKNOWN = "unknown"


class OracleVariety(Section):
    """How varied the teacher oracle is (``None`` on the backend: the plain fixed script)."""

    seed: int = 0
    waste_prob: float = Field(0.15, ge=0.0, le=1.0, description="chance per step of a wasted or redundant query")
    max_retries: int = Field(1, ge=0, description="rephrased searches per sub-question whose answer was not found")
    max_steps: int = Field(5, ge=1, description="the rollout's step cap: extra queries only when an answer still fits")
    paraphrase: bool = True
    plan: bool = Field(True, description="state how many facts the question needs, then count them off as they are found")
    plan_style: Literal["count", "relations"] = Field(
        "count", description="count: the plan states the number ('This needs 2 facts.'); relations: it first names "
        "what each lookup finds, in the question's order, then the number ('To find: the author -> the birthplace. 2 facts.')")
    grounding: bool = Field(
        False, description="after each search, restate the sub-question and give what the documents say to it, or that "
        "they do not say it ('Who wrote X? -> Y.' / 'Who wrote X? -> not in these documents.'), instead of 'We found Y.'")
    compare: bool = Field(
        False, description="comparison and yes/no questions: the final analysis states the comparison the answer rests on "
        "('1922 is later than 1919, so the answer is B.' / 'X and Y are the same, so the answer is yes.')")


# ---- wordings ------------------------------------------------------------------------------------
_FIRST = (
    "To answer this I first need to know: {sq}",
    "The question depends on another fact. Let me look up: {sq}",
    "First I should find out {sq_l}",
    "I will start with the first unknown: {sq}",
    "Before answering, I need this fact: {sq}",
)
_KNOWN = (
    "We found {ans}. ",
    "The documents show {ans}. ",
    "So the answer to the previous part is {ans}. ",
    "From the retrieved passage: {ans}. ",
    "Good, that gives {ans}. ",
)
_NEXT = (
    "Next we need to know: {sq}",
    "Now I need to find out {sq_l}",
    "The remaining question is: {sq}",
    "With that, the next thing to look up is: {sq}",
    "Then: {sq}",
)
_ANSWER = (
    "The documents give {facts}, which answers the question.",
    "Putting it together: {facts}. That is enough to answer.",
    "Based on the retrieved facts ({facts}), I can answer now.",
    "We now know {facts}, so the answer follows.",
)
_WASTE_BROAD = (
    "Let me first search for the whole question.",
    "Maybe one search for the full question finds it directly.",
    "I will try the question as it is.",
)
_AFTER_BROAD = (
    "That search was too broad: the documents do not answer it directly. I need to break it down. ",
    "Searching the whole question did not help; I should ask for one fact at a time. ",
    "Those documents are not specific enough. ",
)
_WASTE_RECHECK = (
    "Let me double-check that {ans} is right: {sq}",
    "Before going on, I want to confirm {ans} once more.",
    "I am not fully sure about {ans}; let me search again.",
)
_AFTER_RECHECK = (
    "The documents confirm {ans}. ",
    "Confirmed: {ans}. ",
    "Yes, it is {ans}. ",
)
_PLAN = (
    "This needs {n} {facts}. ",
    "There {are} {n} {facts} to find. ",
    "I count {n} {lookups} here. ",
    "Plan: {n} {lookups}. ",
)
_PLAN_RELATIONS = (
    "To find: {chain}. That is {n} {facts}. ",
    "Plan: {chain}, so {n} {lookups}. ",
    "I need {chain}: {n} {facts}. ",
)
#: what a lookup of each world relation finds, as the relations plan names it (others: the name, spaced)
RELATION_NAMES = {
    "located_in": "the country", "birth_date": "the birth date", "born_in": "the birthplace", "spouse": "the spouse",
    "father": "the father", "headquarters": "the headquarters", "employer": "the employer",
    "founded_year": "the founding year", "release_year": "the release year", "publication_year": "the publication year",
    "written_by": "the author", "directed_by": "the director", "founded_by": "the founder",
}
_PROGRESS = (
    "That is {j} of {n}. ",
    "Fact {j} of {n} found. ",
    "{j} of {n} done. ",
)
_RETRY = (
    "The documents do not mention the answer to {sq!r}. Let me rephrase the search.",
    "Those passages do not say it. I will search again with other words.",
    "Nothing about that here; a different query may find the right passage.",
)
#: public names for the wordings a probe of a student looks for (``r3rag.evaluation.decisions``)
FOUND_WORDINGS = _KNOWN
RETRY_WORDINGS = _RETRY
_GIVE_UP = "The documents do not say {sq!r}; I cannot tell."
#: the grounding style (``OracleVariety.grounding``): the sub-question, then what the documents say to it
_GROUNDED = "{sq} -> {ans}. "
#: what follows the sub-question when the documents lack its answer (``r3rag.evaluation.decisions`` counts it)
GROUNDED_MISSING_MARK = "-> not in these documents."
_GROUNDED_MISSING = "{sq} " + GROUNDED_MISSING_MARK + " "
_GROUNDED_RETRY = ("Let me rephrase the search.", "I will search again with other words.", "A different query may find it.")

#: the compare style (``OracleVariety.compare``): the comparison the answer of a comparison or
#: yes/no question rests on, keyed by the world's ``compare.op`` ("same", "before", "earlier", "later")
_COMPARE_SAME = ("{x} and {y} are the same, so the answer is {answer}.", "{x} and {y} are different, so the answer is {answer}.")
_COMPARE_ORDER = "{x} is {rel} than {y}, so the answer is {answer}."

_STOPWORDS = frozenset(
    "a an the of in on at to for by was is were are did does do who whom whose what which when where why how "
    "many much year".split()
)


def relation_name(sub: dict[str, Any]) -> str:
    """What a sub-question's lookup finds, for the relations plan.

    >>> relation_name({"relation": "written_by"}), relation_name({"relation": "mayor_of"})
    ('the author', 'the mayor of')
    """
    rel = str(sub.get("relation") or "fact")
    return RELATION_NAMES.get(rel, "the " + rel.replace("_", " "))


def comparison_sentence(compare: dict[str, Any] | None, dec: list[dict[str, Any]], answer: str) -> str | None:
    """The comparison a comparison or yes/no question's gold ``answer`` rests on, or None.

    ``compare`` is the question's ``metadata["compare"]`` (``op``, the two compared ``steps``, the
    two ``options``); the order of the two facts is read off the gold answer, so no date is parsed.

    >>> dec = [{"answer": "1922"}, {"answer": "1919"}]
    >>> comparison_sentence({"op": "earlier", "steps": [0, 1], "options": ["A", "B"]}, dec, "B")
    '1922 is later than 1919, so the answer is B.'
    >>> comparison_sentence({"op": "before", "steps": [0, 1], "options": ["A", "B"]}, dec, "no")
    '1922 is later than 1919, so the answer is no.'
    >>> comparison_sentence({"op": "same", "steps": [0, 1], "options": ["A", "B"]}, dec, "no")
    '1922 and 1919 are different, so the answer is no.'
    """
    if not compare or len(compare.get("steps") or []) != 2:
        return None
    i, j = compare["steps"]
    if not (0 <= i < len(dec) and 0 <= j < len(dec)):
        return None
    x, y, op = dec[i]["answer"], dec[j]["answer"], compare.get("op")
    if op == "same":
        if answer.lower() not in ("yes", "no"):
            return None
        return _COMPARE_SAME[answer.lower() == "no"].format(x=x, y=y, answer=answer)
    if op == "before":
        if answer.lower() not in ("yes", "no"):
            return None
        x_first = answer.lower() == "yes"
    elif op in ("earlier", "later"):
        options = [str(o).lower() for o in compare.get("options") or []]
        if len(options) != 2 or answer.lower() not in options:
            return None
        a_wins = answer.lower() == options[0]
        x_first = a_wins if op == "earlier" else not a_wins
    else:
        return None
    return _COMPARE_ORDER.format(x=x, y=y, rel="earlier" if x_first else "later", answer=answer)


def _keywords(text: str) -> str:
    words = re.findall(r"[\w'-]+", text)
    kept = [w for w in words if w.lower() not in _STOPWORDS]
    return " ".join(kept) or text


def _statement(text: str) -> str:
    return text.rstrip("?").strip()


@dataclass
class _Action:
    kind: str  # ask | retry | waste_broad | waste_recheck | answer | give_up
    target: int = -1  # the sub-question index asked (ask/retry), or the one re-checked


class OracleBackend(PolicyBackend):
    name = "oracle"

    def __init__(
        self,
        questions: list[Question],
        fmt: TrajectoryFormat,
        tokenizer: Any,
        variety: OracleVariety | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.fmt = fmt
        self.variety = variety
        # longest question text first, so a question contained in another is not matched by mistake
        self._questions = sorted(questions, key=lambda q: -len(q.question))
        self.gave_up = 0

    async def agenerate(self, requests: list[GenerationRequest]) -> list[GenerationOutput]:
        return [self._one(r) for r in requests]

    def _find(self, context: str) -> tuple[Question, int] | None:
        for q in self._questions:
            pos = context.find(q.question)
            if pos >= 0:
                return q, pos + len(q.question)
        return None

    def _one(self, req: GenerationRequest) -> GenerationOutput:
        found = self._find(req.prompt_text)
        if found is None:
            return GenerationOutput([], "", None, "error", error="oracle: question not found in the context")
        q, after = found
        history = req.prompt_text[after:]
        if self.variety is not None:
            return self._out(self._varied(q, history, req), req)
        marker = self.fmt.documents_marker
        i = history.count(marker)
        decomposition = q.metadata.get("decomposition") or []
        if i > 0:
            sub = decomposition[i - 1] if i - 1 < len(decomposition) else None
            seen = history[history.find(marker):]  # every documents block shown so far
            if sub is None or sub["answer"].lower() not in seen.lower():
                self.gave_up += 1
                text = self.fmt.render_turn(i, f"The documents do not say {sub['question'] if sub else 'it'!r}; I cannot tell.", answer=UNKNOWN)
                return self._out(text, req)
        if i < len(decomposition):
            sub = decomposition[i]
            known = f"We found {decomposition[i - 1]['answer']}. " if i > 0 else ""
            text = self.fmt.render_turn(i, f"{known}Next we need to know: {sub['question']}", query=sub["question"])
        else:
            answer = q.golden_answers[0] if q.golden_answers else UNKNOWN
            facts = ", ".join(d["answer"] for d in decomposition)
            text = self.fmt.render_turn(i, f"The documents give {facts}, which answers the question.", answer=answer)
        return self._out(text, req)

    # ---- the varied teacher ---------------------------------------------------------------------
    def _rng(self, q: Question, key: str, step: int) -> random.Random:
        assert self.variety is not None
        digest = hashlib.sha256(f"{self.variety.seed}|{q.id}|{key}|{step}".encode()).digest()
        return random.Random(int.from_bytes(digest[:8], "big"))

    def _decide(self, q: Question, k: int, j: int, unresolved: int, last: _Action | None, tries: dict[int, int], rng: random.Random) -> _Action:
        """The action at step ``k``: ``j`` sub-questions resolved, ``unresolved`` the one whose search
        just failed (-1 if none)."""
        v = self.variety
        assert v is not None
        n = len(q.metadata.get("decomposition") or [])
        left = v.max_steps - k  # steps left, this one included
        if unresolved >= 0:
            if tries.get(unresolved, 0) < v.max_retries and left >= n - unresolved + 1:
                return _Action("retry", unresolved)
            return _Action("give_up", unresolved)
        if j >= n:
            return _Action("answer")
        roll = rng.random()
        if k >= 1 and last is not None and last.kind in ("ask", "retry") and left >= n - j + 2 and roll < v.waste_prob:
            return _Action("waste_recheck", j - 1) if j > 0 and rng.random() < 0.5 else _Action("waste_broad")
        return _Action("ask", j)

    def _varied(self, q: Question, history: str, req: GenerationRequest) -> str:
        marker = self.fmt.documents_marker
        positions = [m.start() for m in re.finditer(re.escape(marker), history)] if marker else []
        i = len(positions)
        decomposition = q.metadata.get("decomposition") or []
        greedy = req.params.temperature <= 0
        first_key = "greedy" if greedy else f"s{req.params.seed}"
        later_key = history[: positions[0]] if positions else ""
        # replay the decisions of steps 0..i (pure function of the documents shown)
        j, unresolved, last, tries = 0, -1, None, {}
        for k in range(i + 1):
            if k > 0 and last is not None and last.kind in ("ask", "retry"):
                seen = history[positions[0]: positions[k] if k < i else len(history)]
                if decomposition[last.target]["answer"].lower() in seen.lower():
                    j, unresolved = last.target + 1, -1
                else:
                    unresolved = last.target
            elif k > 0:
                unresolved = -1
            rng = self._rng(q, first_key if k == 0 else later_key, k)
            action = self._decide(q, k, j, unresolved, last, tries, rng)
            if action.kind == "retry":
                tries[action.target] = tries.get(action.target, 0) + 1
            if k < i:
                last = action
        return self._render(q, i, action, last, j, rng)

    def _query_form(self, text: str, rng: random.Random, avoid: str | None = None) -> str:
        v = self.variety
        assert v is not None
        forms = [text, _keywords(text), _statement(text).lower()] if v.paraphrase else [text]
        if avoid is not None and len(forms) > 1:
            forms = [f for f in forms if f != avoid] or forms
            return forms[0] if avoid != text else forms[rng.randrange(len(forms))]
        weights = [5, 3, 2][: len(forms)]
        return rng.choices(forms, weights=weights)[0]

    def _render(self, q: Question, i: int, action: _Action, last: _Action | None, j: int, rng: random.Random) -> str:
        dec = q.metadata.get("decomposition") or []
        plan = self.variety is not None and self.variety.plan and bool(dec)
        grounding = self.variety is not None and self.variety.grounding
        lead = ""
        if last is not None and last.kind == "waste_broad":
            lead = rng.choice(_AFTER_BROAD)
        elif last is not None and last.kind == "waste_recheck":
            lead = rng.choice(_AFTER_RECHECK).format(ans=dec[last.target]["answer"])
        elif last is not None and last.kind in ("ask", "retry") and action.kind not in ("retry", "give_up") and j > 0:
            if grounding:
                lead = _GROUNDED.format(sq=dec[j - 1]["question"], ans=dec[j - 1]["answer"])
            else:
                lead = rng.choice(_KNOWN).format(ans=dec[j - 1]["answer"])
            if plan:
                lead += rng.choice(_PROGRESS).format(j=j, n=len(dec))
        if i == 0 and plan and action.kind == "ask":  # step 0 is always an ask (wastes come later)
            n = len(dec)
            words = dict(are="is" if n == 1 else "are", facts="fact" if n == 1 else "facts",
                         lookups="lookup" if n == 1 else "lookups")
            if self.variety is not None and self.variety.plan_style == "relations":
                chain = " -> ".join(relation_name(d) for d in dec)
                lead = rng.choice(_PLAN_RELATIONS).format(n=n, chain=chain, **words)
            else:
                lead = rng.choice(_PLAN).format(n=n, **words)
        if action.kind == "ask":
            sq = dec[action.target]["question"]
            wording = _FIRST if i == 0 else _NEXT
            analysis = lead + rng.choice(wording).format(sq=sq, sq_l=_statement(sq)[:1].lower() + _statement(sq)[1:] + ".")
            return self.fmt.render_turn(i, analysis.strip(), query=self._query_form(sq, rng))
        if action.kind == "retry":
            sq = dec[action.target]["question"]
            if grounding:
                analysis = _GROUNDED_MISSING.format(sq=sq) + rng.choice(_GROUNDED_RETRY)
            else:
                analysis = rng.choice(_RETRY).format(sq=sq)
            return self.fmt.render_turn(i, analysis, query=self._query_form(sq, rng, avoid=sq))
        if action.kind == "waste_broad":
            return self.fmt.render_turn(i, (lead + rng.choice(_WASTE_BROAD)).strip(), query=q.question)
        if action.kind == "waste_recheck":
            sub = dec[action.target]
            analysis = lead + rng.choice(_WASTE_RECHECK).format(ans=sub["answer"], sq=sub["question"])
            return self.fmt.render_turn(i, analysis.strip(), query=self._query_form(sub["question"], rng))
        if action.kind == "give_up":
            self.gave_up += 1
            sq = dec[action.target]["question"]
            text = _GROUNDED_MISSING.format(sq=sq) + "I cannot tell." if grounding else _GIVE_UP.format(sq=sq)
            return self.fmt.render_turn(i, text, answer=UNKNOWN)
        answer = q.golden_answers[0] if q.golden_answers else UNKNOWN
        facts = ", ".join(d["answer"] for d in dec) or "what I know"
        closing = rng.choice(_ANSWER).format(facts=facts)
        if self.variety is not None and self.variety.compare:
            closing = comparison_sentence(q.metadata.get("compare"), dec, answer) or closing
        return self.fmt.render_turn(i, (lead + closing).strip(), answer=answer)

    def _out(self, text: str, req: GenerationRequest) -> GenerationOutput:
        ids = encode(self.tokenizer, text)
        eos = self.fmt.eos_text
        reason = "eos" if eos and text.endswith(eos) else "stop"
        if len(ids) > req.params.max_tokens:
            ids, reason = ids[: req.params.max_tokens], "length"
        return GenerationOutput(ids, text, [0.0] * len(ids), reason)  # type: ignore[arg-type]
