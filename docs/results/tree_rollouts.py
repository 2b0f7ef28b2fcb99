"""Tree rollouts vs flat groups: informative (mixed-reward) comparisons per 1,000 generated tokens.

On the embedded world's training questions, a noisy scripted policy (the gold-decomposition oracle
that, at every turn, gives up with probability ``--eps`` and answers "unknown") is rolled out two
ways with the real rollout engine and BM25 retriever:

- **flat**: ``n`` independent chains per question (``rollout.n_samples``), one sibling group each;
- **tree**: ``rollout.tree`` (``--roots``, ``--branch``, ``--at-steps``), a sibling group per
  branching point.

Reward: exact match of the final answer (1 or 0). For each layout it reports the generated tokens
(a branch's copied prefix is not counted: it was generated once), the sibling groups, the
informative ones (rewards not all equal: the only ones that give a gradient), both per 1,000
generated tokens, and the share of generated tokens whose ``tree_group_norm`` / ``group_norm``
advantage is non-zero. Policy decode time is not measured here (the policy is scripted): what a
branch costs a model is its own tokens' decode plus one prefill of its prefix.

    python docs/results/tree_rollouts.py --questions 200 --eps 0.15
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from r3rag.cli import ArgumentParser, run_main  # noqa: E402


def noisy_oracle(questions, fmt, tokenizer, eps: float):
    from r3rag.rollout.oracle import UNKNOWN, OracleBackend

    class NoisyOracle(OracleBackend):
        name = "noisy_oracle"

        def _one(self, req):
            if random.Random(req.params.seed).random() < eps:
                found = self._find(req.prompt_text)
                if found is not None:
                    i = req.prompt_text[found[1]:].count(self.fmt.documents_marker)
                    return self._out(self.fmt.render_turn(i, "I will guess.", answer=UNKNOWN), req)
            return super()._one(req)

    return NoisyOracle(questions, fmt, tokenizer)


def measure(trajs, estimator: str) -> dict:
    import torch

    from r3rag.metrics import exact_match
    from r3rag.rewards.types import RewardOutput
    from r3rag.rollout.tree import own_generated_tokens
    from r3rag.train.rl.batch import build_batch
    from r3rag.train.rl.estimators import compute_advantages
    from r3rag.train.rl.tree import informative_comparisons

    keep = [t for t in trajs if t.trainable and t.steps]
    rewards = []
    for t in keep:
        r = exact_match(t.answer or "", t.golden_answers)
        rewards.append(RewardOutput(r, [0.0] * (len(t.steps) - 1) + [r], {"correct": r}))
    batch = build_batch(keep, rewards, pad_id=0)
    groups, informative = informative_comparisons(batch.totals, batch.tree_node, batch.tree_child)
    adv = compute_advantages(estimator, batch.step_rewards, batch.action_mask, batch.group,
                             step_layout=batch.layout_for(estimator)).advantages
    tokens = sum(own_generated_tokens(t) for t in trajs)
    signed = int(((adv != 0) & (batch.action_mask > 0)).sum())
    return {"chains": len(trajs), "generated_tokens": tokens, "tokens_per_question": None,
            "mean_reward": round(float(batch.totals.mean()), 4), "sibling_groups": groups, "informative_groups": informative,
            "sibling_groups_per_1k_tokens": round(1000 * groups / tokens, 3),
            "informative_per_1k_tokens": round(1000 * informative / tokens, 3),
            "tokens_with_nonzero_advantage": round(signed / max(1, int(batch.action_mask.sum())), 4)}


def main() -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world-dir", default=None, help="a built world (default: build the small world, seed 0, in a temp folder)")
    p.add_argument("--questions", type=int, default=200, help="training questions (default: %(default)s)")
    p.add_argument("--eps", type=float, default=0.15, help="per-turn give-up probability of the policy (default: %(default)s)")
    p.add_argument("--flat", default="4,8", help="flat group sizes, comma-separated (default: %(default)s)")
    p.add_argument("--roots", type=int, default=2)
    p.add_argument("--branch", type=int, default=2)
    p.add_argument("--at-steps", default="1,2", help="branching boundaries (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    from r3rag.evaluation.components import load_retriever
    from r3rag.evaluation.config import DatasetConfig
    from r3rag.evaluation.datasets import resolve_dataset
    from r3rag.rollout.config import RolloutConfig, TreeConfig
    from r3rag.rollout.engine import RolloutEngine
    from r3rag.rollout.formats.registry import get_format
    from r3rag.rollout.tree import tree_rollout
    from r3rag.rollout.tiny_tokenizer import build_tiny_tokenizer
    from r3rag.evaluation.config import RetrieverConfig

    with tempfile.TemporaryDirectory() as tmp:
        world = args.world_dir or str(Path(tmp) / "world")
        ds = resolve_dataset(DatasetConfig(name="world", world_dir=world, split="train", limit=args.questions))
        retriever = load_retriever(RetrieverConfig(), ds)
        tok = build_tiny_tokenizer()
        cfg = RolloutConfig(format="r3rag_steps", max_steps=6, docs_per_step=3, max_new_tokens=2048, max_total_tokens=8192,
                            temperature=1.0, seed=args.seed)
        fmt = get_format(cfg.format, mode=cfg.mode, tokenizer=tok)
        qs = list(ds.questions)
        engine = RolloutEngine(noisy_oracle(qs, fmt, tok, args.eps), retriever, cfg, fmt=fmt)
        out = {"questions": len(qs), "eps": args.eps}
        for n in [int(x) for x in args.flat.split(",") if x]:
            trajs = engine.run(qs, n_samples=n, seed=args.seed)
            out[f"flat_{n}"] = measure(trajs, "group_norm")
        tree = TreeConfig(roots=args.roots, branch=args.branch, at_steps=[int(x) for x in args.at_steps.split(",")])
        trajs = asyncio.run(tree_rollout(engine, qs, tree, seed=args.seed))
        name = f"tree_{args.roots}x{args.branch}@{args.at_steps}"
        out[name] = measure(trajs, "tree_group_norm")
        for v in out.values():
            if isinstance(v, dict):
                v["tokens_per_question"] = round(v["generated_tokens"] / len(qs), 1)
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    run_main(main)
