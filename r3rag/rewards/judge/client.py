"""An OpenAI-compatible LLM judge that never takes training down.

The judge answers two kinds of questions, each with its own packaged prompt template
(``r3rag/templates/judge/``, replaceable by ``judge.prompt_dir``):

- ``verdict``: is this predicted answer correct given the gold answers? (True/False) -- R3-RAG's
  outcome fallback and the evaluation's LLM-judge accuracy (R1-Searcher's ACC_L, R3-RAG's ACC);
- ``score``: how relevant are a step's documents to its query and analysis? (0-1) -- R3-RAG's
  process reward.

How a batch is answered (:meth:`JudgeClient.ajudge`):

1. each request body (model, messages, temperature, max_tokens) is hashed; a cache hit returns
   the stored reply without a network call;
2. misses go out as ``POST {base_url}/chat/completions``, at most ``concurrency`` in flight:
   that many workers, each with its own keep-alive connection, take requests from a queue. The
   client runs its own event loop in a daemon thread, so connections persist across calls
   (one per training step) and ``judge()`` works from plain code and from inside an event loop;
3. a timeout, connection failure, HTTP 429 or 5xx is retried up to ``max_retries`` times after
   ``backoff_s * 2**attempt`` seconds (capped at ``backoff_max_s``); other 4xx are not retried;
4. the reply is parsed strictly (:mod:`r3rag.rewards.judge.parse`); a parsed reply is cached.

Every request gets a :class:`JudgeResult`; a failure is ``value=None`` with a ``status`` naming
why (``timeout``, ``unreachable``, ``http_error``, ``unparseable``, ``error``) and is counted in
:attr:`JudgeClient.stats`. No exception leaves :meth:`judge`/:meth:`ajudge`; what a missing
result is worth is the caller's configured policy (``on_failure``: zero, drop or rule_only).
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import string
import threading
from collections import Counter
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Sequence

import httpx

from r3rag.config import Section
from r3rag.errors import ConfigError
from r3rag.rewards.judge.cache import JudgeCache, request_key
from r3rag.rewards.judge.parse import PARSERS

JudgeKind = Literal["verdict", "score"]
FailurePolicy = Literal["zero", "drop", "rule_only"]
_RETRY_STATUS = frozenset({408, 409, 425, 429})
TEMPLATES: dict[str, str] = {"verdict": "correctness.txt", "score": "relevance.txt"}


class JudgeConfig(Section):
    """Where the judge lives and how hard to try. The API key is read from the environment
    variable named by ``api_key_env`` (no key is sent when it is unset)."""

    base_url: str = "http://127.0.0.1:8001/v1"
    model: str = "judge"
    api_key_env: str = "R3RAG_JUDGE_API_KEY"
    concurrency: int = 16
    timeout_s: float = 30.0
    max_retries: int = 3
    backoff_s: float = 0.5
    backoff_max_s: float = 8.0
    temperature: float = 0.0
    max_tokens: int = 16
    cache_path: str | None = ".r3rag_cache/judge.sqlite"
    prompt_dir: str | None = None
    on_failure: FailurePolicy = "zero"
    max_document_chars: int = 512


@dataclass
class JudgeRequest:
    """One question for the judge: its kind (how to parse the reply) and the chat messages."""

    kind: JudgeKind
    messages: list[dict[str, str]]


@dataclass
class JudgeResult:
    value: float | None  # 0-1 score, or 1.0/0.0 for True/False; None when missing
    status: str  # ok | cached | timeout | unreachable | http_error | unparseable | error
    reply: str | None = None

    @property
    def ok(self) -> bool:
        return self.value is not None


@dataclass
class JudgeStats:
    requests: int = 0
    cache_hits: int = 0
    ok: int = 0
    missing: int = 0
    retries: int = 0
    by_status: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "cache_hits": self.cache_hits,
            "ok": self.ok,
            "missing": self.missing,
            "retries": self.retries,
            "by_status": dict(self.by_status),
        }


def load_judge_template(kind: JudgeKind, prompt_dir: str | None = None) -> tuple[str, str]:
    """``(system, user)`` templates for ``kind``: ``### system`` / ``### user`` sections of the file."""
    name = TEMPLATES[kind]
    if prompt_dir is not None:
        text = (Path(prompt_dir) / name).read_text(encoding="utf-8")
    else:
        text = resources.files("r3rag").joinpath("templates", "judge", name).read_text(encoding="utf-8")
    _, _, rest = text.partition("### system\n")
    system, _, user = rest.partition("### user\n")
    if not user:
        raise ValueError(f"judge template {name}: needs '### system' and '### user' sections")
    return system.strip(), user.strip()


