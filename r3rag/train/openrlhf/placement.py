"""Where each step's reward goes, in OpenRLHF's token coordinates (pure torch; no OpenRLHF import).

OpenRLHF describes a sample by its token ids ``sequences`` (prompt, model turns, documents) and an
``action_mask`` over ``sequences[1:]``: ``action_mask[p]`` is 1 when token ``p + 1`` was generated
by the policy (its log-prob is read from the logits at position ``p``). Our executor reports the
model turns as ``action_ranges``: half-open ``(start, end)`` ranges in ``sequences``, one per step,
so step ``i``'s last generated token is ``sequences[end_i - 1]``, i.e. ``action_mask`` position
``end_i - 2``. That is exactly :attr:`~r3rag.rollout.trajectory.Trajectory.step_spans`'s
``span.end - 1`` (the single-machine trainer's placement), shifted by OpenRLHF's one-token offset.

Stock OpenRLHF (``models.utils.compute_reward``) puts the episode's one reward on the last action
token. :func:`token_rewards` generalises it: the step rewards on their steps' last tokens, plus
whatever the trainer did to the episode reward after the executor returned it (a group baseline
subtracted, a length penalty added) on the last action token, then the optional clip and the
per-token KL penalty. With one step, or all reward on the last step, it equals stock OpenRLHF.
"""

from __future__ import annotations

from typing import Sequence

import torch


def step_positions(action_ranges: Sequence[Sequence[int]], n_actions: int) -> list[int]:
    """``action_mask`` position of each range's last token (``end - 2``), kept inside
    ``[0, n_actions)``: a range cut off by OpenRLHF's ``max_len`` truncation lands on the last
    position. An empty range (a turn of no tokens) lands on the token before it."""
    out = []
    for start, end in action_ranges:
        pos = max(int(end), int(start) + 1) - 2 if end > start else int(start) - 2
        out.append(min(max(pos, 0), n_actions - 1))
    return out


def dense_step_rewards(action_ranges: Sequence[Sequence[int]], step_rewards: Sequence[float], n_actions: int) -> torch.Tensor:
    """A ``(n_actions,)`` tensor: ``step_rewards[i]`` at range ``i``'s last token, 0 elsewhere.

    >>> dense_step_rewards([(3, 5), (7, 9)], [0.5, 2.0], 9).tolist()
    [0.0, 0.0, 0.0, 0.5, 0.0, 0.0, 0.0, 2.0, 0.0]
    """
    if len(action_ranges) != len(step_rewards):
        raise ValueError(f"{len(step_rewards)} step rewards for {len(action_ranges)} action ranges")
    out = torch.zeros(n_actions, dtype=torch.float32)
    if n_actions == 0:
        return out
    for pos, r in zip(step_positions(action_ranges, n_actions), step_rewards):
        out[pos] += float(r)
    return out


def last_action_index(action_mask: torch.Tensor) -> torch.Tensor:
    """``(B, 1)`` index of each row's last 1 (OpenRLHF's rule; the last column for an all-0 row)."""
    return action_mask.size(1) - 1 - action_mask.long().fliplr().argmax(dim=1, keepdim=True)


def token_rewards(
    episode_reward: torch.Tensor,
    step_rewards: torch.Tensor,
    kl_coef: float,
    kl: torch.Tensor,
    action_mask: torch.Tensor,
    reward_clip_range: tuple[float, float] | None = None,
) -> torch.Tensor:
    """Per-token rewards ``(B, A)`` for OpenRLHF's advantage code.

    ``step_rewards`` ``(B, A)`` holds the executor's step rewards at their positions (their row sum
    is the reward the executor returned); ``episode_reward`` ``(B,)`` is that reward after the
    trainer's shaping. The difference goes on the last action token. Then each position is clipped
    to ``reward_clip_range`` (when set) and ``-kl_coef * kl`` is added, as in stock OpenRLHF.
    """
    kl_coef = max(float(kl_coef), 0.0)
    dense = step_rewards.to(kl.dtype).clone()
    residual = episode_reward.to(kl.dtype) - dense.sum(dim=1)
    dense.scatter_add_(1, last_action_index(action_mask), residual.unsqueeze(1))
    if reward_clip_range:
        nonzero = dense != 0
        dense = torch.where(nonzero, dense.clamp(min=reward_clip_range[0], max=reward_clip_range[1]), dense)
    return dense - kl_coef * kl


def dense_from_step_spans(spans: Sequence[object], per_step: Sequence[float], n_tokens: int) -> list[float]:
    """The single-machine trainer's placement in trajectory coordinates: ``per_step[i]`` at
    ``spans[i].end - 1`` of a ``n_tokens``-long ``token_ids`` (for comparisons)."""
    out = [0.0] * n_tokens
    for span, r in zip(spans, per_step):
        out[span.end - 1] += float(r)  # type: ignore[attr-defined]
    return out
