"""Where each step's reward goes, in OpenRLHF's token coordinates (pure torch; no OpenRLHF import).

OpenRLHF describes a sample by its token ids ``sequences`` (prompt, model turns, documents) and an
``action_mask`` over ``sequences[1:]``: ``action_mask[p]`` is 1 when token ``p + 1`` was generated
by the policy (its log-prob is read from the logits at position ``p``). Our executor reports the
model turns as ``action_ranges``: half-open ``(start, end)`` ranges in ``sequences``, one per step,
so step ``i``'s last generated token is ``sequences[end_i - 1]``, i.e. ``action_mask`` position
``end_i - 2``. That is exactly :attr:`~r3rag.rollout.trajectory.Trajectory.step_spans`'s
``span.end - 1`` (the single-machine trainer's placement), shifted by OpenRLHF's one-token offset.

Stock OpenRLHF (``models.utils.compute_reward``) puts the episode's one reward on the last action
token. :func:`token_rewards` generalises it by the single-machine trainer's rule: the step rewards
on their steps' last tokens, the group shaping of :mod:`r3rag.train.rl.estimators` (step rewards
times the scale, the shift on the last action token), the clip and the per-token KL penalty.
:func:`pack_actions` / :func:`unpack_actions` let OpenRLHF's own GAE and return recursions run over
the action positions alone (documents are not time steps).
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
    totals: torch.Tensor,
    step_rewards: torch.Tensor | None,
    scale: torch.Tensor,
    shift: torch.Tensor,
    kl_coef: float,
    kl: torch.Tensor,
    action_mask: torch.Tensor,
    reward_clip_range: tuple[float, float] | None = None,
) -> torch.Tensor:
    """Per-token rewards ``(B, A)`` for OpenRLHF's advantage code, by the single machine's rule.

    ``totals`` ``(B,)``: each sample's reward as the trainer sees it (the executor's, after
    OpenRLHF's own length penalties); ``step_rewards`` ``(B, A)``: the executor's step rewards at
    their positions, or None (an outcome reward). Whatever of the total is not in the step rewards
    (a length penalty; all of it without step rewards) joins the last action token. Then the group
    shaping ``(scale, shift)`` (:func:`r3rag.train.rl.estimators.shaping`) and the clip are those of
    :func:`r3rag.train.rl.estimators.apply_shaping`, and ``-kl_coef * kl`` is added, as in stock
    OpenRLHF. With one step, or all reward on the last step, and a plain shaping this is stock
    OpenRLHF's ``compute_reward``.
    """
    from r3rag.train.rl.estimators import Shaping, apply_shaping

    kl_coef = max(float(kl_coef), 0.0)
    dense = torch.zeros_like(kl, dtype=torch.float32) if step_rewards is None else step_rewards.float().clone()
    residual = totals.float().to(dense.device) - dense.sum(dim=1)
    dense.scatter_add_(1, last_action_index(action_mask), residual.unsqueeze(1))
    sh = Shaping(scale.float().to(dense.device), shift.float().to(dense.device))
    shaped = apply_shaping(dense, action_mask, sh, tuple(reward_clip_range) if reward_clip_range else None)
    return shaped.to(kl.dtype) - kl_coef * kl


def pack_actions(x: torch.Tensor, action_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Move each row's action positions to the front, in order: ``(packed x, packed mask, order)``.

    A recursion over the packed row visits the generated tokens only, one time step each:
    documents and the prompt are not time steps. :func:`unpack_actions` puts results back.

    >>> x, m, order = pack_actions(torch.tensor([[1., 2., 3., 4.]]), torch.tensor([[1, 0, 0, 1]]))
    >>> x.tolist(), m.tolist()
    ([[1.0, 4.0, 0.0, 0.0]], [[1, 1, 0, 0]])
    """
    order = torch.sort((action_mask <= 0).to(torch.int8), dim=1, stable=True).indices
    packed_mask = action_mask.gather(1, order)
    return x.gather(1, order) * (packed_mask > 0), packed_mask, order


def unpack_actions(packed: torch.Tensor, action_mask: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pack_actions` (0 off the action positions).

    >>> x, m, order = pack_actions(torch.tensor([[1., 2., 3., 4.]]), torch.tensor([[1, 0, 0, 1]]))
    >>> unpack_actions(x * 10, torch.tensor([[1, 0, 0, 1]]), order).tolist()
    [[10.0, 0.0, 0.0, 40.0]]
    """
    out = torch.zeros_like(packed).scatter_(1, order, packed)
    return out * (action_mask > 0)


def dense_from_step_spans(spans: Sequence[object], per_step: Sequence[float], n_tokens: int) -> list[float]:
    """The single-machine trainer's placement in trajectory coordinates: ``per_step[i]`` at
    ``spans[i].end - 1`` of a ``n_tokens``-long ``token_ids`` (for comparisons)."""
    out = [0.0] * n_tokens
    for span, r in zip(spans, per_step):
        out[span.end - 1] += float(r)  # type: ignore[attr-defined]
    return out
