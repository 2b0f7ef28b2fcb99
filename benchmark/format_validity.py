"""How often a model writes a valid step: the share of steps, and of questions, that follow the format.

Reads finished evaluation run folders (``benchmark/evaluate.py run --out RUN``) and prints one row
per run: questions, steps written, the share of those steps that break no rule of the format (the
rewards' own checker, :func:`r3rag.rewards.format.format_violations`), format-valid answers (the
chain ended with an answer and broke no rule: :func:`r3rag.pipeline.report_from_base.format_valid`),
retrievals per question, and the most frequent broken rules. Used to choose the format and prompt
RL from the prompted base starts in (docs/results/from_base.md).

Example (16 dev questions of the small world in runs/fmt/world, prompted SmolLM2, one format and
prompt per run; the other runs add --set rollout.prompt_variant=standard, --set rollout.mode=raw, or
--method r1searcher_tags):

    python benchmark/evaluate.py run --config configs/evaluate/embedded-cpu.yaml --limit 16 --method r3rag_steps \\
        --set dataset.world_dir=runs/fmt/world --set retriever.index_dir=runs/fmt/index --set model.dtype=bfloat16 \\
        --set rollout.max_turn_tokens=80 --set rollout.max_steps=5 --set rollout.doc_max_chars=512 \\
        --set run.batch_size=16 --out runs/fmt/ev-steps-chat-fewshot
    python benchmark/format_validity.py runs/fmt/ev-steps-chat-fewshot runs/fmt/ev-steps-chat-standard
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's r3rag


def summarize(run: Path) -> dict:
    from r3rag.evaluation.paired import run_rows
    from r3rag.pipeline.report_from_base import format_valid
    from r3rag.rewards.format import FormatConfig, format_violations
    from r3rag.rollout.trajectory import Trajectory

    rows = run_rows(str(run))
    steps = valid_steps = 0
    broken: Counter[str] = Counter()
    for r in rows:
        t = Trajectory.from_dict(r["trajectory"])
        violations = format_violations(t, FormatConfig())
        bad = {v.step for v in violations}
        steps += len(t.steps)
        valid_steps += 0 if None in bad else sum(i not in bad for i in range(len(t.steps)))
        broken.update(v.name for v in violations)
    return {"run": str(run), "n": len(rows), "steps": steps,
            "valid_steps_pct": 100.0 * valid_steps / steps if steps else 0.0,
            "format_valid_answers_pct": 100.0 * sum(format_valid(r) for r in rows) / len(rows),
            "retrievals_per_q": sum(int(r.get("num_retrievals") or 0) for r in rows) / len(rows),
            "top_broken": broken.most_common(4)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmark/format_validity.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="finished evaluation run folders")
    a = ap.parse_args(argv)
    found = []
    for run in a.runs:
        try:
            found.append(summarize(Path(run)))
        except Exception as err:  # noqa: BLE001 - one bad folder: say which, print nothing
            print(f"error: {run}: {err}", file=sys.stderr)
            return 2
    print("| run | n | steps | valid steps % | format-valid answers % | retrievals/q | most broken rules |")
    print("|---|---|---|---|---|---|---|")
    for s in found:
        top = ", ".join(f"{k} {v}" for k, v in s["top_broken"]) or "none"
        print(f"| {s['run']} | {s['n']} | {s['steps']} | {s['valid_steps_pct']:.0f} | {s['format_valid_answers_pct']:.1f} "
              f"| {s['retrievals_per_q']:.2f} | {top} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
