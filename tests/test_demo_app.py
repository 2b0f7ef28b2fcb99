"""The demo page's functions, without a browser: streaming order, messages for every failure,
the cards' content and escaping, the raw view's masked spans, configs and the CLI.

A hand-made two-hop question drives the world's oracle policy through an in-memory retriever:
"Where was the founder of Melvane Works born?" -> "Who founded Melvane Works?" (finds m1) ->
"Where was Varnel Oskaro born?" (finds v1; m1 is de-duplicated away) -> "Quessa".
"""

from __future__ import annotations

import asyncio
import html
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from r3rag.config import load_config
from r3rag.data.records import Passage, Question
from r3rag.demo import cards
from r3rag.demo.app import DemoApp, config_from_args, parse_args, services_overrides
from r3rag.demo.config import DemoConfig, PolicySection
from r3rag.demo.policies import BackendPolicy, OraclePolicy, build_policy, root_url
from r3rag.demo.runner import DemoRunner, FinalEvent, RunSettings, StepEvent, save_trajectory
from r3rag.errors import ConfigError
from r3rag.rollout.backends.base import GenerationOutput, PolicyBackend
from r3rag.rollout.trajectory import Segment, Step, Trajectory
from r3rag.testing.fake_retriever import OverlapRetriever
from r3rag.testing.tiny_models import build_tiny_tokenizer

ROOT = Path(__file__).resolve().parents[1]

PASSAGES = [
    Passage("v1", "Varnel Oskaro\nVarnel Oskaro was born in Quessa in 1874."),
    Passage("m1", "Melvane Works\nMelvane Works was founded by Varnel Oskaro, who ran it for years."),
    Passage("q1", "Quessa\nQuessa is a port town on the northern coast."),
]
QUESTION = Question(
    id="dev-000001",
    question="Where was the founder of Melvane Works born?",
    golden_answers=["Quessa"],
    metadata={
        "hops": 2,
        "type": "bridge",
        "decomposition": [
            {"question": "Who founded Melvane Works?", "answer": "Varnel Oskaro", "supporting_ids": ["m1"]},
            {"question": "Where was Varnel Oskaro born?", "answer": "Quessa", "supporting_ids": ["v1"]},
        ],
    },
)


class HealthyRetriever(OverlapRetriever):
    """The in-memory retriever plus the client's health call; ``down`` makes every call fail."""

    def __init__(self, passages: list[Passage], down: bool = False, fail_search: bool = False) -> None:
        super().__init__(passages, fail=fail_search)
        self.down = down

    async def ahealth(self) -> dict:
        if self.down:
            raise ConnectionError("connection refused (test)")
        return {"status": "ok", "indexes": ["world"]}


class SlowPolicy(OraclePolicy):
    """The oracle behind a backend that takes a little time and logs each call, like a real model."""

    def __init__(self, questions: list[Question], tokenizer, log: list[str]) -> None:
        super().__init__(questions, tokenizer)
        self.log = log

    def backend_for(self, fmt):
        inner = super().backend_for(fmt)
        log = self.log

        class Logged(PolicyBackend):
            name = "logged"
            tokenizer = inner.tokenizer

            async def agenerate(self, requests):
                log.append("generate")
                await asyncio.sleep(0.02)
                log.append("generated")
                return await inner.agenerate(requests)

        return Logged()


class BrokenBackend(PolicyBackend):
    name = "broken"

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    async def agenerate(self, requests):
        raise ConnectionError("model server refused the connection (test)")


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def make_app(tmp_path: Path, policy, retriever, questions=(QUESTION,), **overrides) -> DemoApp:
    sets = [f"run_dir={tmp_path}"] + [f"{k}={v}" for k, v in overrides.items()]
    cfg = load_config(DemoConfig, None, sets)
    return DemoApp(DemoRunner(cfg, policy, retriever, list(questions)), tmp_path / "trajectories", "test-set")


async def collect(agen) -> list:
    return [item async for item in agen]


