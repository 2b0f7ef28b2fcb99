"""The RL objective's definitions at the shipped configurations (no OpenRLHF needed).

- documents are not time steps: GAE at configs/rl/r3rag_ppo.yaml's gamma/lambd gives the same
  advantages whatever the length of the documents between two model turns;
- no estimator divides by a vanishing spread: groups of equal (or equal within the dynamic
  filter's tolerance) totals with different step rewards give finite, zero advantages under
  configs/rl/world_sft_grpo.yaml's group_norm with dynamic filtering off;
- group statistics come from the kept samples only (the rule the OpenRLHF hook applies too);
- ``flash_reinforce``: the rollout batch's mean as the one baseline;
- OpenRLHF's reward clip (-10, 10) is the default.
The same definitions inside OpenRLHF's own code: tests/test_rl_openrlhf_parity.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from r3rag.config import load_config
from r3rag.train.openrlhf.placement import pack_actions, token_rewards, unpack_actions
from r3rag.train.rl.config import AlgoConfig, RLConfig
from r3rag.train.rl.estimators import MIN_STD, REWARD_CLIP, Shaping, apply_shaping, compute_advantages, shaping

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "rl"


def algo(name: str) -> AlgoConfig:
    return load_config(RLConfig, CONFIGS / f"{name}.yaml").algo


def two_steps(doc: int, rows: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """Step rewards 0.6 then 2.0: step 1 one token (position 1), a document of ``doc`` tokens, step 2
    four tokens; shifted axis ``(rows, L)``."""
    L = 2 + doc + 4 + 1
    mask, steps = torch.zeros(rows, L), torch.zeros(rows, L)
    mask[:, 1] = 1
    mask[:, 2 + doc: 6 + doc] = 1
    steps[:, 1], steps[:, 5 + doc] = 0.6, 2.0
    return steps, mask


def test_gae_documents_are_not_time_steps_at_the_shipped_gamma_lambda():
    a = algo("r3rag_ppo")
    assert (a.estimator, a.gamma, a.lambd) == ("gae", 1.0, 0.95)
    want = 0.6 + 2.0 * a.lambd**4  # 2.229: the second step's reward 4 generated tokens ahead
    base = None
    for doc in (0, 5, 50, 300):
        steps, mask = two_steps(doc)
        values = torch.zeros_like(mask)
        out = compute_advantages("gae", steps, mask, torch.zeros(2, dtype=torch.long), values=values,
                                 gamma=a.gamma, lambd=a.lambd, reward_clip=a.reward_clip)
        assert float(out.returns[0, 1]) == pytest.approx(want, abs=1e-5)
        got = out.advantages[mask.bool()]
        if base is None:
            base = got
        assert torch.allclose(got, base, atol=1e-6), doc  # the same at every action token, any document
    # the every-position alternative would have decayed it: 0.6 + 2.0 * 0.95^(4 + 50) = 0.725
    assert 0.6 + 2.0 * a.lambd ** (4 + 50) == pytest.approx(0.725, abs=1e-3)


def test_gae_with_critic_values_reads_the_value_of_the_next_generated_token():
    a = algo("r3rag_ppo")
    steps, mask = two_steps(50, rows=1)
    values = torch.randn(1, mask.size(1)) * mask
    docs = torch.zeros_like(mask)
    docs[0, 2:52] = 9.0  # values at document positions would be read by an every-position GAE
    out = compute_advantages("gae", steps, mask, torch.zeros(1, dtype=torch.long), values=values + docs,
                             gamma=a.gamma, lambd=a.lambd)
    packed = compute_advantages("gae", *(pack_actions(x, mask)[0] for x in (steps, mask)), torch.zeros(1, dtype=torch.long),
                                values=pack_actions(values, mask)[0], gamma=a.gamma, lambd=a.lambd)
    assert torch.allclose(out.returns[mask.bool()], packed.returns[pack_actions(mask, mask)[1].bool()], atol=1e-6)


def equal_total_groups(n: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Group 0: totals exactly 2.0; group 1: within 1e-6; group 2: a real spread. Two steps each."""
    firsts = [0.6, 1.4, 0.2, 1.0][:n]
    B, L = 3 * n, 8
    mask, steps = torch.zeros(B, L), torch.zeros(B, L)
    mask[:, 1:3] = 1
    mask[:, 5:7] = 1
    for b in range(B):
        g, k = divmod(b, n)
        first = firsts[k]
        second = 2.0 - first + (2e-7 * k if g == 1 else 0.0) + (float(k) if g == 2 else 0.0)
        steps[b, 2], steps[b, 6] = first, second
    return steps, mask, torch.arange(B) // n


def test_group_norm_never_divides_by_a_vanishing_spread_at_the_shipped_config():
    a = algo("world_sft_grpo")
    assert a.estimator == "group_norm" and a.min_group_std == MIN_STD
    steps, mask, group = equal_total_groups()
    spread = steps.sum(1)[4:8]
    assert float(spread.max() - spread.min()) <= a.filter_tol  # the dynamic filter would call them equal
    out = compute_advantages(a.estimator, steps, mask, group, gamma=a.gamma, lambd=a.lambd,
                             reward_clip=a.reward_clip, min_std=a.min_group_std)
    assert torch.isfinite(out.advantages).all() and torch.isfinite(out.returns).all()
    assert out.advantages[:8].abs().max() == 0.0  # equal totals: no spread, no signal
    real = out.advantages[8:][mask[8:].bool()]
    assert 0.1 < float(real.abs().max()) < 10  # a group with a spread is normalised as before
    # without the guard (min_std 0): step rewards times 1/(std + 1e-9)
    raw = compute_advantages(a.estimator, steps, mask, group, reward_clip=None, min_std=0.0)
    assert float(raw.advantages[:8].abs().max()) > 1e6


def test_group_norm_split_has_the_same_guard():
    steps, mask, group = equal_total_groups()
    table = torch.stack([steps[:, 2], steps[:, 6]], dim=1)  # (B, 2): a query step, the answer
    query = torch.tensor([[True, False]] * table.size(0))
    query[:8, 0] = False  # groups 0 and 1: outcome only, equal totals
    step_id = torch.full_like(mask, -1, dtype=torch.long)
    step_id[:, 1:3], step_id[:, 5:7] = 0, 1
    out = compute_advantages("group_norm_split", steps, mask, group, step_layout=(table, query, step_id))
    assert torch.isfinite(out.advantages).all() and out.advantages[:8].abs().max() == 0.0


@pytest.mark.parametrize("estimator", ["rloo", "group_norm", "reinforce_baseline", "dr_grpo", "flash_reinforce"])
def test_statistics_of_kept_samples_only(estimator):
    totals = torch.tensor([1.0, 0.0, 0.5, 3.0, 2.0, 0.0, 1.0, 4.0])
    group = torch.arange(8) // 4
    kept = torch.tensor([True, True, True, False, True, True, True, True])
    with_drop = shaping(estimator, totals, group, kept=kept)
    alone = shaping(estimator, totals[kept], group[kept])
    assert torch.allclose(with_drop.scale[kept], alone.scale) and torch.allclose(with_drop.shift[kept], alone.shift)
    assert float(with_drop.scale[3]) == 0.0 and float(with_drop.shift[3]) == 0.0


def test_group_left_with_one_kept_sample_gets_nothing():
    sh = shaping("rloo", torch.tensor([1.0, 5.0, 0.0, 2.0]), torch.tensor([0, 0, 1, 1]),
                 kept=torch.tensor([True, False, True, True]))
    assert (float(sh.scale[0]), float(sh.shift[0])) == (0.0, 0.0)
    assert float(sh.scale[2]) == 1.0 and float(sh.shift[2]) == 2.0  # leave-one-out: the other sample


def test_flash_reinforce_one_batch_baseline_no_whitening_no_discount():
    mask = torch.ones(4, 3)
    placed = torch.zeros(4, 3)
    placed[:, -1] = torch.tensor([1.0, 0.0, 3.0, 0.0])
    out = compute_advantages("flash_reinforce", placed, mask, torch.tensor([0, 0, 1, 1]), gamma=0.5)
    want = torch.tensor([0.0, -1.0, 2.0, -1.0])  # minus the batch mean 1.0, whatever the groups
    assert torch.allclose(out.advantages, want[:, None].expand(4, 3))


def test_reward_clip_default_is_openrlhfs_and_applies():
    assert AlgoConfig().reward_clip == REWARD_CLIP == (-10.0, 10.0)
    for name in ("r3rag_ppo", "world_sft_grpo", "r1searcher_reinforce_baseline", "world_sft_rft"):
        assert algo(name).reward_clip == REWARD_CLIP
    placed = torch.tensor([[0.0, 12.0], [0.0, -15.0]])
    out = compute_advantages("reinforce", placed, torch.ones(2, 2), torch.zeros(2, dtype=torch.long), no_std_norm=True)
    assert out.token_rewards[:, 1].tolist() == [10.0, -10.0]


def test_cluster_placement_is_the_single_machine_shaping():
    """The hook's token_rewards = apply_shaping on the placed step rewards, KL added after the clip."""
    g = torch.Generator().manual_seed(0)
    steps, mask, group = equal_total_groups()
    totals = steps.sum(1) + 0.25  # a length penalty OpenRLHF added to the total: joins the last token
    sh = shaping("group_norm", totals, group)
    kl = torch.randn(steps.shape, generator=g) * mask
    ours = token_rewards(totals, steps, sh.scale, sh.shift, 0.05, kl, mask, REWARD_CLIP)
    last = mask.size(1) - 1 - mask.long().fliplr().argmax(1)
    placed = steps.clone()
    placed[torch.arange(len(last)), last] += 0.25
    want = apply_shaping(placed, mask, Shaping(sh.scale, sh.shift), REWARD_CLIP) - 0.05 * kl
    assert torch.allclose(ours, want, atol=1e-6)


def test_pack_and_unpack_round_trip():
    g = torch.Generator().manual_seed(1)
    mask = (torch.rand(5, 17, generator=g) > 0.5).long()
    x = torch.randn(5, 17, generator=g)
    packed, pm, order = pack_actions(x, mask)
    assert pm.tolist() == [sorted(r, reverse=True) for r in mask.tolist()]
    for b in range(5):
        assert packed[b, : int(mask[b].sum())].tolist() == x[b][mask[b].bool()].tolist()
    assert torch.equal(unpack_actions(packed, mask, order), x * mask)
