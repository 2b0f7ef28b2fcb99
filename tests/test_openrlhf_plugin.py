"""The OpenRLHF agent plugin's logic, against a stand-in engine with OpenRLHF's call shape.

These run in the core environment (no OpenRLHF needed): :class:`AgentRollout` is what the
plugin's ``AgentExecutor`` inherits its ``execute`` from. test_openrlhf_stock.py runs the same
plugin through OpenRLHF's own loader and sample conversion in its own environment.
"""

from __future__ import annotations

import asyncio
import threading
import time
from http.server import ThreadingHTTPServer

import pytest

from openrlhf_helpers import DOCS, EngineBackend, SlowRetrieve, StandinEngine, StandinSamplingParams, steps_script, turn_script
from rollout_helpers import CORPUS, QUESTIONS, tiny_tokenizer
from r3rag.errors import ConfigError
from r3rag.rewards.recipes import load_recipe
from r3rag.rollout.config import RolloutConfig
from r3rag.rollout.engine import RolloutEngine
from r3rag.rollout.tokens import decode
from r3rag.testing.fake_retriever import OverlapRetriever
from r3rag.testing.standin_judge import free_port
from r3rag.train.openrlhf.config import AgentConfig, load_agent_config, resolve_config_path
from r3rag.train.openrlhf.data import prompt_row
from r3rag.train.openrlhf.placement import dense_from_step_spans, dense_step_rewards
from r3rag.train.openrlhf.retrieval import LocalFirstClient, order_urls
from r3rag.train.openrlhf.rollout import AgentRollout, turn_params

def config(**rollout) -> AgentConfig:
    base = {"format": "r3rag_steps", "docs_per_step": 2, "max_total_tokens": 2048}
    base.update(rollout)
    return AgentConfig.model_validate({"rollout": base, "reward": {"recipe": "r3rag"}})


def run(agent: AgentRollout, engine, q, params=None, max_length: int = 2048):
    row = prompt_row(q)
    params = params or StandinSamplingParams(temperature=1.0, logprobs=1, min_tokens=1)
    return asyncio.run(agent.execute(row["question"], row["label"], params, max_length, engine.tokenizer, engine))


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def test_plugin_episode_equals_our_engine(tok):
    """Same question, same scripted model, same retriever: the plugin's token ids, action ranges,
    feedback and step rewards are exactly our engine's trajectory, spans and recipe rewards."""
    script = steps_script(tok.eos_token)
    cfg = config()
    scorer = load_recipe("r3rag")
    agent = AgentRollout(cfg, retriever=OverlapRetriever(CORPUS), scorer=scorer)
    engine = StandinEngine(tok, turn_script(script, DOCS))
    ours = RolloutEngine(EngineBackend(StandinEngine(tok, turn_script(script, DOCS))), OverlapRetriever(CORPUS),
                         RolloutConfig(**cfg.rollout.model_dump()))
    for q in QUESTIONS[:2]:
        out = run(agent, engine, q)
        traj = ours.run([q])[0]
        traj.metadata.update({k: q.metadata[k] for k in ("decomposition",) if k in q.metadata})
        assert out["observation_tokens"] == traj.token_ids
        assert out["action_ranges"] == [(s.start, s.end) for s in traj.step_spans]
        ids = out["observation_tokens"]
        # the action ranges cover exactly the model's tokens: their union is the loss mask
        covered = [0] * len(ids)
        for a, b in out["action_ranges"]:
            covered[a:b] = [1] * (b - a)
        assert covered == traj.loss_mask
        # everything between the ranges (after the prompt) is our rendering of the documents
        env_text = [s.text for s in traj.segments if s.role == "env"]
        gaps = [decode(tok, ids[b:a]) for (_, b), (a, _) in zip(out["action_ranges"], out["action_ranges"][1:])]
        assert gaps == env_text and all(g.count(DOCS) == 1 for g in gaps)
        reward = scorer.score([traj])[0]
        assert out["r3rag_step_rewards"] == pytest.approx(reward.per_step)
        assert out["reward"] == pytest.approx(reward.total)
        assert out["r3rag_dropped"] is False
        # rollout log-probs: the engine's for action tokens, 0 for prompt and documents
        lps = out["rollout_log_probs"]
        assert len(lps) == len(ids)
        inside = {i for a, b in out["action_ranges"] for i in range(a, b)}
        assert all((lp < 0) == (i in inside) for i, lp in enumerate(lps))
    # q1 earned per-step rewards (two relevant queries, then the right answer)
    assert run(agent, engine, QUESTIONS[0])["r3rag_step_rewards"] == pytest.approx([1.6, 1.6, 2.0])


