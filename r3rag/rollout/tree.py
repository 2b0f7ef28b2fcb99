"""Step-level tree rollouts: chains that share a prefix up to a step boundary, then diverge.

Flat sampling draws ``n`` independent chains per question; every pair of them differs from the
first generated token, so a group comparison says only which *whole* chain was better. A tree
draws ``roots`` chains, then re-samples continuations from the middle of them: at each boundary
``s`` of ``at_steps`` (in order), every chain of the tree that went on past step ``s - 1``'s
documents gets ``branch - 1`` new continuations that start from exactly its tokens up to there
(the prompt, steps ``0 .. s-1``, and the documents of step ``s - 1``). The continuations of one
boundary are siblings: they share everything before it, so the difference of their rewards is the
effect of what came after it. :mod:`r3rag.train.rl.tree` turns every such sibling group into an
advantage (``algo.estimator: tree_group_norm``).

With ``roots: 2, branch: 2, at_steps: [1, 2]`` a question gets 2 chains, then one more from each
chain that reached boundary 1 (up to 4), then one more from each of those that reached boundary 2
(up to 8). A chain that answered or stopped before a boundary is not branched there.

**Token-exact branches.** A branch is a new :class:`~r3rag.rollout.env.RetrievalEnv` whose state is
the parent's at the boundary: the parent's segments (ids, text and log-probs as sampled), steps,
budget counters, documents seen and chat messages, copied, never re-tokenised. Its own sampling
seed comes from its own sample index. It asks the backend to keep the prefix's keys/values
(``GenerationRequest.shared_prefix`` = the prefix's length), so siblings of one branching point
prefill the shared prefix once (the HF backend's prefix store).

**What each branch records** (``trajectory.metadata["tree"]``):

- ``path``: the branching points above it, root first, each ``{"node", "child", "at"}``: the node's
  key, the key of the child subtree this chain lies in, and ``at``, the index in
  :attr:`~r3rag.rollout.trajectory.Trajectory.token_ids` where that node's continuations begin
  (0 for the root: the question itself);
- ``owns_from``: the token index from which the tokens are this chain's own (0 for a root chain;
  the boundary's prefix length for a branch). A trainer counts a shared prefix once, in the chain
  it was sampled in: a branch's copy of it is context, not an action
  (:func:`r3rag.train.rl.batch.build_batch` masks it);
- ``parent``: the sample index it branched from (None for a root chain), ``boundary``: ``s``.

Generated tokens of a tree are the sum of each chain's own tokens (a branch's prefix was
generated once, by its parent).
"""

from __future__ import annotations

from typing import Any, Sequence

from r3rag.data.records import Question
from r3rag.rollout.backends.base import GenerationRequest
from r3rag.rollout.config import TreeConfig
from r3rag.rollout.engine import RolloutEngine, drive
from r3rag.rollout.env import RetrievalEnv
from r3rag.rollout.trajectory import Segment, Step, Trajectory


class BranchEnv(RetrievalEnv):
    """An episode that starts from another one's prefix; its requests name that prefix as shared."""

    fork_len: int = 0

    def request(self, shared_prefix: int = 0) -> GenerationRequest:
        return super().request(max(shared_prefix, self.fork_len))


def boundary_segment(traj: Trajectory, s: int) -> int | None:
    """Index of the last segment of ``traj``'s prefix at boundary ``s`` (step ``s - 1``'s documents),
    or None when the chain did not go on past it (it stopped at or before step ``s - 1``, or that
    step brought no documents segment)."""
    if s < 1 or len(traj.steps) <= s:
        return None
    seg = traj.steps[s - 1].segment
    if seg is None or seg + 1 >= len(traj.segments) or traj.segments[seg + 1].role != "env":
        return None
    return seg + 1


