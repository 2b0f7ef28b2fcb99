"""PNG curves of a run, drawn from ``metrics.jsonl`` at the end (``curves.png``).

One panel per quantity, each against training iterations: reward and its components, held-out
accuracy, KL, entropy, generated length, retrievals per trajectory, stop reasons, format-error
rate, filtered fraction, rollout/trainer log-prob mismatch, and time per phase.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from r3rag.train.rl.metrics import read_records

#: (panel title, key prefixes or exact keys drawn in it)
PANELS: list[tuple[str, list[str]]] = [
    ("reward (total and components)", ["reward/"]),
    ("held-out accuracy (%)", ["eval/em", "eval/f1", "eval/cover_em"]),
    ("KL to reference", ["kl/"]),
    ("entropy", ["policy/entropy"]),
    ("generated tokens per trajectory", ["rollout/generated_tokens"]),
    ("retrievals per trajectory", ["rollout/retrievals", "eval/avg_retrievals"]),
    ("stop reasons (fraction)", ["stop/"]),
    ("format-error rate", ["rollout/format_error_rate"]),
    ("filtered / dropped", ["batch/filtered_fraction", "batch/rejected_fraction", "batch/dropped_fraction", "batch/untrainable_fraction",
                            "batch/overlong_fraction"]),
    ("log-prob mismatch rollout vs trainer", ["policy/logprob_mismatch"]),
    ("time per phase (s)", ["time/"]),
    ("outside generation + forward/backward (fraction)", ["time/overhead_fraction"]),
    ("policy update", ["policy/clip_frac", "policy/grad_norm", "loss/"]),
]

_SKIP = ("reward/judge_missing", "reward/dropped")


def _series(records: Sequence[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for r in records:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            xs.append(float(r["step"]))
            ys.append(float(v))
    return xs, ys


def plot_curves(run_dir: str | Path, out: str | Path | None = None) -> Path | None:
    """Write ``curves.png`` in ``run_dir`` (or ``out``); None when there is nothing to draw."""
    records = read_records(Path(run_dir) / "metrics.jsonl")
    if not records:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    exact = {w for _, ws in PANELS for w in ws if not w.endswith("/")}
    keys: list[str] = []
    for r in records:
        keys.extend(k for k in r if k not in keys)
    cols = 3
    rows = (len(PANELS) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.2 * rows))
    for ax, (title, wanted) in zip(axes.flat, PANELS):
        drawn = 0
        for k in keys:
            if k in _SKIP or not any(k == w or (w.endswith("/") and k.startswith(w) and k not in exact) for w in wanted):
                continue
            xs, ys = _series(records, k)
            if xs:
                ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, ms=3, label=k)
                drawn += 1
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("iteration", fontsize=8)
        if drawn:
            ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(PANELS):]:
        ax.axis("off")
    fig.tight_layout()
    path = Path(out) if out else Path(run_dir) / "curves.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
