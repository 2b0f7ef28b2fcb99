"""Step-level tree rollouts (rollout.tree) and their estimator (algo.estimator: tree_group_norm)."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch
from rl_helpers import PASSAGES, QUESTIONS as RL_QUESTIONS, EvenTokenReward, tiny_cfg, tiny_trainer
from rollout_helpers import CORPUS, QUESTIONS, tiny_tokenizer

from r3rag.errors import ConfigError
from r3rag.rewards.types import RewardOutput
from r3rag.rollout.backends.base import GenerationOutput, PolicyBackend
from r3rag.rollout.config import RolloutConfig, TreeConfig
from r3rag.rollout.engine import RolloutEngine
from r3rag.rollout.tokens import encode
from r3rag.rollout.tree import own_generated_tokens, tree_rollout
from r3rag.testing.fake_retriever import OverlapRetriever
from r3rag.train.rl.batch import build_batch
from r3rag.train.rl.config import RLConfig
from r3rag.train.rl.estimators import MIN_STD, compute_advantages
from r3rag.train.rl.tree import informative_comparisons, tree_group_norm, tree_layout

MARKER = "The retrieval documents:"


def step(k: int, query: str | None = None, answer: str | None = None) -> str:
    tail = f"The retrieval query: {query}" if query is not None else f"The final answer: {answer}"
    return f"Step {k + 1}:\nThe problem analysis: step {k}.\n{tail}<|im_end|>"


class CoinBackend(PolicyBackend):
    """A stochastic scripted policy seeded by each request's seed: two queries, then an answer that
    is right (Quessa) or wrong (Pellin) at random; every turn is a valid step."""

    name = "coin"

    def __init__(self, tokenizer, queries_before_answer: int = 2) -> None:
        self.tokenizer = tokenizer
        self.n = queries_before_answer
        self.requests = []

    async def agenerate(self, requests):
        self.requests.extend(requests)
        outs = []
        for r in requests:
            rng = random.Random(r.params.seed)
            turn = r.prompt_text.count(MARKER)
            if turn < self.n:
                text = step(turn, query=rng.choice(["Varnel Oskaro born", "Quessa province", "Tirra Olle"]))
            else:
                text = step(turn, answer=rng.choice(["Quessa", "Pellin"]))
            ids = encode(self.tokenizer, text)[: r.params.max_tokens]
            outs.append(GenerationOutput(ids, text, [-0.5] * len(ids), "stop"))
        return outs


def coin_engine(tree_budget: int = 2048) -> tuple[CoinBackend, RolloutEngine]:
    be = CoinBackend(tiny_tokenizer())
    cfg = RolloutConfig(max_steps=4, docs_per_step=1, max_new_tokens=tree_budget, temperature=1.0)
    return be, RolloutEngine(be, OverlapRetriever(CORPUS), cfg)


def correct_reward(trajs):
    return [RewardOutput(float(t.answer == "Quessa"), [0.0] * (len(t.steps) - 1) + [float(t.answer == "Quessa")],
                         {"correct": float(t.answer == "Quessa")}) for t in trajs]


def run_tree(tree: TreeConfig, seed: int = 3):
    be, eng = coin_engine()
    return be, asyncio.run(tree_rollout(eng, QUESTIONS[:2], tree, seed=seed))


# ---- the rollout ------------------------------------------------------------------------------
def test_branches_share_their_parents_tokens_up_to_the_boundary():
    be, trajs = run_tree(TreeConfig(roots=2, branch=3, at_steps=[1, 2]))
    by = {(t.question_id, t.sample_index): t for t in trajs}
    branches = [t for t in trajs if t.metadata["tree"]["parent"] is not None]
    # every chain reaches both boundaries: 2 roots -> +2*2 at boundary 1 -> +6*2 at boundary 2 = 18 per question
    assert len(trajs) == 2 * 18 and len(branches) == 2 * 16
    for t in branches:
        meta = t.metadata["tree"]
        parent = by[(t.question_id, meta["parent"])]
        cut = meta["owns_from"]
        own = [e for e in meta["path"] if e["node"] == f"{meta['parent']}@{meta['boundary']}"]
        assert len(own) == 1 and own[0]["child"] != own[0]["node"] + "/0"
        assert cut == own[0]["at"] > len(t.segments[0].token_ids)
        assert t.token_ids[:cut] == parent.token_ids[:cut]  # ids
        assert t.loss_mask[:cut] == parent.loss_mask[:cut]  # masks
        assert [s.to_dict() for s in t.steps[: meta["boundary"]]] == [s.to_dict() for s in parent.steps[: meta["boundary"]]]
        # the boundary is after step s-1's documents: the token before it is a documents token
        spans = t.step_spans
        assert spans[meta["boundary"]].start >= cut and spans[meta["boundary"] - 1].end < cut
        assert t.trainable and t.stop_reason == "answered"
    # siblings of one branching point diverge after it (their own seeds), at least somewhere
    assert any(t.token_ids != by[(t.question_id, t.metadata["tree"]["parent"])].token_ids for t in branches)
    # every branch asked the backend to keep its whole prefix (siblings share its keys/values)
    first = {tuple(r.prompt_ids): r.shared_prefix for r in be.requests}
    assert all(first[tuple(t.token_ids[: t.metadata["tree"]["owns_from"]])] == t.metadata["tree"]["owns_from"] for t in branches)


def test_branch_budget_counts_the_prefix_and_generated_tokens_count_once():
    _, trajs = run_tree(TreeConfig(roots=2, branch=2, at_steps=[1]))
    for t in trajs:
        own = own_generated_tokens(t)
        if t.metadata["tree"]["parent"] is None:
            assert own == t.num_generated_tokens
        else:
            assert 0 < own < t.num_generated_tokens


def test_a_chain_that_stopped_before_a_boundary_is_not_branched():
    _, trajs = run_tree(TreeConfig(roots=2, branch=2, at_steps=[3]))  # chains answer at step 2: no step 3
    assert len(trajs) == 4 and all(t.metadata["tree"]["parent"] is None for t in trajs)


def test_batch_masks_a_branchs_copied_prefix():
    _, trajs = run_tree(TreeConfig(roots=2, branch=2, at_steps=[1]))
    batch = build_batch(trajs, correct_reward(trajs), pad_id=0)
    for b, t in enumerate(trajs):
        own = t.metadata["tree"]["owns_from"]
        mask = batch.action_mask[b]
        assert float(mask.sum()) == own_generated_tokens(t)
        if own:
            assert float(mask[: own - 1].sum()) == 0.0 and float(mask[own - 1]) == 1.0  # its first own token is a model token


# ---- the estimator ------------------------------------------------------------------------------
def P(node, child, at):
    return {"node": node, "child": child, "at": at}


def hand_tree():
    """One question: roots A (row 0) and B (row 2); A2 (row 1) branched from A after token 3 (shifted
    2), B2 (row 3) from B; then A3 (row 4) branched from A after token 5 (shifted 4). Six tokens each."""
    paths = [
        [P("root", "r0", 0), P("0@1", "0@1/0", 3), P("0@2", "0@2/0", 5)],  # A
        [P("root", "r0", 0), P("0@1", "0@1/1", 3)],                      # A2
        [P("root", "r1", 0), P("1@1", "1@1/0", 3)],                      # B
        [P("root", "r1", 0), P("1@1", "1@1/1", 3)],                      # B2
        [P("root", "r0", 0), P("0@1", "0@1/0", 3), P("0@2", "0@2/1", 5)],  # A3
    ]
    mask = torch.tensor([[1.0] * 6, [0, 0, 1, 1, 1, 1], [1.0] * 6, [0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1]])
    return tree_layout(paths, ["q"] * 5), mask


def test_advantages_worked_out_by_hand():
    # rewards A=1, A2=0, B=0, B2=1, A3=0
    # root: V(A subtree = A, A2, A3) = 1/3, V(B subtree = B, B2) = 1/2; mu = 5/12, sigma = |1/3 - 1/2| / sqrt(2) = 0.117851
    #   D(A) = (1/3 - 5/12) / 0.117851 = -0.707107, D(B) = +0.707107
    # A's boundary 1: V(A's own continuation = A, A3) = 1/2, V(A2) = 0; mu = 1/4, sigma = 0.353553: D = +0.707107, -0.707107
    # B's boundary 1: V(B) = 0, V(B2) = 1: mu = 1/2, sigma = 0.707107: D = -0.707107, +0.707107
    # A's boundary 2: V(A) = 1, V(A3) = 0: D = +0.707107, -0.707107
    (node, child, at), mask = hand_tree()
    adv = tree_group_norm(torch.tensor([1.0, 0, 0, 1, 0]), node, child, at, mask, torch.zeros(5, dtype=torch.long))
    s = 0.707107
    want = [
        [-s, -s, -s + s, -s + s, -s + s + s, -s + s + s],  # A: root, + boundary 1 from shifted 2, + boundary 2 from 4
        [0, 0, -s - s, -s - s, -s - s, -s - s],              # A2 owns from shifted 2
        [s, s, s - s, s - s, s - s, s - s],                  # B
        [0, 0, s + s, s + s, s + s, s + s],                  # B2
        [0, 0, 0, 0, -s + s - s, -s + s - s],                # A3 owns from shifted 4
    ]
    assert torch.allclose(adv, torch.tensor(want), atol=1e-5)
    assert informative_comparisons(torch.tensor([1.0, 0, 0, 1, 0]), node, child) == (4, 4)


def test_all_equal_rewards_give_zero_advantages():
    (node, child, at), mask = hand_tree()
    for r in (0.0, 1.0, 0.37):
        adv = tree_group_norm(torch.full((5,), r), node, child, at, mask, torch.zeros(5, dtype=torch.long))
        assert torch.count_nonzero(adv) == 0
    assert informative_comparisons(torch.full((5,), 1.0), node, child) == (4, 0)


def test_vanishing_spread_at_one_point_is_guarded_not_divided():
    (node, child, at), mask = hand_tree()
    # A and A3 differ by less than min_std: boundary 2 contributes 0, never (1e-4 / 1e-9)
    r = torch.tensor([1.0, 0, 0, 1, 1.0 - MIN_STD / 10])
    adv = tree_group_norm(r, node, child, at, mask, torch.zeros(5, dtype=torch.long), min_std=MIN_STD)
    assert float(adv.abs().max()) < 3.0
    assert torch.allclose(adv[0, 4:], adv[0, 2:4])  # nothing added at A's boundary 2


@pytest.mark.parametrize("n", [2, 4, 8])
def test_flat_tree_is_group_norm(n):
    """No branching: every chain a child of the root: exactly group_norm (shipped n_samples 8 included)."""
    g = torch.Generator().manual_seed(n)
    totals = torch.randint(0, 3, (2 * n,), generator=g).float() * 0.5
    mask = (torch.rand(2 * n, 7, generator=g) > 0.3).float()
    mask[:, 0] = 1.0
    step_rewards = torch.zeros(2 * n, 7)
    step_rewards[torch.arange(2 * n), 6 - mask.fliplr().argmax(dim=1)] = totals
    group = torch.arange(2 * n) // n
    paths = [[P("root", f"r{i}", 0)] for i in range(2 * n)]
    layout = tree_layout(paths, [f"q{int(x)}" for x in group])
    flat = compute_advantages("group_norm", step_rewards, mask, group).advantages
    tree = compute_advantages("tree_group_norm", step_rewards, mask, group, step_layout=(totals, *layout)).advantages
    assert torch.allclose(flat, tree, atol=1e-6)


def test_flat_rollout_batch_is_group_norm_end_to_end():
    """Trajectories without tree metadata (plain n_samples) get the flat layout from build_batch."""
    be, eng = coin_engine()
    eng.config = eng.config.model_copy(update={"n_samples": 4})
    trajs = eng.run(QUESTIONS[:2], seed=5)
    rewards = correct_reward(trajs)
    batch = build_batch(trajs, rewards, pad_id=0)
    flat = compute_advantages("group_norm", batch.step_rewards, batch.action_mask, batch.group).advantages
    tree = compute_advantages("tree_group_norm", batch.step_rewards, batch.action_mask, batch.group,
                              step_layout=batch.layout_for("tree_group_norm")).advantages
    assert torch.allclose(flat, tree, atol=1e-6)


def test_tree_batch_advantages_follow_the_subtrees():
    _, trajs = run_tree(TreeConfig(roots=2, branch=2, at_steps=[1]))
    rewards = correct_reward(trajs)
    batch = build_batch(trajs, rewards, pad_id=0)
    adv = compute_advantages("tree_group_norm", batch.step_rewards, batch.action_mask, batch.group,
                             step_layout=batch.layout_for("tree_group_norm")).advantages
    for b, t in enumerate(trajs):
        own = t.metadata["tree"]["owns_from"]
        assert float(adv[b, : max(0, own - 1)].abs().sum()) == 0.0
    # a root chain whose branch scored differently: its tokens after the boundary move by that point's term
    q = [b for b, t in enumerate(trajs) if t.metadata["tree"]["parent"] is None]
    checked = False
    for b in q:
        t = trajs[b]
        sib = [j for j, u in enumerate(trajs) if u.question_id == t.question_id and u.metadata["tree"]["parent"] == t.sample_index]
        if sib and rewards[sib[0]].total != rewards[b].total:
            spans = t.step_spans  # step 0 is before the boundary, step 1 after it
            assert batch.action_mask[b, spans[0].last - 1] == 1 and batch.action_mask[b, spans[1].start - 1] == 1
            before, after = float(adv[b, spans[0].last - 1]), float(adv[b, spans[1].start - 1])
            sign = 1.0 if rewards[b].total > rewards[sib[0]].total else -1.0
            assert sign * (after - before) == pytest.approx(0.707107, abs=1e-5)
            checked = True
    assert checked


# ---- config and the trainer ------------------------------------------------------------------
def test_config_refuses_a_tree_with_another_estimator_and_accepts_the_shipped_shape():
    cfg = RLConfig.model_validate({"rollout": {"n_samples": 1, "tree": {"roots": 2, "branch": 2, "at_steps": [1, 2]}},
                                   "algo": {"estimator": "tree_group_norm"}}).check()
    assert cfg.rollout.tree.at_steps == [1, 2]
    with pytest.raises(ConfigError, match="tree_group_norm"):
        RLConfig.model_validate({"rollout": {"tree": {"roots": 2}}, "algo": {"estimator": "group_norm"}}).check()
    with pytest.raises(ValueError, match="at_steps"):
        TreeConfig(at_steps=[2, 1])
    with pytest.raises(ValueError):
        TreeConfig(branch=1)


def test_one_rl_iteration_with_tree_rollouts_on_a_tiny_model(tmp_path):
    """The trainer's own path: tree rollout (the coin policy drives it so chains do reach the
    boundaries) -> rewards -> tree advantages -> one clipped update of the tiny model."""
    cfg = tiny_cfg("tree_group_norm", iterations=1)
    cfg = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={
        "max_steps": 4, "max_turn_tokens": 64, "max_new_tokens": 512, "tree": TreeConfig(roots=2, branch=2, at_steps=[1, 2])})})
    tr = tiny_trainer(cfg, tmp_path, reward=correct_reward)
    tr._build()
    tr.engine.backend = CoinBackend(tr.models.tokenizer)
    before = {k: v.clone() for k, v in tr.models.policy.state_dict().items()}
    rec = tr.iteration(0)
    assert rec["batch/trajectories"] == 4 * 8  # 4 questions x (2 roots, 2 at boundary 1, 4 at boundary 2)
    assert rec["tree/sibling_groups"] >= 1 and rec["tree/informative_groups"] >= 1
    assert rec["batch/kept"] > 0 and rec["advantage/abs_mean"] > 0
    after = tr.models.policy.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_flat_groups_log_their_informative_comparisons_as_one_level_trees(tmp_path):
    """Without a tree each question's group is one branching point. Dynamic filtering off: all 4
    questions' groups are trained, so 4 sibling groups. On: only the groups whose rewards differ
    are trained, so every trained group is informative and their count is what filtering kept."""
    recs = {}
    for filtering in (False, True):
        cfg = tiny_cfg("group_norm", iterations=1, dynamic_filtering=filtering)
        cfg = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={  # room for the coin policy to answer
            "max_steps": 4, "max_turn_tokens": 64, "max_new_tokens": 512})})
        tr = tiny_trainer(cfg, tmp_path / str(filtering), reward=correct_reward)
        tr._build()
        tr.engine.backend = CoinBackend(tr.models.tokenizer)
        recs[filtering] = tr.iteration(0)
    off, on = recs[False], recs[True]
    assert off["tree/sibling_groups"] == 4 and 0 <= off["tree/informative_groups"] <= 4
    assert off["tree/informative_per_1k_tokens"] == pytest.approx(1000.0 * off["tree/informative_groups"] / off["batch/generated_tokens"])
    kept = round(on["batch/groups"] * (1.0 - on["batch/filtered_fraction"]))
    assert on["tree/sibling_groups"] == on["tree/informative_groups"] == kept >= 1


def test_tree_run_end_to_end_with_the_tiny_models_own_rollouts(tmp_path):
    """The tiny random model itself generating (its chains rarely reach a boundary: the tree then
    is its roots): the run finishes and writes its final model."""
    cfg = tiny_cfg("tree_group_norm", iterations=1)
    cfg = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"tree": TreeConfig(roots=4, branch=2, at_steps=[1])})})
    final = tiny_trainer(cfg, tmp_path, reward=EvenTokenReward()).run()
    assert (final / "config.json").is_file()


def test_docstring_examples_hold():
    import doctest

    import r3rag.train.rl.tree as mod

    result = doctest.testmod(mod)
    assert result.attempted >= 3 and result.failed == 0


def test_the_quickstart_rl_config_takes_the_tree_as_overrides():
    """The shipped RL config (the quickstart's) with the documented overrides: valid, its profile's
    budgets kept, and every branching boundary below its max_steps (else the tree never branches)."""
    from pathlib import Path

    from r3rag.config import load_config

    root = Path(__file__).resolve().parents[1]
    cfg = load_config(RLConfig, root / "configs/rl/world_sft_grpo.yaml",
                      ["algo.estimator=tree_group_norm", "rollout.tree={roots: 2, branch: 2, at_steps: [1, 2]}"]).check()
    flat = load_config(RLConfig, root / "configs/rl/world_sft_grpo.yaml", []).check()
    assert cfg.rollout.tree == TreeConfig(roots=2, branch=2, at_steps=[1, 2])
    assert cfg.rollout.model_dump(exclude={"tree"}) == flat.rollout.model_dump(exclude={"tree"})
    assert max(cfg.rollout.tree.at_steps) < cfg.rollout.max_steps
    assert cfg.algo.min_group_std == MIN_STD


def test_a_branch_is_the_state_a_replay_of_its_parents_turns_reaches():
    """The copied state (ids, text, chat messages, budget, documents seen) equals what the env
    reaches when the parent's turns and documents are fed to a fresh one, turn by turn."""
    from r3rag.rollout.tree import branch_env

    be, eng = coin_engine()
    assert eng.config.mode == "chat"
    _, trajs = run_tree(TreeConfig(roots=1, branch=2, at_steps=[1, 2]))
    parent = next(t for t in trajs if t.metadata["tree"]["parent"] is None)
    q = next(q for q in QUESTIONS if str(q.id) == parent.question_id)
    for s in (1, 2):
        copy = branch_env(eng, q, parent, s, sample_index=7, seed=3)
        replay = eng.make_env(q, 7, 3)
        for st in parent.steps[:s]:
            seg = parent.segments[st.segment]
            assert replay.record_turn(GenerationOutput(list(seg.token_ids), seg.text, seg.logprobs, "stop")) is not None
            replay.insert_documents(list(st.documents))
        assert copy.ids == replay.ids and copy.text == replay.text and copy.messages == replay.messages
        assert copy.trajectory.loss_mask == replay.trajectory.loss_mask
        assert (copy._b.generated, copy._b.n_docs, copy._b.seen) == (replay._b.generated, replay._b.n_docs, replay._b.seen)
        assert copy.request().params.max_tokens == replay.request().params.max_tokens
        assert copy.request().shared_prefix == len(copy.ids)
