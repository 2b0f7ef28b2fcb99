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
   ``flash_reinforce``    ``r - mean(batch)``                           (FlashREINFORCE; no group)
   ``rft``                ``1``, whatever ``r``                         (rejection sampling)
   ==================== =====================================================================

   Only the samples that are trained on enter these statistics: a sample dropped by the recipe
   (judge or retrieval outage) or with no generated token is never part of a group's mean, std
   or leave-one-out sum, on one machine (:func:`r3rag.train.rl.batch.select` leaves it out of the
   batch) as on OpenRLHF (:mod:`r3rag.train.openrlhf.per_step` passes ``kept``). A group left
   with fewer than two such samples gets no group baseline and no advantage from its reward.

   **No division by a vanishing spread.** ``group_norm`` (and ``group_norm_split``) divide by a
   group's std only when it is above ``min_std`` (:data:`MIN_STD`, ``algo.min_group_std``); a
   group whose totals are equal or nearly so carries no signal, and its shaping is ``0``: scale
   0, shift 0, so every reward of it, step rewards included, counts zero. Without the guard, equal
   totals with different step rewards would multiply the step rewards by ``1 / 1e-9``.

   ``rft`` is rejection-sampling fine-tuning (expert iteration: RFT, ReST-EM, RAFT). The
   selection (:func:`r3rag.train.rl.batch.select` with ``top_k``) keeps only the accepted, best
   samples of each question, and every generated token of those gets advantage 1: the clipped
   loss's gradient at ratio 1 is then the token-mean negative log-likelihood's, SFT on the
   policy's own successes. It never pushes a sample down.

   With an outcome reward (one number on the last generated token) this is exactly OpenRLHF's
   shaped scalar (outside the guard). With per-step rewards the shaping is an affine map
   ``r -> a r - b`` applied as: every step reward times ``a`` (``1/(std + 1e-9)`` for
   ``group_norm``, 0 under the guard, else 1), and ``-b`` added on the last generated token. The
   return at the first generated token is then the shaped total, and a token's return still
   counts only the rewards ahead of it (OpenRLHF's hook does the same, see
   :mod:`r3rag.train.openrlhf.per_step`);
2. clamp (``reward_clip``, default ``(-10, 10)`` as OpenRLHF's ``--reward.clip_range``) of each
   placed reward, then the per-token KL penalty
   ``-kl_coef * kl`` on every generated token when the KL is in the reward (``compute_reward``);
3. returns: ``reinforce``-family: discounted cumulative sum of the token rewards; ``gae``:
   generalised advantage estimation with the critic's values (returns = advantages + values).
   Both run **over generated tokens only**: documents inside a trajectory are skipped, they do
   not count as time steps, so a retrieved document of 5 or 300 tokens changes no advantage.
   (Stock OpenRLHF discounts over every response position, so each document token would decay
   the advantage by ``gamma * lambd``; :mod:`r3rag.train.openrlhf.per_step` runs OpenRLHF's own
   recursions on the generated tokens alone, so the cluster follows this definition too.)
   ``rloo``, ``reinforce_baseline``, ``group_norm``, ``dr_grpo`` and ``flash_reinforce`` force
   ``gamma = 1`` (as OpenRLHF);
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

(unbiased std, as ``group_norm``, with the same guard: a spread of at most ``min_std`` gives 0).
It needs the batch's step layout (``step_table``,
``query_steps``, ``step_id``, see :class:`r3rag.train.rl.batch.RolloutBatch`). With an outcome-only
recipe it is ``group_norm``. The raw scale of the process reward (``process_weight``) no longer
matters, only its order within the group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from r3rag.train.rl.tree import tree_group_norm

GROUP_ESTIMATORS = ("reinforce_baseline", "group_norm", "rloo", "dr_grpo", "group_norm_split", "tree_group_norm")
BATCH_NORMALISED = ("gae", "reinforce", "reinforce_baseline")
UNDISCOUNTED = GROUP_ESTIMATORS + ("rft", "flash_reinforce")  # gamma forced to 1
#: a group std at or below this is no spread (``algo.min_group_std``; the guard of the module docstring)
MIN_STD = 1e-3
#: OpenRLHF's ``--reward.clip_range`` default, also ours (``algo.reward_clip``)
REWARD_CLIP = (-10.0, 10.0)


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


