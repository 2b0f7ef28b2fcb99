"""The quickstart's report: did each stage make the model better, and by how much?

Written to ``WORK/report``:

- ``quickstart.md``: one table (base / SFT / RL / RL's null control rows: EM, F1, cover-EM,
  retrievals per question, format-error rate, each with its 95% bootstrap interval), the paired
  differences SFT - base, RL - SFT, RL - base and RL - null control with their 95% intervals
  (:mod:`r3rag.evaluation.paired`), the learning claims (:mod:`r3rag.pipeline.checks`), what RL did
  (RL - SFT and RL - null control with the replicate-aware intervals of
  :mod:`r3rag.evaluation.replicates`, the training reward on RL's own questions before and after,
  why no held-out gain is expected at this size), EM by question type (:mod:`r3rag.pipeline.by_type`), the evidence the trained
  models found and how often they answered right with it (:mod:`r3rag.evaluation.evidence`), the
  time of each stage, the RL curves and the two example questions;
- ``table.csv``, ``paired.json``, ``claims.json``, ``rl_effects.json``: the same numbers for machines;
- ``rl_curves*.png``: the RL stage's curves, copied;
- ``examples.html``: for the same questions, the base model's trajectory and the trained model's,
  rendered with the demo's own cards (:mod:`r3rag.demo.cards`).

"base" is the best prompted method of the base model by EM (``eval.base_methods``); the other
prompted runs are listed under the table. All rows are on the same held-out questions, so the
paired differences use every question.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path
from typing import Any

from r3rag.evaluation.evidence import report_lines as evidence_lines
from r3rag.evaluation.paired import means_with_ci, paired_differences, run_rows
from r3rag.machine import BF16_MARK
from r3rag.pipeline.by_type import by_type_lines
from r3rag.pipeline.checks import NO_HELD_OUT_GAIN, claim, rl_claim
from r3rag.pipeline.runner import Context
from r3rag.pipeline.stages import NULL_RUN
from r3rag.fileio import atomic_write_json
from r3rag.pipeline.state import PipelineState

COLUMN_LABELS = {"em": "EM", "f1": "F1", "cover_em": "cover-EM", "retrievals": "retrievals/q", "format_error": "format errors %"}
#: said under an RL claim: its interval covers the questions, not the training run
RL_RUN_NOTE = ("With one RL run these intervals resample the held-out questions, not the training run: on this "
               "world two RL runs of one recipe from one SFT checkpoint, differing only in `train.seed`, scored 4 EM "
               "apart on the same questions (docs/results/rl.md). To judge a recipe, train it with several `train.seed` values, "
               "write each run's null control (`python -m r3rag.train.rl.update_noise random-sign SFT RUN --out NULL`) "
               "and compare with `python -m r3rag.evaluation.replicates WORK/eval/sft RUN1 RUN2 ... --control NULL1 "
               "NULL2 ...`: the interval then covers the runs too. Any change to a greedy student redraws some answers "
               "(every small change of the SFT checkpoint tried on this world cost it about 3 EM), which is why RL is "
               "compared with its null control and not only with SFT. Fifteen more minutes of supervised training on "
               "the teacher's chains did no better than RL there (-2.8 EM).")
#: the goals, in EM points (stated beside the measured claim)
GOALS = {"sft_vs_base": 30.0}


def _skip_note(cfg: Any) -> str:
    """Where the evaluated questions start, when the preset leaves the split's first ones out."""
    skip = cfg.eval.skip
    return f" (positions {skip + 1} on: the first {skip} were consulted while choosing the recipes)" if skip else ""


def _cell(v: dict[str, Any], digits: int) -> str:
    lo, hi = v["ci95"]
    return f"{v['mean']:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def _diff_cell(v: dict[str, Any], digits: int) -> str:
    lo, hi = v["ci95"]
    star = " *" if v["excludes_zero"] else ""
    return f"{v['diff']:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]{star}"


def _digits(col: str) -> int:
    return 2 if col == "retrievals" else 1