class JudgeClient:
    """Batched, cached, bounded-concurrency judge over an OpenAI-compatible chat endpoint.

    >>> client = JudgeClient(JudgeConfig(cache_path=None))
    >>> req = client.correctness_request("Capital of France?", "Paris", ["Paris"])
    >>> req.kind, req.messages[0]["role"], "Predicted answer: Paris" in req.messages[1]["content"]
    ('verdict', 'system', True)
    """

    def __init__(self, config: JudgeConfig | None = None) -> None:
        self.config = config or JudgeConfig()
        self.stats = JudgeStats()
        self.cache = JudgeCache(self.config.cache_path) if self.config.cache_path else None
        self._templates = {k: load_judge_template(k, self.config.prompt_dir) for k in TEMPLATES}  # type: ignore[arg-type]
        self._stats_lock = threading.Lock()
        self._ssl: ssl.SSLContext | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._loop_lock = threading.Lock()
        self._clients: list[httpx.AsyncClient] = []
        try:
            self._url = httpx.URL(self.config.base_url.rstrip("/") + "/chat/completions")  # parsed once
        except (httpx.InvalidURL, TypeError) as err:
            raise ConfigError(f"judge.base_url {self.config.base_url!r}: not a valid URL ({err})") from None
        if self._url.scheme not in ("http", "https"):
            raise ConfigError(f"judge.base_url {self.config.base_url!r}: expected http:// or https://")

    # ---- building requests -----------------------------------------------------------------
    def _request(self, kind: JudgeKind, **fields: str) -> JudgeRequest:
        system, user = self._templates[kind]
        content = string.Template(user).safe_substitute(fields)
        return JudgeRequest(kind, [{"role": "system", "content": system}, {"role": "user", "content": content}])

    def correctness_request(self, question: str, prediction: str, golden_answers: Sequence[str]) -> JudgeRequest:
        golds = " | ".join(str(g) for g in golden_answers)
        return self._request("verdict", question=question, golden_answers=golds, prediction=prediction)

    def relevance_request(self, question: str, analysis: str, query: str, documents: Sequence[str]) -> JudgeRequest:
        cut = self.config.max_document_chars
        docs = "\n".join(f"({i + 1}) {d[:cut]}" for i, d in enumerate(documents)) or "(none)"
        return self._request("score", question=question, analysis=analysis, query=query, documents=docs)

    def judge_correct(
        self, questions: Sequence[str], predictions: Sequence[str], golden_answers: Sequence[Sequence[str]]
    ) -> list[JudgeResult]:
        """LLM-judge accuracy for evaluation (R1-Searcher's ACC_L, R3-RAG's judge part of ACC):
        one True/False verdict per prediction; ``value`` 1.0/0.0, or None (missing) with a status."""
        if not len(questions) == len(predictions) == len(golden_answers):
            raise ValueError("questions, predictions and golden_answers must have the same length")
        return self.judge([self.correctness_request(q, p, g) for q, p, g in zip(questions, predictions, golden_answers)])

    def body(self, request: JudgeRequest) -> dict[str, Any]:
        return {
            "model": self.config.model,
            "messages": request.messages,
            "temperature": self.config.temperature,
            "max_tokens": self.config.max_tokens,
        }

    # ---- answering -------------------------------------------------------------------------
    def judge(self, requests: Sequence[JudgeRequest]) -> list[JudgeResult]:
        """Answer every request (blocking); never raises. Safe from any thread or event loop."""
        if not requests:
            return []
        try:
            future = asyncio.run_coroutine_threadsafe(self._ajudge_safe(requests), self._ensure_loop())
            return future.result()
        except Exception as err:
            return self._all_failed(requests, err)

    async def ajudge(self, requests: Sequence[JudgeRequest]) -> list[JudgeResult]:
        """Awaitable :meth:`judge` for async callers; never raises. Results are in request order."""
        if not requests:
            return []
        try:
            future = asyncio.run_coroutine_threadsafe(self._ajudge_safe(requests), self._ensure_loop())
            return await asyncio.wrap_future(future)
        except Exception as err:
            return self._all_failed(requests, err)

    def close(self) -> None:
        """Close the connections and stop the client's event-loop thread (it is a daemon anyway)."""
        with self._loop_lock:
            loop, self._loop = self._loop, None
        if loop is None:
            return
        clients, self._clients = self._clients, []

        async def shutdown() -> None:
            for c in clients:
                await c.aclose()

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), loop).result(timeout=10)
        except Exception:
            pass
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> "JudgeClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        """The client's own event loop, in a daemon thread: connections stay open across calls,
        and a synchronous call works the same from plain code and from inside another loop."""
        with self._loop_lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=loop.run_forever, name="r3rag-judge", daemon=True)
                self._thread.start()
                self._loop = loop
            return self._loop

    def _all_failed(self, requests: Sequence[JudgeRequest], err: BaseException) -> list[JudgeResult]:
        results = [JudgeResult(None, "error", repr(err)) for _ in requests]
        self._count(results)
        return results

    async def _ajudge_safe(self, requests: Sequence[JudgeRequest]) -> list[JudgeResult]:
        try:
            return await self._ajudge(requests)
        except Exception as err:  # last line of defence: the training loop must go on
            return self._all_failed(requests, err)

    async def _ajudge(self, requests: Sequence[JudgeRequest]) -> list[JudgeResult]:
        cfg = self.config
        results: list[JudgeResult | None] = [None] * len(requests)
        todo: list[int] = []
        for i, req in enumerate(requests):  # cache hits first: no connection is used for them
            hit = self.cache.get(request_key(self.body(req))) if self.cache is not None else None
            if hit is not None:
                results[i] = JudgeResult(PARSERS[req.kind](hit), "cached", hit)
            else:
                todo.append(i)
        if todo:
            queue: asyncio.Queue[int] = asyncio.Queue()
            for i in todo:
                queue.put_nowait(i)
            while len(self._clients) < max(1, cfg.concurrency):
                self._clients.append(self._http())

            async def worker(http: httpx.AsyncClient) -> None:
                while not queue.empty():
                    i = queue.get_nowait()
                    try:
                        results[i] = await self._one(http, requests[i])
                    except Exception as err:
                        results[i] = JudgeResult(None, "error", repr(err))

            await asyncio.gather(*(worker(c) for c in self._clients[: min(max(1, cfg.concurrency), len(todo))]))
        done = [r if r is not None else JudgeResult(None, "error") for r in results]
        self._count(done)
        return done

    def _http(self) -> httpx.AsyncClient:
        """One worker's connection: a client with a single keep-alive connection, reused across calls.

        ``concurrency`` workers each own one (instead of one shared pool): httpcore's shared pool
        scans every connection on every request, which measured about 2x the CPU per request.
        """
        return httpx.AsyncClient(
            headers={"Content-Type": "application/json"},
            timeout=httpx.Timeout(self.config.timeout_s),
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
            verify=self._ssl_context(),
        )

    def _auth_headers(self) -> dict[str, str]:
        env = self.config.api_key_env
        key = os.environ.get(env, "") if env else ""
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _ssl_context(self) -> ssl.SSLContext:
        """One TLS context per judge client, shared by its workers: httpx builds a new one for
        every ``AsyncClient`` otherwise (about 25 ms each, even with ``verify=False``)."""
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    async def _one(self, http: httpx.AsyncClient, req: JudgeRequest) -> JudgeResult:
        cfg = self.config
        body = self.body(req)
        parse = PARSERS[req.kind]
        key = request_key(body)
        data = json.dumps(body, ensure_ascii=False).encode("utf-8")
        status = "error"
        for attempt in range(cfg.max_retries + 1):
            if attempt:
                with self._stats_lock:
                    self.stats.retries += 1
                await asyncio.sleep(min(cfg.backoff_max_s, cfg.backoff_s * 2 ** (attempt - 1)))
            try:
                resp = await http.post(self._url, content=data, headers=self._auth_headers())
            except httpx.TimeoutException:
                status = "timeout"
                continue
            except httpx.TransportError:
                status = "unreachable"
                continue
            if resp.status_code >= 500 or resp.status_code in _RETRY_STATUS:
                status = "http_error"
                continue
            if resp.status_code >= 400:
                return JudgeResult(None, "http_error", resp.text[:200])
            reply = _reply_text(resp)
            if reply is None:
                return JudgeResult(None, "unparseable", resp.text[:200])
            value = parse(reply)
            if value is None:
                return JudgeResult(None, "unparseable", reply)
            if self.cache is not None:
                self.cache.put(key, reply)
            return JudgeResult(value, "ok", reply)
        return JudgeResult(None, status)

    def _count(self, results: Sequence[JudgeResult]) -> None:
        with self._stats_lock:
            for r in results:
                self.stats.requests += 1
                self.stats.by_status[r.status] += 1
                self.stats.cache_hits += r.status == "cached"
                if r.ok:
                    self.stats.ok += 1
                else:
                    self.stats.missing += 1


def _reply_text(resp: httpx.Response) -> str | None:
    try:
        content = resp.json()["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    return content if isinstance(content, str) else None
