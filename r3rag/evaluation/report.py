"""Reports of a run: a Markdown table, a CSV and PNG plots beside ``results.json``.

- ``report.md``: the headline table (metrics with 95% intervals), stop reasons, accuracy if cut
  after k steps, and the per-hop / per-type breakdowns;
- ``results.csv``: one row, one column per number;
- ``accuracy_by_steps.png``, ``retrievals_histogram.png``, ``accuracy_by_hops.png`` (when the
  dataset has hop counts), drawn with matplotlib's Agg backend (no display needed).

:func:`results_table` is shared with :mod:`r3rag.evaluation.compare`: any number of runs become
rows of one table.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Sequence

HEADLINE = ("em", "f1", "cover_em", "acc", "judge_acc", "rule_or_judge_acc")
LABELS = {
    "em": "EM", "f1": "F1", "cover_em": "cover-EM (ACC_R)", "acc": "acc (substring)",
    "judge_acc": "judge (ACC_L)", "rule_or_judge_acc": "rule-or-judge ACC",
}


def headline_metrics(results: Sequence[dict[str, Any]]) -> list[str]:
    return [m for m in HEADLINE if all(m in r.get("metrics", {}) for r in results)]


def _cell(r: dict[str, Any], m: str) -> str:
    value = r["metrics"][m]
    ci = r.get("ci95", {}).get(m)
    return f"{value:.1f} [{ci[0]:.1f}, {ci[1]:.1f}]" if ci else f"{value:.1f}"


def incomplete_note(r: dict[str, Any]) -> str | None:
    """One sentence when a service failed for some of the run's questions (``None`` when complete).

    >>> incomplete_note({"n": 1, "complete": False, "n_questions": 3, "failed": {"retrieval_failed": 2}, "not_attempted": 0})
    'INCOMPLETE: 2 of 3 questions not evaluated (retrieval_failed 2); the numbers cover the 1 scored question(s) only. Rerun the same command to retry them.'
    """
    if r.get("complete", True):
        return None
    parts = [f"{k} {v}" for k, v in r.get("failed", {}).items()]
    if r.get("not_attempted"):
        parts.append(f"not attempted {r['not_attempted']}")
    missing = r["n_questions"] - r["n"]
    return (f"INCOMPLETE: {missing} of {r['n_questions']} questions not evaluated ({', '.join(parts)}); the numbers "
            f"cover the {r['n']} scored question(s) only. Rerun the same command to retry them.")


def results_table(results: Sequence[dict[str, Any]]) -> str:
    """Markdown: one row per run (dataset, method, model), metrics with 95% bootstrap intervals
    (``n`` reads ``n of N`` when a service failed for some of the run's N questions)."""
    metrics = headline_metrics(results)
    head = ["dataset", "method", "model", "n", *(LABELS[m] for m in metrics), "retrievals/q", "tokens/q"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        n = str(r["n"]) if r.get("complete", True) else f"{r['n']} of {r['n_questions']}"
        cells = [r["dataset"], r["method"], Path(str(r["model"])).name or str(r["model"]), n,
                 *(_cell(r, m) for m in metrics), f"{r['avg_retrievals']:.2f}", f"{r['avg_generated_tokens']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def csv_rows(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in results:
        row: dict[str, Any] = {k: r[k] for k in ("dataset", "method", "model", "n")}
        if not r.get("complete", True):  # a service failed for some questions: counted apart, never scored
            row["n_questions"] = r["n_questions"]
            row.update({f"failed_{k}": v for k, v in r.get("failed", {}).items()})
            row["not_attempted"] = r.get("not_attempted", 0)
        for m, v in r["metrics"].items():
            row[m] = v
            ci = r.get("ci95", {}).get(m)
            row[f"{m}_ci_low"], row[f"{m}_ci_high"] = (ci if ci else (None, None))
        for k in ("answered", "avg_retrievals", "avg_generated_tokens", "avg_steps"):
            row[k] = r[k]
        for s, v in r["stop_reasons"].items():
            row[f"stop_{s}"] = v
        out.append(row)
    return out


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    fields: list[str] = []
    for row in rows:
        fields.extend(k for k in row if k not in fields)
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)


def _breakdown_table(title: str, column: str, groups: dict[str, dict[str, Any]]) -> list[str]:
    if not groups:
        return []
    metrics = [m for m in HEADLINE if all(m in g for g in groups.values())]
    lines = [f"### {title}", "", "| " + " | ".join([column, "n", *(LABELS[m] for m in metrics)]) + " |",
             "|" + "---|" * (len(metrics) + 2)]
    for k, g in groups.items():
        lines.append("| " + " | ".join([k, str(g["n"]), *(f"{g[m]:.1f}" for m in metrics)]) + " |")
    return lines + [""]


def markdown_report(r: dict[str, Any]) -> str:
    note = incomplete_note(r)
    lines = [f"# {r['method']} on {r['dataset']}", "", *([f"**{note}**", ""] if note else []), results_table([r]), "",
             f"Answered: {r['answered']:.1f}% · steps/q {r['avg_steps']:.2f} · normaliser `{r['normalization']}` · "
             "intervals: 95% percentile bootstrap.", "", "### Stop reasons", "",
             "| reason | % |", "|---|---|"]
    lines += [f"| {s} | {v:.1f} |" for s, v in r["stop_reasons"].items()]
    steps = r["accuracy_by_steps"]
    if steps.get("k"):
        lines += ["", "### Accuracy if cut after k steps", "",
                  "| k | " + " | ".join(LABELS[m] for m in ("em", "f1", "cover_em", "acc")) + " |",
                  "|---|---|---|---|---|"]
        for i, k in enumerate(steps["k"]):
            lines.append(f"| {k} | " + " | ".join(f"{steps[m][i]:.1f}" for m in ("em", "f1", "cover_em", "acc")) + " |")
    lines.append("")
    lines += _breakdown_table("By hop count", "hops", r.get("by_hops", {}))
    lines += _breakdown_table("By question type", "type", r.get("by_type", {}))
    return "\n".join(lines)


def _pyplot():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_run(out: Path, r: dict[str, Any]) -> list[Path]:
    plt = _pyplot()
    written = []
    steps = r["accuracy_by_steps"]
    if steps.get("k"):
        fig, ax = plt.subplots(figsize=(5, 3.5))
        for m in ("cover_em", "em", "f1"):
            ax.plot(steps["k"], steps[m], marker="o", label=LABELS[m])
        ax.set(xlabel="steps allowed (k)", ylabel="score if cut after k steps (%)", title=f"{r['method']} on {r['dataset']}")
        ax.set_xticks(steps["k"])
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "accuracy_by_steps.png", dpi=110)
        plt.close(fig)
        written.append(out / "accuracy_by_steps.png")
    hist = r["retrievals_histogram"]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.bar([int(k) for k in hist], list(hist.values()))
    ax.set(xlabel="retrievals per question", ylabel="questions", title=f"{r['method']} on {r['dataset']}")
    fig.tight_layout()
    fig.savefig(out / "retrievals_histogram.png", dpi=110)
    plt.close(fig)
    written.append(out / "retrievals_histogram.png")
    hops = r.get("by_hops") or {}
    if hops:
        fig, ax = plt.subplots(figsize=(5, 3.5))
        keys = list(hops)
        ax.bar(keys, [hops[k]["cover_em"] for k in keys])
        ax.set(xlabel="hops", ylabel="cover-EM (%)", title=f"{r['method']} on {r['dataset']}: by hop count")
        fig.tight_layout()
        fig.savefig(out / "accuracy_by_hops.png", dpi=110)
        plt.close(fig)
        written.append(out / "accuracy_by_hops.png")
    return written


def write_report(out: str | Path, results: dict[str, Any]) -> list[Path]:
    """Write report.md, results.csv and the plots of one run into ``out``; returns the paths."""
    out = Path(out)
    if not results.get("n"):
        note = incomplete_note(results)
        if note is None:
            return []
        (out / "report.md").write_text(f"# {results['method']} on {results['dataset']}\n\n**{note}**\n", encoding="utf-8")
        return [out / "report.md"]
    (out / "report.md").write_text(markdown_report(results), encoding="utf-8")
    write_csv(out / "results.csv", csv_rows([results]))
    return [out / "report.md", out / "results.csv", *plot_run(out, results)]