def collect_runs(ctx: Context) -> dict[str, dict[str, Any]]:
    """``{run name: {"role", "method", "model", "rows"}}`` from the eval stage's marker."""
    marker = PipelineState(ctx.work).get("eval") or {}
    runs = marker.get("summary", {}).get("runs", {})
    out = {}
    for name, info in runs.items():
        rows = sorted(run_rows(info["dir"]), key=lambda r: r["index"])  # refuses a run a service failed for
        out[name] = {**info, "rows": rows}
    return out


def pick_base(runs: dict[str, dict[str, Any]]) -> str | None:
    """The best prompted base run by EM (ties: the first listed)."""
    best, best_em = None, -1.0
    for name, r in runs.items():
        if r["role"] == "base":
            em = sum(float(x["scores"]["em"]) for x in r["rows"]) / max(len(r["rows"]), 1)
            if em > best_em:
                best, best_em = name, em
    return best


def _stage_times(ctx: Context) -> list[tuple[str, float, int, str]]:
    """``(stage, seconds over every invocation, invocations, CPU it finished on)`` of each finished stage."""
    state = PipelineState(ctx.work)
    out = []
    for stage in ("world", "index", "coldstart", "sft", "rl", "eval"):
        m = state.get(stage)
        if m is not None:
            out.append((stage, float(m.get("elapsed_s", 0.0)), int(m.get("attempts", 1)), str(m.get("cpu", "not recorded"))))
    return out


def _time_lines(times: list[tuple[str, float, int, str]], budget: float | None) -> list[str]:
    """The report's time table; the CPU is named once when every stage ran on the same one, else per row."""
    total = sum(t for _, t, _, _ in times)
    verdict = "" if budget is None else (f" (budget {budget:g} min: " + ("within" if total <= 60 * budget else "OVER") + ")")
    cpus = sorted({c for *_, c in times})
    one = len(cpus) == 1
    head = ["| stage | time |", "|---|---|"] if one else ["| stage | time | CPU |", "|---|---|---|"]
    rows = [f"| {s} | {_fmt_time(t)}{f' ({n} runs: resumed)' if n > 1 else ''} |" + ("" if one else f" {c} |")
            for s, t, n, c in times]
    lines = ["## Time per stage", ""]
    if one:
        lines += [f"CPU: {cpus[0]}.", ""]
    lines += [*head, *rows, f"| total | {_fmt_time(total)}{verdict} |" + ("" if one else " |"), "",
              "A stage's time adds every run that worked on it: a killed run's time counts (to within 30 s)."]
    slow = [c for c in cpus if BF16_MARK not in c and c != "not recorded"]
    if slow and budget is not None:
        lines += ["", f"{' and '.join(slow)}: no native bf16 (no `avx512_bf16` / `amx_bf16`), so its stages ran in "
                  "float32, about 3x slower than on the budget's reference machines (docs/quickstart.md, "
                  "\"On an AVX2-only CPU\")."]
    return [*lines, ""]


def _fmt_time(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


def choose_examples(before: list[dict[str, Any]], after: list[dict[str, Any]], k: int) -> list[tuple[dict, dict]]:
    """``k`` questions answered by both runs: first those the trained model got right and the base
    wrong (multi-hop first), then any other; deterministic (dataset order within each group)."""
    by_id = {r["id"]: r for r in after}
    pairs = [(b, by_id[b["id"]]) for b in before if b["id"] in by_id]

    def rank(p: tuple[dict, dict]) -> tuple[int, int, int]:
        b, a = p
        fixed = a["scores"]["em"] > b["scores"]["em"]
        hops = int((a.get("metadata") or {}).get("hops") or 1)
        return (0 if fixed else 1, 0 if hops >= 2 else 1, int(b["index"]))

    return sorted(pairs, key=rank)[:k]


def examples_html(pairs: list[tuple[dict, dict]], before_label: str, after_label: str) -> str:
    from html import escape

    from r3rag.data.records import Question
    from r3rag.demo.cards import CSS, final_card_html, step_card_html
    from r3rag.rollout.trajectory import Trajectory

    def column(row: dict[str, Any], label: str) -> str:
        traj = Trajectory.from_dict(row["trajectory"])
        gold = Question(row["id"], row["question"], list(row["golden_answers"]), dict(row.get("metadata") or {}))
        cards = "".join(step_card_html(s) for s in traj.steps)
        return (f'<div class="r3-col"><h2>{escape(label)}</h2>{cards}'
                f'{final_card_html(traj, gold, {k: float(v) for k, v in row["scores"].items()})}</div>')

    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>r3rag quickstart: before and after training</title>",
             f"<style>{CSS}\n.r3-pair{{display:flex;gap:18px}}.r3-col{{flex:1;min-width:0}}"
             "body{font-family:sans-serif;max-width:1300px;margin:auto}</style></head><body>",
             "<h1>The same questions before and after training</h1>"]
    for i, (b, a) in enumerate(pairs, 1):
        parts.append(f'<h2>Example {i}: {escape(b["question"])}</h2><div class="r3-pair">'
                     f"{column(b, before_label)}{column(a, after_label)}</div>")
    parts.append("</body></html>")
    return "".join(parts)


