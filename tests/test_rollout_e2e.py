"""End to end on the embedded world through the real BM25 retrieval service: the oracle in both
formats (its accuracy equals an independent hop-by-hop retrieval check), and the HF backend with a
tiny random model and with SmolLM2-135M-Instruct, one retrieval request per round."""

from __future__ import annotations


import httpx
import pytest
import torch
from rollout_helpers import tiny_model, tiny_tokenizer

from r3rag.data.readers import read_questions
from r3rag.metrics import exact_match
from r3rag.retrieval.client import RetrievalClient
from r3rag.retrieval.searcher import load_searcher
from r3rag.retrieval.service import serve_in_thread
from r3rag.rollout.backends.hf import HFBackend, load_model
from r3rag.rollout.config import RolloutConfig
from r3rag.rollout.engine import RolloutEngine
from r3rag.rollout.formats import get_format
from r3rag.rollout.oracle import OracleBackend
from r3rag.evaluation.components import prepare_world
from r3rag.rollout.tokens import decode
from r3rag.rollout.trajectory import STOP_REASONS

pytestmark = pytest.mark.slow
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    world_dir, index_dir = prepare_world(tmp_path_factory.mktemp("oracle"), seed=0, size="small")
    return read_questions(world_dir / "dev.jsonl")[:40], index_dir


@pytest.fixture(scope="module")
def service(world):
    with serve_in_thread([world[1]]) as handle:
        yield handle


def requests_served(url: str) -> int:
    return httpx.get(url + "/stats").json()["requests"]


def hop_by_hop_upper_bound(questions, index_dir, k: int) -> float:
    """Independent of the engine: a question counts when every sub-answer is in the top-k passages
    of its own sub-question or of an earlier one (searched literally)."""
    searcher = load_searcher(index_dir)
    ok = 0
    for q in questions:
        subs = q.metadata["decomposition"]
        hits = searcher.search([s["question"] for s in subs], k)
        seen = ""
        good = True
        for s, h in zip(subs, hits):
            seen += " ".join(p.contents for p in h).lower()
            good = good and s["answer"].lower() in seen
        ok += good
    return ok / len(questions)


@pytest.mark.parametrize("name,mode", [("r3rag_steps", "chat"), ("r1searcher_tags", "raw")])
def test_oracle_through_the_service(world, service, name, mode):
    questions, index_dir = world
    tok = tiny_tokenizer()
    f = get_format(name, mode=mode, tokenizer=tok)
    cfg = RolloutConfig(format=name, mode=mode, docs_per_step=5, dedupe_docs=False, doc_max_chars=None)
    before = requests_served(service.url)
    engine = RolloutEngine(OracleBackend(questions, f, tok), RetrievalClient(service.url), cfg, fmt=f)
    trajs = engine.run(questions)
    em = sum(exact_match(t.answer or "", t.golden_answers) for t in trajs) / len(trajs)
    bound = hop_by_hop_upper_bound(questions, index_dir, 5)
    assert em == pytest.approx(bound)
    assert 0.3 < em < 1.0  # the world leaves room to learn
    assert requests_served(service.url) - before == engine.stats.retrieval_calls == engine.stats.rounds - 1
    assert engine.stats.retrieval_calls == rounds_with_queries(trajs) >= 2


def rounds_with_queries(trajs) -> int:
    """Step i of every trajectory runs in round i, so the rounds that sent queries are the step
    indices at which some trajectory's query went to the retriever."""
    return len({st.index for t in trajs for st in t.steps if st.retrieved})


def run_model(backend, questions, service, name, mode):
    cfg = RolloutConfig(format=name, mode=mode, max_turn_tokens=24, max_steps=2, temperature=1.0, seed=1)
    f = get_format(name, mode=mode, tokenizer=backend.tokenizer)
    # script-free: the model writes what it writes; force one query round by prefilling nothing
    before = requests_served(service.url)
    engine = RolloutEngine(backend, RetrievalClient(service.url), cfg, fmt=f)
    trajs = engine.run(questions)
    assert requests_served(service.url) - before == engine.stats.retrieval_calls == rounds_with_queries(trajs)
    for t in trajs:
        assert t.stop_reason in STOP_REASONS
        assert decode(backend.tokenizer, t.token_ids) == t.text
        assert len(t.loss_mask) == len(t.token_ids)
    return trajs


@pytest.mark.parametrize("name,mode", [("r3rag_steps", "chat"), ("r1searcher_tags", "raw")])
def test_tiny_model_through_the_service(world, service, name, mode):
    trajs = run_model(HFBackend(tiny_model(), tiny_tokenizer()), world[0][:8], service, name, mode)
    assert len(trajs) == 8 and all(t.num_generated_tokens > 0 for t in trajs)


def test_smollm2_through_the_service_both_formats(world, service):
    model, tok = load_model("smollm2")
    backend = HFBackend(model, tok)
    for name, mode in [("r3rag_steps", "chat"), ("r1searcher_tags", "chat")]:
        trajs = run_model(backend, world[0][:2], service, name, mode)
        assert all(t.num_generated_tokens > 0 for t in trajs)
