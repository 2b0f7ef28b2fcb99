"""A stand-in OpenAI-compatible judge server for tests and benchmarks (no model, no network).

It speaks ``POST /v1/chat/completions`` and ``GET /health`` and answers the two prompts of
:mod:`r3rag.rewards.judge` by rule, in one of these modes (switchable while running):

``correct``  verdicts: True when the squad-normalised prediction contains a gold answer and is at
             most two tokens longer; scores: the fraction of the query's normalised tokens found
             in the passages, rounded to 2 decimals;
``garbage``  replies with text no strict parser accepts;
``slow``     like ``correct`` after ``slow_s`` seconds (longer than a client's timeout in tests);
``error``    HTTP 500 with a JSON error;
``flaky``    HTTP 500 for the first ``flaky_failures`` requests, then ``correct``.

Every reply waits ``latency_s`` first (``asyncio.sleep``, so concurrent requests overlap, like a
batching inference server). ``requests`` counts what arrived. A closed port is the fifth
("not listening") case and needs no server.

    with StandinJudge(mode="correct", latency_s=0.05) as judge:
        client = JudgeClient(JudgeConfig(base_url=judge.base_url))
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from r3rag.metrics import normalize_squad
from r3rag.testing.threaded_server import ThreadedServer

MODES: tuple[str, ...] = ("correct", "garbage", "slow", "error", "flaky")
MAX_BODY_BYTES = 1_000_000
_FIELD = re.compile(r"^(Question|Reference answers|Predicted answer|Search query):[ ]?(.*)$", re.MULTILINE)


def rule_reply(prompt: str) -> str:
    """The ``correct``-mode reply to one user prompt of the packaged judge templates.

    >>> rule_reply("Reference answers: Paris | City of Light\\nPredicted answer: paris")
    'True'
    >>> rule_reply("Search query: capital France\\nRetrieved passages:\\n(1) Paris is the capital.\\n\\nScoring")
    '0.5'
    """
    fields = dict(_FIELD.findall(prompt))
    if "Predicted answer" in fields:
        pred = normalize_squad(fields["Predicted answer"])
        golds = [normalize_squad(g) for g in fields.get("Reference answers", "").split(" | ")]
        ok = any(g and g in pred and len(pred.split()) <= len(g.split()) + 2 for g in golds)
        return "True" if ok else "False"
    query = normalize_squad(fields.get("Search query", "")).split()
    passages = prompt.split("Retrieved passages:", 1)[-1].split("\n\n")[0]
    words = set(normalize_squad(passages).split())
    score = sum(t in words for t in query) / len(query) if query else 0.0
    return f"{score:.2f}".rstrip("0").rstrip(".") if score not in (0.0, 1.0) else str(int(score))


def _completion(content: str, model: str) -> dict[str, Any]:
    return {
        "id": "standin",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
    }


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error"}}, status_code=status)


class StandinJudge(ThreadedServer):
    label = "stand-in judge"

    """The stand-in server, run by uvicorn in a background thread on 127.0.0.1 and a free port."""

    def __init__(
        self,
        mode: str = "correct",
        latency_s: float = 0.0,
        slow_s: float = 2.0,
        flaky_failures: int = 2,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown stand-in mode {mode!r}; choose one of {MODES}")
        self.mode = mode
        self.latency_s = latency_s
        self.slow_s = slow_s
        self.flaky_failures = flaky_failures
        self.host = host
        self.port = port or free_port(host)
        self.requests = 0
        self.last_authorization: str | None = None
        self.app = self._build_app()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def _build_app(self) -> FastAPI:
        app = FastAPI(title="r3rag stand-in judge")

        @app.get("/health")
        async def health() -> dict[str, Any]:
            return {"status": "ok", "mode": self.mode}

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Any:
            raw = await request.body()
            if len(raw) > MAX_BODY_BYTES:
                return _error(413, f"request body over {MAX_BODY_BYTES} bytes")
            try:
                body = json.loads(raw)
                messages = body["messages"]
                prompt = str(messages[-1]["content"])
            except (ValueError, KeyError, IndexError, TypeError):
                return _error(400, "expected JSON with a non-empty 'messages' list of {role, content}")
            self.requests += 1
            self.last_authorization = request.headers.get("authorization")
            n = self.requests
            await asyncio.sleep(self.latency_s)
            model = str(body.get("model", "standin"))
            if self.mode == "error" or (self.mode == "flaky" and n <= self.flaky_failures):
                return _error(500, "stand-in judge: simulated server error")
            if self.mode == "garbage":
                return _completion("I think it is probably fine, hard to say!", model)
            if self.mode == "slow":
                await asyncio.sleep(self.slow_s)
            return _completion(rule_reply(prompt), model)

        return app


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (also the 'not listening' judge in tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


async def _serve_minimal(host: str, port: int, mode: str, latency_s: float) -> None:
    """A bare asyncio HTTP/1.1 server (keep-alive, Content-Length bodies) with the same replies.

    FastAPI and uvicorn cost several ms of CPU per request on a loaded two-core machine, which
    would make a concurrency benchmark measure the stand-in instead of the client. Only
    ``correct``, ``garbage`` and ``error`` modes; used by :class:`StandinJudgeProcess` with
    ``engine="minimal"``.
    """

    def respond(writer: asyncio.StreamWriter, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 413: "Payload Too Large", 500: "Internal Server Error"}
        head = f"HTTP/1.1 {status} {reason.get(status, 'Error')}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
        writer.write(head.encode() + data)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path = lines[0].split(" ")[:2]
                length = 0
                for line in lines[1:]:
                    if line.lower().startswith("content-length:"):
                        length = int(line.split(":", 1)[1])
                if length > MAX_BODY_BYTES:
                    respond(writer, 413, {"error": {"message": "request body too large"}})
                    await writer.drain()
                    break
                raw = await reader.readexactly(length) if length else b""
                if method == "GET" and path == "/health":
                    respond(writer, 200, {"status": "ok", "mode": mode})
                elif method == "POST" and path == "/v1/chat/completions":
                    try:
                        body = json.loads(raw)
                        prompt = str(body["messages"][-1]["content"])
                    except (ValueError, KeyError, IndexError, TypeError):
                        respond(writer, 400, {"error": {"message": "expected JSON with 'messages'"}})
                    else:
                        await asyncio.sleep(latency_s)
                        if mode == "error":
                            respond(writer, 500, {"error": {"message": "simulated server error"}})
                        else:
                            text = "not sure" if mode == "garbage" else rule_reply(prompt)
                            respond(writer, 200, _completion(text, str(body.get("model", "standin"))))
                else:
                    respond(writer, 404, {"error": {"message": f"no route {method} {path}"}})
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, host, port, backlog=1024)
    async with server:
        await server.serve_forever()


class StandinJudgeProcess:
    """The stand-in in its own process (``python -m r3rag.testing.standin_judge``): for benchmarks,
    so the server does not share the client's interpreter lock. Stopped (terminate, then kill) on exit."""

    def __init__(
        self, mode: str = "correct", latency_s: float = 0.0, host: str = "127.0.0.1", port: int = 0, engine: str = "fastapi"
    ) -> None:
        self.mode, self.latency_s, self.host, self.engine = mode, latency_s, host, engine
        self.port = port or free_port(host)
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def __enter__(self) -> "StandinJudgeProcess":
        cmd = [sys.executable, "-m", "r3rag.testing.standin_judge", "--mode", self.mode,
               "--latency-s", str(self.latency_s), "--host", self.host, "--port", str(self.port), "--quiet", "--engine", self.engine]
        self._proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://{self.host}:{self.port}/health", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError("stand-in judge process did not start")
            time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description="Run the stand-in OpenAI-compatible judge (for local testing).")
    parser.add_argument("--mode", choices=MODES, default="correct", help="how to answer (default: %(default)s)")
    parser.add_argument("--latency-s", type=float, default=0.05, help="delay before each reply (default: %(default)s)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default: %(default)s)")
    parser.add_argument("--port", type=int, default=8001, help="port (default: %(default)s)")
    parser.add_argument("--quiet", action="store_true", help="no access log")
    parser.add_argument("--engine", choices=("fastapi", "minimal"), default="fastapi",
                        help="fastapi (full checks) or a bare asyncio server for benchmarks (default: %(default)s)")
    args = parser.parse_args()
    if args.engine == "minimal":
        asyncio.run(_serve_minimal(args.host, args.port, args.mode, args.latency_s))
        return
    judge = StandinJudge(mode=args.mode, latency_s=args.latency_s, host=args.host, port=args.port)
    uvicorn.run(judge.app, host=args.host, port=args.port, log_level="warning" if args.quiet else "info",
                access_log=not args.quiet)


if __name__ == "__main__":
    main()
