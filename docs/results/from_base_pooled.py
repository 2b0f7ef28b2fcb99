"""The from-base quickstart's figures per world seed and pooled over seeds (docs/results/from_base.md).

Each WORK is a finished ``python -m r3rag.quickstart --preset from-base --work WORK`` folder. The
script reads the prompted base's and the RL model's predictions on the held-out questions
(``WORK/eval/base-r3rag_steps`` and ``WORK/eval/rl``), and prints one markdown row per seed and a
pooled row (question ids prefixed by the folder, so the bootstrap resamples all questions
together), each with the report's own figures and claims
(:func:`r3rag.pipeline.report_from_base.compare` and ``claims``). ``--extra NAME=RUN`` adds another
evaluation run of the first folder's questions (e.g. the stage-1 model), paired against the base.

    python docs/results/from_base_pooled.py runs/qs-from-base-s0 runs/qs-from-base-s1 runs/qs-from-base-s2 \\
        --extra "stage 1 only=runs/qs-from-base-s0/extra/stage1"
"""

from __future__ import annotations

import argparse
from pathlib import Path

from r3rag.evaluation.paired import run_rows
from r3rag.pipeline.report_from_base import claims, compare

COLUMNS = [("format_valid", "format-valid answers %", 1), ("answered", "answered %", 1), ("em", "EM", 1),
           ("retrievals", "retrievals/q", 2)]


def rows(run: Path, tag: str) -> list[dict]:
    """The run's prediction rows (a run a service failed for is refused), ids prefixed by ``tag``."""
    return [dict(r, id=f"{tag}:{r['id']}") for r in sorted(run_rows(run), key=lambda r: r["index"])]


def cells(c: dict) -> list[str]:
    out = []
    for key, _, digits in COLUMNS:
        m = c["metrics"][key]
        d, (lo, hi) = m["diff"]["diff"], m["diff"]["ci95"]
        out.append(f"{m['base']['mean']:.{digits}f} -> {m['rl']['mean']:.{digits}f}, "
                   f"{d:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]")
    return out


def line(name: str, base: list[dict], rl: list[dict], resamples: int) -> str:
    """One markdown row: the paired figures of ``rl`` against ``base`` and the report's verdicts."""
    c = compare(base, rl, resamples)
    verdicts = ", ".join("yes" if x["holds"] else "no" for x in claims(c))
    return f"| {name} | {c['n']} | " + " | ".join(cells(c)) + f" | {verdicts} |"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("works", nargs="+", type=Path, help="finished from-base work folders, one per world seed")
    p.add_argument("--extra", action="append", default=[], help="NAME=RUN: another run on the first folder's questions")
    p.add_argument("--resamples", type=int, default=1000)
    a = p.parse_args()

    print("| run | n | " + " | ".join(f"{label}: base -> RL, RL - base" for _, label, _ in COLUMNS) + " | claims (format, EM, search) |")
    print("|---" * (len(COLUMNS) + 3) + "|")
    bases = [rows(work / "eval" / "base-r3rag_steps", work.name) for work in a.works]
    rls = [rows(work / "eval" / "rl", work.name) for work in a.works]
    for work, base, rl in zip(a.works, bases, rls):
        print(line(work.name, base, rl, a.resamples))
    if len(a.works) > 1:
        print(line("pooled", sum(bases, []), sum(rls, []), a.resamples))
    for item in a.extra:
        name, run = item.split("=", 1)
        print(line(f"{name} ({a.works[0].name})", bases[0], rows(Path(run), a.works[0].name), a.resamples))


if __name__ == "__main__":
    main()
