"""Advantage estimators on a literal batch, computed by hand (see the comments for the arithmetic).

The batch: two groups (questions q1, q2), per-step rewards, one dropped trajectory, and a
document span in the middle of trajectory A. Token ids don't matter; the segment layout does.

    A (q1): prompt[1,2] model[3,4] env[5,6] model[7,8]   per-step rewards [0.5, 2.0]  (total 2.5)
    B (q1): prompt[1,2] model[3,4,9]                     per-step rewards [0.0]       (total 0.0)
    C (q1): prompt[1,2] model[3]                         dropped by the recipe: never trained on
    D (q2): prompt[1,2] model[3]                         per-step rewards [1.0]
    E (q2): prompt[1,2] model[3,4]                       per-step rewards [-0.9]      (format error)

Shifted axis (position p predicts token p+1), L = 7:
    A: action positions 1,2 (step 0; its last token at 2) and 5,6 (step 1; last at 6); 3,4 = documents
    B: action positions 1,2,3 (last 3)    D: position 1    E: positions 1,2 (last 2)
"""

from __future__ import annotations

import math

import pytest
import torch

from r3rag.rewards.types import RewardOutput
from r3rag.rollout.trajectory import Segment, Step, Trajectory
from r3rag.train.rl.batch import build_batch, select
from r3rag.train.rl.estimators import ALL_ESTIMATORS, ESTIMATORS, compute_advantages

PAD = 0


def traj(qid: str, sample: int, model_parts: list[list[int]], env: list[list[int]] | None = None) -> Trajectory:
    segs = [Segment("prompt", "P", [1, 2])]
    steps = []
    for i, part in enumerate(model_parts):
        segs.append(Segment("model", "M", part, [-0.5] * len(part)))
        steps.append(Step(i, query="x" if i < len(model_parts) - 1 else None, answer=None if i < len(model_parts) - 1 else "y",
                          segment=len(segs) - 1))
        if env and i < len(env):
            segs.append(Segment("env", "D", env[i]))
    return Trajectory(qid, "?", "r3rag_steps", segments=segs, steps=steps, stop_reason="answered", sample_index=sample)


def literal_batch():
    trajs = [
        traj("q1", 0, [[3, 4], [7, 8]], env=[[5, 6]]),  # A
        traj("q1", 1, [[3, 4, 9]]),                      # B
        traj("q1", 2, [[3]]),                            # C (dropped)
        traj("q2", 0, [[3]]),                            # D
        traj("q2", 1, [[3, 4]]),                         # E
    ]
    rewards = [
        RewardOutput(2.5, [0.5, 2.0]),
        RewardOutput(0.0, [0.0]),
        RewardOutput(1.0, [1.0], dropped=True),
        RewardOutput(1.0, [1.0]),
        RewardOutput(-0.9, [-0.9]),
    ]
    sel = select(trajs, rewards, grouped=True, dynamic_filtering=True)
    batch = build_batch([trajs[i] for i in sel.keep], [rewards[i] for i in sel.keep], PAD)
    return sel, batch


# action positions of the kept rows A, B, D, E on the shifted axis
ACTIONS = {0: [1, 2, 5, 6], 1: [1, 2, 3], 2: [1], 3: [1, 2]}


def at_actions(x: torch.Tensor) -> list[list[float]]:
    return [[round(float(x[b, p]), 5) for p in ps] for b, ps in ACTIONS.items()]


def flat(rows: list[list[float]]) -> list[float]:
    return [v for r in rows for v in r]


def close(got: list[list[float]], want: list[list[float]]) -> bool:
    return [len(r) for r in got] == [len(r) for r in want] and flat(got) == pytest.approx(flat(want), abs=2e-5)


def normalised(rows: list[list[float]]) -> list[list[float]]:
    """(x - mean) / sqrt(var) over every listed value (population variance): batch normalisation."""
    xs = flat(rows)
    mean = sum(xs) / len(xs)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))
    return [[round((x - mean) / std, 5) for x in r] for r in rows]


