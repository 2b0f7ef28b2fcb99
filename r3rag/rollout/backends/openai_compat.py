"""OpenAI-compatible HTTP backend: ``/v1/completions`` or ``/v1/chat/completions``.

For a vLLM server or a hosted teacher model. ``base_url`` is the server's root (``http://host:8000``)
or, as the OpenAI SDK writes it, that root plus ``/v1``. Requests of a round are sent concurrently (bounded by
``max_concurrency``), each with its own temperature, seed, stop strings and ``max_tokens``.

Token ids: a vLLM server returns the sampled ids when asked
(``return_tokens_as_token_ids`` with ``logprobs``: every token reads ``token_id:N``); those are
used as they are (``exact_ids=True``) on the completions endpoint. The chat endpoint re-renders
the conversation on the server, so its ids are not known to follow our context: flagged
``exact_ids=False`` even with ids. A server that returns only text (a hosted API) gets its
text tokenised locally and is flagged ``exact_ids=False`` too. The trajectory records it
(:attr:`~r3rag.rollout.trajectory.Trajectory.exact_ids`) and its ``loss_mask`` then refuses: fine
for cold-start SFT text, not for token-level RL.

Stop strings: OpenAI servers strip the matched stop string; we add it back (``stop_string``
from ``finish_reason == "stop"`` and the ``stop_reason`` field vLLM returns), so the text matches
what was generated. A failed request (HTTP error, timeout, unparsable reply) becomes an output with
``finish_reason="error"``; it never raises.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import httpx

from r3rag.rollout.backends.base import GenerationOutput, GenerationRequest, PolicyBackend
from r3rag.rollout.tokens import decode, encode


class OpenAICompatBackend(PolicyBackend):
    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        tokenizer: Any,
        endpoint: Literal["completions", "chat"] = "completions",
        api_key: str | None = None,
        timeout: float = 60.0,
        max_concurrency: int = 32,
        token_ids_from_server: bool = True,
        send_prompt_ids: bool = True,
        retries: int = 2,
    ) -> None:
        # the server's root; a URL in the OpenAI SDK's convention (".../v1") names the same server
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.model = model
        self.tokenizer = tokenizer
        self.endpoint = endpoint
        self.timeout = timeout
        self.retries = retries
        self.token_ids_from_server = token_ids_from_server
        self.send_prompt_ids = send_prompt_ids
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.max_concurrency = max_concurrency
        self._sem: asyncio.Semaphore | None = None
        self._client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout, headers=self._headers)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def generate_batch(self, requests: list[GenerationRequest]) -> list[GenerationOutput]:
        async def go() -> list[GenerationOutput]:
            try:
                return await self.agenerate(requests)
            finally:
                await self.aclose()

        return asyncio.run(go())

    async def agenerate(self, requests: list[GenerationRequest]) -> list[GenerationOutput]:
        self._sem = asyncio.Semaphore(self.max_concurrency)  # bound to the running loop
        return list(await asyncio.gather(*(self._one(r) for r in requests)))

    def _payload(self, req: GenerationRequest) -> tuple[str, dict[str, Any]]:
        p = req.params
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": p.max_tokens,
            "temperature": p.temperature,
            "top_p": p.top_p,
            "stop": p.stop or None,
            "n": 1,
        }
        if p.seed is not None:
            body["seed"] = p.seed
        if self.token_ids_from_server:
            body["return_tokens_as_token_ids"] = True
            body["include_stop_str_in_output"] = True
            body["skip_special_tokens"] = False
        if self.endpoint == "chat":
            if req.messages is None:
                raise ValueError("the chat endpoint needs a chat-mode format (the request has no messages)")
            body["messages"] = req.messages
            if self.token_ids_from_server:
                body["logprobs"] = True
                body["top_logprobs"] = 0
            return "/v1/chat/completions", body
        body["prompt"] = req.prompt_ids if self.send_prompt_ids else req.prompt_text
        if self.token_ids_from_server:
            body["logprobs"] = 0
        return "/v1/completions", body

    async def _one(self, req: GenerationRequest) -> GenerationOutput:
        try:
            path, body = self._payload(req)
        except ValueError as err:
            return GenerationOutput([], "", None, "error", error=str(err))
        last = ""
        assert self._sem is not None
        async with self._sem:
            for attempt in range(self.retries + 1):
                try:
                    r = await self._http().post(self.base_url + path, json=body)
                    if r.status_code >= 400:
                        last = f"HTTP {r.status_code}: {r.text[:200]}"
                        if r.status_code < 500:
                            break
                        continue
                    return self._parse(r.json(), req)
                except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as err:
                    last = f"{type(err).__name__}: {err}"
                await asyncio.sleep(0.05 * (attempt + 1))
        return GenerationOutput([], "", None, "error", error=last)

    def _parse(self, data: dict[str, Any], req: GenerationRequest) -> GenerationOutput:
        choice = data["choices"][0]
        if self.endpoint == "chat":
            text = choice["message"].get("content") or ""
            lp = (choice.get("logprobs") or {}).get("content")
            tokens = [t["token"] for t in lp] if lp else None
            logprobs = [float(t["logprob"]) for t in lp] if lp else None
        else:
            text = choice.get("text") or ""
            lp = choice.get("logprobs") or None
            tokens = lp.get("tokens") if lp else None
            logprobs = [float(x) for x in lp["token_logprobs"]] if lp and lp.get("token_logprobs") else None
        raw_finish = choice.get("finish_reason") or "stop"
        stop_string = choice.get("stop_reason") if isinstance(choice.get("stop_reason"), str) else None
        if raw_finish == "stop" and stop_string is None:
            stop_string = next((s for s in req.params.stop if text.endswith(s)), None)
        ids = _ids_from_tokens(tokens) if tokens else None
        if ids is not None:
            text = decode(self.tokenizer, ids)
            # the chat endpoint renders the conversation itself: the ids are what the server's
            # model sampled, but its context is the server's rendering, not known to be ours
            exact = self.endpoint != "chat"
        else:
            if raw_finish == "stop" and stop_string and not text.endswith(stop_string):
                text += stop_string  # server stripped it
            eos_text = self.tokenizer.eos_token or ""
            if raw_finish == "stop" and stop_string is None and eos_text and not text.endswith(eos_text):
                text += eos_text  # ended by EOS, which servers leave out of the text
            ids = encode(self.tokenizer, text)
            logprobs = None
            exact = False
        eos = self.tokenizer.eos_token_id
        finish = "length" if raw_finish == "length" else ("eos" if (ids and ids[-1] == eos) or stop_string is None else "stop")
        return GenerationOutput(ids, text, logprobs, finish, stop_string=stop_string, exact_ids=exact)  # type: ignore[arg-type]


def _ids_from_tokens(tokens: list[str]) -> list[int] | None:
    """vLLM's ``return_tokens_as_token_ids`` spells every token ``token_id:N``."""
    out = []
    for t in tokens:
        if not isinstance(t, str) or not t.startswith("token_id:"):
            return None
        try:
            out.append(int(t[len("token_id:"):]))
        except ValueError:
            return None
    return out
