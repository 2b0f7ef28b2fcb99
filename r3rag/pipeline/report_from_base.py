"""The report of RL from the prompted base (``python -m r3rag.quickstart --preset from-base``).

R1-Searcher's thesis is that a model learns to call a search tool from reward alone, with no
cold start. In miniature: the prompted SmolLM2 (the base) and the same model after RL
(``rl.start: base``, no cold start, no SFT) answer the same held-out questions in the same format
and prompt, and this report says, each figure paired question by question against the base with
its 95% bootstrap interval (:func:`r3rag.evaluation.paired.paired_values`):

- **format-valid answers**: the share of questions whose trajectory ended with a final answer and
  broke no rule of its format (:func:`format_valid`: the format's own rule checker, the one the
  rewards use, with ``require_answer``, so that a chain cut off by its step budget is not valid);
- **retrievals per question, by hop count** (``metadata.hops`` of the world's questions): does
  the model search more where the question needs more facts;
- **EM** (and F1, cover-EM), the rule metrics of the evaluation.

Then the claims, checked on every run:

- *format-valid answers at least doubled, with the paired interval above zero* (the target):
  RL's rate at least twice the base's (any rise when the base never managed one) and the 95%
  interval of RL - base above zero;
- *EM up, with the paired interval above zero* (the moonshot for a 135M model; reported, not
  required by ``--require-claims``);
- *still searching*: retrievals per question not significantly below the base's (the paired
  interval of RL - base reaches zero or above). Reported, not required. It guards the other two:
  stage 2 pays only the answer and the format, so a policy can raise both by answering at once
  and never calling the tool, which is the opposite of R1-Searcher's thesis. When it fails, the
  format and EM gains came without search.

Written to ``WORK/report``: ``quickstart.md`` (these sections first, then the quickstart's usual
table, EM by question type, times and examples from :mod:`r3rag.pipeline.report`),
``from_base.json`` (every figure) and ``claims.json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from r3rag.errors import ConfigError
from r3rag.evaluation.paired import paired_values
from r3rag.fileio import atomic_write_json
from r3rag.pipeline.runner import Context

#: "format-valid answers at least doubled": RL's rate over the base's
FORMAT_RATIO_TARGET = 2.0


def format_valid(row: dict[str, Any]) -> float:
    """1.0 when the prediction row's trajectory ended with an answer and broke no rule of its
    format (the rewards' checker, :func:`r3rag.rewards.format.format_violations`, with
    ``require_answer``); else 0.0. A run in a method without a registered trajectory format (standard
    RAG, direct) has no format to follow: a one-line error."""
    from r3rag.rewards.format import FormatConfig, format_violations
    from r3rag.rollout.trajectory import Trajectory

    if row.get("stop_reason") != "answered":
        return 0.0
    traj = Trajectory.from_dict(row["trajectory"])
    try:
        broken = format_violations(traj, FormatConfig(require_answer=True))
    except ValueError as err:
        raise ConfigError(f"the from-base report needs runs in a step format (eval.trained_method): {err}") from None
    return 0.0 if broken else 1.0


def _hops(row: dict[str, Any]) -> int | None:
    h = (row.get("metadata") or {}).get("hops")
    return int(h) if isinstance(h, (int, float)) else None


def _mean_ci(values: np.ndarray, resamples: int, seed: int) -> dict[str, Any]:
    """The mean of ``values`` with its percentile bootstrap interval (as the paired differences)."""
    zeros = np.zeros_like(values)
    d = paired_values(zeros, values, resamples, seed)  # B - 0 = B: the same resampled questions as every diff
    return {"mean": d["diff"], "ci95": d["ci95"]}


def compare(base_rows: Sequence[dict[str, Any]], rl_rows: Sequence[dict[str, Any]], resamples: int = 1000,
            seed: int = 0) -> dict[str, Any]:
    """Every figure of the report for two runs on the same questions (matched by id, base's order).

    ``{"n", "metrics": {name: {"base", "rl", "diff"}}, "by_hops": {hops: {"n", "base", "rl", "diff"}},
    "format_ratio"}``; each ``base``/``rl`` is ``{"mean", "ci95"}`` and each ``diff`` the paired
    ``{"diff", "ci95", "excludes_zero", "n"}``. Percentages for rates and metrics, counts for
    retrievals.

    >>> def row(i, em, retrievals):
    ...     return {"id": str(i), "scores": {"em": em, "f1": em, "cover_em": em}, "num_retrievals": retrievals,
    ...             "stop_reason": "format_error", "metadata": {"hops": 1 + i % 2}}
    >>> c = compare([row(i, 0.0, 0) for i in range(4)], [row(i, 1.0, 1 + i % 2) for i in range(4)], 200)
    >>> c["metrics"]["em"]["diff"]["diff"], c["by_hops"][1]["n"], c["by_hops"][2]["rl"]["mean"]
    (100.0, 2, 2.0)
    """
    by_id = {str(r["id"]): r for r in rl_rows}
    pairs = [(b, by_id[str(b["id"])]) for b in base_rows if str(b["id"]) in by_id]
    if not pairs:
        raise ConfigError("the from-base report: the base and RL runs share no question")
    readers = {
        "format_valid": lambda r: 100.0 * format_valid(r),
        "answered": lambda r: 100.0 * (r.get("stop_reason") == "answered"),
        "em": lambda r: 100.0 * float(r["scores"]["em"]),
        "f1": lambda r: 100.0 * float(r["scores"]["f1"]),
        "cover_em": lambda r: 100.0 * float(r["scores"]["cover_em"]),
        "retrievals": lambda r: float(r.get("num_retrievals") or 0),
    }
    metrics = {}
    for name, read in readers.items():
        a = np.array([read(b) for b, _ in pairs])
        b = np.array([read(r) for _, r in pairs])
        metrics[name] = {"base": _mean_ci(a, resamples, seed), "rl": _mean_ci(b, resamples, seed),
                         "diff": paired_values(a, b, resamples, seed)}
    by_hops = {}
    for h in sorted({_hops(b) for b, _ in pairs} - {None}):
        sub = [(b, r) for b, r in pairs if _hops(b) == h]
        a = np.array([readers["retrievals"](b) for b, _ in sub])
        b = np.array([readers["retrievals"](r) for _, r in sub])
        by_hops[h] = {"n": len(sub), "base": _mean_ci(a, resamples, seed), "rl": _mean_ci(b, resamples, seed),
                      "diff": paired_values(a, b, resamples, seed)}
    fv = metrics["format_valid"]
    base_rate, rl_rate = fv["base"]["mean"], fv["rl"]["mean"]
    ratio = rl_rate / base_rate if base_rate > 0 else (float("inf") if rl_rate > 0 else None)
    return {"n": len(pairs), "metrics": metrics, "by_hops": by_hops, "format_ratio": ratio}


def claims(c: dict[str, Any]) -> list[dict[str, Any]]:
    """The three claims from :func:`compare`'s figures; ``required`` says whether ``--require-claims``
    needs it (the EM claim is the moonshot and the search claim a guard: reported, not required)."""
    fv = c["metrics"]["format_valid"]
    d, (lo, hi) = fv["diff"]["diff"], fv["diff"]["ci95"]
    base_rate, rl_rate, ratio = fv["base"]["mean"], fv["rl"]["mean"], c["format_ratio"]
    doubled = rl_rate >= FORMAT_RATIO_TARGET * base_rate and rl_rate > 0
    holds = doubled and lo > 0
    if holds:
        verdict = "yes"
    elif lo > 0:
        verdict = f"no: up, but less than x{FORMAT_RATIO_TARGET:g}"
    else:
        verdict = "no: the interval includes zero" if hi >= 0 else "no: fewer than before"
    times = "n/a" if ratio is None else ("from none" if ratio == float("inf") else f"x{ratio:.2f}")
    fv_text = (f"Format-valid answers at least doubled by RL from the prompted base: {verdict} ({base_rate:.1f}% -> "
               f"{rl_rate:.1f}%, {times}; paired difference {d:+.1f} points, 95% CI [{lo:+.1f}, {hi:+.1f}], n={fv['diff']['n']})")
    em = c["metrics"]["em"]["diff"]
    elo, ehi = em["ci95"]
    everdict = "yes" if elo > 0 else ("no: the interval includes zero" if ehi >= 0 else "no: it is lower")
    em_text = (f"EM up after RL from the prompted base (the moonshot): {everdict} (EM {em['diff']:+.1f}, "
               f"paired 95% CI [{elo:+.1f}, {ehi:+.1f}], n={em['n']})")
    return [
        {"name": "format_valid_doubled", "holds": holds, "required": True, "diff": d, "ci95": [lo, hi],
         "ratio": ratio, "text": fv_text},
        {"name": "em_up", "holds": elo > 0, "required": False, "diff": em["diff"], "ci95": [elo, ehi], "text": em_text},
        _search_claim(c["metrics"]["retrievals"]),
    ]


def _search_claim(r: dict[str, Any]) -> dict[str, Any]:
    """Still searching: RL's retrievals per question not significantly below the base's."""
    d, (lo, hi) = r["diff"]["diff"], r["diff"]["ci95"]
    base, rl = r["base"]["mean"], r["rl"]["mean"]
    holds = hi >= 0
    if holds:
        verdict = "yes"
    elif rl == 0:
        verdict = "no: RL stopped calling the search tool, so its format and EM gains came without retrieval"
    else:
        verdict = "no: fewer searches than the base"
    text = (f"RL still searches as much as the prompted base: {verdict} (retrievals/q {base:.2f} -> {rl:.2f}, "
            f"paired difference {d:+.2f}, 95% CI [{lo:+.2f}, {hi:+.2f}], n={r['diff']['n']})")
    return {"name": "still_searches", "holds": holds, "required": False, "diff": d, "ci95": [lo, hi], "text": text}


def _cell(v: dict[str, Any], digits: int) -> str:
    lo, hi = v["ci95"]
    return f"{v['mean']:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def _diff_cell(v: dict[str, Any], digits: int) -> str:
    lo, hi = v["ci95"]
    return f"{v['diff']:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]" + (" *" if v["excludes_zero"] else "")


LABELS = {"format_valid": "format-valid answers %", "answered": "answered %", "em": "EM", "f1": "F1",
          "cover_em": "cover-EM", "retrievals": "retrievals/q"}


def tables(c: dict[str, Any]) -> tuple[str, str]:
    """The Markdown tables: the metrics, and retrievals per question by hop count."""
    lines = ["| metric | base (prompted) | RL from the base | RL - base (paired) |", "|---|---|---|---|"]
    for name, m in c["metrics"].items():
        digits = 2 if name == "retrievals" else 1
        lines.append(f"| {LABELS[name]} | {_cell(m['base'], digits)} | {_cell(m['rl'], digits)} | {_diff_cell(m['diff'], digits)} |")
    hops = ["| hops | n | base retrievals/q | RL retrievals/q | RL - base (paired) |", "|---|---|---|---|---|"]
    for h, m in c["by_hops"].items():
        hops.append(f"| {h} | {m['n']} | {_cell(m['base'], 2)} | {_cell(m['rl'], 2)} | {_diff_cell(m['diff'], 2)} |")
    return "\n".join(lines), "\n".join(hops) if c["by_hops"] else ""


def rl_schedule_lines(rl_dir: Path) -> list[str]:
    """One line per RL stage (R1-Searcher's stage 1 and 2 write ``WORK/rl/<stage>/``): iterations and
    the training reward at the first and the last iteration."""
    from r3rag.pipeline.checks import FILTERED_KEYS, REWARD_KEYS, read_jsonl

    def first(row: dict[str, Any], keys: Sequence[str]) -> float | None:
        return next((float(row[k]) for k in keys if isinstance(row.get(k), (int, float))), None)

    out = []
    for metrics in sorted(rl_dir.glob("**/metrics.jsonl")):
        rows = [r for r in read_jsonl(metrics) if r.get("kind", "train") == "train" and first(r, REWARD_KEYS) is not None]
        if not rows:
            continue
        rewards = [first(r, REWARD_KEYS) for r in rows]
        filtered = [f for f in (first(r, FILTERED_KEYS) for r in rows) if f is not None]
        name = metrics.parent.relative_to(rl_dir).as_posix() if metrics.parent != rl_dir else "rl"
        line = (f"- {name}: {len(rows)} iterations, training reward {rewards[0]:.3f} -> {rewards[-1]:.3f} "
                f"(mean of the last three {sum(rewards[-3:]) / len(rewards[-3:]):.3f})")  # type: ignore[arg-type]
        if filtered:
            line += f"; groups filtered out for want of signal: {100 * sum(filtered) / len(filtered):.0f}% on average"
            if all(f >= 1.0 - 1e-9 for f in filtered):
                line += " (every group, every iteration: no update was made)"
        out.append(line)
    return out


def pick_runs(runs: dict[str, dict[str, Any]], trained_method: str) -> tuple[str, str]:
    """``(base run, RL run)``: the prompted base in the method the RL model is evaluated in."""
    if "rl" not in runs:
        raise ConfigError("the from-base report needs the RL run: run --stages rl,eval,report")
    same = [n for n, r in runs.items() if r["role"] == "base" and r["method"] == trained_method]
    if not same:
        raise ConfigError(f"the from-base report compares RL with the prompted base in the same format: add "
                          f"{trained_method} to eval.base_methods")
    return same[0], "rl"


def write_report(ctx: Context) -> dict[str, Any]:
    """The quickstart's report (:func:`r3rag.pipeline.report.write_report`) with the from-base
    figures and claims in front; returns what the CLI prints."""
    from r3rag.pipeline.report import collect_runs, write_report as write_training_report

    cfg = ctx.cfg
    runs = collect_runs(ctx)
    if not runs:
        raise ConfigError(f"no evaluation runs in {ctx.work}: run --stages eval first")
    base, rl = pick_runs(runs, cfg.eval.trained_method)
    general = write_training_report(ctx)  # the usual table, by type, times, examples (no SFT claims: no SFT)
    c = compare(runs[base]["rows"], runs[rl]["rows"], cfg.report.bootstrap, cfg.report.seed)
    found = claims(c)
    table, hop_table = tables(c)
    skip = cfg.eval.skip
    where = f" (positions {skip + 1}-{skip + c['n']})" if skip else ""
    md = [f"# r3rag quickstart: RL from the prompted base ({cfg.preset} preset)", "",
          f"World seed {cfg.world.seed}, size {cfg.world.size}; {c['n']} held-out {cfg.eval.split} questions{where} that RL "
          f"never trained on. The base is the prompted model (`{cfg.model.base}`) in the `{runs[base]['method']}` format "
          f"(`rollout.prompt_variant={cfg.eval.base_prompt_variant}`); RL started from that same model with no cold start "
          f"and no SFT and is evaluated in the same format and prompt. Cells: mean [95% bootstrap interval], "
          f"{cfg.report.bootstrap} resamples; differences are paired by question (* = the interval excludes zero).", "",
          "A format-valid answer: the trajectory ended with a final answer and broke no rule of its format (the rules "
          "the rewards check).", "", table, ""]
    if hop_table:
        md += ["Retrievals per question by the question's hop count:", "", hop_table, ""]
    md += ["## Claims", "", *[f"- {x['text']}" for x in found], "",
           "The intervals resample the held-out questions, not the training run: judge the recipe on several world "
           "seeds (`--seed N --work DIR`).", ""]
    schedule = rl_schedule_lines(ctx.work / "rl")
    if schedule:
        md += ["## The RL stages", "", *schedule, ""]
    rest = general["markdown"].split("\n", 1)[1] if "\n" in general["markdown"] else ""
    md += ["## The quickstart's tables", "", rest.replace("\n## ", "\n### ")]
    text = "\n".join(md)
    out = ctx.work / "report"
    (out / "quickstart.md").write_text(text, encoding="utf-8")
    atomic_write_json(out / "from_base.json", {"base_run": base, "rl_run": rl, **{k: v for k, v in c.items()
                                                                                  if k != "format_ratio"},
                                               "format_ratio": None if c["format_ratio"] is None else
                                               (str(c["format_ratio"]) if c["format_ratio"] == float("inf") else c["format_ratio"])})
    atomic_write_json(out / "claims.json", found)
    hops = f"Retrievals per question by hop count:\n{hop_table}" if hop_table else ""
    return {**general, "table": table, "diff_table": hops, "claims": found, "markdown": text, "from_base": c}