def test_selection_and_layout():
    sel, b = literal_batch()
    assert sel.keep == [0, 1, 3, 4] and sel.dropped == 1 and sel.groups == 2 and sel.filtered_groups == 0
    # input_ids: (B=4, T=8); action_mask: (4, 7)
    assert tuple(b.input_ids.shape) == (4, 8) and tuple(b.action_mask.shape) == (4, 7)
    assert b.action_mask[0].tolist() == [0, 1, 1, 0, 0, 1, 1]  # prompt, step 0, documents, step 1
    assert b.action_mask[1].tolist() == [0, 1, 1, 1, 0, 0, 0]  # padding after B's 5 tokens
    # per-step rewards on each step's last generated token (A: 0.5 at 2, 2.0 at 6)
    assert b.step_rewards[0].tolist() == [0, 0, 0.5, 0, 0, 0, 2.0]
    assert b.step_rewards[3].tolist() == pytest.approx([0, 0, -0.9, 0, 0, 0, 0])
    assert b.group.tolist() == [0, 0, 1, 1]
    # the rollout's log-probs sit on the generated tokens' positions, NaN elsewhere
    assert b.rollout_logprobs[0, 5].item() == -0.5 and math.isnan(b.rollout_logprobs[0, 3].item())


def run(est: str, **kw) -> torch.Tensor:
    _, b = literal_batch()
    return compute_advantages(est, b.step_rewards, b.action_mask, b.group, **kw)


def test_reinforce_baseline():
    # q1 mean = (2.5 + 0) / 2 = 1.25 -> A: 0.5 at pos 2, 2.0 - 1.25 = 0.75 at pos 6; B: -1.25
    # q2 mean = (1.0 - 0.9) / 2 = 0.05 -> D: 0.95, E: -0.95
    # returns (gamma 1, generated tokens only): A = [0.5 + 0.75, 1.25, 0.75, 0.75]
    out = run("reinforce_baseline")
    returns = [[1.25, 1.25, 0.75, 0.75], [-1.25, -1.25, -1.25], [0.95], [-0.95, -0.95]]
    assert close(at_actions(out.returns), returns)
    assert close(at_actions(out.advantages), normalised(returns))  # batch-normalised over the 10 generated tokens


def test_dr_grpo_same_baseline_no_normalisation():
    out = run("dr_grpo")
    assert close(at_actions(out.advantages), [[1.25, 1.25, 0.75, 0.75], [-1.25, -1.25, -1.25], [0.95], [-0.95, -0.95]])


def test_group_norm():
    # q1: std = sqrt(2 * 1.25^2 / 1) = 1.767767 (unbiased); scale = 0.565685
    #     A: pos 2: 0.5 * 0.565685 = 0.282843; pos 6: (2.0 - 1.25) * 0.565685 = 0.424264
    #     returns A = [0.707107, 0.707107, 0.424264, 0.424264]; B = -1.25 * 0.565685 = -0.707107
    # q2: std = sqrt(2 * 0.95^2) = 1.343503 -> D: 0.707107, E: -0.707107
    out = run("group_norm")
    s = 0.707107
    assert close(at_actions(out.advantages), [[s, s, 0.424264, 0.424264], [-s, -s, -s], [s], [-s, -s]])


def test_rloo():
    # q1 (n = 2): A's baseline is B's reward 0, B's is A's 2.5; q2: D - E = 1.9, E - D = -1.9
    out = run("rloo")
    assert close(at_actions(out.advantages), [[2.5, 2.5, 2.0, 2.0], [-2.5, -2.5, -2.5], [1.9], [-1.9, -1.9]])