def run_answer(app: DemoApp, question: str | None, fmt: str = "R3-RAG steps", steps=5, docs=1, temp=0.0) -> list:
    return asyncio.run(collect(app.answer(question, fmt, steps, docs, temp)))


# ---- streaming ---------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["R3-RAG steps", "R1-Searcher tags"])
def test_cards_stream_in_order_then_final_card(tmp_path, tokenizer, fmt):
    app = make_app(tmp_path, OraclePolicy([QUESTION], tokenizer), HealthyRetriever(PASSAGES))
    updates = run_answer(app, QUESTION.question, fmt)
    # one "thinking" update, one per step (2 queries + the answer), one with the final card
    assert len(updates) == 5
    card_html = [u[1] for u in updates]
    for before, after in zip(card_html, card_html[1:]):
        assert after.startswith(before[: -len("</div>")])  # each update only appends cards
    steps = [int(n) for n in re.findall(r'class="r3-card r3-step" data-step="(\d+)"', card_html[-1])]
    assert steps == [1, 2, 3]
    final = card_html[-1]
    assert final.index('data-step="3"') < final.index("r3-final")
    # step 1 found m1; step 2 found v1 (m1 scored higher but was already shown: de-duplicated)
    assert re.findall(r'data-pid="(\w+)"', final) == ["m1", "v1"]
    assert '<div class="r3-answer">Quessa</div>' in final
    assert "Gold answer</span>Quessa" in final
    assert "<td>1.00</td>" in final  # em = f1 = 1 against the gold answer
    status, _, raw, path = updates[-1]
    assert "stop reason answered" in status
    assert raw.split('<div class="r3-raw">')[1].count('<mark class="r3-env"') == 2  # two documents blocks
    saved = json.loads(Path(path).read_text(encoding="utf-8"))
    assert saved["answer"] == "Quessa" and saved["question_id"] == QUESTION.id
    # nothing but the first update and the final one carry the raw view or a file
    assert all(u[3] is None and u[2] == "" for u in updates[:-1])


def test_steps_arrive_while_the_model_is_still_generating(tmp_path, tokenizer):
    log: list[str] = []
    runner = DemoRunner(load_config(DemoConfig), SlowPolicy([QUESTION], tokenizer, log), HealthyRetriever(PASSAGES), [QUESTION])

    async def consume() -> None:
        async for event in runner.stream(QUESTION.question, RunSettings(docs_per_step=1)):
            if isinstance(event, StepEvent):
                log.append(f"step {event.step.index + 1}")
            elif isinstance(event, FinalEvent):
                log.append("final")

    asyncio.run(consume())
    # each step's card is out while the model is still writing the next step: streamed, not batched
    assert log == [
        "generate", "generated",
        "generate", "step 1", "generated",
        "generate", "step 2", "generated",
        "step 3", "final",
    ]


# ---- errors become messages --------------------------------------------------------------------
@pytest.mark.parametrize(
    "question, expected",
    [
        ("", "The question is empty"),
        ("   \n ", "The question is empty"),
        (None, "The question is empty"),
        ("x" * 501, "the limit is 500"),
    ],
)
def test_bad_questions_get_a_message_and_no_cards(tmp_path, tokenizer, question, expected):
    retriever = HealthyRetriever(PASSAGES)
    app = make_app(tmp_path, OraclePolicy([QUESTION], tokenizer), retriever)
    updates = run_answer(app, question)
    status, card_html, raw, path = updates[-1]
    assert expected in html.unescape(status) and "r3-msg-error" in status
    assert "r3-card " not in card_html and path is None
    assert retriever.calls == []


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({"steps": 0}, "Max steps must be between 1 and 10"),
        ({"docs": 11}, "Documents per step must be between 1 and 10"),
        ({"temp": 3.0}, "Temperature must be between 0 and 2.0"),
        ({"fmt": "made-up"}, "Unknown format 'made-up'"),
        ({"steps": None}, "must be numbers"),
        ({"temp": "hot"}, "must be numbers"),
        ({"temp": float("nan")}, "Temperature must be a number"),
    ],
)
def test_bad_settings_get_a_message(tmp_path, tokenizer, kwargs, expected):
    app = make_app(tmp_path, OraclePolicy([QUESTION], tokenizer), HealthyRetriever(PASSAGES))
    status = run_answer(app, QUESTION.question, **kwargs)[-1][0]
    assert expected in html.unescape(status)