def test_turn_params_stop_strings_and_budget(tok):
    """Every turn asks the engine for the format's stop strings, kept in the output, within the
    turn budget, with OpenRLHF's own sampling settings; OpenRLHF's params object is untouched."""
    engine = StandinEngine(tok, turn_script(steps_script(tok.eos_token), DOCS))
    agent = AgentRollout(config(max_turn_tokens=64), retriever=OverlapRetriever(CORPUS))
    base = StandinSamplingParams(temperature=0.7, top_p=0.9, logprobs=None, min_tokens=1)
    out = run(agent, engine, QUESTIONS[1], params=base)
    assert base.stop is None and base.max_tokens is None and not base.include_stop_str_in_output
    assert len(engine.calls) == 2
    for ids, p in engine.calls:
        assert p.stop == agent.format_for(tok).stop and "\n" + DOCS in p.stop
        assert p.include_stop_str_in_output is True
        assert (p.temperature, p.top_p) == (0.7, 0.9)
        assert 0 < p.max_tokens <= 64
    # the first turn was cut right after the stop string, which stays in the model's tokens
    a, b = out["action_ranges"][0]
    turn = decode(tok, out["observation_tokens"][a:b])
    assert turn.endswith(DOCS) and "made up" not in decode(tok, out["observation_tokens"])
    assert out["rollout_log_probs"] is None
    assert turn_params(base, 5, ["x"]).max_tokens == 5


def test_budget_is_capped_by_openrlhf_max_length(tok):
    """OpenRLHF's --data.max_len caps the episode: it never has to truncate our ids."""
    engine = StandinEngine(tok, turn_script(steps_script(tok.eos_token), DOCS))
    agent = AgentRollout(config(), retriever=OverlapRetriever(CORPUS))
    prompt_len = len(agent.format_for(tok).render_prompt(QUESTIONS[0].question))  # chars >= tokens
    limit = 320
    out = run(agent, engine, QUESTIONS[0], max_length=limit)
    assert len(out["observation_tokens"]) <= limit < prompt_len + 400
    assert out["extra_logs"]["r3rag/max_tokens"] == 1.0 or out["extra_logs"]["r3rag/answered"] == 1.0


def test_r1searcher_raw_tags_stop_at_end_of_query(tok):
    """Tag format, raw mode: the turn stops at <|end_of_query|> (kept), documents follow inline."""
    q = QUESTIONS[1]
    script = {q.question: ["<think> need the founder <|begin_of_query|> founded Melvane Works <|end_of_query|> and more",
                           " found </think>\n<answer> Tirra Olle </answer>"]}
    cfg = AgentConfig.model_validate({"rollout": {"format": "r1searcher_tags", "mode": "raw", "docs_per_step": 3,
                                                  "max_steps": 9, "max_total_tokens": 2048},
                                      "reward": {"recipe": "r1searcher_stage2"}, "agent": {"per_step_rewards": False}})
    engine = StandinEngine(tok, turn_script(script, "<|begin_of_documents|>"))
    out = run(AgentRollout(cfg, retriever=OverlapRetriever(CORPUS)), engine, q)
    ids, ranges = out["observation_tokens"], out["action_ranges"]
    assert decode(tok, ids[ranges[0][0]:ranges[0][1]]).endswith("<|end_of_query|>")
    assert "and more" not in decode(tok, ids)
    assert decode(tok, ids[ranges[0][1]:ranges[1][0]]).strip().startswith("<|begin_of_documents|>")
    assert out["reward"] == pytest.approx(1.0) and "r3rag_step_rewards" not in out


@pytest.fixture()
def slow_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Slow", (SlowRetrieve,), {"corpus": CORPUS, "delay": 1.0}))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


async def _with_ticker(coro, period: float = 0.02):
    """Run ``coro`` while a ticker coroutine counts its wake-ups; returns (result, ticks, longest gap)."""
    ticks, gaps, stop = [0], [0.0], asyncio.Event()

    async def ticker():
        last = time.perf_counter()
        while not stop.is_set():
            await asyncio.sleep(period)
            now = time.perf_counter()
            gaps[0], last = max(gaps[0], now - last), now
            ticks[0] += 1

    task = asyncio.create_task(ticker())
    await asyncio.sleep(period)  # the ticker is running before the episode starts
    try:
        result = await coro
    finally:
        stop.set()
        await task
    return result, ticks[0], gaps[0]