def test_reinforce_discounts_over_generated_tokens_only():
    # gamma 0.5, no baseline: A pos 6: 2.0; pos 5: 0.5 * 2.0 = 1.0; the documents (3, 4) are
    # skipped, so pos 2: 0.5 + 0.5 * 1.0 = 1.0 (not 0.5 + 0.5^3 * 1.0); pos 1: 0.5 * 1.0 = 0.5
    # E: pos 2: -0.9, pos 1: -0.45
    out = run("reinforce", gamma=0.5)
    returns = [[0.5, 1.0, 1.0, 2.0], [0.0, 0.0, 0.0], [1.0], [-0.45, -0.9]]
    assert close(at_actions(out.returns), returns)
    assert close(at_actions(out.advantages), normalised(returns))


def test_kl_in_reward_ignores_prompt_and_documents():
    # dr_grpo + KL penalty 0.5 * kl on generated tokens; kl = 5 on A's documents must not count
    _, b = literal_batch()
    kl = torch.zeros_like(b.action_mask)
    kl[0, [1, 2, 5, 6]] = torch.tensor([0.1, 0.2, 0.3, 0.4])
    kl[0, [0, 3, 4]] = 5.0  # prompt and documents: masked out
    out = compute_advantages("dr_grpo", b.step_rewards, b.action_mask, b.group, kl=kl, kl_coef=0.5)
    # A token rewards: pos1 -0.05, pos2 0.5 - 0.1 = 0.4, pos5 -0.15, pos6 0.75 - 0.2 = 0.55
    # returns: pos6 0.55, pos5 0.40, pos2 0.80, pos1 0.75
    assert close(at_actions(out.advantages)[:1], [[0.75, 0.8, 0.4, 0.55]])
    assert close(at_actions(out.advantages)[1:], [[-1.25, -1.25, -1.25], [0.95], [-0.95, -0.95]])
    assert float(out.token_rewards[0, 3]) == 0.0 and float(out.token_rewards[0, 0]) == 0.0


def test_gae_over_generated_tokens_only():
    # A's values at its action positions 1,2,5,6 = 0.1,0.2,0.3,0.4 (others 0); gamma 1, lambda 0.5,
    # rewards as placed (no shaping): 0.5 at pos 2, 2.0 at pos 6
    #   pos6: delta = 2.0 - 0.4 = 1.6;                 A = 1.6
    #   pos5: delta = 0 + 0.4 - 0.3 = 0.1;             A = 0.1 + 0.5 * 1.6  = 0.9
    #   pos2: delta = 0.5 + 0.3 - 0.2 = 0.6 (V_next = pos 5's, across the documents); A = 0.6 + 0.45 = 1.05
    #   pos1: delta = 0 + 0.2 - 0.1 = 0.1;             A = 0.1 + 0.525 = 0.625
    # E (values 0): pos2 -0.9, pos1 0.5 * -0.9 = -0.45; D: 1.0; B: 0
    _, b = literal_batch()
    values = torch.zeros_like(b.action_mask)
    values[0, [1, 2, 5, 6]] = torch.tensor([0.1, 0.2, 0.3, 0.4])
    values[0, [3, 4]] = 7.0  # document positions: ignored
    out = compute_advantages("gae", b.step_rewards, b.action_mask, b.group, values=values, gamma=1.0, lambd=0.5)
    raw = [[0.625, 1.05, 0.9, 1.6], [0.0, 0.0, 0.0], [1.0], [-0.45, -0.9]]
    assert close(at_actions(out.returns)[:1], [[0.725, 1.25, 1.2, 2.0]])  # advantages + values
    assert close(at_actions(out.advantages), normalised(raw))
    assert float(out.returns[0, 3]) == 0.0


def test_dynamic_filtering_and_single_sample_groups():
    # q1: both samples score 1.0 -> filtered; q2: one kept sample after a drop -> filtered for group estimators
    ts = [traj("q1", 0, [[3]]), traj("q1", 1, [[4]]), traj("q2", 0, [[3]]), traj("q2", 1, [[4]])]
    rs = [RewardOutput(1.0, [1.0]), RewardOutput(1.0, [1.0]), RewardOutput(0.0, [0.0]), RewardOutput(1.0, [1.0], dropped=True)]
    sel = select(ts, rs, grouped=True, dynamic_filtering=True)
    assert sel.keep == [] and sel.filtered_groups == 2 and sel.dropped == 1 and sel.filtered_fraction == 1.0
    # without groups (reinforce) and without filtering every trainable sample stays
    sel = select(ts, rs, grouped=False, dynamic_filtering=False)
    assert sel.keep == [0, 1, 2]


def test_untrainable_trajectories_are_counted_not_trained():
    t = traj("q1", 0, [[3]])
    t.stop_reason = "retrieval_failed"
    u = traj("q1", 1, [[3]])
    u.metadata["exact_ids"] = False
    sel = select([t, u, traj("q1", 2, [[4]])], [RewardOutput(0.0, [0.0])] * 3, grouped=False, dynamic_filtering=False)
    assert sel.keep == [2] and sel.untrainable == 2


def test_rft_imitates_every_kept_token_with_advantage_one_and_none_off_the_mask():
    # every kept row's total becomes 1 whatever its rewards (A's 0.5 + 2.0, E's -0.9): the return at
    # each generated token is 1 (gamma forced to 1, the discount below is ignored); no normalisation;
    # A's documents (shifted positions 3, 4) and the prompt/padding stay 0
    out = run("rft", gamma=0.5)
    assert close(at_actions(out.advantages), [[1.0] * 4, [1.0] * 3, [1.0], [1.0, 1.0]])
    assert close(at_actions(out.returns), [[1.0] * 4, [1.0] * 3, [1.0], [1.0, 1.0]])
    _, b = literal_batch()
    off = b.action_mask == 0  # (4, 7)
    assert off.sum() == 28 - 10 and out.advantages[off].abs().max() == 0


def test_rft_selection_keeps_each_questions_best_accepted_samples():
    # q1: four trainable samples, totals 2.5 / 3.1 / 0.4 (wrong) / 3.1 (tie with sample 1) and one dropped;
    # q2: two wrong samples -> nothing kept; q3: one correct sample, total 2.0
    t = [traj("q1", i, [[3]]) for i in range(5)] + [traj("q2", i, [[3]]) for i in range(2)] + [traj("q3", 0, [[3]])]
    ok = {"correct": 1.0}
    wrong = {"correct": 0.0}
    r = [RewardOutput(2.5, [2.5], ok), RewardOutput(3.1, [3.1], ok), RewardOutput(0.4, [0.4], wrong),
         RewardOutput(3.1, [3.1], ok), RewardOutput(9.0, [9.0], ok, dropped=True),
         RewardOutput(0.8, [0.8], wrong), RewardOutput(0.0, [0.0], wrong), RewardOutput(2.0, [2.0], ok)]
    correct = lambda t, x: x.components["correct"] >= 1  # noqa: E731
    sel = select(t, r, grouped=False, dynamic_filtering=True, top_k=1, accept=correct)
    # q1's best is a tie at 3.1: the earlier sample (1) wins; the dropped 9.0 never competes
    assert sel.keep == [1, 7] and sel.dropped == 1 and sel.rejected == 3 + 2 + 0 and sel.filtered_groups == 0
    sel = select(t, r, grouped=False, dynamic_filtering=True, top_k=2, accept=correct)
    assert sel.keep == [1, 3, 7] and sel.rejected == 2 + 2
    # without an acceptance test: the best of every question, wrong or not
    sel = select(t, r, grouped=False, dynamic_filtering=True, top_k=1)
    assert sel.keep == [1, 5, 7]
    # a threshold on the total instead (the loop's rft_min_reward): q3's 2.0 passes at 2.0, not at 2.1;
    # q1's 2.5 passes both, 3.0 leaves only its two 3.1s
    for th, want in ((2.0, [0, 1, 3, 7]), (2.1, [0, 1, 3]), (3.0, [1, 3])):
        sel = select(t, r, grouped=False, dynamic_filtering=False, top_k=4, accept=lambda t, x, th=th: x.total >= th)
        assert sel.keep == want


