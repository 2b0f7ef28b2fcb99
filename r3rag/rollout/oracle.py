"""A scripted policy that follows each question's gold decomposition through real retrieval.

It is a :class:`~r3rag.rollout.backends.base.PolicyBackend` like the model backends and reads only
the context it is given:

1. it finds which question the context is about (the question text in the prompt);
2. it counts the documents blocks after the question: ``i`` blocks means ``i`` sub-questions
   have been asked;
3. if ``i > 0`` it checks that the answer of sub-question ``i`` appears (case-insensitively) in the
   documents shown so far (all blocks: with de-duplication a passage retrieved again is not shown
   twice), i.e. in what retrieval actually returned; if not, it gives up honestly and answers
   ``unknown``;
4. otherwise it asks sub-question ``i + 1`` verbatim (the world fills earlier answers into later
   sub-questions), or, when every sub-answer has been seen, writes the gold final answer.

Its accuracy through a retriever is therefore the share of questions whose every gold hop is
retrievable with the literal sub-question: the retrieval upper bound of the world for a policy that
copies the decomposition, and a teacher for cold-start data on the world. Turns are written with
the format's :meth:`render_turn`, so the oracle works in every format and mode.
"""

from __future__ import annotations

from typing import Any

from r3rag.data.records import Question
from r3rag.rollout.backends.base import GenerationOutput, GenerationRequest, PolicyBackend
from r3rag.rollout.formats.base import TrajectoryFormat
from r3rag.rollout.tokens import encode

UNKNOWN = "unknown"


class OracleBackend(PolicyBackend):
    name = "oracle"

    def __init__(self, questions: list[Question], fmt: TrajectoryFormat, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.fmt = fmt
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

    def _out(self, text: str, req: GenerationRequest) -> GenerationOutput:
        ids = encode(self.tokenizer, text)
        eos = self.fmt.eos_text
        reason = "eos" if eos and text.endswith(eos) else "stop"
        if len(ids) > req.params.max_tokens:
            ids, reason = ids[: req.params.max_tokens], "length"
        return GenerationOutput(ids, text, [0.0] * len(ids), reason)  # type: ignore[arg-type]
