"""Put finished runs side by side: ``evaluate.py compare RUN_DIR... --out DIR``.

Reads each run's ``results.json`` and writes one Markdown table (``compare.md``, also printed),
one CSV (``compare.csv``) and one figure (``compare.png``): the headline metrics as grouped bars
with their 95% intervals, and each run's accuracy-if-cut-after-k-steps curve.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from r3rag.errors import DataError
from r3rag.evaluation.report import LABELS, _pyplot, csv_rows, headline_metrics, results_table, write_csv


def load_results(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / "results.json"
    if not path.is_file():
        raise DataError(f"{path}: no results.json (not a finished run folder?)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise DataError(f"{path}: not valid JSON ({err.msg})") from None
    if not isinstance(data, dict) or "metrics" not in data:
        raise DataError(f"{path}: not an evaluation results file")
    if data.get("complete") is False:
        raise DataError(f"{path}: an incomplete run ({data['n_questions'] - data['n']} of {data['n_questions']} "
                        "questions not evaluated because a service failed); rerun it to retry them, then compare")
    return data


def run_label(r: dict[str, Any]) -> str:
    model = Path(str(r["model"])).name or str(r["model"])
    return f"{r['method']} / {r['dataset']}" + ("" if model in (r["method"], "oracle") else f" / {model}")


def plot_compare(path: Path, results: Sequence[dict[str, Any]]) -> None:
    plt = _pyplot()
    metrics = headline_metrics(results)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / max(len(results), 1)
    for i, r in enumerate(results):
        xs = [j + i * width for j in range(len(metrics))]
        vals = [r["metrics"][m] for m in metrics]
        cis = [r.get("ci95", {}).get(m) for m in metrics]
        err = [[v - (c[0] if c else v) for v, c in zip(vals, cis)], [(c[1] if c else v) - v for v, c in zip(vals, cis)]]
        ax.bar(xs, vals, width, yerr=err, capsize=3, label=run_label(r))
        steps = r.get("accuracy_by_steps", {})
        if steps.get("k"):
            ax2.plot(steps["k"], steps["cover_em"], marker="o", label=run_label(r))
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(metrics))])
    ax.set_xticklabels([LABELS[m] for m in metrics], rotation=15)
    ax.set(ylabel="%", title="headline metrics (95% CI)")
    ax2.set(xlabel="steps allowed (k)", ylabel="cover-EM if cut after k steps (%)", title="accuracy against steps")
    ax2.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def compare_runs(run_dirs: Sequence[str | Path], out: str | Path | None = None) -> str:
    """The Markdown table of ``run_dirs``; with ``out``, also compare.md/.csv/.png there."""
    if not run_dirs:
        raise DataError("compare: give at least one run folder")
    results = [load_results(d) for d in run_dirs]
    table = results_table(results)
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "compare.md").write_text(table + "\n", encoding="utf-8")
        write_csv(out / "compare.csv", csv_rows(results))
        plot_compare(out / "compare.png", results)
    return table
