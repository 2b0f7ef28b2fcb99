"""Stand-ins for the OpenRLHF plugin tests: an engine with OpenRLHF's call shape, a SamplingParams.

``StandinEngine.generate(prompt_token_ids, sampling_params)`` is awaited exactly as OpenRLHF's
``RolloutRayActor.generate`` is by an executor, and returns an object shaped like vLLM's
``RequestOutput`` (``outputs[0].token_ids / .text / .logprobs / .finish_reason / .stop_reason``).
It "samples" scripted text token by token and applies the request's stop strings, budget and
log-prob request the way vLLM does, so the plugin's use of them is exercised.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from types import SimpleNamespace
from typing import Any, Callable

from r3rag.rollout.tokens import decode, encode

DOCS = "The retrieval documents:"


def steps_script(eos: str) -> dict[str, list[str]]:
    from rollout_helpers import QUESTIONS

    q1, q2 = QUESTIONS[0].question, QUESTIONS[1].question
    return {
        q1: ["Step 1:\nThe problem analysis: where was he born\nThe retrieval query: Varnel Oskaro born" + eos,
             "Step 2:\nThe problem analysis: which province\nThe retrieval query: Quessa province" + eos,
             "Step 3:\nThe problem analysis: Quessa is in Dromel\nThe final answer: Dromel" + eos],
        # the first turn runs past the stop string: the engine must cut it there
        q2: ["Step 1:\nThe problem analysis: founder\nThe retrieval query: founded Melvane Works\n" + DOCS + " made up",
             "Step 2:\nThe problem analysis: found it\nThe final answer: Tirra Olle" + eos],
    }


class StandinSamplingParams:
    """The fields of vLLM's SamplingParams the plugin reads or sets (keyword-only, like vLLM's)."""

    def __init__(self, *, n=1, temperature=1.0, top_p=1.0, top_k=-1, max_tokens=None, min_tokens=0, logprobs=None,
                 skip_special_tokens=False, stop=None, include_stop_str_in_output=False, seed=None) -> None:
        self.n, self.temperature, self.top_p, self.top_k = n, temperature, top_p, top_k
        self.max_tokens, self.min_tokens, self.logprobs = max_tokens, min_tokens, logprobs
        self.skip_special_tokens, self.stop, self.seed = skip_special_tokens, stop, seed
        self.include_stop_str_in_output = include_stop_str_in_output


@dataclass
class StandinEngine:
    """``script(context_text) -> the text the model writes next`` (may end with the EOS text)."""

    tokenizer: Any
    script: Callable[[str], str]
    delay: float = 0.0
    calls: list[tuple[list[int], Any]] = field(default_factory=list)

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        self.calls.append((list(prompt_token_ids), sampling_params))
        if self.delay:
            await asyncio.sleep(self.delay)
        text = self.script(decode(self.tokenizer, list(prompt_token_ids)))
        full = encode(self.tokenizer, text)
        stops = [s for s in (sampling_params.stop or []) if s]
        out_ids: list[int] = []
        finish, stop_reason = "length", None
        for tok in full:
            if sampling_params.max_tokens is not None and len(out_ids) >= sampling_params.max_tokens:
                break
            out_ids.append(tok)
            so_far = decode(self.tokenizer, out_ids)
            hit = next((s for s in stops if s in so_far), None)
            if hit is not None:
                assert sampling_params.include_stop_str_in_output, "the plugin must keep stop strings"
                finish, stop_reason = "stop", hit
                break
            if tok == self.tokenizer.eos_token_id:
                finish = "stop"
                break
        else:
            finish = "stop"
        logprobs = None
        if sampling_params.logprobs is not None:
            logprobs = [{t: SimpleNamespace(logprob=-0.25 - 0.001 * i)} for i, t in enumerate(out_ids)]
        completion = SimpleNamespace(token_ids=out_ids, text=decode(self.tokenizer, out_ids), logprobs=logprobs,
                                     finish_reason=finish, stop_reason=stop_reason)
        return SimpleNamespace(outputs=[completion], prompt_token_ids=list(prompt_token_ids))


def turn_script(turns: dict[str, list[str]], marker: str) -> Callable[[str], str]:
    """Turn ``i`` of a question = ``turns[question][i]``, ``i`` = documents blocks already in the context."""

    def script(context: str) -> str:
        key = max((q for q in turns if q in context), key=len)
        i = context[context.find(key):].count(marker)
        return turns[key][min(i, len(turns[key]) - 1)]

    return script


class EngineBackend:
    """The same stand-in model as our own engine's backend (``PolicyBackend`` duck type), so one
    script drives both paths: the plugin on ``StandinEngine`` and ``RolloutEngine`` on this."""

    name = "standin"

    def __init__(self, engine: StandinEngine) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer

    async def agenerate(self, requests):
        from r3rag.rollout.backends.vllm import completion_to_output

        outs = []
        for r in requests:
            p = StandinSamplingParams(max_tokens=r.params.max_tokens, stop=list(r.params.stop),
                                      include_stop_str_in_output=True, logprobs=0)
            res = await self.engine.generate(r.prompt_ids, p)
            outs.append(completion_to_output(res.outputs[0], self.tokenizer.eos_token_id))
        return outs

    async def aclose(self):
        return None


class SlowRetrieve(BaseHTTPRequestHandler):
    """A /retrieve endpoint that answers after ``delay`` seconds with the first ``topk`` passages."""

    delay = 0.6
    corpus: list = []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        time.sleep(self.delay)
        result = [[{"document": {"id": p.id, "contents": p.contents}, "score": 1.0} for p in self.corpus[:body["topk"]]]
                  for _ in body["queries"]]
        data = json.dumps({"result": result}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass
