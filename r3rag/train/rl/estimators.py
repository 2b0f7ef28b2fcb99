"""Advantage estimators by name, with OpenRLHF's names and numbers.

Every estimator sees the same inputs, all on the shifted token axis ``(B, L)``:
``step_rewards`` (each step's reward on its last generated token, see :mod:`.batch`),
``action_mask`` (1 on generated tokens), ``group`` (``(B,)``, samples of one question share an
index), and optionally ``kl`` (per-token KL to the reference) and ``values`` (the critic's, for
``gae``). The pipeline, as OpenRLHF's ``compute_advantages_and_returns``:

1. **group shaping** of each sample's total reward ``r`` (the sum of its step rewards), within its
   group (``n`` kept samples):

   ==================== =====================================================================
   ``reinforce``, ``gae`` none
   ``reinforce_baseline`` ``r - mean(group)``                           (Reinforce++-baseline)
   ``dr_grpo``            ``r - mean(group)``                           (Dr. GRPO: no std)
   ``group_norm``         ``(r - mean(group)) / (std(group) + 1e-9)``   (GRPO; unbiased std)
   ``rloo``               ``r - (sum(group) - r) / (n - 1)``            (leave one out)
   ``rft``                ``1``, whatever ``r``                         (rejection sampling)
   ==================== =====================================================================

   ``rft`` is rejection-sampling fine-tuning (expert iteration: RFT, ReST-EM, RAFT). The
   selection (:func:`r3rag.train.rl.batch.select` with ``top_k``) keeps only the accepted, best
   samples of each question, and every generated token of those gets advantage 1: the clipped
   loss's gradient at ratio 1 is then the token-mean negative log-likelihood's, SFT on the
   policy's own successes. It never pushes a sample down.

   With an outcome reward (one number on the last generated token) this is exactly OpenRLHF's
   shaped scalar. With per-step rewards the shaping is an affine map ``r -> a r - b`` applied
   as: every step reward times ``a`` (``1/(std + 1e-9)`` for ``group_norm``, else 1), and ``-b``
   added on the last generated token. The return at the first generated token is then the
   shaped total, and a token's return still counts only the rewards ahead of it;
2. optional clamp (``reward_clip``) of the placed rewards, then the per-token KL penalty
   ``-kl_coef * kl`` on every generated token when the KL is in the reward (``compute_reward``);
3. returns: ``reinforce``-family: discounted cumulative sum of the token rewards; ``gae``:
   generalised advantage estimation with the critic's values (returns = advantages + values).
   Both run **over generated tokens only**: documents inside a trajectory are skipped, they do
   not count as time steps. (OpenRLHF discounts over every response position; the two agree
   whenever ``gamma = lambd = 1`` or the generated tokens are contiguous.)
   ``rloo``, ``reinforce_baseline``, ``group_norm`` and ``dr_grpo`` force ``gamma = 1`` (as OpenRLHF);
4. batch normalisation of advantages over all generated tokens of the batch for ``gae``,
   ``reinforce`` and ``reinforce_baseline``: ``(A - mean) / sqrt(max(var, 1e-8))`` (mean only with
   ``no_std_norm``). Prompt, document and padding positions take no part in the statistics.

**Per-step rewards and one group baseline.** Under ``group_norm`` a token's advantage is its
return-to-go minus the group's mean *total*: the answer step's tokens get ``r_answer -
mean(total)``, which is below zero on average by the group's mean process reward. The gradient is
still unbiased (the baseline is the same for every token of the group), but the baseline fits
only the first step, so every later step carries the variance of the rewards earned before it.

``group_norm_split`` (ours; no OpenRLHF counterpart) gives each kind of reward its own group
baseline. The *outcome* (every reward not on a query step: the answer, a broken answer step, the
outcome shape's total) is normalised over the group's samples as GRPO does and reaches every
generated token of the sample; each *query step's* reward (its process relevance, or a format
penalty) is normalised over all query steps of the group (pooled, as DeepSeekMath's process
supervision) and reaches that step's tokens only::

    A(t) = (o_i - mean_g(o)) / (std_g(o) + 1e-9)  +  [t in query step k] (p_ik - mean_g(p)) / (std_g(p) + 1e-9)

(unbiased std, as ``group_norm``). It needs the batch's step layout (``step_table``,
``query_steps``, ``step_id``, see :class:`r3rag.train.rl.batch.RolloutBatch`). With an outcome-only
recipe it is ``group_norm``. The raw scale of the process reward (``process_weight``) no longer
matters, only its order within the group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

GROUP_ESTIMATORS = ("reinforce_baseline", "group_norm", "rloo", "dr_grpo", "group_norm_split")
BATCH_NORMALISED = ("gae", "reinforce", "reinforce_baseline")
UNDISCOUNTED = GROUP_ESTIMATORS + ("rft",)  # gamma forced to 1


@dataclass
class Shaping:
    """``r -> scale * r - shift`` per sample: ``scale`` multiplies every step reward, ``-shift``
    lands on the last generated token."""

    scale: torch.Tensor  # (B,)
    shift: torch.Tensor  # (B,)


def _group_stats(r: torch.Tensor, group: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample group ``(mean, unbiased std, sum, count)`` of ``r`` (all ``(B,)``)."""
    G = int(group.max()) + 1 if group.numel() else 0
    count = torch.zeros(G, dtype=r.dtype).index_add_(0, group, torch.ones_like(r))
    total = torch.zeros(G, dtype=r.dtype).index_add_(0, group, r)
    mean = total / count
    sq = torch.zeros(G, dtype=r.dtype).index_add_(0, group, (r - mean[group]) ** 2)
    std = (sq / (count - 1).clamp(min=1)).sqrt()
    return mean[group], std[group], total[group], count[group]