def rl_effect(runs: dict[str, dict[str, Any]], resamples: int, seed: int) -> dict[str, Any]:
    """RL - SFT (:func:`r3rag.evaluation.replicates.replicate_differences`: its interval resamples the
    RL runs and the questions; one run here) and, when the null control was evaluated, RL - null
    control (:func:`r3rag.evaluation.replicates.control_differences`), on the held-out columns."""
    from r3rag.evaluation.replicates import control_differences, replicate_differences

    sft, rl = runs["sft"]["rows"], runs["rl"]["rows"]
    out: dict[str, Any] = {"rl_vs_sft": replicate_differences(sft, [rl], resamples=resamples, seed=seed)}
    if NULL_RUN in runs:
        out["rl_vs_null"] = control_differences(sft, [rl], [runs[NULL_RUN]["rows"]], resamples=resamples, seed=seed)
    return out


def rl_section(effects: dict[str, Any], rl_summary: dict[str, Any]) -> list[str]:
    """The report's RL section: RL - SFT and RL - null control on held-out EM, the training reward
    before and after on RL's own questions, why no held-out gain is expected, the update's size."""
    def em(v: dict[str, Any]) -> str:
        return f"{v['diff']:+.1f} [{v['ci95'][0]:+.1f}, {v['ci95'][1]:+.1f}]"

    lines = ["## What RL did", ""]
    d = effects["rl_vs_sft"]["em"]
    lines.append(f"- Held-out EM, RL - SFT: {em(d)} (n={d['n']}; the interval resamples the RL runs and the "
                 f"questions: {d['runs']} run)")
    null = effects.get("rl_vs_null")
    if null:
        v = null["em"]
        lines.append(f"- Held-out EM, RL - null control: {em(v)} (the null control, SFT moved by RL's update with a "
                     f"random sign per parameter, scored {v['control_per_run'][0]:+.1f} against SFT; RL "
                     f"{v['per_run'][0]:+.1f})")
    else:
        lines.append("- RL - null control: not measured (`eval.null_control` is off)")
    check = rl_summary.get("reward_check")
    if check:
        lines.append(f"- Training reward on {check['n']} of RL's own training questions (the first of its training "
                     f"order, answered greedily, scored by its reward recipe): {check['before']:.3f} before, "
                     f"{check['after']:.3f} after, paired {check['diff']:+.3f} [{check['ci95'][0]:+.3f}, "
                     f"{check['ci95'][1]:+.3f}]")
    else:
        lines.append("- Training reward before and after: not measured (`rl.reward_check` is 0)")
    update = rl_summary.get("update")
    params = f"{update['params'] / 1e6:.0f}M-parameter" if update and update.get("params") else "small"
    lines += ["", NO_HELD_OUT_GAIN.format(params=params, trajectories=f"{rl_summary.get('trajectories', 0):,}"), "",
              RL_RUN_NOTE, ""]
    if update:
        from r3rag.train.rl.update_noise import update_line

        lines += [update_line(update), ""]
    return lines


