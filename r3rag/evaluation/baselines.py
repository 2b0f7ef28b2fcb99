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
segments are exact.
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

    def _cut(self, docs: list[Passage], seen: set[str]) -> list[Passage]:
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

    # ---- the loop -------------------------------------------------------------------------------
    async def arun(self, questions: list[Question]) -> list[Trajectory]:
        trajs = [
            Trajectory(str(q.id), q.question, self.name, golden_answers=list(q.golden_answers),
                       metadata={"method": self.name})
            for q in questions
        ]
        seen: list[set[str]] = [set() for _ in questions]
        first_docs: list[list[Passage]] = [[] for _ in questions]
        if self.spec.initial_retrieval:
            found = await self._search([q.question for q in questions], trajs, self.method.top_k)
            if found is None:
                return trajs
            for i, (q, docs) in enumerate(zip(questions, found)):
                first_docs[i] = self._cut(docs, seen[i])
                trajs[i].steps.append(Step(0, query=q.question, documents=first_docs[i]))
        ctx_ids: list[list[int]] = []
        ctx_text: list[str] = []
        for i, q in enumerate(questions):
            prompt = self.render_prompt(q.question, first_docs[i])
            ids = encode(self.tokenizer, prompt)
            trajs[i].segments.append(Segment("prompt", prompt, ids))
            ctx_ids.append(list(ids))
            ctx_text.append(prompt)
        active = list(range(len(questions)))
        turns = self.method.max_steps if self.spec.iterative else 1
        stop = ["\n"] if self.spec.iterative else ["\n\n"]
        for turn in range(turns):
            if not active:
                break
            reqs = [
                GenerationRequest(ctx_ids[i], ctx_text[i], SamplingParams(
                    max_tokens=self.method.answer_max_tokens, temperature=self.rollout.temperature,
                    top_p=self.rollout.top_p, stop=stop, seed=self.rollout.seed + i), shared_prefix=self.shared_prefix)
                for i in active
            ]
            outs = await self.backend.agenerate(reqs)
            to_search: list[int] = []
            for i, out in zip(active, outs):
                text = self._record(trajs[i], out, ctx_ids[i])
                ctx_text[i] += text
                if self._parse(trajs[i], text, out, last=turn == turns - 1):
                    to_search.append(i)
            if to_search:
                queries = [trajs[i].steps[-1].query or "" for i in to_search]
                found = await self._search(queries, [trajs[i] for i in to_search], self.method.top_k + max(len(seen[i]) for i in to_search))
                if found is not None:
                    for i, docs in zip(to_search, found):
                        kept = self._cut(docs, seen[i])
                        trajs[i].steps[-1].documents = kept
                        feedback = "\nMore passages:\n" + render_documents(kept) + "\n"
                        ids = encode(self.tokenizer, feedback)
                        trajs[i].segments.append(Segment("env", feedback, ids))
                        ctx_ids[i].extend(ids)
                        ctx_text[i] += feedback
                        if len(ctx_ids[i]) >= self.rollout.max_total_tokens:
                            trajs[i].stop_reason = "max_tokens"
            active = [i for i in active if trajs[i].stop_reason is None]
        return trajs

    async def _search(self, queries: list[str], trajs: list[Trajectory], k: int) -> list[list[Passage]] | None:
        assert self.retriever is not None
        try:
            found = await self.retriever.asearch(queries, k)
            if len(found) != len(queries):
                raise RuntimeError(f"retriever returned {len(found)} lists for {len(queries)} queries")
            return found
        except Exception as err:  # noqa: BLE001 - recorded as a stop reason, like the rollout engine
            for t in trajs:
                t.stop_reason = "retrieval_failed"
                t.metadata["retrieval_error"] = f"{type(err).__name__}: {err}"
            return None

    def _record(self, traj: Trajectory, out: GenerationOutput, ctx_ids: list[int]) -> str:
        text = decode(self.tokenizer, out.token_ids) if out.token_ids and out.exact_ids else out.text
        if out.token_ids:
            traj.segments.append(Segment("model", text, list(out.token_ids), out.logprobs))
            ctx_ids.extend(out.token_ids)
        if out.finish_reason == "error":
            traj.metadata["backend_error"] = out.error
        return text

    def _parse(self, traj: Trajectory, text: str, out: GenerationOutput, last: bool) -> bool:
        """Record the turn as a step; True when its sentence should be searched."""
        index = len(traj.steps)
        if out.finish_reason == "error":
            traj.steps.append(Step(index, raw=text, format_error=f"backend_error: {out.error}"))
            traj.stop_reason = "format_error"
            return False
        if not self.spec.iterative:
            answer = clean_answer(text, self.eos)
            traj.steps.append(Step(index, answer=answer or None, raw=text,
                                   format_error=None if answer else "empty_answer"))
            traj.stop_reason = "answered" if answer else "format_error"
            return False
        m = ANSWER_MARKER.search(text)
        sentence = clean_answer(text[: m.start()] if m else text, self.eos)
        if m is not None or out.finish_reason == "eos":
            # the marker, or the model ended its turn: its last words are its answer
            answer = clean_answer(text[m.end():], self.eos) if m else sentence
            traj.steps.append(Step(index, analysis=sentence, answer=answer or None, raw=text,
                                   format_error=None if answer else "empty_answer"))
            traj.stop_reason = "answered" if answer else "format_error"
            return False
        if not sentence:
            traj.steps.append(Step(index, raw=text, format_error="empty_query"))
            traj.stop_reason = "format_error"
            return False
        if last:
            traj.steps.append(Step(index, analysis=sentence, raw=text))
            traj.stop_reason = "max_steps"
            return False
        traj.steps.append(Step(index, analysis=sentence, query=sentence, raw=text))
        return True


BASELINES: dict[str, BaselineSpec] = {
    "direct": BaselineSpec("direct.txt", initial_retrieval=False, iterative=False),
    "rag": BaselineSpec("rag.txt", initial_retrieval=True, iterative=False),
    "ircot": BaselineSpec("ircot.txt", initial_retrieval=True, iterative=True),
}
