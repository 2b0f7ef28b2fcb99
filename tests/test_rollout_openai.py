"""OpenAI-compatible backend against the local stand-in server (completions and chat)."""

from __future__ import annotations

import socket

import httpx
import pytest
from rollout_helpers import CORPUS, QUESTIONS, tiny_tokenizer

from r3rag.retrieval.service import serve_app_in_thread
from r3rag.rollout.backends.openai_compat import OpenAICompatBackend
from r3rag.rollout.config import RolloutConfig
from r3rag.rollout.engine import RolloutEngine
from r3rag.rollout.formats import get_format
from r3rag.rollout.oracle import OracleBackend
from r3rag.testing.fake_retriever import OverlapRetriever
from r3rag.testing.openai_standin import create_openai_app


def serve_oracle(name: str, mode: str):
    tok = tiny_tokenizer()
    f = get_format(name, mode=mode, tokenizer=tok)
    return serve_app_in_thread(create_openai_app(OracleBackend(QUESTIONS, f, tok)))


def run(url: str, name: str, mode: str, **kw):
    tok = tiny_tokenizer()
    be = OpenAICompatBackend(url, "standin", tok, **kw)
    cfg = RolloutConfig(format=name, mode=mode, docs_per_step=2)
    return RolloutEngine(be, OverlapRetriever(CORPUS), cfg).run(QUESTIONS)


def direct(name: str, mode: str):
    tok = tiny_tokenizer()
    f = get_format(name, mode=mode, tokenizer=tok)
    cfg = RolloutConfig(format=name, mode=mode, docs_per_step=2)
    return RolloutEngine(OracleBackend(QUESTIONS, f, tok), OverlapRetriever(CORPUS), cfg, fmt=f).run(QUESTIONS)


@pytest.mark.parametrize("name", ["r3rag_steps", "r1searcher_tags"])
def test_completions_with_server_token_ids_match_the_direct_run(name):
    with serve_oracle(name, "raw") as h:
        got = run(h.url, name, "raw", endpoint="completions")
    want = direct(name, "raw")
    assert [t.answer for t in got] == ["Dromel", "Tirra Olle", "unknown"]
    assert [t.token_ids for t in got] == [t.token_ids for t in want]
    assert all(t.metadata.get("exact_ids", True) for t in got)


def test_text_only_server_restores_stripped_stop_strings():
    with serve_oracle("r1searcher_tags", "raw") as h:
        got = run(h.url, "r1searcher_tags", "raw", token_ids_from_server=False, send_prompt_ids=False)
    want = direct("r1searcher_tags", "raw")
    assert [t.answer for t in got] == ["Dromel", "Tirra Olle", "unknown"]
    assert [t.text for t in got] == [t.text for t in want]
    assert got[0].metadata["exact_ids"] is False
    assert got[0].steps[0].raw.endswith("<|end_of_query|>")


@pytest.mark.parametrize("name", ["r3rag_steps", "r1searcher_tags"])
def test_chat_endpoint(name):
    with serve_oracle(name, "chat") as h:
        got = run(h.url, name, "chat", endpoint="chat")
    want = direct(name, "chat")
    assert [t.answer for t in got] == ["Dromel", "Tirra Olle", "unknown"]
    assert [t.token_ids for t in got] == [t.token_ids for t in want]


def test_unreachable_server_ends_trajectories_without_raising():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    got = run(f"http://127.0.0.1:{port}", "r3rag_steps", "raw", retries=0, timeout=2.0)
    # a dead server is the infrastructure's fault: backend_error, not a format error of the policy
    assert [t.stop_reason for t in got] == ["backend_error"] * 3
    assert "backend_error" in got[0].metadata and got[0].steps == [] and not got[0].trainable


def test_standin_answers_bad_input_with_clear_4xx():
    with serve_oracle("r3rag_steps", "raw") as h:
        assert httpx.get(h.url + "/health").json()["status"] == "ok"
        cases = [
            ("/v1/completions", b"{not json", "not valid JSON"),
            ("/v1/completions", b"[1, 2]", "JSON object"),
            ("/v1/completions", b'{"prompt": []}', "prompt must be"),
            ("/v1/completions", b'{"prompt": [99999999]}', "valid token ids"),
            ("/v1/completions", b'{"prompt": "x", "max_tokens": 0}', "max_tokens"),
            ("/v1/completions", b'{"prompt": "x", "stop": [1]}', "stop must be"),
            ("/v1/chat/completions", b'{"messages": [{"role": "user"}]}', "messages must be"),
        ]
        for path, body, msg in cases:
            r = httpx.post(h.url + path, content=body, headers={"content-type": "application/json"})
            assert r.status_code == 400 and msg in r.json()["error"]["message"], (path, body, r.text)
        big = httpx.post(h.url + "/v1/completions", content=b" " * (5 << 20))
        assert big.status_code == 413
        assert httpx.get(h.url + "/health").status_code == 200