def inverse_spread(std: torch.Tensor, min_std: float = MIN_STD) -> torch.Tensor:
    """``1 / (std + 1e-9)`` where ``std > min_std``, else 0 (no spread: no signal; never ``1/1e-9``).

    >>> inverse_spread(torch.tensor([0.5, 1e-4, 0.0])).tolist()
    [2.0, 0.0, 0.0]
    """
    return torch.where(std > min_std, 1.0 / (std + 1e-9), torch.zeros_like(std))


def _none(r: torch.Tensor, group: torch.Tensor, min_std: float) -> Shaping:
    return Shaping(torch.ones_like(r), torch.zeros_like(r))


def _mean_baseline(r: torch.Tensor, group: torch.Tensor, min_std: float) -> Shaping:
    mean, _, _, _ = _group_stats(r, group)
    return Shaping(torch.ones_like(r), mean)


def _batch_mean_baseline(r: torch.Tensor, group: torch.Tensor, min_std: float) -> Shaping:
    return Shaping(torch.ones_like(r), r.mean().expand_as(r) if r.numel() else torch.zeros_like(r))


def _group_norm(r: torch.Tensor, group: torch.Tensor, min_std: float) -> Shaping:
    mean, std, _, _ = _group_stats(r, group)
    scale = inverse_spread(std, min_std)
    return Shaping(scale, mean * scale)


def _imitate(r: torch.Tensor, group: torch.Tensor, min_std: float) -> Shaping:
    """Every kept sample's total becomes 1: step rewards times 0, ``+1`` on the last generated token."""
    return Shaping(torch.zeros_like(r), -torch.ones_like(r))


def _rloo(r: torch.Tensor, group: torch.Tensor, min_std: float) -> Shaping:
    _, _, total, count = _group_stats(r, group)
    return Shaping(torch.ones_like(r), (total - r) / (count - 1).clamp(min=1))


#: estimator name -> group shaping of the total reward ``(r, group, min_std) -> Shaping``
ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor, float], Shaping]] = {
    "reinforce": _none,
    "reinforce_baseline": _mean_baseline,
    "group_norm": _group_norm,
    "rloo": _rloo,
    "dr_grpo": _mean_baseline,
    "flash_reinforce": _batch_mean_baseline,
    "gae": _none,
    "rft": _imitate,
}


def shaping(estimator: str, totals: torch.Tensor, group: torch.Tensor, kept: torch.Tensor | None = None,
            min_std: float = MIN_STD) -> Shaping:
    """Step 1 of the pipeline for both paths: each sample's ``(scale, shift)`` (all ``(B,)``).

    Statistics come from the ``kept`` samples only (default: all); a sample not kept, and every
    sample of a group with fewer than two kept ones under a group estimator, gets scale 0 and
    shift 0. ``flash_reinforce`` takes the whole batch as one group.

    >>> sh = shaping("rloo", torch.tensor([1.0, 0.0, 0.0, 5.0]), torch.zeros(4, dtype=torch.long),
    ...              kept=torch.tensor([True, True, True, False]))
    >>> [round(x, 3) for x in (torch.tensor([1.0, 0.0, 0.0, 5.0]) * sh.scale - sh.shift).tolist()]
    [1.0, -0.5, -0.5, 0.0]
    """
    totals = totals.float()
    B = totals.numel()
    kept = torch.ones(B, dtype=torch.bool) if kept is None else kept.bool()
    scale, shift = torch.zeros(B), torch.zeros(B)
    idx = kept.nonzero().squeeze(1)
    if idx.numel() == 0:
        return Shaping(scale, shift)
    g = torch.zeros(B, dtype=torch.long) if estimator == "flash_reinforce" else group.long()
    _, inv = torch.unique(g[idx], return_inverse=True)
    sh = ESTIMATORS[estimator](totals[idx], inv, min_std)
    scale[idx], shift[idx] = sh.scale, sh.shift
    if estimator in GROUP_ESTIMATORS:
        count = torch.zeros(int(inv.max()) + 1).index_add_(0, inv, torch.ones(idx.numel()))
        lonely = idx[count[inv] < 2]
        scale[lonely], shift[lonely] = 0.0, 0.0
    return Shaping(scale, shift)


