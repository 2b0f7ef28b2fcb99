"""The judge client against the stand-in OpenAI server: correct, garbage, slow, 500s, not listening.

Results and counts must be as specified and nothing may raise."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from r3rag.data.records import Passage
from r3rag.rewards import load_recipe
from r3rag.rewards.judge import JudgeCache, JudgeClient, JudgeConfig, parse_score, parse_verdict, request_key
from r3rag.rollout.trajectory import Step, Trajectory
from r3rag.testing.standin_judge import StandinJudge, free_port

RECIPES = Path(__file__).resolve().parent.parent / "configs" / "rewards"


@pytest.fixture(scope="module")
def server():
    with StandinJudge(mode="correct") as judge:
        yield judge


@pytest.fixture
def judge_server(server: StandinJudge):
    server.mode, server.latency_s, server.requests = "correct", 0.0, 0
    yield server
    server.mode = "correct"


def client(base_url: str, **kw) -> JudgeClient:
    cfg = dict(base_url=base_url, cache_path=None, max_retries=0, backoff_s=0.01, timeout_s=5.0)
    cfg.update(kw)
    return JudgeClient(JudgeConfig(**cfg))


# ---- parsing and cache ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("reply", "score", "verdict"),
    [
        ("0.8", 0.8, None),
        ("Score: 1", 1.0, None),
        ("<think>hmm</think>\n0", 0.0, None),
        ("1.5", None, None),
        ("0.8 since the passage...", None, None),
        ("True", None, 1.0),
        ("false.", None, 0.0),
        ("Verdict: TRUE", None, 1.0),
        ("True. The prediction matches", None, None),
        ("", None, None),
    ],
)
def test_strict_parsing(reply: str, score: float | None, verdict: float | None) -> None:
    assert parse_score(reply) == score
    assert parse_verdict(reply) == verdict


def test_cache_persists_by_full_request(tmp_path: Path) -> None:
    path = tmp_path / "c" / "judge.sqlite"
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 0.0}
    cache = JudgeCache(path)
    cache.put(request_key(body), "True")
    cache.close()
    again = JudgeCache(path)
    assert again.get(request_key(dict(reversed(list(body.items()))))) == "True"
    assert again.get(request_key({**body, "temperature": 0.7})) is None
    assert len(again) == 1


# ---- the five server behaviours ---------------------------------------------------------------
def test_correct_mode_and_cache_hits_are_free(judge_server: StandinJudge, tmp_path: Path) -> None:
    c = client(judge_server.base_url, cache_path=str(tmp_path / "j.sqlite"))
    reqs = [
        c.correctness_request("Who?", "Ora Lind", ["Ora Lind"]),
        c.correctness_request("Who?", "Ari Voss", ["Ora Lind"]),
        c.relevance_request("Who?", "need mayor", "Harrow mayor", ["Harrow\nThe mayor is Ora Lind.", "Other\ntext"]),
        c.relevance_request("Who?", "need mayor", "mayor of Vell city", ["Vell\nA city."]),
    ]
    res = c.judge(reqs)
    assert [r.value for r in res] == [1.0, 0.0, 1.0, 0.5]  # query tokens found: 2/2 and 2/4
    assert [r.status for r in res] == ["ok"] * 4 and judge_server.requests == 4
    again = c.judge(reqs)
    assert [r.value for r in again] == [1.0, 0.0, 1.0, 0.5] and {r.status for r in again} == {"cached"}
    assert judge_server.requests == 4  # no new network calls
    assert c.stats.as_dict()["cache_hits"] == 4 and c.stats.ok == 8 and c.stats.missing == 0


def test_garbage_is_missing_counted_and_not_cached(judge_server: StandinJudge, tmp_path: Path) -> None:
    judge_server.mode = "garbage"
    c = client(judge_server.base_url, cache_path=str(tmp_path / "j.sqlite"))
    reqs = [c.correctness_request("Who?", "Ora Lind", ["Ora Lind"]) for _ in range(3)]
    res = c.judge(reqs)
    assert [r.value for r in res] == [None] * 3 and {r.status for r in res} == {"unparseable"}
    assert c.stats.missing == 3 and c.stats.by_status["unparseable"] == 3
    judge_server.mode = "correct"
    assert [r.value for r in c.judge(reqs[:1])] == [1.0]  # garbage was not cached


def test_slow_server_times_out(judge_server: StandinJudge) -> None:
    judge_server.mode, judge_server.slow_s = "slow", 1.5
    c = client(judge_server.base_url, timeout_s=0.2)
    t0 = time.monotonic()
    res = c.judge([c.correctness_request("Who?", "x", ["x"]) for _ in range(4)])
    assert [r.status for r in res] == ["timeout"] * 4 and c.stats.missing == 4
    assert time.monotonic() - t0 < 1.4  # concurrent, and the client did not wait for the reply


def test_500s_are_retried_with_backoff_then_missing(judge_server: StandinJudge) -> None:
    judge_server.mode = "error"
    c = client(judge_server.base_url, max_retries=2)
    res = c.judge([c.correctness_request("Who?", "x", ["x"]) for _ in range(3)])
    assert [r.status for r in res] == ["http_error"] * 3
    assert judge_server.requests == 9 and c.stats.retries == 6 and c.stats.missing == 3


def test_transient_500s_recover(judge_server: StandinJudge) -> None:
    judge_server.mode, judge_server.flaky_failures = "flaky", 2
    c = client(judge_server.base_url, max_retries=3, concurrency=1)
    res = c.judge([c.correctness_request("Who?", "Ora Lind", ["Ora Lind"])])
    assert res[0].value == 1.0 and c.stats.retries == 2 and judge_server.requests == 3


def test_not_listening_is_missing_not_a_crash() -> None:
    c = client(f"http://127.0.0.1:{free_port()}/v1", max_retries=1)
    res = c.judge([c.relevance_request("Who?", "a", "q", ["d"]) for _ in range(2)])
    assert [r.status for r in res] == ["unreachable"] * 2 and c.stats.missing == 2


def test_sync_call_inside_a_running_event_loop(judge_server: StandinJudge) -> None:
    c = client(judge_server.base_url)

    async def trainer_step() -> list[float | None]:
        return [r.value for r in c.judge([c.correctness_request("Who?", "Ora Lind", ["ora lind"])])]

    assert asyncio.run(trainer_step()) == [1.0]


def test_concurrency_overlaps_requests(judge_server: StandinJudge) -> None:
    judge_server.latency_s = 0.2
    c = client(judge_server.base_url, concurrency=8)
    reqs = [c.correctness_request("Who?", f"a{i}", ["x"]) for i in range(8)]
    t0 = time.monotonic()
    res = c.judge(reqs)
    assert all(r.ok for r in res) and time.monotonic() - t0 < 0.8  # sequential would take 1.6 s


# ---- recipes with a judge ---------------------------------------------------------------------
def r3(answer: str, docs: list[Passage]) -> Trajectory:
    steps = [
        Step(0, analysis="need mayor", query="mayor of Harrow", documents=docs,
             raw="The problem analysis: need mayor\nThe retrieval query: mayor of Harrow"),
        Step(1, analysis="done", answer=answer, raw=f"The problem analysis: done\nThe final answer: {answer}"),
    ]
    return Trajectory("w", "Who is the mayor of Harrow?", "r3rag_steps", steps=steps, golden_answers=["Ora Lind"])


DOCS = [Passage("p1", "Harrow\nThe mayor of Harrow is Ora Lind.")]


def paper_recipe(url: str, *extra: str):
    return load_recipe(RECIPES / "r3rag.yaml", ["answer.judge_fallback=true", "process.source=judge",
                                                f"judge.base_url={url}", "judge.cache_path=null",
                                                "judge.max_retries=0", *extra])


def test_r3rag_with_judge_fallback_and_judge_relevance(judge_server: StandinJudge) -> None:
    scorer = paper_recipe(judge_server.base_url)
    out = scorer.score([r3("Ora Lind, Harrow", DOCS), r3("Ari Voss", []), r3("Ora Lind", DOCS)])
    # 1: em fails, judge says True -> +2, relevance 1.0 x 1.6; 2: no documents -> 0, judge False
    # -> fate 0.8; 3: rule match, no verdict request
    assert [o.per_step for o in out] == [[1.6, 2.0], [0.0, 0.0], [1.6, 2.0]]
    assert judge_server.requests == 2 + 2  # two verdicts (1, 2) + two relevance (1, 3)
    assert all(o.missing == [] for o in out)


@pytest.mark.parametrize(
    ("policy", "per_step", "dropped"),
    [("zero", [0.0, 0.0], False), ("drop", [0.0, 0.0], True), ("rule_only", [0.8, 0.0], False)],
)
def test_judge_failure_policies(judge_server: StandinJudge, policy: str, per_step: list[float], dropped: bool) -> None:
    judge_server.mode = "garbage"
    scorer = paper_recipe(judge_server.base_url, f"judge.on_failure={policy}")
    traj = r3("Ora Lind, Harrow", DOCS)
    traj.metadata = {"supporting_ids": ["p1"]}
    out = scorer.score([traj])[0]
    assert out.missing == ["outcome:unparseable", "step1:unparseable"]
    assert out.per_step == pytest.approx(per_step) and out.dropped is dropped
    assert scorer.judge is not None and scorer.judge.stats.missing == 2


# ---- the stand-in itself and the client's plumbing ---------------------------------------------
def test_standin_answers_bad_input_with_4xx_json(judge_server: StandinJudge) -> None:
    import httpx

    root = judge_server.base_url.removesuffix("/v1")
    assert httpx.get(f"{root}/health").json()["status"] == "ok"
    bad = httpx.post(f"{judge_server.base_url}/chat/completions", content=b"not json")
    assert bad.status_code == 400 and "messages" in bad.json()["error"]["message"]
    big = httpx.post(f"{judge_server.base_url}/chat/completions", content=b"x" * 1_000_001)
    assert big.status_code == 413


def test_api_key_comes_from_the_named_environment_variable(judge_server: StandinJudge, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_JUDGE_KEY", "sk-test")
    c = client(judge_server.base_url, api_key_env="MY_JUDGE_KEY")
    c.judge([c.correctness_request("Who?", "a", ["a"])])
    assert judge_server.last_authorization == "Bearer sk-test"
    monkeypatch.delenv("MY_JUDGE_KEY")
    c.judge([c.correctness_request("Who?", "b", ["b"])])
    assert judge_server.last_authorization is None


def test_user_prompt_dir_replaces_the_packaged_templates(judge_server: StandinJudge, tmp_path: Path) -> None:
    (tmp_path / "correctness.txt").write_text("### system\nBe strict.\n### user\nReference answers: $golden_answers\nPredicted answer: $prediction\n")
    (tmp_path / "relevance.txt").write_text("### system\nRate.\n### user\nSearch query: $query\nRetrieved passages:\n$documents\n")
    c = client(judge_server.base_url, prompt_dir=str(tmp_path))
    req = c.correctness_request("Who?", "Ora Lind", ["Ora Lind"])
    assert req.messages[0]["content"] == "Be strict." and req.messages[1]["content"].startswith("Reference answers: Ora Lind")
    assert c.judge([req])[0].value == 1.0


@pytest.mark.slow
def test_standin_process_minimal_engine() -> None:
    from r3rag.testing.standin_judge import StandinJudgeProcess

    with StandinJudgeProcess(engine="minimal") as proc:
        c = client(proc.base_url, concurrency=4)
        res = c.judge([c.correctness_request("Who?", a, ["Ora Lind"]) for a in ("Ora Lind", "Ari Voss")] * 4)
        assert [r.value for r in res] == [1.0, 0.0] * 4


def test_bad_base_url_is_a_config_error() -> None:
    from r3rag.errors import ConfigError

    with pytest.raises(ConfigError, match="judge.base_url"):
        JudgeClient(JudgeConfig(base_url="ftp://judge", cache_path=None))


def test_async_callers_and_close(judge_server: StandinJudge) -> None:
    c = client(judge_server.base_url, concurrency=2)

    async def many() -> list[list[float | None]]:
        batches = [[c.correctness_request("Who?", a, ["Ora Lind"])] for a in ("Ora Lind", "Ari Voss", "ora lind")]
        done = await asyncio.gather(*(c.ajudge(b) for b in batches))
        return [[r.value for r in rs] for rs in done]

    assert asyncio.run(many()) == [[1.0], [0.0], [1.0]]
    c.close()
    assert c.judge([c.correctness_request("Who?", "Ora Lind", ["Ora Lind"])])[0].value == 1.0  # reopens
    c.close()


def test_judge_correct_for_evaluation(judge_server: StandinJudge) -> None:
    c = client(judge_server.base_url)
    res = c.judge_correct(["Who?", "Who?", "Who?"], ["Ora Lind", "Ari Voss", ""], [["Ora Lind"], ["Ora Lind"], ["Ora Lind"]])
    assert [r.value for r in res] == [1.0, 0.0, 0.0]
    with pytest.raises(ValueError):
        c.judge_correct(["Who?"], [], [])
