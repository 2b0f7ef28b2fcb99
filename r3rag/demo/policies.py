"""The policies the demo can run, by name: ``hf`` (in-process model), ``openai`` (a served model,
e.g. ``vllm serve``) and ``oracle`` (the embedded world's gold-decomposition policy).

A :class:`Policy` hands the rollout engine a :class:`~r3rag.rollout.backends.base.PolicyBackend`
for the format chosen on the page. Model backends are loaded once and reused for every question;
the oracle needs the format to write its turns, so it builds a cheap backend per question. Every
policy reports its health in one line for the settings panel.
"""

from __future__ import annotations

import os
import sys
from abc import ABC, abstractmethod
from typing import Any, Callable

import httpx

from r3rag.data.records import Question
from r3rag.demo.config import PolicySection
from r3rag.errors import ConfigError
from r3rag.rollout.backends.base import PolicyBackend
from r3rag.rollout.backends.hf_loading import ModelLoadError
from r3rag.rollout.backends.hf_loading import load_tokenizer as _load_tokenizer
from r3rag.rollout.backends.registry import get_backend
from r3rag.rollout.formats.base import TrajectoryFormat
from r3rag.rollout.tiny_tokenizer import TINY_TOKENIZER


class Policy(ABC):
    """What the page needs from a policy: a tokenizer, a backend per format, a description, health."""

    tokenizer: Any = None

    @abstractmethod
    def backend_for(self, fmt: TrajectoryFormat) -> PolicyBackend:
        """The backend that writes the model turns of one trajectory in ``fmt``."""

    @abstractmethod
    def describe(self) -> str:
        """One line for the settings panel: which model, where."""

    async def health(self) -> tuple[bool, str]:
        """``(ok, message)``; in-process policies are healthy once loaded."""
        return True, "loaded in this process"

    def refusal(self, gold: Question | None) -> str | None:
        """Why this policy cannot answer a question (``gold``: its dataset record, if any), or None."""
        return None


class BackendPolicy(Policy):
    """A loaded model backend (``hf``), or a client of a model server (``openai``) with its health URL."""

    def __init__(self, backend: PolicyBackend, description: str, health_url: str | None = None, timeout_s: float = 5.0) -> None:
        self.backend = backend
        self.tokenizer = backend.tokenizer
        self.description = description
        self.health_url = health_url
        self.timeout_s = timeout_s

    def backend_for(self, fmt: TrajectoryFormat) -> PolicyBackend:
        return self.backend

    def describe(self) -> str:
        return self.description

    async def health(self) -> tuple[bool, str]:
        """GET the health URL; a server without it (404) is asked ``/health`` at its root (vLLM has both)."""
        if self.health_url is None:
            return await super().health()
        urls = [self.health_url]
        if self.health_url.endswith("/v1/models"):
            urls.append(self.health_url[: -len("/v1/models")] + "/health")
        status = 0
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s) as client:
                for url in urls:
                    status = (await client.get(url)).status_code
                    if status < 400:
                        return True, f"model server {url} is up"
        except httpx.HTTPError as err:
            return False, f"model server {self.health_url} is not answering ({type(err).__name__})"
        return False, f"model server {self.health_url} answered HTTP {status}"


class OraclePolicy(Policy):
    """The gold-decomposition policy of the embedded world: answers dataset questions only."""

    def __init__(self, questions: list[Question], tokenizer: Any) -> None:
        self.questions = questions
        self.tokenizer = tokenizer

    def backend_for(self, fmt: TrajectoryFormat) -> PolicyBackend:
        from r3rag.rollout.oracle import OracleBackend

        return OracleBackend(self.questions, fmt, self.tokenizer)

    def refusal(self, gold: Question | None) -> str | None:
        if gold is None:
            return "The oracle policy only follows the gold decompositions of dataset questions: pick an example."
        return None

    def describe(self) -> str:
        return f"oracle (gold decompositions of {len(self.questions)} dataset questions, through real retrieval)"


def load_tokenizer(spec: str) -> Any:
    """The tokenizer ``policy.tokenizer`` names (:func:`r3rag.rollout.backends.hf_loading.load_tokenizer`:
    a folder, a hub name, a ``.gguf`` file, ``smollm2`` or ``tiny``), errors prefixed with the key."""
    try:
        return _load_tokenizer(spec)
    except ModelLoadError as err:
        raise ConfigError(f"policy.tokenizer: {err}") from None


def _hf_policy(cfg: PolicySection, questions: list[Question]) -> Policy:
    from r3rag.precision import choose_precision

    precision = choose_precision(cfg.dtype, cfg.device)  # the one rule; auto: bf16 only where it is native
    print(precision.line("demo"), file=sys.stderr, flush=True)
    backend = get_backend("hf", model=cfg.model, dtype=precision.torch_name, device=cfg.device)
    return BackendPolicy(backend, f"hf in-process: {cfg.model} ({precision.torch_name}, {cfg.device})")


def _openai_policy(cfg: PolicySection, questions: list[Question]) -> Policy:
    if not cfg.base_url:
        raise ConfigError("policy.base_url: the openai policy needs the server URL, e.g. http://127.0.0.1:8000")
    tokenizer = load_tokenizer(cfg.tokenizer or cfg.model)
    api_key = os.environ.get(cfg.api_key_env) if cfg.api_key_env else None
    backend = get_backend(
        "openai", base_url=root_url(cfg.base_url), model=cfg.model, tokenizer=tokenizer, endpoint=cfg.endpoint,
        api_key=api_key, timeout=cfg.timeout_s,
    )
    url = root_url(cfg.base_url)
    description = f"openai-compatible server {url} serving {cfg.model} ({cfg.endpoint})"
    return BackendPolicy(backend, description, health_url=url + "/v1/models")


def root_url(base_url: str) -> str:
    """The server root: the backend adds ``/v1/...`` itself, so a trailing ``/v1`` is dropped."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _oracle_policy(cfg: PolicySection, questions: list[Question]) -> Policy:
    if not questions:
        raise ConfigError("policy.backend=oracle needs a dataset (data.dataset) whose questions it follows")
    return OraclePolicy(questions, load_tokenizer(cfg.tokenizer or TINY_TOKENIZER))


POLICIES: dict[str, Callable[[PolicySection, list[Question]], Policy]] = {
    "hf": _hf_policy,
    "openai": _openai_policy,
    "oracle": _oracle_policy,
}


def build_policy(cfg: PolicySection, questions: list[Question]) -> Policy:
    try:
        factory = POLICIES[cfg.backend]
    except KeyError:
        raise ConfigError(f"policy.backend: unknown {cfg.backend!r}; known: {', '.join(sorted(POLICIES))}") from None
    return factory(cfg, questions)
