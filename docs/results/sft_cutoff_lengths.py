"""Chain and turn lengths of a cold-start folder, in the trajectories' own tokens.

    python docs/results/sft_cutoff_lengths.py runs/coldstart --cutoff 1024 --turn-budget 80 --new-budget 320

Prints, over the kept chains: the length distribution (prompt + turns + documents, the tokens SFT
trains on), how many are longer than each ``--cutoff``, the longest by hop count, the model-turn
length distribution, how many turns are longer than ``--turn-budget`` and how many chains generate
more than ``--new-budget`` tokens in all (what an RL rollout with those budgets could not sample).

With ``--lf-rows FILE`` (the output of ``python -m r3rag.train.sft.lf_preprocess`` on the folder's
sharegpt dataset, one or more ``--cutoff-len``), it also says, per cutoff, how many chains
LLaMA-Factory's ids differ from the trajectory's, how many of those lose their final-answer turn
(wholly or in part), and how many trained tokens sit after the point where LLaMA-Factory's
sequence leaves the rollout's (contexts the rollout never produces). Step-format chains only
(their SFT view is the trajectory itself).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def pct(xs: list[int], q: float) -> int:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder")
    ap.add_argument("--cutoff", type=int, action="append", default=[])
    ap.add_argument("--turn-budget", type=int, action="append", default=[])
    ap.add_argument("--new-budget", type=int, action="append", default=[])
    ap.add_argument("--lf-rows", help="lf_preprocess output to compare with the trajectories")
    a = ap.parse_args()
    chains, turns, gen, trajs = [], [], [], []
    by_hops: dict[int, list[int]] = defaultdict(list)
    for p in sorted((Path(a.folder) / "trajectories").glob("part-*.jsonl")):
        for line in p.read_text(encoding="utf-8").splitlines():
            t = json.loads(line)
            trajs.append(t)
            n = sum(len(s["token_ids"]) for s in t["segments"])
            chains.append(n)
            by_hops[t["metadata"].get("hops", 0)].append(n)
            ts = [len(s["token_ids"]) for s in t["segments"] if s["role"] == "model"]
            turns += ts
            gen.append(sum(ts))
    print(f"chains {len(chains)}: tokens median {pct(chains, .5)}, p90 {pct(chains, .9)}, max {max(chains)}")
    for c in a.cutoff:
        k = sum(n > c for n in chains)
        print(f"  longer than {c}: {k} ({100 * k / len(chains):.1f}%)")
    for h in sorted(by_hops):
        xs = by_hops[h]
        print(f"  {h} hops: {len(xs)} chains, median {pct(xs, .5)}, max {max(xs)}"
              + "".join(f", >{c}: {sum(n > c for n in xs)}" for c in a.cutoff))
    print(f"turns {len(turns)}: median {pct(turns, .5)}, p99 {pct(turns, .99)}, max {max(turns)}")
    for b in a.turn_budget:
        print(f"  longer than {b}: {sum(n > b for n in turns)}")
    print(f"generated per chain: median {pct(gen, .5)}, max {max(gen)}")
    for b in a.new_budget:
        print(f"  chains generating more than {b}: {sum(n > b for n in gen)}")
    if a.lf_rows:
        compare(trajs, a.lf_rows)


def compare(trajs: list[dict], path: str) -> None:
    by_cutoff: dict[int, list[dict]] = defaultdict(list)
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        by_cutoff[row.get("cutoff_len", 0)].append(row)
    for cutoff, rows in sorted(by_cutoff.items()):
        assert len(rows) == len(trajs), f"{path}: {len(rows)} rows at cutoff {cutoff}, {len(trajs)} trajectories"
        differ = whole = part = 0
        foreign = trained = 0
        for t, row in zip(trajs, rows):
            ids = [i for s in t["segments"] for i in s["token_ids"]]
            got, labels = row["input_ids"], row["labels"]
            marks = [k for k, lab in enumerate(labels) if lab != -100]
            trained += len(marks)
            if got == ids:
                continue
            differ += 1
            split = next((k for k, (x, y) in enumerate(zip(got, ids)) if x != y), min(len(got), len(ids)))
            foreign += sum(k >= split for k in marks)
            last = t["segments"][-1]["token_ids"]
            if got[-len(last):] != last:
                part += any(got[-k:] == last[:k] for k in range(1, len(last)))
                whole += not any(got[-k:] == last[:k] for k in range(1, len(last)))
        print(f"LLaMA-Factory at cutoff {cutoff}: {differ} of {len(trajs)} chains differ from the rollout; final-answer "
              f"turn lost {whole}, cut {part}; trained tokens after the point of difference {foreign} of {trained} "
              f"({100 * foreign / max(1, trained):.1f}%)")


if __name__ == "__main__":
    main()