def _none(r: torch.Tensor, group: torch.Tensor) -> Shaping:
    return Shaping(torch.ones_like(r), torch.zeros_like(r))


def _mean_baseline(r: torch.Tensor, group: torch.Tensor) -> Shaping:
    mean, _, _, _ = _group_stats(r, group)
    return Shaping(torch.ones_like(r), mean)


def _group_norm(r: torch.Tensor, group: torch.Tensor) -> Shaping:
    mean, std, _, _ = _group_stats(r, group)
    scale = 1.0 / (std + 1e-9)
    return Shaping(scale, mean * scale)


def _imitate(r: torch.Tensor, group: torch.Tensor) -> Shaping:
    """Every kept sample's total becomes 1: step rewards times 0, ``+1`` on the last generated token."""
    return Shaping(torch.zeros_like(r), -torch.ones_like(r))


def _rloo(r: torch.Tensor, group: torch.Tensor) -> Shaping:
    _, _, total, count = _group_stats(r, group)
    return Shaping(torch.ones_like(r), (total - r) / (count - 1).clamp(min=1))


#: estimator name -> group shaping of the total reward
ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], Shaping]] = {
    "reinforce": _none,
    "reinforce_baseline": _mean_baseline,
    "group_norm": _group_norm,
    "rloo": _rloo,
    "dr_grpo": _mean_baseline,
    "gae": _none,
    "rft": _imitate,
}


