"""Trajectories + rewards -> padded tensors a trainer can use.

Every tensor of the trainer lives on the *shifted* axis: position ``p`` (0 .. T-2) holds the
prediction of token ``p + 1`` from the logits at ``p``. So for a trajectory with token ids
``ids`` and loss mask ``m`` (1 on tokens the policy sampled):

- ``action_mask[p] = m[p + 1]``: prompt tokens, retrieved documents and padding are 0;
- a step's reward sits on its **last generated token**: the step owns the half-open span
  ``[start, end)`` of ``ids`` (its model segment), its last token is ``ids[end - 1]``, predicted at
  shifted position ``end - 2``;
- ``rollout_logprobs[p]`` is the log-prob the rollout recorded for token ``p + 1`` (NaN where the
  backend returned none), kept to measure the rollout/trainer mismatch.

Which trajectories are trained on (:func:`select`): a trajectory the reward recipe marked
``dropped`` (judge or infrastructure failure), or that the rollout says is not trainable
(ids re-tokenised from text, backend error, retrieval failure), or that generated no token, is left
out and counted. Then, for the group estimators, a group (the samples of one question) whose kept
samples all scored the same carries no signal and is filtered (``dynamic_filtering``), as is a
group reduced to one sample.

With ``algo.overlong_filtering`` (DAPO's overlong filtering), a trajectory the budget cut off
(stop reason in :data:`TRUNCATED`: out of tokens, or a query at the last allowed step) is left out
too and counted as ``overlong``: it ended without an answer because it ran long, not because it
answered wrongly, and scoring it as a failure teaches the policy that searching more is worse.

Rejection sampling (``algo.estimator: rft``) selects differently: of each question's trainable
samples it keeps only those that ``accept`` passes (e.g. the recipe scored the answer correct and
the documents cover the gold passages), then the ``top_k`` of them with the highest total reward;
the others are counted as ``rejected``. No group filtering applies: the kept samples are imitated,
not compared.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Sequence

import torch

from r3rag.rewards.types import RewardOutput
from r3rag.rollout.trajectory import StepSpan, Trajectory

#: stop reasons that mean the rollout's budget cut the episode off (``algo.overlong_filtering``)
TRUNCATED: tuple[str, ...] = ("max_tokens", "max_steps")


def step_spans(traj: Trajectory) -> list[StepSpan] | None:
    """The rollout's step -> token-span map, or None when a step has no generated tokens (such a
    trajectory cannot carry per-step rewards and is not trained on)."""
    try:
        return traj.step_spans
    except ValueError:
        return None


def _why_untrainable(traj: Trajectory) -> str | None:
    if not traj.trainable:
        return traj.stop_reason if traj.infra_failed else "inexact_ids"
    if not any(traj.loss_mask):
        return "no_generated_tokens"
    if step_spans(traj) is None:
        return "step_without_tokens"
    return None


@dataclass
class Selection:
    """Which trajectories of an iteration are trained on, and why the others are not."""

    keep: list[int]
    dropped: int = 0  # the recipe dropped them (judge/infrastructure failure)
    untrainable: int = 0  # inexact ids, backend error, retrieval failure, nothing generated
    groups: int = 0
    filtered_groups: int = 0  # all-same (or single-sample) groups removed by dynamic filtering
    rejected: int = 0  # rejection sampling: trainable samples not accepted, or past a question's top_k
    overlong: int = 0  # overlong filtering: trainable samples the budget cut off
    reasons: dict[str, int] = field(default_factory=dict)

    @property
    def filtered_fraction(self) -> float:
        return self.filtered_groups / self.groups if self.groups else 0.0


def group_keys(trajs: Sequence[Trajectory]) -> list[str]:
    """Samples of one question form a group (the question's id)."""
    return [t.question_id for t in trajs]


def select(
    trajs: Sequence[Trajectory],
    rewards: Sequence[RewardOutput],
    grouped: bool,
    dynamic_filtering: bool,
    tol: float = 1e-6,
    top_k: int | None = None,
    accept: Callable[[Trajectory, RewardOutput], bool] | None = None,
    truncated: Collection[str] = (),
) -> Selection:
    """Indices of the trajectories to train on (see the module docstring). ``top_k`` switches to
    rejection sampling: per question, the ``top_k`` best samples by total reward among those
    ``accept`` passes (all, when it is None); ties keep the earlier sample. Trainable samples whose
    stop reason is in ``truncated`` are left out before any grouping (overlong filtering)."""
    sel = Selection(keep=[])
    ok: list[int] = []
    for i, (t, r) in enumerate(zip(trajs, rewards)):
        if r.dropped:
            sel.dropped += 1
            sel.reasons["dropped"] = sel.reasons.get("dropped", 0) + 1
        elif (why := _why_untrainable(t)) is not None:
            sel.untrainable += 1
            sel.reasons[why] = sel.reasons.get(why, 0) + 1
        elif t.stop_reason in truncated:
            sel.overlong += 1
            sel.reasons["overlong"] = sel.reasons.get("overlong", 0) + 1
        else:
            ok.append(i)
    keys = group_keys(trajs)
    groups: "OrderedDict[str, list[int]]" = OrderedDict()
    for i in range(len(trajs)):
        groups.setdefault(keys[i], [])
    for i in ok:
        groups[keys[i]].append(i)
    sel.groups = len(groups)
    for members in groups.values():
        if not members:
            continue
        if top_k is not None:
            passed = [i for i in members if accept is None or accept(trajs[i], rewards[i])]
            best = sorted(passed, key=lambda i: -rewards[i].total)[:top_k]
            sel.rejected += len(members) - len(best)
            sel.keep.extend(best)
            continue
        totals = [rewards[i].total for i in members]
        if grouped and len(members) < 2:
            sel.filtered_groups += 1
            continue
        if dynamic_filtering and len(members) > 1 and max(totals) - min(totals) <= tol:
            sel.filtered_groups += 1
            continue
        sel.keep.extend(members)
    sel.keep.sort()
    return sel


@dataclass
class RolloutBatch:
    """Padded tensors for ``B`` kept trajectories, ``T`` the longest; shifted tensors are ``(B, T-1)``."""

    input_ids: torch.Tensor  # (B, T) long, right-padded
    attention_mask: torch.Tensor  # (B, T) long
    action_mask: torch.Tensor  # (B, T-1) float: 1 where the predicted token was generated
    step_rewards: torch.Tensor  # (B, T-1) float: each step's reward on its last generated token
    rollout_logprobs: torch.Tensor  # (B, T-1) float, NaN where unknown
    temperatures: torch.Tensor  # (B,) the sampling temperature of each row (0 = greedy)
    group: torch.Tensor  # (B,) long: group index (same question)
    totals: torch.Tensor  # (B,) float: total reward of each row
    lengths: list[int]  # unpadded length of each row
    # the step layout (``group_norm_split``): S = the most steps of any row
    step_table: torch.Tensor | None = None  # (B, S) float: each step's reward (a recipe's extras on the last step)
    query_steps: torch.Tensor | None = None  # (B, S) bool: the step issued a query
    step_id: torch.Tensor | None = None  # (B, T-1) long: the step of each generated token, -1 elsewhere
    # the tree layout (``tree_group_norm``, :mod:`r3rag.train.rl.tree`): D = the deepest path
    tree_node: torch.Tensor | None = None  # (B, D) long: batch-wide id of each branching point above the row, -1 pads
    tree_child: torch.Tensor | None = None  # (B, D) long: the child subtree the row lies in at that point
    tree_at: torch.Tensor | None = None  # (B, D) long: shifted position from which that point applies

    @property
    def step_layout(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        if self.step_table is None or self.query_steps is None or self.step_id is None:
            return None
        return self.step_table, self.query_steps, self.step_id

    @property
    def tree_layout(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:
        if self.tree_node is None or self.tree_child is None or self.tree_at is None:
            return None
        return self.totals, self.tree_node, self.tree_child, self.tree_at

    def layout_for(self, estimator: str) -> tuple[torch.Tensor, ...] | None:
        """What a step estimator reads: the tree layout for ``tree_group_norm``, else the step layout."""
        return self.tree_layout if estimator == "tree_group_norm" else self.step_layout

    @property
    def num_actions(self) -> int:
        return int(self.action_mask.sum())

    def rows(self, idx: Sequence[int]) -> "RolloutBatch":
        """A sub-batch (cut to its own longest row)."""
        ix = torch.as_tensor(list(idx), dtype=torch.long)
        T = max(self.lengths[i] for i in idx)
        return RolloutBatch(
            self.input_ids[ix, :T], self.attention_mask[ix, :T], self.action_mask[ix, : T - 1],
            self.step_rewards[ix, : T - 1], self.rollout_logprobs[ix, : T - 1], self.temperatures[ix],
            self.group[ix], self.totals[ix], [self.lengths[i] for i in idx],
            None if self.step_table is None else self.step_table[ix],
            None if self.query_steps is None else self.query_steps[ix],
            None if self.step_id is None else self.step_id[ix, : T - 1],
            *(None if x is None else x[ix] for x in (self.tree_node, self.tree_child, self.tree_at)),
        )


def place_step_rewards(traj: Trajectory, per_step: Sequence[float]) -> dict[int, float]:
    """``{token index in traj.token_ids: reward}``: step i's reward on its span's last token
    (``span.end - 1``). A recipe with more rewards than steps (a trajectory with no steps scores one
    entry) puts the extras on the last step's last token; rewards landing on one token add."""
    spans = step_spans(traj) or []
    if not spans:
        return {}
    out: dict[int, float] = {}
    for i, r in enumerate(per_step):
        if r != 0.0:
            tok = spans[min(i, len(spans) - 1)].end - 1
            out[tok] = out.get(tok, 0.0) + float(r)
    return out


def build_batch(
    trajs: Sequence[Trajectory],
    rewards: Sequence[RewardOutput],
    pad_id: int,
    temperature_for: Any = None,
) -> RolloutBatch:
    """Pad ``trajs`` (already selected) into a :class:`RolloutBatch`; ``temperature_for(j)`` gives
    the sampling temperature of sample index ``j`` (1.0 when not given)."""
    B = len(trajs)
    lengths = [len(t.token_ids) for t in trajs]
    T = max(lengths)
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.long)
    action = torch.zeros((B, T - 1), dtype=torch.float32)
    placed = torch.zeros((B, T - 1), dtype=torch.float32)
    roll = torch.full((B, T - 1), float("nan"), dtype=torch.float32)
    S = max(1, max(len(step_spans(t) or []) for t in trajs))
    table = torch.zeros((B, S), dtype=torch.float32)
    query = torch.zeros((B, S), dtype=torch.bool)
    step_id = torch.full((B, T - 1), -1, dtype=torch.long)
    keys: dict[str, int] = {}
    group = torch.zeros(B, dtype=torch.long)
    temps = torch.ones(B, dtype=torch.float32)
    for b, (t, r) in enumerate(zip(trajs, rewards)):
        ids = t.token_ids
        n = len(ids)
        input_ids[b, :n] = torch.tensor(ids, dtype=torch.long)
        attn[b, :n] = 1
        mask = torch.tensor(t.loss_mask, dtype=torch.float32)
        mask[: int(t.metadata.get("tree", {}).get("owns_from", 0))] = 0.0  # a branch's copied prefix is its parent's
        action[b, : n - 1] = mask[1:]
        pos = 0
        for seg in t.segments:
            k = len(seg.token_ids)
            if seg.role == "model" and seg.logprobs is not None and len(seg.logprobs) == k and pos > 0:
                roll[b, pos - 1: pos - 1 + k] = torch.tensor(seg.logprobs, dtype=torch.float32)
            pos += k
        for tok, value in place_step_rewards(t, r.per_step).items():
            placed[b, tok - 1] += value
        spans = step_spans(t) or []
        for k, span in enumerate(spans):
            step_id[b, span.start - 1: span.end - 1] = k
            query[b, k] = t.steps[k].query is not None
        for i, value in enumerate(r.per_step):
            if spans:
                table[b, min(i, len(spans) - 1)] += float(value)
        group[b] = keys.setdefault(t.question_id, len(keys))
        if temperature_for is not None:
            temps[b] = float(temperature_for(t.sample_index))
    totals = torch.tensor([float(r.total) for r in rewards], dtype=torch.float32)
    from r3rag.train.rl.tree import tree_layout

    paths = [t.metadata.get("tree", {}).get("path") or [{"node": "root", "child": f"s{b}", "at": 0}] for b, t in enumerate(trajs)]
    node, child, at = tree_layout(paths, [t.question_id for t in trajs])
    return RolloutBatch(input_ids, attn, action, placed, roll, temps, group, totals, lengths, table, query, step_id,
                        node, child, at)


def micro_batches(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Split rows into micro-batches whose padded size (rows x longest) stays within the budget.

    Rows are taken longest first so similar lengths share a micro-batch (little padding); a row
    longer than the budget goes alone."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    out: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        width = max([lengths[j] for j in cur] + [lengths[i]])
        if cur and width * (len(cur) + 1) > token_budget:
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return out


def optimizer_steps(n_rows: int, train_batch_size: int | None, seed: int) -> list[list[int]]:
    """Rows of one rollout batch per optimizer step (OpenRLHF's ``--train_batch_size``).

    ``None`` (or a size >= ``n_rows``): one step over every row, in order. Otherwise the rows are
    shuffled with ``seed`` (the same split on a resumed run) and cut into ``ceil(n_rows / size)``
    steps of near-equal size, so a short last step never carries a handful of rows alone.

    >>> optimizer_steps(5, None, seed=0)
    [[0, 1, 2, 3, 4]]
    >>> steps = optimizer_steps(10, 4, seed=0)
    >>> [len(s) for s in steps], sorted(i for s in steps for i in s) == list(range(10))
    ([4, 3, 3], True)
    >>> steps == optimizer_steps(10, 4, seed=0) != optimizer_steps(10, 4, seed=1)
    True
    """
    if train_batch_size is None or train_batch_size >= n_rows:
        return [list(range(n_rows))]
    order = torch.randperm(n_rows, generator=torch.Generator().manual_seed(seed)).tolist()
    k = math.ceil(n_rows / train_batch_size)
    base, extra = divmod(n_rows, k)
    out, start = [], 0
    for j in range(k):
        size = base + (1 if j < extra else 0)
        out.append(order[start:start + size])
        start += size
    return out
