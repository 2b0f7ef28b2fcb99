"""A stand-in OpenAI-compatible server that serves any :class:`PolicyBackend` over HTTP.

Tests point :class:`~r3rag.rollout.backends.openai_compat.OpenAICompatBackend` at it; it also lets
a local model or the oracle play "hosted teacher" on a machine without internet. Endpoints:
``GET /health``, ``POST /v1/completions`` (``prompt``: text or token ids) and
``POST /v1/chat/completions`` (``messages``, rendered with the tokenizer's chat template).

It mimics the two server behaviours the client must handle: a plain OpenAI server strips the
matched stop string and returns only text; a vLLM server with ``include_stop_str_in_output`` and
``return_tokens_as_token_ids`` (plus ``logprobs``) keeps it and spells tokens ``token_id:N``.
Bad input gets a 400 JSON error that says what was wrong; bodies over ``max_body_bytes`` get 413.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from r3rag.rollout.backends.base import GenerationRequest, PolicyBackend, SamplingParams
from r3rag.rollout.tokens import encode


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error"}}, status_code=status)


def create_openai_app(backend: PolicyBackend, model_name: str = "standin", max_body_bytes: int = 4 << 20,
                      check_model: bool = False) -> FastAPI:
    """``check_model``: answer a request for another model than ``model_name`` with vLLM's 404
    (``vllm serve ORG/NAME`` serves the model under its hub id and nothing else)."""
    app = FastAPI(title="r3rag OpenAI-compatible stand-in")
    tok = backend.tokenizer
    app.state.requests = 0

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": model_name, "requests": app.state.requests}

    async def body_of(request: Request) -> dict[str, Any] | JSONResponse:
        raw = await request.body()
        if len(raw) > max_body_bytes:
            return _error(413, f"request body is {len(raw)} bytes; the limit is {max_body_bytes}")
        try:
            data = json.loads(raw)
        except ValueError:
            return _error(400, "request body is not valid JSON")
        if not isinstance(data, dict):
            return _error(400, "request body must be a JSON object")
        return data

    def params_of(data: dict[str, Any]) -> SamplingParams | str:
        try:
            stop = data.get("stop") or []
            stop = [stop] if isinstance(stop, str) else list(stop)
            if not all(isinstance(s, str) for s in stop):
                return "stop must be a string or a list of strings"
            p = SamplingParams(
                max_tokens=int(data.get("max_tokens", 16)),
                temperature=float(data.get("temperature", 1.0)),
                top_p=float(data.get("top_p", 1.0)),
                stop=stop,
                seed=None if data.get("seed") is None else int(data["seed"]),
            )
        except (TypeError, ValueError) as err:
            return f"bad sampling parameter: {err}"
        if p.max_tokens < 1 or p.temperature < 0 or not 0 < p.top_p <= 1:
            return "max_tokens must be >= 1, temperature >= 0 and top_p in (0, 1]"
        return p

    async def complete(data: dict[str, Any], text: str, ids: list[int], messages: Any, chat: bool) -> JSONResponse:
        if check_model and data.get("model") != model_name:
            return _error(404, f"The model `{data.get('model')}` does not exist.")
        params = params_of(data)
        if isinstance(params, str):
            return _error(400, params)
        app.state.requests += 1
        out = (await backend.agenerate([GenerationRequest(ids, text, params, messages)]))[0]
        if out.finish_reason == "error":
            return _error(500, f"backend failed: {out.error}")
        keep_stop = bool(data.get("include_stop_str_in_output"))
        lp = data.get("logprobs")
        as_ids = bool(data.get("return_tokens_as_token_ids")) and lp is not None and lp is not False
        gen_text, gen_ids = out.text, out.token_ids
        if out.stop_string and not keep_stop:
            cut = gen_text.find(out.stop_string)
            gen_text = gen_text[: cut if cut >= 0 else len(gen_text)]
            as_ids = False  # ids past the cut no longer match the text
        finish = "length" if out.finish_reason == "length" else "stop"
        eos = tok.eos_token or ""
        if out.finish_reason == "eos" and eos and gen_text.endswith(eos) and data.get("skip_special_tokens", True):
            gen_text = gen_text[: -len(eos)]
        tokens = [f"token_id:{i}" for i in gen_ids] if as_ids else None
        lps = out.logprobs or [0.0] * len(gen_ids)
        if chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": gen_text}}
            if tokens:
                choice["logprobs"] = {"content": [{"token": t, "logprob": lp} for t, lp in zip(tokens, lps)]}
        else:
            choice = {"index": 0, "text": gen_text}
            if tokens:
                choice["logprobs"] = {"tokens": tokens, "token_logprobs": lps}
        choice["finish_reason"] = finish
        choice["stop_reason"] = out.stop_string
        usage = {"prompt_tokens": len(ids), "completion_tokens": len(gen_ids)}
        return JSONResponse({"object": "chat.completion" if chat else "text_completion", "model": model_name, "choices": [choice], "usage": usage})

    @app.post("/v1/completions")
    async def completions(request: Request) -> JSONResponse:
        data = await body_of(request)
        if isinstance(data, JSONResponse):
            return data
        prompt = data.get("prompt")
        if isinstance(prompt, str):
            text, ids = prompt, encode(tok, prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(i, int) and 0 <= i < len(tok) for i in prompt):
            ids = list(prompt)
            text = tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        else:
            return _error(400, "prompt must be a non-empty string or a list of valid token ids")
        return await complete(data, text, ids, None, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> JSONResponse:
        data = await body_of(request)
        if isinstance(data, JSONResponse):
            return data
        msgs = data.get("messages")
        ok = isinstance(msgs, list) and msgs and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in msgs
        )
        if not ok:
            return _error(400, "messages must be a non-empty list of {role, content} objects with string values")
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        return await complete(data, text, encode(tok, text), msgs, chat=True)

    return app