def test_registry_refuses_an_unknown_name():
    # the names themselves are checked against OpenRLHF's own parser in tests/test_rl_openrlhf_parity.py
    assert set(ALL_ESTIMATORS) == set(ESTIMATORS) | {"group_norm_split", "tree_group_norm"}
    with pytest.raises(ValueError, match="unknown estimator"):
        run("ppo")


def test_rft_acceptance_correct_and_grounded():
    """The loop's acceptance test (``rft_selection``): correct per the recipe and, with
    ``rft_min_recall``, the retrieved documents covering that share of the gold passages."""
    from r3rag.data.records import Passage
    from r3rag.errors import ConfigError
    from r3rag.train.rl.config import AlgoConfig
    from r3rag.train.rl.loop import rft_selection

    def chain(docs_per_step: list[list[str]], gold=("g1", "g2")) -> Trajectory:
        steps = [Step(i, query="x", documents=[Passage(d, "t\nx") for d in docs]) for i, docs in enumerate(docs_per_step)]
        steps.append(Step(len(steps), answer="y"))
        return Trajectory("q", "?", "r3rag_steps", steps=steps, metadata={"supporting_ids": list(gold)} if gold else {})

    both, one, none = chain([["g1", "d1"], ["d2", "g2"]]), chain([["g1", "d1"], ["d2"]]), chain([["d1"]])
    right, wrong = RewardOutput(3.0, [3.0], {"correct": 1.0}), RewardOutput(0.8, [0.8], {"correct": 0.0})
    accept = rft_selection(AlgoConfig(estimator="rft", rft_min_recall=1.0))["accept"]
    assert [accept(t, right) for t in (both, one, none)] == [True, False, False]
    assert accept(both, wrong) is False  # grounded but wrong
    half = rft_selection(AlgoConfig(estimator="rft", rft_min_recall=0.5))["accept"]
    assert [half(t, right) for t in (both, one, none)] == [True, True, False]
    plain = rft_selection(AlgoConfig(estimator="rft"))["accept"]  # correct only: the lucky guess passes
    assert [plain(t, right) for t in (both, one, none)] == [True, True, True]
    with pytest.raises(ConfigError, match="gold supporting passages"):
        accept(chain([["d1"]], gold=()), right)
    assert rft_selection(AlgoConfig(estimator="group_norm")) == {}


@pytest.mark.parametrize("name", ["world_sft_grpo", "world_sft_rft", "r3rag_ppo", "r1searcher_reinforce_baseline"])
def test_shipped_rl_configs_load_and_pass_their_checks(name):
    from pathlib import Path

    from r3rag.config import load_config
    from r3rag.train.rl.config import RLConfig

    path = Path(__file__).resolve().parents[1] / "configs" / "rl" / f"{name}.yaml"
    cfg = load_config(RLConfig, path).check()
    if name == "world_sft_rft":  # the rejection-sampling recipe: correct and grounded, one per question
        a = cfg.algo
        assert (a.estimator, a.rft_top_k, a.rft_min_recall, a.rft_correct_only) == ("rft", 1, 1.0, True)
        assert cfg.train.skip_guessable and cfg.rollout.n_samples == 2