def _example_text(b: dict[str, Any], a: dict[str, Any], before_label: str, after_label: str) -> list[str]:
    def one(r: dict[str, Any]) -> str:
        queries = [s.get("query") for s in r["trajectory"].get("steps", []) if s.get("query")]
        q = "; ".join(f"`{x}`" for x in queries) or "none"
        return f"answer {r['prediction']!r} (EM {r['scores']['em']:.0f}), {r['num_retrievals']} retrieval(s): {q}"

    hops = (b.get("metadata") or {}).get("hops")
    return [f"- **{b['question']}** (gold: {' | '.join(b['golden_answers'])}{f'; {hops} hops' if hops else ''})",
            f"  - {before_label}: {one(b)}", f"  - {after_label}: {one(a)}"]


def write_report(ctx: Context) -> dict[str, Any]:
    cfg = ctx.cfg
    out = ctx.work / "report"
    out.mkdir(parents=True, exist_ok=True)
    runs = collect_runs(ctx)
    if not runs:
        from r3rag.errors import ConfigError

        raise ConfigError(f"no evaluation runs in {ctx.work}: run --stages eval first")
    B, seed = cfg.report.bootstrap, cfg.report.seed
    base = pick_base(runs)
    order = ([base] if base else []) + [s for s in ("sft", "rl", NULL_RUN) if s in runs]
    labels = {base: f"base ({runs[base]['method']}, prompted)" if base else "", "sft": "SFT", "rl": "RL",
              NULL_RUN: "RL null control"}
    models = [name for name in order if name != NULL_RUN]  # the per-type and evidence sections: the models themselves
    stats = {name: means_with_ci(runs[name]["rows"], B, seed) for name in runs}
    n = {name: len(runs[name]["rows"]) for name in runs}

    # the table
    cols = list(COLUMN_LABELS)
    lines = ["| model | n | " + " | ".join(COLUMN_LABELS[c] for c in cols) + " |", "|---|---|" + "---|" * len(cols)]
    csv_rows = []
    for name in order:
        lines.append(f"| {labels[name]} | {n[name]} | " + " | ".join(_cell(stats[name][c], _digits(c)) for c in cols) + " |")
        csv_rows.append({"model": labels[name], "run": name, "n": n[name],
                         **{f"{c}{suffix}": v for c in cols for suffix, v in
                            (("", stats[name][c]["mean"]), ("_lo", stats[name][c]["ci95"][0]), ("_hi", stats[name][c]["ci95"][1]))}})
    table = "\n".join(lines)
    others = [name for name in runs if name not in order]
    other_lines = [f"- {name} ({runs[name]['method']}): EM {_cell(stats[name]['em'], 1)}, cover-EM "
                   f"{_cell(stats[name]['cover_em'], 1)}, retrievals/q {stats[name]['retrievals']['mean']:.2f}" for name in others]

    # paired differences
    comparisons = [("sft_vs_base", "sft", base), ("rl_vs_sft", "rl", "sft"), ("rl_vs_base", "rl", base),
                   ("rl_vs_null", "rl", NULL_RUN)]
    paired: dict[str, Any] = {}
    for key, b_name, a_name in comparisons:
        if b_name in runs and a_name in runs:
            paired[key] = paired_differences(runs[a_name]["rows"], runs[b_name]["rows"], B, seed)
    diff_lines = ["| difference (paired) | n | " + " | ".join(COLUMN_LABELS[c] for c in cols) + " |",
                  "|---|---|" + "---|" * len(cols)]
    nice = {"sft_vs_base": "SFT - base", "rl_vs_sft": "RL - SFT", "rl_vs_base": "RL - base",
            "rl_vs_null": "RL - null control"}
    for key, d in paired.items():
        diff_lines.append(f"| {nice[key]} | {d['em']['n']} | " + " | ".join(_diff_cell(d[c], _digits(c)) for c in cols) + " |")
    diff_table = "\n".join(diff_lines) if paired else ""

    # claims
    claims = []
    if base and "sft" in runs:
        claims.append(claim("sft_vs_base", "SFT", "the prompted base", paired["sft_vs_base"]["em"], GOALS["sft_vs_base"]))
    rl_marker = PipelineState(ctx.work).get("rl")
    rl_summary = (rl_marker or {}).get("summary", {})
    rl_lines: list[str] = []
    rl_effects: dict[str, Any] = {}
    if "rl" in runs and "sft" in runs:
        rl_effects = rl_effect(runs, B, seed)
        claims.append(rl_claim(rl_summary.get("reward_check"), (rl_effects.get("rl_vs_null") or {}).get("em")))
        rl_lines = rl_section(rl_effects, rl_summary)

    # curves and examples
    curves = []
    for i, src in enumerate(rl_summary.get("curves", [])):
        if Path(src).is_file():
            dst = out / (f"rl_curves_{Path(src).stem}.png" if i else "rl_curves.png")
            shutil.copyfile(src, dst)
            curves.append(dst.name)
    after = "rl" if "rl" in runs else ("sft" if "sft" in runs else None)
    example_lines: list[str] = []
    if base and after and cfg.report.examples:
        pairs = choose_examples(runs[base]["rows"], runs[after]["rows"], cfg.report.examples)
        before_label, after_label = f"before: {labels[base]}", f"after: {labels[after]}"
        (out / "examples.html").write_text(examples_html(pairs, before_label, after_label), encoding="utf-8")
        for b, a in pairs:
            example_lines += _example_text(b, a, before_label, after_label)

    times = _stage_times(ctx)
    n_eval = max(n.values()) if n else 0
    md = [f"# r3rag quickstart ({cfg.preset} preset)", "",
          f"World seed {cfg.world.seed}, size {cfg.world.size}; {n_eval} held-out {cfg.eval.split} questions that no "
          f"stage trained on{_skip_note(cfg)}. Cells: mean [95% bootstrap interval], {B} resamples.", ""]
    if cfg.report.fast_note:
        md += [f"**Fast preset:** only {n_eval} held-out questions, so every interval is wider than the full "
               "preset's (about sqrt(300/n) times); use the full preset for the published figures.", ""]
    md += [table, ""]
    if other_lines:
        md += ["Other prompted runs of the base model:", "", *other_lines, ""]
    if diff_table:
        md += ["Paired differences (same questions; * = the 95% interval excludes zero):", "", diff_table, ""]
    if claims:
        md += ["## Learning claims", "", *[f"- {c['text']}" for c in claims], ""]
    md += rl_lines
    md += by_type_lines({labels[name]: runs[name]["rows"] for name in models})
    md += evidence_lines({labels[name]: runs[name]["rows"] for name in models if name != base})
    if times:
        md += _time_lines(times, cfg.report.budget_min)
    if curves:
        md += ["## RL curves", "", *[f"![RL curves]({c})" for c in curves], ""]
    if example_lines:
        md += ["## Examples: the same questions before and after training", "",
               "Rendered as the demo renders them in [examples.html](examples.html).", "", *example_lines, ""]
    if after:
        ckpt = runs[after]["model"]
        md += ["## Try the trained model in the demo", "", "```bash", f"bash startup/server.sh --index {ctx.work / 'index'}",
               f"bash startup/startup_visualize.sh --model {ckpt} --dataset {ctx.work / 'world' / (cfg.eval.split + '.jsonl')}",
               "bash startup/server.sh --stop", "```", ""]
    text = "\n".join(md)
    (out / "quickstart.md").write_text(text, encoding="utf-8")
    with (out / "table.csv").open("w", newline="", encoding="utf-8") as fh:
        if csv_rows:
            w = csv.DictWriter(fh, fieldnames=list(csv_rows[0]))
            w.writeheader()
            w.writerows(csv_rows)
    atomic_write_json(out / "paired.json", paired)
    atomic_write_json(out / "claims.json", claims)
    if rl_effects:
        atomic_write_json(out / "rl_effects.json", {**rl_effects, "reward_check": rl_summary.get("reward_check")})
    total_s = sum(t for _, t, _, _ in times)
    return {"table": table, "diff_table": diff_table, "total_s": total_s, "claims": claims, "paired": paired, "others": other_lines,
            "times": times, "markdown": text, "n": n_eval, "checkpoint": runs[after]["model"] if after else None}