def split_group_norm(step_table: torch.Tensor, query_steps: torch.Tensor, step_id: torch.Tensor,
                     action_mask: torch.Tensor, group: torch.Tensor, min_std: float = MIN_STD) -> torch.Tensor:
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
    a_out = (outcome - mean) * inverse_spread(std, min_std)  # (B,)
    G = int(group.max()) + 1 if group.numel() else 0
    g = group[:, None].expand(B, S)[query]  # (Q,) the group of every query step
    p = step_table[query]  # (Q,)
    count = torch.zeros(G, dtype=p.dtype).index_add_(0, g, torch.ones_like(p))
    p_mean = torch.zeros(G, dtype=p.dtype).index_add_(0, g, p) / count.clamp(min=1)
    p_var = torch.zeros(G, dtype=p.dtype).index_add_(0, g, (p - p_mean[g]) ** 2) / (count - 1).clamp(min=1)
    a_proc = torch.zeros(B, S, dtype=p.dtype)
    a_proc[query] = (p - p_mean[g]) * inverse_spread(p_var[g].sqrt(), min_std)
    per_token = a_proc.gather(1, step_id.clamp(min=0)) * (step_id >= 0)  # (B, L)
    return (a_out[:, None] + per_token) * action_mask


#: estimators that need the batch's step layout instead of a shaping of the total
STEP_ESTIMATORS: dict[str, Callable[..., torch.Tensor]] = {"group_norm_split": split_group_norm, "tree_group_norm": tree_group_norm}

#: every estimator name ``algo.estimator`` takes
ALL_ESTIMATORS: tuple[str, ...] = tuple(ESTIMATORS) + tuple(STEP_ESTIMATORS)


def last_action_index(action_mask: torch.Tensor) -> torch.Tensor:
    """``(B,)`` position of each row's last generated token (0 for a row with none)."""
    L = action_mask.size(1)
    return L - 1 - action_mask.long().fliplr().argmax(dim=1)


def apply_shaping(placed: torch.Tensor, action_mask: torch.Tensor, sh: Shaping,
                  reward_clip: tuple[float, float] | None = REWARD_CLIP) -> torch.Tensor:
    """Step 1-2a on placed rewards ``(B, L)`` (their row sum is each sample's total): every reward
    times ``scale``, ``-shift`` on the last generated token, then each non-zero position clamped to
    ``reward_clip`` (None: no clamp). Shared by both paths (OpenRLHF's via the per-step hook)."""
    out = placed.float() * sh.scale[:, None]
    last = last_action_index(action_mask)
    out[torch.arange(out.size(0)), last] -= sh.shift
    if reward_clip is not None:
        nz = out != 0
        out = torch.where(nz, out.clamp(min=reward_clip[0], max=reward_clip[1]), out)
    return out


def shaped_rewards(step_rewards: torch.Tensor, action_mask: torch.Tensor, group: torch.Tensor, estimator: str,
                   reward_clip: tuple[float, float] | None = REWARD_CLIP, min_std: float = MIN_STD) -> torch.Tensor:
    """Step 1-2a of the pipeline: group shaping and clamping of the placed rewards, ``(B, L)``."""
    sh = shaping(estimator, step_rewards.sum(dim=1), group, min_std=min_std)
    return apply_shaping(step_rewards, action_mask, sh, reward_clip)


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
    reward_clip: tuple[float, float] | None = REWARD_CLIP,
    step_layout: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    min_std: float = MIN_STD,
) -> Advantages:
    """The whole pipeline of the module docstring. ``step_layout`` = ``(step_table, query_steps,
    step_id)`` of the batch, for the estimators of :data:`STEP_ESTIMATORS`. Every row is a kept
    sample (the single-machine batch holds only those)."""
    if estimator not in ALL_ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}; choose one of {', '.join(ALL_ESTIMATORS)}")
    action_mask = action_mask.float()
    if estimator in STEP_ESTIMATORS:
        if step_layout is None:
            raise ValueError(f"estimator {estimator} needs the batch's step layout")
        if kl is not None and kl_coef > 0:
            raise ValueError(f"estimator {estimator} takes no KL in the reward: set algo.kl_use_loss=true")
        adv = STEP_ESTIMATORS[estimator](*step_layout, action_mask, group, min_std=min_std)
        return Advantages(adv, adv.clone(), step_rewards.float() * action_mask)
    shaped = shaped_rewards(step_rewards.float(), action_mask, group, estimator, reward_clip, min_std)
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