def test_retriever_down_before_the_question(tmp_path, tokenizer):
    retriever = HealthyRetriever(PASSAGES, down=True)
    app = make_app(tmp_path, OraclePolicy([QUESTION], tokenizer), retriever)
    status, card_html, _, path = run_answer(app, QUESTION.question)[-1]
    text = html.unescape(status)
    assert "Retriever down" in text and "connection refused (test)" in text and "bash startup/server.sh" in text
    assert "Traceback" not in text and "r3-card " not in card_html and path is None


def test_retriever_failing_mid_question(tmp_path, tokenizer):
    app = make_app(tmp_path, OraclePolicy([QUESTION], tokenizer), HealthyRetriever(PASSAGES, fail_search=True))
    status, card_html, _, path = run_answer(app, QUESTION.question)[-1]
    assert "Retriever down" in html.unescape(status) and "retriever is down (test)" in html.unescape(status)
    assert 'data-stop="retrieval_failed"' in card_html and "no final answer" in card_html
    assert path is not None  # the failed trajectory can still be downloaded


def test_model_failure_is_a_message(tmp_path, tokenizer):
    policy = BackendPolicy(BrokenBackend(tokenizer), "broken test model")
    app = make_app(tmp_path, policy, HealthyRetriever(PASSAGES))
    status, card_html, _, _ = run_answer(app, "Who founded Melvane Works?")[-1]
    text = html.unescape(status)
    assert "Model failed" in text and "model server refused the connection (test)" in text
    assert "Traceback" not in text and 'data-stop="backend_error"' in card_html


def test_model_server_down_is_caught_by_its_health_check(tmp_path, tokenizer):
    policy = BackendPolicy(BrokenBackend(tokenizer), "served model", health_url="http://127.0.0.1:9/v1/models", timeout_s=2)
    app = make_app(tmp_path, policy, HealthyRetriever(PASSAGES))
    status = html.unescape(run_answer(app, QUESTION.question)[-1][0])
    assert "Model down" in status and "http://127.0.0.1:9/v1/models is not answering" in status


def test_oracle_refuses_questions_outside_the_dataset(tmp_path, tokenizer):
    app = make_app(tmp_path, OraclePolicy([QUESTION], tokenizer), HealthyRetriever(PASSAGES))
    status = html.unescape(run_answer(app, "Who painted the Quessa harbour?")[-1][0])
    assert "only follows the gold decompositions of dataset questions" in status


@pytest.mark.slow
def test_tiny_random_model_runs_to_a_stop_reason(tmp_path, tokenizer):
    from r3rag.rollout.backends.hf import HFBackend
    from r3rag.testing.tiny_models import build_tiny_model

    policy = BackendPolicy(HFBackend(build_tiny_model(tokenizer), tokenizer), "tiny random model")
    app = make_app(tmp_path, policy, HealthyRetriever(PASSAGES), **{"rollout.max_turn_tokens": 16})
    updates = run_answer(app, QUESTION.question, steps=2)
    status, card_html, raw, path = updates[-1]
    saved = json.loads(Path(path).read_text(encoding="utf-8"))
    assert saved["stop_reason"] in ("format_error", "max_tokens", "max_steps", "answered")
    assert f'data-stop="{saved["stop_reason"]}"' in card_html
    assert card_html.count("r3-step") == len(saved["steps"])


# ---- cards ---------------------------------------------------------------------------------------
def test_step_card_escapes_model_text():
    step = Step(0, analysis="<script>alert(1)</script>", query="a & b", documents=[Passage("p<1>", "T<i>\nbody <b>", 1.5)])
    out = cards.step_card_html(step)
    assert "<script>" not in out and "&lt;script&gt;" in out
    assert "a &amp; b" in out and "T&lt;i&gt;" in out and "body &lt;b&gt;" in out and "score 1.500" in out