def test_overlong_filtering_leaves_out_what_the_budget_cut_off():
    """A third sample of q1 that ran out of steps (process reward 0.9, never answered) would pull q1's
    mean down to 1.133 and change A's and B's advantages; filtered, q1 is the A/B pair again and
    group_norm gives exactly the values of ``test_group_norm``."""
    from r3rag.train.rl.batch import TRUNCATED

    trajs = [traj("q1", 0, [[3, 4], [7, 8]], env=[[5, 6]]), traj("q1", 1, [[3, 4, 9]]), traj("q1", 2, [[3, 4]]),
             traj("q2", 0, [[3]]), traj("q2", 1, [[3, 4]])]
    trajs[2].stop_reason = "max_steps"
    rewards = [RewardOutput(2.5, [0.5, 2.0]), RewardOutput(0.0, [0.0]), RewardOutput(0.9, [0.9]),
               RewardOutput(1.0, [1.0]), RewardOutput(-0.9, [-0.9])]
    kept_all = select(trajs, rewards, grouped=True, dynamic_filtering=True)
    assert kept_all.keep == [0, 1, 2, 3, 4] and kept_all.overlong == 0  # off: the cut sample competes
    sel = select(trajs, rewards, grouped=True, dynamic_filtering=True, truncated=TRUNCATED)
    assert sel.keep == [0, 1, 3, 4] and sel.overlong == 1 and sel.reasons == {"overlong": 1}
    b = build_batch([trajs[i] for i in sel.keep], [rewards[i] for i in sel.keep], PAD)
    out = compute_advantages("group_norm", b.step_rewards, b.action_mask, b.group)
    s = 0.707107
    assert close(at_actions(out.advantages), [[s, s, 0.424264, 0.424264], [-s, -s, -s], [s], [-s, -s]])
    # a group left with one sample once its cut ones are out carries no comparison: filtered
    trajs[1].stop_reason = "max_tokens"
    sel = select(trajs, rewards, grouped=True, dynamic_filtering=True, truncated=TRUNCATED)
    assert sel.keep == [3, 4] and sel.overlong == 2 and sel.filtered_groups == 1


def test_step_layout_of_the_literal_batch():
    _, b = literal_batch()
    # step_table: (B=4, S=2), each step's reward; query_steps: A's first step is its only query
    assert flat(b.step_table.tolist()) == pytest.approx([0.5, 2.0, 0.0, 0.0, 1.0, 0.0, -0.9, 0.0])
    assert b.query_steps.tolist() == [[True, False], [False, False], [False, False], [False, False]]
    # step_id: (4, 7) on the shifted axis; A's documents (3, 4), the prompt and the padding are -1
    assert b.step_id[0].tolist() == [-1, 0, 0, -1, -1, 1, 1]
    assert b.step_id[1].tolist() == [-1, 0, 0, 0, -1, -1, -1]
    sub = b.rows([3, 0])  # a sub-batch keeps the layout of its rows, cut to its own length
    assert sub.step_id.tolist() == [[-1, 0, 0, -1, -1, -1, -1], [-1, 0, 0, -1, -1, 1, 1]] and sub.query_steps[1, 0]


def split_batch():
    """One question, three samples (query steps then an answer; documents after every query):

        A: query (no gold: 0.0), query (gold, correct: 1.6), answer (right: 2.0)   total 3.6
        B: query (gold, correct: 1.6), answer (right: 2.0)                          total 3.6
        C: query (broken: -0.9), answer (wrong: 0.0)                                total -0.9
    """
    trajs = [traj("q", 0, [[3, 4], [7], [8, 9]], env=[[5, 6], [5]]),
             traj("q", 1, [[3], [8]], env=[[5]]),
             traj("q", 2, [[3, 4], [8]], env=[[5]])]
    rewards = [RewardOutput(3.6, [0.0, 1.6, 2.0]), RewardOutput(3.6, [1.6, 2.0]), RewardOutput(-0.9, [-0.9, 0.0])]
    return build_batch(trajs, rewards, PAD)