def branch_env(engine: RolloutEngine, question: Question, parent: Trajectory, s: int, sample_index: int,
               seed: int | None) -> BranchEnv:
    """A new episode whose state is ``parent``'s at boundary ``s`` (module docstring); the caller
    checked :func:`boundary_segment`."""
    last = boundary_segment(parent, s)
    if last is None:
        raise ValueError(f"trajectory {parent.question_id}#{parent.sample_index} did not go on past boundary {s}")
    env = BranchEnv(question, engine.fmt, engine.tokenizer, engine.config, engine.retriever, sample_index, seed)
    t = env.trajectory
    t.segments = [Segment(g.role, g.text, list(g.token_ids), None if g.logprobs is None else list(g.logprobs))
                  for g in parent.segments[: last + 1]]
    t.steps = [Step.from_dict(st.to_dict()) for st in parent.steps[:s]]
    if "exact_ids" in parent.metadata:
        t.metadata["exact_ids"] = parent.metadata["exact_ids"]
    env.ids = [i for g in t.segments for i in g.token_ids]
    env.text = "".join(g.text for g in t.segments)
    env._b.generated = sum(len(g.token_ids) for g in t.segments if g.role == "model")
    env._b.n_docs = sum(len(st.documents) for st in t.steps)
    env._b.seen = {p.id for st in t.steps for p in st.documents}
    if env.messages:  # chat mode: the same messages the parent's turns appended
        eos = engine.fmt.eos_text
        for st in t.steps:
            env.messages.append({"role": "assistant", "content": st.raw[: -len(eos)] if eos and st.raw.endswith(eos) else st.raw})
            env.messages.append({"role": engine.fmt.observation_role, "content": engine.fmt.render_documents(st.documents, st.index)})
    env.fork_len = len(env.ids)
    return env


def _tag(traj: Trajectory, path: list[dict[str, Any]], owns_from: int, parent: int | None, boundary: int | None) -> None:
    traj.metadata["tree"] = {"path": path, "owns_from": owns_from, "parent": parent, "boundary": boundary}


async def tree_rollout(engine: RolloutEngine, questions: Sequence[Question], tree: TreeConfig,
                       seed: int | None = None) -> list[Trajectory]:
    """Every question's tree (module docstring), in question order, then sample index. The chains
    of one level (the roots, then the branches of each boundary) are generated together, in one
    batched drive over every question."""
    run_seed = engine.config.seed + engine.calls if seed is None else seed
    engine.calls += 1
    by_q = {str(q.id): q for q in questions}
    roots = [engine.make_env(q, j, run_seed) for q in questions for j in range(tree.roots)]
    chains: dict[str, list[Trajectory]] = {str(q.id): [] for q in questions}
    async for env in drive(roots, engine.backend, engine.retriever, engine.stats, engine.on_step, engine.shared_prefix):
        t = env.trajectory
        _tag(t, [{"node": "root", "child": f"r{t.sample_index}", "at": 0}], 0, None, None)
        chains[t.question_id].append(t)
    next_index = {qid: tree.roots for qid in chains}
    for s in tree.at_steps:
        new: list[BranchEnv] = []
        for qid, ts in chains.items():
            for parent in sorted(ts, key=lambda t: t.sample_index):
                if not parent.trainable or boundary_segment(parent, s) is None:
                    continue
                node = f"{parent.sample_index}@{s}"
                path = parent.metadata["tree"]["path"]
                at = sum(len(g.token_ids) for g in parent.segments[: boundary_segment(parent, s) + 1])
                for m in range(1, tree.branch):
                    env = branch_env(engine, by_q[qid], parent, s, next_index[qid], run_seed)
                    next_index[qid] += 1
                    _tag(env.trajectory, path + [{"node": node, "child": f"{node}/{m}", "at": at}], at, parent.sample_index, s)
                    new.append(env)
                path.append({"node": node, "child": f"{node}/0", "at": at})
        async for env in drive(new, engine.backend, engine.retriever, engine.stats, engine.on_step, engine.shared_prefix):
            chains[env.trajectory.question_id].append(env.trajectory)
    return [t for q in questions for t in sorted(chains[str(q.id)], key=lambda t: t.sample_index)]


def own_generated_tokens(traj: Trajectory) -> int:
    """Tokens this chain sampled itself (a branch's copied prefix excluded)."""
    owns = int(traj.metadata.get("tree", {}).get("owns_from", 0))
    pos, n = 0, 0
    for g in traj.segments:
        if g.role == "model":
            n += sum(1 for i in range(pos, pos + len(g.token_ids)) if i >= owns)
        pos += len(g.token_ids)
    return n