def test_raw_view_marks_exactly_the_environment_segments():
    traj = Trajectory("q", "Q?", "r3rag_steps", segments=[
        Segment("prompt", "P <x>", [1, 2]), Segment("model", "M1", [3]),
        Segment("env", "DOCS", [4, 5, 6]), Segment("model", "M2", [7]),
    ])
    out = cards.raw_view_html(traj)
    body = out[out.index('<div class="r3-raw">'):]
    assert re.findall(r'<mark class="r3-env"[^>]*>(.*?)</mark>', body) == ["DOCS"]
    assert "3 tokens, loss mask 0" in body
    assert html.unescape(re.sub(r"<[^>]+>", "", body)) == traj.text  # the exact text, nothing added


def test_final_card_without_answer_or_gold():
    traj = Trajectory("q", "Q?", "r3rag_steps", steps=[Step(0, analysis="a", query="x")], stop_reason="max_steps")
    out = cards.final_card_html(traj)
    assert "no final answer" in out and "step limit was reached" in out and "Gold answer" not in out
    assert "r3-noanswer" in out


def test_wrong_answer_is_flagged_against_the_gold():
    traj = Trajectory("q", "Q?", "r3rag_steps", steps=[Step(0, answer="Oslo")], stop_reason="answered")
    out = cards.final_card_html(traj, QUESTION, {"em": 0.0, "f1": 0.0, "cover_em": 0.0, "acc": 0.0})
    assert "r3-wrong" in out and "Gold answer</span>Quessa" in out


# ---- settings panel ---------------------------------------------------------------------------
def test_settings_panel_reports_health(tmp_path, tokenizer):
    app = make_app(tmp_path, OraclePolicy([QUESTION], tokenizer), HealthyRetriever(PASSAGES, down=True))
    rows = dict((name, (what, health)) for name, what, health in asyncio.run(app.settings_rows()))
    assert rows["model"][1].startswith("OK:") and "oracle" in rows["model"][0]
    assert rows["retriever"][1].startswith("DOWN:") and rows["retriever"][0] == "http://127.0.0.1:8100"
    assert rows["dataset"][1] == "1 questions loaded"
    panel = asyncio.run(app.settings_panel())
    assert panel.startswith("| component | in use | health |") and panel.count("\n") == 7


# ---- config, services.json, policies, CLI -----------------------------------------------------------
def test_shipped_config_loads():
    cfg = load_config(DemoConfig, ROOT / "configs" / "demo.yaml")
    assert cfg.page.host == "127.0.0.1" and cfg.policy.backend == "hf" and cfg.policy.model == "smollm2"
    assert cfg.rollout.format == "r3rag_steps"


def test_services_json_sets_the_urls_and_flags_win(tmp_path):
    services = tmp_path / "services.json"
    services.write_text(json.dumps({
        "retriever_url": "http://127.0.0.1:18100", "dataset": "d.jsonl",
        "model_base_url": "http://127.0.0.1:18000/v1", "model": "r3rag-policy", "tokenizer": "/ckpt/policy",
    }))
    assert services_overrides(services) == [
        "retrieval.urls=[http://127.0.0.1:18100]", "data.dataset=d.jsonl",
        "policy.backend=openai", "policy.base_url=http://127.0.0.1:18000/v1", "policy.model=r3rag-policy",
        "policy.tokenizer=/ckpt/policy",
    ]
    cfg = config_from_args(parse_args(["--services", str(services), "--port", "7999", "--set", "policy.model=other"]))
    assert cfg.retrieval.urls == ["http://127.0.0.1:18100"] and cfg.policy.backend == "openai"
    assert cfg.page.port == 7999 and cfg.policy.model == "other"  # --set beats services.json
    cfg = config_from_args(parse_args(["--services", str(services), "--backend", "oracle"]))
    assert cfg.policy.backend == "oracle"  # a flag beats services.json
    assert services_overrides(tmp_path / "missing.json") == []