def test_event_loop_keeps_ticking_during_retrieval(tok, slow_server):
    """Retrieval over HTTP (1 s per query, two queries) never blocks the engine's event loop."""
    agent = AgentRollout(config(), retriever=LocalFirstClient([slow_server], retries=0))
    engine = StandinEngine(tok, turn_script(steps_script(tok.eos_token), DOCS), delay=0.005)
    row = prompt_row(QUESTIONS[0])
    coro = agent.execute(row["question"], row["label"], StandinSamplingParams(), 2048, tok, engine)
    (out, ticks, gap) = asyncio.run(_with_ticker(coro))
    assert out["extra_logs"]["r3rag/retrievals"] == 2.0 and not out["r3rag_dropped"]
    assert ticks >= 30 and gap < 0.5, (ticks, gap)

    class Blocking:  # the control: a retriever that blocks the loop is caught by the same probe
        async def asearch(self, queries, k):
            time.sleep(1.0)
            return OverlapRetriever(CORPUS).search(queries, k)

    blocked = AgentRollout(config(), retriever=Blocking())
    coro = blocked.execute(row["question"], row["label"], StandinSamplingParams(), 2048, tok, engine)
    _, _, gap = asyncio.run(_with_ticker(coro))
    assert gap >= 0.9


def test_reward_scoring_runs_off_the_event_loop(tok):
    """A slow reward recipe (an LLM judge) runs in a worker thread: the loop keeps ticking."""
    real = load_recipe("r3rag")

    class SlowScorer:
        config = real.config

        def score(self, trajs):
            time.sleep(1.0)
            return real.score(trajs)

    agent = AgentRollout(config(), retriever=OverlapRetriever(CORPUS), scorer=SlowScorer())
    engine = StandinEngine(tok, turn_script(steps_script(tok.eos_token), DOCS))
    row = prompt_row(QUESTIONS[1])
    coro = agent.execute(row["question"], row["label"], StandinSamplingParams(), 2048, tok, engine)
    out, ticks, gap = asyncio.run(_with_ticker(coro))
    assert out["reward"] > 0 and ticks >= 20 and gap < 0.5, (ticks, gap)


def test_retrieval_outage_drops_the_sample(tok):
    """Every replica down: the episode ends ``retrieval_failed``; the sample comes back with no
    action ranges (no loss), reward 0 and ``r3rag_dropped``, not as a penalty for the policy."""
    dead = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
    cfg = config()
    cfg.agent.return_trajectory = True
    agent = AgentRollout(cfg, retriever=LocalFirstClient(dead, retries=1, backoff=0.01, timeout=2.0))
    engine = StandinEngine(tok, turn_script(steps_script(tok.eos_token), DOCS))
    out = run(agent, engine, QUESTIONS[0])
    assert out["r3rag_trajectory"]["stop_reason"] == "retrieval_failed"
    assert out["r3rag_dropped"] is True and out["action_ranges"] == [] and out["reward"] == 0.0
    assert out["r3rag_step_rewards"] == []
    assert out["extra_logs"]["r3rag/dropped"] == 1.0 and out["extra_logs"]["r3rag/retrieval_failed"] == 1.0
    # the same keys as a normal sample (OpenRLHF merges the logs of a batch key by key)
    ok = run(AgentRollout(config(), retriever=OverlapRetriever(CORPUS)), engine, QUESTIONS[0])
    assert set(ok["extra_logs"]) == set(out["extra_logs"])


def test_engine_failure_drops_the_sample(tok):
    class Broken:
        tokenizer = tok

        async def generate(self, ids, params, multi_modal_data=None):
            raise RuntimeError("engine died")

    out = run(AgentRollout(config(), retriever=OverlapRetriever(CORPUS)), Broken(), QUESTIONS[0])
    assert out["r3rag_dropped"] is True and out["action_ranges"] == []


