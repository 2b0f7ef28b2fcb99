"""``tree_group_norm``: advantages per branching point of a step-level tree rollout.

A tree rollout (:mod:`r3rag.rollout.tree`, ``rollout.tree``) gives every question a tree whose
leaves are the chains (trajectories) and whose inner nodes are branching points: the question
itself (the root, whose children are the ``roots`` independent chains) and every step boundary
where a chain was re-sampled (whose children are the continuations from there, the original one
included). Each chain records the branching points above it (``metadata["tree"]["path"]``).

**Definition.** Let ``r_i`` be chain ``i``'s total reward (the sum of its step rewards: any
recipe). For a child subtree ``c``, ``V(c)`` is the mean of ``r_i`` over the kept chains below it.
For a branching point ``n`` with children ``c_1 .. c_m`` that have kept chains below them
(``m >= 2``; with fewer the point compares nothing and contributes 0)::

    mu_n    = mean_j V(c_j)
    sigma_n = unbiased std_j V(c_j)
    D(n, c) = (V(c) - mu_n) / (sigma_n + 1e-9)   if sigma_n > min_std  (algo.min_group_std)
            = 0                                   otherwise (no spread, no signal; never 1/1e-9)

A generated token ``t`` of chain ``i`` gets the sum over the branching points ``n`` on ``i``'s path
whose continuations begin at or before ``t`` (the root always; a boundary once ``t`` is after it)::

    A_i(t) = sum_{n above t} D(n, c(i, n))          c(i, n): the child of n that i lies in

so a token is compared once per branching point above it: with its siblings at the question
(whole-chain subtrees) and again at every later boundary (the continuations that share its
prefix). Each token is trained once, in the chain that sampled it: a branch's copy of its parent's
prefix carries no loss (its action mask is 0 there, :func:`r3rag.train.rl.batch.build_batch`),
and the parent's tokens before the boundary carry the subtree means ``V`` over every
continuation of them, the branches' included. Without branching (every chain a child of the root
alone, ``V(c) = r_i``) this is exactly ``group_norm``: ``(r_i - mean) / (std + 1e-9)`` with the
same guard.

**Worked example** (one question, ``roots: 2, branch: 2, at_steps: [1]``): chains ``A`` and ``B``
from the question; ``A2`` branched from ``A`` after its first step, ``B2`` from ``B``. Rewards
``A = 1, A2 = 0, B = 0, B2 = 0``.

- root: children ``{A, A2}`` with ``V = 0.5`` and ``{B, B2}`` with ``V = 0``; ``mu = 0.25``,
  ``sigma = 0.3536``: ``D = +0.7071`` for ``A``'s subtree, ``-0.7071`` for ``B``'s;
- ``A``'s boundary: ``A = 1``, ``A2 = 0``: ``mu = 0.5``, ``sigma = 0.7071``, ``D = +0.7071, -0.7071``;
- ``B``'s boundary: ``0, 0``: no spread, ``D = 0``.

Tokens: ``A``'s first step ``+0.7071``, after the boundary ``+1.4142``; ``A2``'s own tokens
``0.7071 - 0.7071 = 0``; ``B`` and ``B2``'s own ``-0.7071``.

Only kept chains enter the statistics (:func:`r3rag.train.rl.batch.select`): a chain the recipe
dropped, or that ``overlong_filtering`` left out, is in no ``V``, and its tokens are not trained,
including the prefix its branches copied from it (they keep that prefix masked). A question whose
kept chains all scored the same has zero advantages everywhere (``dynamic_filtering`` leaves it out).

The rollout records the tree; :func:`r3rag.train.rl.batch.build_batch` turns it into the batch's
``tree_layout`` (``node``, ``child``, ``at``, each ``(B, D)``), which :func:`tree_group_norm` reads.
The returns are the advantages (no critic, ``gamma = 1``); no KL in the reward (use
``algo.kl_use_loss``).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch


def tree_layout(paths: Sequence[Sequence[dict[str, Any]]], groups: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(node, child, at)``, each ``(B, D)`` long (``D`` = the deepest path, -1 pads): batch-wide ids
    of each row's branching points and children, and the *shifted* position from which each applies
    (token index ``at`` is predicted at ``at - 1``; the root applies from 0). ``groups`` keeps the
    keys of different questions apart.

    >>> node, child, at = tree_layout([[{"node": "root", "child": "r0", "at": 0}],
    ...                                [{"node": "root", "child": "r1", "at": 0}]], ["q", "q"])
    >>> node.tolist(), child.tolist(), at.tolist()
    ([[0], [0]], [[0], [1]], [[0], [0]])
    """
    B, D = len(paths), max(1, max((len(p) for p in paths), default=1))
    node = torch.full((B, D), -1, dtype=torch.long)
    child = torch.full((B, D), -1, dtype=torch.long)
    at = torch.zeros((B, D), dtype=torch.long)
    nodes: dict[tuple[str, str], int] = {}
    children: dict[tuple[str, str], int] = {}
    for b, (path, g) in enumerate(zip(paths, groups)):
        for d, e in enumerate(path):
            node[b, d] = nodes.setdefault((g, e["node"]), len(nodes))
            child[b, d] = children.setdefault((g, e["child"]), len(children))
            at[b, d] = max(0, int(e["at"]) - 1)
    return node, child, at