def test_unknown_policy_and_missing_base_url_are_config_errors():
    with pytest.raises(ConfigError, match="unknown 'bogus'; known: hf, openai, oracle"):
        build_policy(PolicySection(backend="bogus"), [])
    with pytest.raises(ConfigError, match="policy.base_url"):
        build_policy(PolicySection(backend="openai", model="m", tokenizer="tiny"), [])
    with pytest.raises(ConfigError, match="needs a dataset"):
        build_policy(PolicySection(backend="oracle"), [])


def test_model_server_url_is_its_root():
    assert root_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000"  # the backend adds /v1/...
    assert root_url("http://gpu-host:8000") == "http://gpu-host:8000"


def test_save_trajectory_round_trips(tmp_path):
    traj = Trajectory("dev/1 x", "Q?", "r3rag_steps", steps=[Step(0, answer="A")], stop_reason="answered")
    path = save_trajectory(traj, tmp_path)
    assert path.parent == tmp_path and "/" not in path.name[len("trajectory-"):]
    assert Trajectory.from_dict(json.loads(path.read_text())).to_dict() == traj.to_dict()


def test_cli_help_and_one_line_config_error(tmp_path):
    ok = subprocess.run([sys.executable, "-m", "r3rag.demo.app", "--help"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert ok.returncode == 0 and "--backend" in ok.stdout and "server.sh" in ok.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "r3rag.demo.app", "--services", str(tmp_path / "none.json"), "--set", "page.colour=red"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )
    assert bad.returncode == 2 and bad.stderr.strip() == "error: --set: unknown key 'page.colour'"


# ---- instructions the policy sees ----------------------------------------------------------------
@pytest.mark.parametrize(
    "sets, expected",
    [
        ([], "r3rag_steps_fewshot.txt"),  # the untrained default (hf + smollm2) gets the worked example
        (["policy.model=/ckpt/trained"], None),  # a trained checkpoint sees what it was trained with
        (["policy.backend=oracle"], None),
        (["prompt=fewshot", "policy.backend=oracle"], "r3rag_steps_fewshot.txt"),
        (["prompt=standard"], None),
        (["rollout.system_prompt_path=/my/prompt.txt"], "/my/prompt.txt"),
    ],
)
def test_prompt_choice(tokenizer, sets, expected):
    runner = DemoRunner(load_config(DemoConfig, None, sets), OraclePolicy([QUESTION], tokenizer), HealthyRetriever(PASSAGES))
    got = runner.system_prompt_path("r3rag_steps")
    assert (got is None) if expected is None else got.endswith(expected)
    if got is not None and expected.endswith("_fewshot.txt"):
        assert "Example." in Path(got).read_text() and Path(runner.system_prompt_path("r1searcher_tags")).is_file()


def test_fewshot_prompt_reaches_the_model_and_format_errors_get_a_hint(tmp_path, tokenizer):
    class Chatty(PolicyBackend):
        name = "chatty"

        def __init__(self) -> None:
            self.tokenizer = tokenizer
            self.prompts: list[str] = []

        async def agenerate(self, requests):
            self.prompts += [r.prompt_text for r in requests]
            ids = tokenizer("I think it is Quessa.", add_special_tokens=False).input_ids
            return [GenerationOutput(ids, "I think it is Quessa.", [0.0] * len(ids), "eos") for _ in requests]

    backend = Chatty()
    app = make_app(tmp_path, BackendPolicy(backend, "chatty"), HealthyRetriever(PASSAGES), prompt="fewshot")
    status, card_html, raw, _ = run_answer(app, QUESTION.question)[-1]
    assert "Example." in backend.prompts[0] and "The final answer: Quessa" in backend.prompts[0]
    text = html.unescape(status)
    assert "Step 1 did not follow the r3rag_steps format (no_marker)" in text and "--backend oracle" in text
    assert 'data-stop="format_error"' in card_html
