"""The prompted baselines (direct, rag, ircot) with a scripted policy and an in-memory retriever."""

from __future__ import annotations

import asyncio

import pytest

from r3rag.data.records import Passage, Question
from r3rag.evaluation.baselines import BASELINES, PromptedBaseline, clean_answer, load_prompt
from r3rag.evaluation.config import MethodConfig
from r3rag.rollout.backends.base import GenerationOutput, GenerationRequest, PolicyBackend
from r3rag.rollout.config import RolloutConfig
from r3rag.rollout.tokens import encode
from r3rag.testing.tiny_models import build_tiny_tokenizer

TOKENIZER = build_tiny_tokenizer()


class Scripted(PolicyBackend):
    """Replies with the next line of a per-question script (found by the question text in the context)."""

    def __init__(self, scripts: dict[str, list[str]], finish: str = "stop") -> None:
        self.tokenizer = TOKENIZER
        self.scripts = {q: list(s) for q, s in scripts.items()}
        self.finish = finish
        self.contexts: list[str] = []

    async def agenerate(self, requests: list[GenerationRequest]) -> list[GenerationOutput]:
        outs = []
        for r in requests:
            self.contexts.append(r.prompt_text)
            q = next(q for q in self.scripts if q in r.prompt_text)
            text = self.scripts[q].pop(0)
            outs.append(GenerationOutput(encode(TOKENIZER, text), text, None, self.finish))  # type: ignore[arg-type]
        return outs


class Library:
    """A retriever over fixed passages: a passage matches when it shares a word of 5+ letters."""

    def __init__(self, passages: list[Passage]) -> None:
        self.passages = passages
        self.calls: list[tuple[list[str], int]] = []

    async def asearch(self, queries: list[str], k: int) -> list[list[Passage]]:
        self.calls.append((list(queries), k))
        out = []
        for q in queries:
            words = {w.strip("?.,").lower() for w in q.split() if len(w.strip("?.,")) >= 5}
            hits = [p for p in self.passages if words & {w.strip("?.,").lower() for w in p.contents.split()}]
            out.append(hits[:k])
        return out


PASSAGES = [
    Passage("p1", "Window and Shadow\nWindow and Shadow is a novel written by Varnel Oskaro."),
    Passage("p2", "Varnel Oskaro\nVarnel Oskaro was born in Quessa."),
    Passage("p3", "Quessa\nQuessa is a city."),
]
Q = Question("q1", "Where was the author of Window and Shadow born?", ["Quessa"])


def baseline(name, backend, retriever=None, **method):
    return PromptedBaseline(name, BASELINES[name], backend, retriever, MethodConfig(name=name, **method), RolloutConfig())


def test_direct_answers_without_retrieval():
    backend = Scripted({Q.question: ["Answer: Quessa.\nIt is a city."]})
    [t] = asyncio.run(baseline("direct", backend).arun([Q]))
    assert t.answer == "Quessa" and t.stop_reason == "answered" and t.num_retrievals == 0
    assert [s.role for s in t.segments] == ["prompt", "model"]
    assert "Passages:" not in backend.contexts[0] and "<|im_start|>system" in backend.contexts[0]


def test_rag_searches_once_with_the_question_and_puts_passages_in_the_prompt():
    lib = Library(PASSAGES)
    backend = Scripted({Q.question: ["Varnel Oskaro"]})
    [t] = asyncio.run(baseline("rag", backend, lib, top_k=2).arun([Q]))
    assert lib.calls == [([Q.question], 2)]
    assert t.steps[0].query == Q.question and [d.id for d in t.steps[0].documents] == ["p1"]
    assert "(1) Window and Shadow: Window and Shadow is a novel" in backend.contexts[0]
    assert t.answer == "Varnel Oskaro" and t.num_retrievals == 1 and len(t.steps) == 2


def test_ircot_searches_with_each_sentence_until_the_answer():
    lib = Library(PASSAGES)
    script = ["The novel was written by Varnel Oskaro.\n", "Varnel Oskaro was born in Quessa.\n",
              "So the answer is: Quessa\n"]
    backend = Scripted({Q.question: script})
    [t] = asyncio.run(baseline("ircot", backend, lib, top_k=3).arun([Q]))
    # each sentence (without its full stop) is the next query
    assert [c[0] for c in lib.calls] == [[Q.question], [script[0].strip(".\n")], [script[1].strip(".\n")]]
    assert t.answer == "Quessa" and t.stop_reason == "answered"
    assert t.num_retrievals == 3 and len(t.steps) == 4
    # passages already shown are not repeated: p1 first, then p2 (p1 is skipped), then p3
    assert [[d.id for d in s.documents] for s in t.steps[:3]] == [["p1"], ["p2"], ["p3"]]
    # the context only grows: each request extends the previous one
    assert all(b.startswith(a) for a, b in zip(backend.contexts, backend.contexts[1:]))
    assert "More passages:\n(1) Varnel Oskaro" in backend.contexts[1]
    assert t.text.startswith(backend.contexts[-1])
    assert [s.role for s in t.segments] == ["prompt", "model", "env", "model", "env", "model"]


def test_ircot_stops_at_max_steps_and_on_empty_turns():
    lib = Library(PASSAGES)
    backend = Scripted({Q.question: ["Thinking about Window.\n", "Still thinking about Shadow.\n"]})
    [t] = asyncio.run(baseline("ircot", backend, lib, max_steps=2).arun([Q]))
    assert t.stop_reason == "max_steps" and t.answer is None and t.num_retrievals == 2
    backend = Scripted({Q.question: ["\n"]})
    [t] = asyncio.run(baseline("ircot", backend, lib).arun([Q]))
    assert t.stop_reason == "format_error" and t.steps[-1].format_error == "empty_query"


def test_ircot_takes_a_sentence_that_ends_the_turn_as_the_answer():
    backend = Scripted({Q.question: ["Quessa<|im_end|>"]}, finish="eos")
    [t] = asyncio.run(baseline("ircot", backend, Library(PASSAGES)).arun([Q]))
    assert t.answer == "Quessa" and t.stop_reason == "answered"


def test_retrieval_failure_is_a_stop_reason():
    class Down:
        async def asearch(self, queries, k):
            raise ConnectionError("refused")

    [t] = asyncio.run(baseline("rag", Scripted({Q.question: ["x"]}), Down()).arun([Q]))
    assert t.stop_reason == "retrieval_failed" and "refused" in t.metadata["retrieval_error"]


def test_clean_answer_and_templates(tmp_path):
    assert clean_answer("  \nThe answer is: Ann Lee.\nmore") == "Ann Lee"
    assert clean_answer("Paris<|im_end|>", eos="<|im_end|>") == "Paris"
    assert clean_answer("\n\n") == ""
    for spec in BASELINES.values():
        system, user = load_prompt(spec.template)
        assert system and "$question" in user and ("$documents" in user) == spec.initial_retrieval
    bad = tmp_path / "p.txt"
    bad.write_text("no sections")
    with pytest.raises(ValueError, match="needs '### system'"):
        load_prompt("direct.txt", bad)