def node_terms(totals: torch.Tensor, node: torch.Tensor, child: torch.Tensor,
               min_std: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``D(n, c)`` of every child id, and per node its number of children and spread (``sigma_n``)."""
    from r3rag.train.rl.estimators import inverse_spread

    valid = child >= 0
    C = int(child.max()) + 1 if valid.any() else 0
    N = int(node.max()) + 1 if valid.any() else 0
    rows = torch.arange(node.size(0))[:, None].expand_as(node)[valid]
    c, n = child[valid], node[valid]
    r = totals.float()[rows]
    csum = torch.zeros(C).index_add_(0, c, r)
    ccount = torch.zeros(C).index_add_(0, c, torch.ones_like(r))
    v = csum / ccount.clamp(min=1)  # V(c)
    parent = torch.full((C,), -1, dtype=torch.long)
    parent[c] = n
    has = ccount > 0
    kids = torch.zeros(N).index_add_(0, parent[has], torch.ones(int(has.sum())))
    mu = torch.zeros(N).index_add_(0, parent[has], v[has]) / kids.clamp(min=1)
    var = torch.zeros(N).index_add_(0, parent[has], (v[has] - mu[parent[has]]) ** 2) / (kids - 1).clamp(min=1)
    sigma = var.sqrt()
    d = torch.zeros(C)
    d[has] = (v[has] - mu[parent[has]]) * inverse_spread(sigma[parent[has]], min_std)
    d[has & (kids[parent.clamp(min=0)] < 2)] = 0.0
    return d, kids, sigma


def tree_group_norm(totals: torch.Tensor, node: torch.Tensor, child: torch.Tensor, at: torch.Tensor,
                    action_mask: torch.Tensor, group: torch.Tensor, min_std: float = 1e-3) -> torch.Tensor:
    """Advantages ``(B, L)`` of the module docstring (``group`` is unused: the layout's keys already
    keep questions apart; the argument keeps the step estimators' signature).

    The worked example (rows ``A, A2, B, B2``; 4 generated tokens each, the boundary at shifted 2):

    >>> P = lambda n, c, a: {"node": n, "child": c, "at": a}
    >>> paths = [[P("root", "r0", 0), P("0@1", "0@1/0", 3)], [P("root", "r0", 0), P("0@1", "0@1/1", 3)],
    ...          [P("root", "r1", 0), P("1@1", "1@1/0", 3)], [P("root", "r1", 0), P("1@1", "1@1/1", 3)]]
    >>> layout = tree_layout(paths, ["q"] * 4)
    >>> mask = torch.tensor([[1., 1, 1, 1], [0, 0, 1, 1], [1, 1, 1, 1], [0, 0, 1, 1]])
    >>> adv = tree_group_norm(torch.tensor([1., 0, 0, 0]), *layout, mask, torch.zeros(4, dtype=torch.long))
    >>> [[round(float(x), 4) + 0.0 for x in row] for row in adv]
    [[0.7071, 0.7071, 1.4142, 1.4142], [0.0, 0.0, 0.0, 0.0], [-0.7071, -0.7071, -0.7071, -0.7071], [0.0, 0.0, -0.7071, -0.7071]]
    """
    d, _, _ = node_terms(totals, node, child, min_std)
    B, L = action_mask.shape
    pos = torch.arange(L)[None, :]
    adv = torch.zeros(B, L)
    for k in range(node.size(1)):
        ok = child[:, k] >= 0
        term = torch.where(ok, d[child[:, k].clamp(min=0)], torch.zeros(B))
        adv += term[:, None] * (pos >= at[:, k][:, None])
    return adv * action_mask


def informative_comparisons(totals: torch.Tensor, node: torch.Tensor, child: torch.Tensor,
                            min_std: float = 1e-3) -> tuple[int, int]:
    """``(branching points with two or more children, those whose children's rewards differ)``: the
    sibling groups that give a comparison, and those that give a non-zero one.

    >>> P = lambda n, c: {"node": n, "child": c, "at": 0}
    >>> layout = tree_layout([[P("root", "r0")], [P("root", "r1")], [P("root", "r2")]], ["q"] * 3)
    >>> informative_comparisons(torch.tensor([1.0, 0.0, 0.0]), layout[0], layout[1])
    (1, 1)
    """
    _, kids, sigma = node_terms(totals, node, child, min_std)
    groups = kids >= 2
    return int(groups.sum()), int((groups & (sigma > min_std)).sum())