def split_group_norm(step_table: torch.Tensor, query_steps: torch.Tensor, step_id: torch.Tensor,
                     action_mask: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """``group_norm_split``'s advantages ``(B, L)`` (formula in the module docstring).

    ``step_table`` ``(B, S)``: each step's reward; ``query_steps`` ``(B, S)`` bool: the steps whose
    reward is a query step's; ``step_id`` ``(B, L)``: the step each generated token belongs to (-1
    for a generated token outside every step, which gets the outcome term only).

    >>> table = torch.tensor([[1.6, 2.0], [0.0, 2.0], [0.0, 0.0]])  # (B=3, S=2): query step, answer
    >>> query = torch.tensor([[True, False]] * 3)
    >>> step_id = torch.tensor([[0, 0, 1], [0, 1, 1], [0, 1, -1]])  # (B, L=3)
    >>> adv = split_group_norm(table, query, step_id, torch.ones(3, 3), torch.zeros(3, dtype=torch.long))
    >>> [[round(float(x), 3) + 0.0 for x in row] for row in adv]  # outcome 2, 2, 0: +0.577, +0.577, -1.155
    [[1.732, 1.732, 0.577], [0.0, 0.577, 0.577], [-1.732, -1.155, -1.155]]
    """
    B, S = step_table.shape
    query = query_steps.bool()
    outcome = (step_table * ~query).sum(dim=1)  # (B,)
    mean, std, _, _ = _group_stats(outcome, group)
    a_out = (outcome - mean) / (std + 1e-9)  # (B,)
    G = int(group.max()) + 1 if group.numel() else 0
    g = group[:, None].expand(B, S)[query]  # (Q,) the group of every query step
    p = step_table[query]  # (Q,)
    count = torch.zeros(G, dtype=p.dtype).index_add_(0, g, torch.ones_like(p))
    p_mean = torch.zeros(G, dtype=p.dtype).index_add_(0, g, p) / count.clamp(min=1)
    p_var = torch.zeros(G, dtype=p.dtype).index_add_(0, g, (p - p_mean[g]) ** 2) / (count - 1).clamp(min=1)
    a_proc = torch.zeros(B, S, dtype=p.dtype)
    a_proc[query] = (p - p_mean[g]) / (p_var[g].sqrt() + 1e-9)
    per_token = a_proc.gather(1, step_id.clamp(min=0)) * (step_id >= 0)  # (B, L)
    return (a_out[:, None] + per_token) * action_mask


#: estimators that need the batch's step layout instead of a shaping of the total
STEP_ESTIMATORS: dict[str, Callable[..., torch.Tensor]] = {"group_norm_split": split_group_norm}

#: every estimator name ``algo.estimator`` takes
ALL_ESTIMATORS: tuple[str, ...] = tuple(ESTIMATORS) + tuple(STEP_ESTIMATORS)


def last_action_index(action_mask: torch.Tensor) -> torch.Tensor:
    """``(B,)`` position of each row's last generated token (0 for a row with none)."""
    L = action_mask.size(1)
    return L - 1 - action_mask.long().fliplr().argmax(dim=1)


def shaped_rewards(step_rewards: torch.Tensor, action_mask: torch.Tensor, group: torch.Tensor, estimator: str,
                   reward_clip: tuple[float, float] | None = None) -> torch.Tensor:
    """Step 1-2a of the pipeline: group shaping and clamping of the placed rewards, ``(B, L)``."""
    r = step_rewards.sum(dim=1)
    sh = ESTIMATORS[estimator](r, group)
    out = step_rewards * sh.scale[:, None]
    last = last_action_index(action_mask)
    out[torch.arange(out.size(0)), last] -= sh.shift
    if reward_clip is not None:
        nz = out != 0
        out = torch.where(nz, out.clamp(min=reward_clip[0], max=reward_clip[1]), out)
    return out


def token_rewards(shaped: torch.Tensor, action_mask: torch.Tensor, kl: torch.Tensor | None, kl_coef: float) -> torch.Tensor:
    """Add the KL penalty ``-kl_coef * kl`` on generated tokens (OpenRLHF ``compute_reward``)."""
    out = shaped.clone()
    if kl is not None and kl_coef > 0:
        out = out - kl_coef * kl * action_mask
    return out * action_mask


def discounted_returns(rewards: torch.Tensor, action_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """``G_t = r_t + gamma * G_next`` where ``next`` is the next *generated* token (0 elsewhere)."""
    B, L = rewards.shape
    out = torch.zeros_like(rewards)
    g = torch.zeros(B, dtype=rewards.dtype)
    for t in reversed(range(L)):
        m = action_mask[:, t] > 0
        g = torch.where(m, rewards[:, t] + gamma * g, g)
        out[:, t] = torch.where(m, g, torch.zeros_like(g))
    return out


def gae(rewards: torch.Tensor, values: torch.Tensor, action_mask: torch.Tensor, gamma: float, lambd: float) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over generated tokens only: ``delta_t = r_t + gamma V_next - V_t``,
    ``A_t = delta_t + gamma lambd A_next`` (``next`` = the next generated token; 0 after the last).
    Returns ``(advantages, returns = advantages + values)``, zero off the mask."""
    B, L = rewards.shape
    adv = torch.zeros_like(rewards)
    next_v = torch.zeros(B, dtype=rewards.dtype)
    last = torch.zeros(B, dtype=rewards.dtype)
    v = values * action_mask
    for t in reversed(range(L)):
        m = action_mask[:, t] > 0
        delta = rewards[:, t] + gamma * next_v - v[:, t]
        a = delta + gamma * lambd * last
        last = torch.where(m, a, last)
        next_v = torch.where(m, v[:, t], next_v)
        adv[:, t] = torch.where(m, a, torch.zeros_like(a))
    return adv, (adv + v) * action_mask


def normalise(adv: torch.Tensor, action_mask: torch.Tensor, std: bool = True) -> torch.Tensor:
    """``(A - mean) * rsqrt(max(var, 1e-8))`` with statistics over generated tokens only."""
    n = action_mask.sum()
    mean = (adv * action_mask).sum() / n
    out = adv - mean
    if std:
        var = ((adv - mean) ** 2 * action_mask).sum() / n
        out = out * var.clamp(min=1e-8).rsqrt()
    return out * action_mask


@dataclass
class Advantages:
    advantages: torch.Tensor  # (B, L)
    returns: torch.Tensor  # (B, L)
    token_rewards: torch.Tensor  # (B, L): shaped rewards + KL penalty, what the returns sum


def compute_advantages(
    estimator: str,
    step_rewards: torch.Tensor,
    action_mask: torch.Tensor,
    group: torch.Tensor,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    values: torch.Tensor | None = None,
    gamma: float = 1.0,
    lambd: float = 1.0,
    no_std_norm: bool = False,
    reward_clip: tuple[float, float] | None = None,
    step_layout: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> Advantages:
    """The whole pipeline of the module docstring. ``step_layout`` = ``(step_table, query_steps,
    step_id)`` of the batch, for the estimators of :data:`STEP_ESTIMATORS`."""
    if estimator not in ALL_ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}; choose one of {', '.join(ALL_ESTIMATORS)}")
    action_mask = action_mask.float()
    if estimator in STEP_ESTIMATORS:
        if step_layout is None:
            raise ValueError(f"estimator {estimator} needs the batch's step layout")
        if kl is not None and kl_coef > 0:
            raise ValueError(f"estimator {estimator} takes no KL in the reward: set algo.kl_use_loss=true")
        adv = STEP_ESTIMATORS[estimator](*step_layout, action_mask, group)
        return Advantages(adv, adv.clone(), step_rewards.float() * action_mask)
    shaped = shaped_rewards(step_rewards.float(), action_mask, group, estimator, reward_clip)
    rewards = token_rewards(shaped, action_mask, None if kl is None else kl.float(), kl_coef)
    if estimator == "gae":
        if values is None:
            raise ValueError("estimator gae needs the critic's values")
        adv, ret = gae(rewards, values.float(), action_mask, gamma, lambd)
    else:
        g = 1.0 if estimator in UNDISCOUNTED else gamma
        ret = discounted_returns(rewards, action_mask, g)
        adv = ret.clone()
    if estimator in BATCH_NORMALISED:
        adv = normalise(adv, action_mask, std=not no_std_norm)
    return Advantages(adv, ret, rewards)