def test_group_norm_split_by_hand():
    b = split_batch()
    # outcome (non-query steps): 2, 2, 0 -> mean 4/3, unbiased std sqrt((4/9 + 4/9 + 16/9) / 2) = 1.154701
    #   -> +0.577350, +0.577350, -1.154701 on every generated token of the sample
    # query steps pooled over the group: 0.0, 1.6, 1.6, -0.9 -> mean 0.575,
    #   unbiased std sqrt((0.330625 + 2 * 1.050625 + 2.175625) / 3) = 1.239287
    #   -> -0.463977, +0.827090, +0.827090, -1.190199 on that step's tokens only
    # action positions (shifted): A 1,2 (query) | docs 3,4 | 5 (query) | doc 6 | 7,8 (answer)
    #                             B 1 (query) | doc 2 | 3 (answer);  C 1,2 (query) | doc 3 | 4 (answer)
    adv = compute_advantages("group_norm_split", b.step_rewards, b.action_mask, b.group, step_layout=b.step_layout).advantages
    o, p = 0.577350, [-0.463977, 0.827090, 0.827090, -1.190199]
    got = [[round(float(adv[0, t]), 5) for t in (1, 2, 5, 7, 8)], [round(float(adv[1, t]), 5) for t in (1, 3)],
           [round(float(adv[2, t]), 5) for t in (1, 2, 4)]]
    want = [[o + p[0], o + p[0], o + p[1], o, o], [o + p[2], o], [-2 * o + p[3], -2 * o + p[3], -2 * o]]
    assert flat(got) == pytest.approx(flat(want), abs=2e-5)
    assert adv[0, [0, 3, 4, 6]].abs().max() == 0 and adv[1, [0, 2]].abs().max() == 0  # prompt and documents


def test_group_norm_pushes_a_right_answer_down_group_norm_split_does_not():
    # group_norm: A's answer tokens get (2.0 - mean total 2.1) / std(3.6, 3.6, -0.9) < 0 although A
    # answered right, because the baseline is the mean *total*, process rewards included
    b = split_batch()
    gn = compute_advantages("group_norm", b.step_rewards, b.action_mask, b.group).advantages
    sp = compute_advantages("group_norm_split", b.step_rewards, b.action_mask, b.group, step_layout=b.step_layout).advantages
    assert float(gn[0, 8]) == pytest.approx((2.0 - 2.1) / 2.598076, abs=1e-5) and float(gn[0, 8]) < 0
    assert float(sp[0, 8]) == pytest.approx(0.577350, abs=1e-5)
    # the query that found nothing (A's first) gets what the one that found gold gets under group_norm
    # (the same return-to-go, 3.6), and less than it under group_norm_split
    assert float(gn[0, 1]) == pytest.approx(float(gn[0, 5])) and float(sp[0, 1]) < float(sp[0, 5]) - 1.0


def test_group_norm_split_without_process_rewards_is_group_norm():
    # query steps that all earn the same (here 0: an outcome-only recipe) add nothing
    trajs = [traj("q", 0, [[3, 4], [7]], env=[[5, 6]]), traj("q", 1, [[3], [8]], env=[[5]]), traj("q", 2, [[4]])]
    rewards = [RewardOutput(2.0, [0.0, 2.0]), RewardOutput(0.0, [0.0, 0.0]), RewardOutput(-0.9, [-0.9])]
    b = build_batch(trajs, rewards, PAD)
    gn = compute_advantages("group_norm", b.step_rewards, b.action_mask, b.group).advantages
    sp = compute_advantages("group_norm_split", b.step_rewards, b.action_mask, b.group, step_layout=b.step_layout).advantages
    assert torch.allclose(gn, sp, atol=1e-6) and sp.abs().max() > 0.5


def test_group_norm_split_needs_the_layout_and_no_kl_in_the_reward():
    b = split_batch()
    with pytest.raises(ValueError, match="step layout"):
        compute_advantages("group_norm_split", b.step_rewards, b.action_mask, b.group)
    with pytest.raises(ValueError, match="kl_use_loss"):
        compute_advantages("group_norm_split", b.step_rewards, b.action_mask, b.group, kl=torch.ones_like(b.action_mask),
                           kl_coef=0.1, step_layout=b.step_layout)
