"""Shared pieces for the rollout tests: a tiny world, a scripted backend."""

from __future__ import annotations

from functools import lru_cache

from r3rag.data.records import Passage, Question
from r3rag.rollout.backends.base import GenerationOutput, GenerationRequest, PolicyBackend
from r3rag.rollout.tokens import encode

CORPUS = [
    Passage("p1", "Varnel Oskaro\nVarnel Oskaro was born in Quessa in 1874."),
    Passage("p2", "Quessa\nQuessa is a town in the province of Dromel."),
    Passage("p3", "Tirra Olle\nTirra Olle founded Melvane Works."),
    Passage("p4", "Melvane Works\nMelvane Works is based in Quessa."),
    Passage("p5", "Varnel Oskari\nVarnel Oskari was born in Pellin."),
]


def sub(question: str, answer: str, ids: list[str]) -> dict:
    return {"question": question, "answer": answer, "supporting_ids": ids}


QUESTIONS = [
    Question("q1", "In which province was Varnel Oskaro born?", ["Dromel"], {
        "decomposition": [sub("Where was Varnel Oskaro born?", "Quessa", ["p1"]),
                          sub("In which province is the town Quessa?", "Dromel", ["p2"])]}),
    Question("q2", "Who founded Melvane Works?", ["Tirra Olle"], {
        "decomposition": [sub("Who founded Melvane Works?", "Tirra Olle", ["p3"])]}),
    # its sub-answer is in no passage: the oracle must give up honestly
    Question("q3", "Who founded Zorvik Hall?", ["Amma Lind"], {
        "decomposition": [sub("Who founded Zorvik Hall?", "Amma Lind", ["p9"])]}),
]


class ScriptedBackend(PolicyBackend):
    """Replies with scripted texts: ``script[question_text][turn]``, where ``turn`` is the number of
    documents blocks (``marker``) already in the context after the question."""

    name = "scripted"

    def __init__(self, tokenizer, script: dict[str, list[str]], marker: str = "The retrieval documents:", finish: str = "stop") -> None:
        self.tokenizer = tokenizer
        self.script = script
        self.marker = marker
        self.finish = finish
        self.calls: list[int] = []
        self.requests: list[GenerationRequest] = []

    async def agenerate(self, requests: list[GenerationRequest]) -> list[GenerationOutput]:
        self.calls.append(len(requests))
        self.requests.extend(requests)
        outs = []
        for r in requests:
            key = max((q for q in self.script if q in r.prompt_text), key=len)
            turn = r.prompt_text[r.prompt_text.find(key):].count(self.marker)
            text = self.script[key][min(turn, len(self.script[key]) - 1)]
            full = encode(self.tokenizer, text)
            ids = full[: r.params.max_tokens]
            fin = "length" if len(full) > r.params.max_tokens else self.finish
            outs.append(GenerationOutput(ids, text, [0.0] * len(ids), fin))  # type: ignore[arg-type]
        return outs


@lru_cache(maxsize=None)
def tiny_tokenizer():
    from r3rag.testing.tiny_models import build_tiny_tokenizer

    return build_tiny_tokenizer()


@lru_cache(maxsize=None)
def tiny_model(arch: str = "llama"):
    from r3rag.testing.tiny_models import build_tiny_model

    return build_tiny_model(tiny_tokenizer(), arch=arch)


def mixed_requests(backend: PolicyBackend, prompts: list[str]) -> tuple[list[GenerationRequest], GenerationOutput]:
    """A batch with every kind of row the HF backend's token choice handles: greedy, sampled,
    sampled with top-p (same seed as the sampled row, other distribution) and teacher-forced (the
    ids of ``free``, a sampled output of ``backend``, which it returns too)."""
    from r3rag.rollout.backends.base import SamplingParams

    tok = backend.tokenizer  # type: ignore[attr-defined]

    def req(text: str, **kw: object) -> GenerationRequest:
        return GenerationRequest(encode(tok, text), text, SamplingParams(**kw))  # type: ignore[arg-type]

    free = backend.generate_batch([req(prompts[2], max_tokens=5, temperature=1.0, seed=4)])[0]  # type: ignore[attr-defined]
    forced = req(prompts[2], max_tokens=9, temperature=1.0)
    forced.forced_ids = free.token_ids
    return [req(prompts[0], max_tokens=9), req(prompts[1], max_tokens=9, temperature=1.0, seed=3),
            req(prompts[1], max_tokens=9, temperature=0.7, top_p=0.8, seed=3), forced], free