def test_node_local_replica_first_then_failover(slow_server):
    assert order_urls(["http://node2.cluster:8100", "http://127.0.0.1:8100"]) == ["http://127.0.0.1:8100", "http://node2.cluster:8100"]
    assert order_urls(["http://b:1", "http://a:1", "http://c:1"], local={"a"}) == ["http://a:1", "http://b:1", "http://c:1"]
    dead = f"http://127.0.0.1:{free_port()}"

    async def go():
        first = LocalFirstClient([slow_server, dead], retries=1, backoff=0.01)
        for _ in range(3):  # a round-robin client would send the 2nd request to the dead URL first
            await first.asearch(["x"], 1)
        c1 = first.counters()
        failover = LocalFirstClient([dead, slow_server], retries=1, backoff=0.01)
        got = await failover.asearch(["x"], 2)
        return c1, failover.counters(), got

    c1, c2, got = asyncio.run(go())
    assert c1.get("retries", 0) == 0, c1
    assert len(got[0]) == 2 and c2.get("retries", 0) >= 1, c2


def test_config_from_environment(tmp_path):
    cfg = load_agent_config({"R3RAG_AGENT_CONFIG": "r3rag_ppo", "R3RAG_AGENT_SET": "rollout.max_steps=4; reward.overrides=[process.source=off]",
                             "R3RAG_RETRIEVER_URLS": "http://n1:8100, http://n2:8100"})
    assert (cfg.rollout.max_steps, cfg.rollout.docs_per_step, cfg.rollout.doc_max_chars) == (4, 2, 512)
    assert cfg.reward.overrides == ["process.source=off"] and cfg.retrieval.urls == ["http://n1:8100", "http://n2:8100"]
    r1 = load_agent_config({"R3RAG_AGENT_CONFIG": "r1searcher_stage2"})
    assert (r1.rollout.format, r1.rollout.docs_per_step, r1.rollout.max_steps, r1.reward.recipe) == (
        "r1searcher_tags", 3, 9, "r1searcher_stage2")
    assert load_recipe(r1.reward.recipe, recipe_dir=r1.reward.recipe_dir).config.outcome.format_penalty == -2.0
    for name in ("r3rag_ppo", "r1searcher_stage1", "r1searcher_stage2"):
        assert resolve_config_path(name).is_file()
    with pytest.raises(ConfigError, match="no packaged config"):
        load_agent_config({"R3RAG_AGENT_CONFIG": "nope"})
    with pytest.raises(ConfigError, match="unknown key"):
        load_agent_config({"R3RAG_AGENT_SET": "rollout.max_stepz=3"})
    own = tmp_path / "agent.yaml"
    own.write_text("rollout:\n  docs_per_step: 7\n")
    assert load_agent_config({"R3RAG_AGENT_CONFIG": str(own)}).rollout.docs_per_step == 7


def test_placement_matches_single_machine_trainer(tok):
    """OpenRLHF's action_mask axis is the token axis shifted by one: a step reward at action
    position end-2 is the single-machine trainer's reward on token end-1 (step_spans)."""
    script = steps_script(tok.eos_token)
    cfg = config()
    scorer = load_recipe("r3rag")
    ours = RolloutEngine(EngineBackend(StandinEngine(tok, turn_script(script, DOCS))), OverlapRetriever(CORPUS),
                         RolloutConfig(**cfg.rollout.model_dump()))
    trajs = ours.run(QUESTIONS[:2])
    by_id = {q.id: q for q in QUESTIONS}
    for traj in trajs:  # the plugin copies the gold decomposition into the trajectory, as here
        traj.metadata["decomposition"] = by_id[traj.question_id].metadata["decomposition"]
    rewards = scorer.score(trajs)
    try:
        from r3rag.train.rl.batch import build_batch
    except ImportError:  # the single-machine trainer is not there: compare with step_spans alone
        build_batch = None
    for traj, reward in zip(trajs, rewards):
        T = len(traj.token_ids)
        ranges = [(s.start, s.end) for s in traj.step_spans]
        dense = dense_step_rewards(ranges, reward.per_step, T - 1).tolist()
        by_token = dense_from_step_spans(traj.step_spans, reward.per_step, T)
        assert dense == pytest.approx(by_token[1:])
        assert sum(dense) == pytest.approx(reward.total) and sum(1 for d in dense if d) >= 2
        if build_batch is not None:
            batch = build_batch([traj], [reward], pad_id=0)
            assert dense == pytest.approx(batch.step_rewards[0].tolist())
            assert [int(x) for x in batch.action_mask[0].tolist()] == traj.loss_mask[1:]


@pytest.mark.parametrize("name", ["config", "data", "placement", "retrieval", "rollout", "launch"])
def test_docstring_examples(name):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(f"r3rag.train.openrlhf.{name}"))
    assert result.attempted > 0 and result.failed == 0
