"""Teachers by name: the embedded world's oracle, any HF model, any OpenAI-compatible model.

- ``oracle`` (the CPU default): :class:`r3rag.rollout.oracle.OracleBackend` with teacher variety
  (paraphrased queries, varied analysis, wasted-then-corrected queries, rephrased retries); its
  text is tokenised with ``teacher.tokenizer`` (the student's), so the ids are exact for SFT.
- ``hf``: a transformers model through :class:`r3rag.rollout.backends.hf.HFBackend` (ids exact
  in that model's tokenizer).
- ``openai``: DeepSeek, GPT-4o, a local vLLM server...: ``teacher.base_url`` + ``teacher.model``,
  the key from the environment variable ``teacher.api_key_env``; ``teacher.tokenizer`` tokenises
  its text (ids need not be exact for SFT data: LLaMA-Factory tokenises the exported text).

Both the teacher and the retriever are probed once before the first chunk: unreachable ones stop
the build with one line instead of a folder of dropped questions.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from r3rag.data.records import Question
from r3rag.errors import ConfigError, R3RagError
from r3rag.rollout.backends.base import GenerationRequest, PolicyBackend, SamplingParams
from r3rag.rollout.config import RolloutConfig
from r3rag.train.coldstart.config import RetrieverSection, TeacherSection


class UnreachableError(R3RagError):
    """The teacher or the retriever does not answer."""


def _oracle(t: TeacherSection, questions: list[Question], rollout: RolloutConfig) -> tuple[PolicyBackend, Any]:
    from r3rag.rollout.backends.hf_loading import load_tokenizer
    from r3rag.rollout.formats.registry import get_format
    from r3rag.rollout.oracle import OracleBackend

    missing = [q.id for q in questions if not q.metadata.get("decomposition")]
    if missing:
        raise ConfigError(f"teacher oracle needs world questions with a gold decomposition; {len(missing)} have none "
                          f"(first: {missing[0]!r}); use teacher.kind=hf or openai for other data")
    tok = load_tokenizer(t.tokenizer)
    fmt = get_format(rollout.format, mode=rollout.mode, tokenizer=tok, observation_role=rollout.observation_role,
                     system_prompt_path=rollout.system_prompt_path, raw_prompt_path=rollout.raw_prompt_path,
                     prompt_variant=rollout.prompt_variant)
    variety = t.variety.model_copy(update={"max_steps": rollout.max_steps})
    return OracleBackend(questions, fmt, tok, variety=variety), tok


def _hf(t: TeacherSection, questions: list[Question], rollout: RolloutConfig) -> tuple[PolicyBackend, Any]:
    from r3rag.rollout.backends.registry import get_backend

    backend = get_backend("hf", model=t.model, dtype=t.dtype, device=t.device)
    return backend, backend.tokenizer


def _openai(t: TeacherSection, questions: list[Question], rollout: RolloutConfig) -> tuple[PolicyBackend, Any]:
    from r3rag.rollout.backends.hf_loading import load_tokenizer
    from r3rag.rollout.backends.registry import get_backend

    if not t.base_url:
        raise ConfigError("teacher.kind openai needs teacher.base_url (e.g. http://127.0.0.1:8000/v1)")
    tok = load_tokenizer(t.tokenizer)
    backend = get_backend("openai", base_url=t.base_url, model=t.model, tokenizer=tok, endpoint=t.endpoint,
                          api_key=os.environ.get(t.api_key_env))
    return backend, tok


TEACHERS: dict[str, Callable[[TeacherSection, list[Question], RolloutConfig], tuple[PolicyBackend, Any]]] = {
    "oracle": _oracle,
    "hf": _hf,
    "openai": _openai,
}


def build_teacher(t: TeacherSection, questions: list[Question], rollout: RolloutConfig) -> tuple[PolicyBackend, Any]:
    return TEACHERS[t.kind](t, questions, rollout)


def load_retriever(r: RetrieverSection) -> Any:
    if r.urls:
        from r3rag.retrieval.client import RetrievalClient

        return RetrievalClient(r.urls, timeout=r.timeout_s, retries=r.retries)
    if r.index_dir:
        from r3rag.retrieval.searcher import load_searcher
        from r3rag.rollout.retriever import SearcherRetriever

        try:
            return SearcherRetriever(load_searcher(r.index_dir))
        except (OSError, ValueError) as err:
            raise ConfigError(f"retriever.index_dir {r.index_dir}: {str(err).splitlines()[0]}") from None
    raise ConfigError("no retriever: set retriever.urls=[http://127.0.0.1:8000] or retriever.index_dir=DIR")


async def probe_retriever(retriever: Any) -> None:
    try:
        await retriever.asearch(["probe"], 1)
    except Exception as err:  # noqa: BLE001 - any failure means the build cannot work
        raise UnreachableError(f"retriever unreachable: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}") from None


async def probe_teacher(backend: PolicyBackend, t: TeacherSection) -> None:
    if t.kind != "openai":
        return
    req = GenerationRequest([], "ping", SamplingParams(max_tokens=1, temperature=0.0),
                            messages=[{"role": "user", "content": "ping"}])
    try:
        out = (await backend.agenerate([req]))[0]
    except Exception as err:  # noqa: BLE001
        raise UnreachableError(f"teacher unreachable at {t.base_url}: {type(err).__name__}: {err}") from None
    if out.finish_reason == "error":
        raise UnreachableError(f"teacher unreachable at {t.base_url}: {out.error}")
