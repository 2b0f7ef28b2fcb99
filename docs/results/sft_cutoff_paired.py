"""Two evaluation runs on the same questions, paired, by hop count: EM and retrievals per question.

    python docs/results/sft_cutoff_paired.py runs/qs-before-s0/eval/sft runs/qs-after-s0/eval/sft \
        [--also runs/qs-before-s1/eval/sft runs/qs-after-s1/eval/sft ...]

Each pair is A (before) then B (after). Prints, for all questions and per ``metadata.hops``: n, EM
of A and B, B - A with its paired percentile-bootstrap 95% interval (questions resampled, both
runs' scores of a question together: r3rag.evaluation.paired), and retrievals per question of A
and B with their paired difference. With several pairs (world seeds), the pairs' questions are
pooled, each question id prefixed with its pair's position so ids never collide.
"""

from __future__ import annotations

import argparse

from r3rag.evaluation.paired import align, columns, paired_differences, run_rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_a")
    ap.add_argument("run_b")
    ap.add_argument("--also", nargs=2, action="append", default=[], metavar=("RUN_A", "RUN_B"), help="another pair (seed)")
    ap.add_argument("--resamples", type=int, default=1000)
    a = ap.parse_args()
    rows_a, rows_b = [], []
    for k, (ra, rb) in enumerate([(a.run_a, a.run_b), *a.also]):
        x, y = align(run_rows(ra), run_rows(rb))
        rows_a += [dict(r, id=f"{k}:{r['id']}") for r in x]
        rows_b += [dict(r, id=f"{k}:{r['id']}") for r in y]
    hops = sorted({(r.get("metadata") or {}).get("hops") for r in rows_a} - {None})
    print("| hops | n | EM A | EM B | B - A [95% CI] | retrievals A | retrievals B | B - A [95% CI] |")
    print("|---|---|---|---|---|---|---|---|")
    for h in ["all", *hops]:
        keep = [i for i, r in enumerate(rows_a) if h == "all" or (r.get("metadata") or {}).get("hops") == h]
        sa, sb = [rows_a[i] for i in keep], [rows_b[i] for i in keep]
        d = paired_differences(sa, sb, a.resamples, 0, names=("em", "retrievals"))
        ca, cb = columns(sa, ("em", "retrievals")), columns(sb, ("em", "retrievals"))
        em, rt = d["em"], d["retrievals"]
        print(f"| {h} | {len(sa)} | {ca['em'].mean():.1f} | {cb['em'].mean():.1f} | {em['diff']:+.1f} "
              f"[{em['ci95'][0]:+.1f}, {em['ci95'][1]:+.1f}] | {ca['retrievals'].mean():.2f} | {cb['retrievals'].mean():.2f} | "
              f"{rt['diff']:+.2f} [{rt['ci95'][0]:+.2f}, {rt['ci95'][1]:+.2f}] |")


if __name__ == "__main__":
    main()
