"""Tree rollouts against flat groups in the quickstart's RL stage (docs/results/tree_rollouts.md).

Each pair is ``FLAT=TREE``: two finished quickstart work folders (or copies of one) whose RL stage
started from the same SFT checkpoint, one with flat groups (``group_norm``, ``n_samples`` 4) and
one with a tree (``tree_group_norm``, ``rollout.tree``), with the same iterations. The script reads
each RL stage's ``rl/metrics.jsonl`` and the report's ``rl_effects.json`` and prints two markdown
tables:

1. training signal and cost per iteration: chains, generated tokens (a branch's own tokens only),
   informative comparisons (sibling groups whose rewards are not all equal: a question for flat
   groups, a branching point for a tree), informative comparisons per 1,000 generated tokens, and
   wall time per iteration;
2. held-out effects: RL - SFT and RL - null control (the report's figures), the training reward
   check, and tree RL - flat RL paired on the same held-out questions (EM, from the two
   ``eval/rl`` runs).

    python docs/results/tree_vs_flat.py runs/flat-s0=runs/after-s0 runs/flat-s1=runs/after-s1
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from r3rag.evaluation.paired import paired_differences, run_rows


def train_rows(work: Path) -> list[dict]:
    rows = [json.loads(x) for x in (work / "rl" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r for r in rows if r.get("kind") == "train"]


def signal(work: Path) -> dict[str, float]:
    """Per-iteration means of chains, generated tokens, informative comparisons and wall time."""
    rows = train_rows(work)
    chains = np.array([r["batch/trajectories"] for r in rows], dtype=float)
    tokens = np.array([r["rollout/generated_tokens"] for r in rows], dtype=float) * chains  # per-chain mean x chains
    if all("tree/informative_groups" in r for r in rows):
        informative = np.array([r["tree/informative_groups"] for r in rows], dtype=float)
        groups = np.array([r["tree/sibling_groups"] for r in rows], dtype=float)
    else:  # flat runs recorded before the trainer counted flat groups too: with dynamic filtering on,
        # a question whose group was kept had rewards that were not all equal
        groups = np.array([r["batch/groups"] for r in rows], dtype=float)
        informative = groups * (1.0 - np.array([r["batch/filtered_fraction"] for r in rows], dtype=float))
    return {"iterations": len(rows), "chains": chains.mean(), "tokens": tokens.mean(), "groups": groups.mean(),
            "informative": informative.mean(), "per_1k": 1000.0 * informative.sum() / tokens.sum(),
            "minutes": np.mean([r["time/iteration"] for r in rows]) / 60.0,
            "generate_min": np.mean([r["time/generate"] for r in rows]) / 60.0}


def effects(work: Path) -> dict:
    return json.loads((work / "report" / "rl_effects.json").read_text())


def ci(d: dict) -> str:
    lo, hi = d["ci95"]
    return f"{d['diff']:+.1f} [{lo:+.1f}, {hi:+.1f}]"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pairs", nargs="+", help="FLAT=TREE: the two work folders of one world seed")
    p.add_argument("--resamples", type=int, default=1000)
    a = p.parse_args()
    pairs = [tuple(Path(x) for x in s.split("=", 1)) for s in a.pairs]

    print("| run | layout | iterations | chains / iteration | generated tokens / iteration | sibling groups | "
          "informative | informative / 1k tokens | min / iteration (generation) |")
    print("|---" * 9 + "|")
    for flat, tree in pairs:
        for name, work in (("flat 4", flat), ("tree 2x2 @ [1,2]", tree)):
            s = signal(work)
            print(f"| {work.name} | {name} | {s['iterations']} | {s['chains']:.1f} | {s['tokens']:.0f} | {s['groups']:.1f} | "
                  f"{s['informative']:.1f} | {s['per_1k']:.3f} | {s['minutes']:.1f} ({s['generate_min']:.1f}) |")

    print()
    print("| run | layout | RL - SFT, EM | RL - null control, EM | training reward, before -> after | tree - flat, EM |")
    print("|---" * 6 + "|")
    for flat, tree in pairs:
        d = paired_differences(run_rows(str(flat / "eval" / "rl")), run_rows(str(tree / "eval" / "rl")), a.resamples,
                               names=("em",))["em"]
        for name, work in (("flat 4", flat), ("tree 2x2 @ [1,2]", tree)):
            e = effects(work)
            rc = e["reward_check"]
            lo, hi = rc["ci95"]
            print(f"| {work.name} | {name} | {ci(e['rl_vs_sft']['em'])} | {ci(e['rl_vs_null']['em'])} | "
                  f"{rc['before']:.3f} -> {rc['after']:.3f} ({rc['diff']:+.3f} [{lo:+.3f}, {hi:+.3f}]) | "
                  f"{ci(d) if work == tree else ''} |")


if __name__ == "__main__":
    main()
