"""The prompted baselines: direct answer, standard RAG, and iterative retrieve-and-reason (IRCoT).

All three are one loop over a batch of questions, differing in two switches:

- ``initial_retrieval``: search once with the question (top-``k``) and put the passages in the
  prompt (standard RAG, IRCoT), or not (direct answer);
- ``iterative``: after each generated sentence, search with that sentence and append the new
  passages, until the model writes ``So the answer is: ...`` or ``max_steps`` sentences (IRCoT,
  after Trivedi et al. 2023: the chain of thought drives retrieval); otherwise the first
  generated line is the answer.

The prompts are our own text in ``r3rag/templates/evaluation/{direct,rag,ircot}.txt``
(``### system`` / ``### user`` sections, ``$question`` and ``$documents`` placeholders), rendered
with the tokenizer's chat template when it has one. Each question becomes a
:class:`~r3rag.rollout.trajectory.Trajectory` like the step formats' (a search with the question
is step 0, each sentence is a step), so every metric is computed the same way for every method.
The context only grows (prompt, model sentence, passages, model sentence, ...), so the token
segments are exact. The rounds are the rollout engine's own driver
(:func:`r3rag.rollout.engine.drive`) over one :class:`BaselineEnv` per question: batching,
retrieval calls and failure handling are not written twice.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from r3rag.data.records import Passage, Question
from r3rag.evaluation.config import MethodConfig
from r3rag.rollout.backends.base import GenerationOutput, GenerationRequest, PolicyBackend, SamplingParams
from r3rag.rollout.backends.shared_prefix import SENTINELS, shared_prefix_len
from r3rag.rollout.config import RolloutConfig
from r3rag.rollout.engine import drive
from r3rag.rollout.env import trajectory_seed
from r3rag.rollout.formats.r3rag_steps import render_passage
from r3rag.rollout.retriever import Retriever
from r3rag.rollout.tokens import decode, encode
from r3rag.rollout.trajectory import Segment, Step, Trajectory

ANSWER_MARKER = re.compile(r"so the answer is\s*:?\s*", re.IGNORECASE)
_ANSWER_PREFIX = re.compile(r"^\s*(final answer|the answer is|answer|a)\s*[:\-]\s*", re.IGNORECASE)


@dataclass(frozen=True)
class BaselineSpec:
    template: str
    initial_retrieval: bool
    iterative: bool


def load_prompt(template: str, path: str | Path | None = None) -> tuple[str, str]:
    """``(system, user)`` of a baseline template (``path`` replaces the packaged file)."""
    if path is not None:
        text = Path(path).read_text(encoding="utf-8")
    else:
        text = resources.files("r3rag.templates").joinpath("evaluation", template).read_text(encoding="utf-8")
    _, _, rest = text.partition("### system\n")
    system, _, user = rest.partition("### user\n")
    if not user.strip():
        raise ValueError(f"prompt template {path or template}: needs '### system' and '### user' sections")
    return system.strip(), user.strip()


def render_documents(docs: list[Passage]) -> str:
    return "\n".join(render_passage(i + 1, p) for i, p in enumerate(docs)) or "(no passages found)"


def clean_answer(text: str, eos: str = "") -> str:
    """The first non-empty line, without EOS text, an ``Answer:`` prefix or a final full stop.

    >>> clean_answer("\\nAnswer: Quessa.\\nBecause ...")
    'Quessa'
    """
    if eos:
        text = text.replace(eos, "\n")
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    line = _ANSWER_PREFIX.sub("", line).strip()
    return line.rstrip(".").strip().strip('"').strip()


class PromptedBaseline:
    """Run one of the prompted baselines over a batch of questions."""

    def __init__(
        self,
        name: str,
        spec: BaselineSpec,
        backend: PolicyBackend,
        retriever: Retriever | None,
        method: MethodConfig,
        rollout: RolloutConfig,
    ) -> None:
        self.name = name
        self.spec = spec
        self.backend = backend
        self.tokenizer = backend.tokenizer
        self.retriever = retriever
        self.method = method
        self.rollout = rollout
        self.system, self.user = load_prompt(spec.template, method.prompt_path)
        self.eos = self.tokenizer.eos_token or ""
        # prompt ids common to every prompt (chat template, system prompt): the backend may
        # prefill them once (GenerationRequest.shared_prefix)
        self.shared_prefix = shared_prefix_len(
            lambda j: encode(self.tokenizer, self.render_prompt(SENTINELS[j], [Passage(str(j), SENTINELS[j])])))

    # ---- prompt ---------------------------------------------------------------------------------
    def render_prompt(self, question: str, docs: list[Passage]) -> str:
        user = string.Template(self.user).safe_substitute(question=question, documents=render_documents(docs))
        if getattr(self.tokenizer, "chat_template", None):
            msgs = [{"role": "system", "content": self.system}, {"role": "user", "content": user}]
            return self.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        return f"{self.system}\n\n{user}\n\n"

    def cut(self, docs: list[Passage], seen: set[str]) -> list[Passage]:
        """Up to ``top_k`` passages not in ``seen`` (which grows), each cut to ``doc_max_chars``."""
        out: list[Passage] = []
        limit = self.rollout.doc_max_chars
        for p in docs:
            if len(out) >= self.method.top_k:
                break
            if p.id in seen:
                continue
            seen.add(p.id)
            out.append(Passage(p.id, p.contents[:limit] if limit else p.contents, p.score))
        return out

    # ---- a model turn -----------------------------------------------------------------------------
    def parse_turn(self, index: int, text: str, out: GenerationOutput, last: bool) -> Step:
        """One model turn as a step: an answer, an IRCoT sentence to search with (``query``), a
        last sentence with no answer (neither set), or a ``format_error``."""
        if not self.spec.iterative:
            answer = clean_answer(text, self.eos)
            return Step(index, answer=answer or None, raw=text, format_error=None if answer else "empty_answer")
        m = ANSWER_MARKER.search(text)
        sentence = clean_answer(text[: m.start()] if m else text, self.eos)
        if m is not None or out.finish_reason == "eos":
            # the marker, or the model ended its turn: its last words are its answer
            answer = clean_answer(text[m.end():], self.eos) if m else sentence
            return Step(index, analysis=sentence, answer=answer or None, raw=text,
                        format_error=None if answer else "empty_answer")
        if not sentence:
            return Step(index, raw=text, format_error="empty_query")
        if last:
            return Step(index, analysis=sentence, raw=text)
        return Step(index, analysis=sentence, query=sentence, raw=text)

    # ---- the loop: the engine's round driver over one BaselineEnv per question -------------------
    async def arun(self, questions: list[Question]) -> list[Trajectory]:
        envs = [BaselineEnv(self, q) for q in questions]
        async for _ in drive(envs, self.backend, self.retriever, shared_prefix=self.shared_prefix):
            pass
        return [e.trajectory for e in envs]


class BaselineEnv:
    """One question under a prompted baseline's rules, driven by :func:`r3rag.rollout.engine.drive`.

    Standard RAG and IRCoT start with the question waiting for documents (step 0 is that search;
    the prompt is rendered once its passages arrive); direct answer starts with its prompt. Each
    model turn is one step: the answer (direct, RAG, or IRCoT's ``So the answer is:``), or for
    IRCoT a sentence that becomes the next query, whose new passages follow as ``env`` text."""

    def __init__(self, baseline: PromptedBaseline, question: Question) -> None:
        self.b = baseline
        self.question = question
        self.trajectory = Trajectory(str(question.id), question.question, baseline.name,
                                     golden_answers=list(question.golden_answers), metadata={"method": baseline.name})
        self.seen: set[str] = set()
        self.ids: list[int] = []
        self.text = ""
        self.turns = 0
        self.max_turns = baseline.method.max_steps if baseline.spec.iterative else 1
        self.seed = trajectory_seed(baseline.rollout.seed, str(question.id), 0)
        self.pending: Step | None = None
        if baseline.spec.initial_retrieval:
            self.pending = Step(0, query=question.question)
            self.trajectory.steps.append(self.pending)
        else:
            self._set_prompt([])

    @property
    def done(self) -> bool:
        return self.trajectory.stop_reason is not None

    def _set_prompt(self, docs: list[Passage]) -> Segment:
        prompt = self.b.render_prompt(self.question.question, docs)
        ids = encode(self.b.tokenizer, prompt)
        seg = Segment("prompt", prompt, ids)
        self.trajectory.segments.append(seg)
        self.ids, self.text = list(ids), prompt
        return seg

    def request(self, shared_prefix: int = 0) -> GenerationRequest:
        b = self.b
        budget = max(0, min(b.method.answer_max_tokens, b.rollout.max_total_tokens - len(self.ids)))
        params = SamplingParams(max_tokens=budget, temperature=b.rollout.temperature, top_p=b.rollout.top_p,
                                stop=["\n"] if b.spec.iterative else ["\n\n"], seed=(self.seed * 131 + self.turns) % (2**63 - 1))
        return GenerationRequest(list(self.ids), self.text, params, shared_prefix=shared_prefix)

    def record_turn(self, out: GenerationOutput) -> Step | None:
        t = self.trajectory
        self.turns += 1
        if not out.exact_ids:
            t.metadata["exact_ids"] = False
        if out.finish_reason == "error":
            t.metadata["backend_error"] = out.error or "unknown backend error"
            t.stop_reason = "backend_error"
            return None
        if not out.token_ids:
            t.stop_reason = "max_tokens" if out.finish_reason == "length" else "format_error"
            return None
        text = decode(self.b.tokenizer, out.token_ids) if out.exact_ids else out.text
        t.segments.append(Segment("model", text, list(out.token_ids), out.logprobs))
        self.ids.extend(out.token_ids)
        self.text += text
        step = self.b.parse_turn(len(t.steps), text, out, last=self.turns >= self.max_turns)
        step.segment = len(t.segments) - 1
        t.steps.append(step)
        if step.format_error is not None:
            t.stop_reason = "format_error"
        elif step.answer is not None:
            t.stop_reason = "answered"
        elif step.query is None:
            t.stop_reason = "max_steps"
        else:
            self.pending = step
            return step
        return None

    def retrieval_k(self) -> int:
        return self.b.method.top_k + len(self.seen)

    def insert_documents(self, found: list[Passage]) -> Segment | None:
        step, self.pending = self.pending, None
        assert step is not None
        kept = self.b.cut(found, self.seen)
        step.documents, step.retrieved = kept, True
        if not self.trajectory.segments:  # the search with the question, before the first turn
            return self._set_prompt(kept)
        feedback = "\nMore passages:\n" + render_documents(kept) + "\n"
        seg = Segment("env", feedback, encode(self.b.tokenizer, feedback))
        self.trajectory.segments.append(seg)
        self.ids.extend(seg.token_ids)
        self.text += feedback
        if len(self.ids) >= self.b.rollout.max_total_tokens:
            self.trajectory.stop_reason = "max_tokens"
        return seg

    def fail_retrieval(self, error: str) -> None:
        self.pending = None
        self.trajectory.stop_reason = "retrieval_failed"
        self.trajectory.metadata["retrieval_error"] = error


BASELINES: dict[str, BaselineSpec] = {
    "direct": BaselineSpec("direct.txt", initial_retrieval=False, iterative=False),
    "rag": BaselineSpec("rag.txt", initial_retrieval=True, iterative=False),
    "ircot": BaselineSpec("ircot.txt", initial_retrieval=True, iterative=True),
}
