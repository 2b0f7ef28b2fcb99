"""What one RL iteration of N trajectories costs outside the model's arithmetic: the cost model
behind ``benchmark/gpu_checks.sh``'s batch size.

On a GPU, SmolLM2-135M's arithmetic for one decode step is small next to what the host does around
it (the backend's Python per step and per row, the transfer of the chosen tokens, the reward, the
batch building), and that host work does not get faster on a GPU. A tiny random model on this CPU
has the same shape: its forward is cheap, so what is left is the host's share. For each N
(``--trajectories``, ``N / rollout.n_samples`` prompts) the benchmark builds a trainer from the
shipped RL config (``configs/rl/world_sft_grpo.yaml``: its turn and total token budgets, group
normalisation) on the tiny model and the small world, runs one real iteration (rollout, rewards,
update; dynamic filtering off so the update sees every row) under
:class:`r3rag.evaluation.profile.ForwardTimer`, and reports:

- decode steps and rows per step, the forward time and the rest of generation (the host: ``host_s``),
- ``host_ms_per_step`` and its linear fit ``a + b * rows`` over the N measured,
- the update's time, and the whole iteration's.

With the fit, the GPU cost of an iteration is ``steps x (a + b x rows + g(rows))`` for generation,
``g`` the GPU's own time per decode step (docs/results/gpu_checks.md works it out), plus the update.

    python benchmark/perf/rl_iteration_cost.py --trajectories 8,32,128,512
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from r3rag.cli import ArgumentParser, run_main  # noqa: E402
from r3rag.machine import cpu_name  # noqa: E402


def one_iteration(cfg, out: Path) -> dict:
    from r3rag.evaluation.profile import ForwardTimer
    from r3rag.train.rl.loop import RLTrainer

    trainer = RLTrainer(cfg, out)
    trainer._build()
    t0 = time.perf_counter()
    with ForwardTimer(trainer.backend.model) as timer:
        rec = trainer.iteration(0)
    wall = time.perf_counter() - t0
    fw = timer.summary()
    gen = float(rec["time/generate"])
    host = max(0.0, gen - fw["forward_s"])
    steps = fw["decode_steps"]
    return {"trajectories": int(rec["batch/trajectories"]), "iteration_s": round(wall, 2), "generate_s": round(gen, 2),
            "forward_s": fw["forward_s"], "host_s": round(host, 2), "decode_steps": steps, "rows_per_step": fw["decode_rows_mean"],
            "prefill_calls": fw["prefill_calls"], "host_ms_per_step": round(1000 * host / steps, 3) if steps else None,
            "generated_tokens_per_trajectory": round(float(rec.get("rollout/generated_tokens", 0.0)), 1),
            "update_s": round(float(rec.get("time/update", 0.0)) + float(rec.get("time/forward", 0.0)), 2),
            "reward_s": round(float(rec.get("time/reward", 0.0)), 3)}


def linear_fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares ``y = a + b x``."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - b * mx, b


def main() -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "configs/rl/world_sft_grpo.yaml"), help="RL config (default: %(default)s)")
    p.add_argument("--trajectories", default="8,32,128,512", help="comma-separated N per iteration (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="more RL config overrides (repeatable)")
    args = p.parse_args()
    sizes = [int(x) for x in args.trajectories.split(",") if x.strip()]

    import torch

    from r3rag.config import load_config
    from r3rag.testing.rl_bench import trainer_overrides
    from r3rag.train.rl.config import RLConfig

    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="r3rag-perf-rliter-"))
    _, common = trainer_overrides("unused", None, args.threads, True, tmp, tmp / "world")
    common = [c for c in common if not c.startswith(("rollout.max_new_tokens", "rollout.max_turn_tokens", "rollout.max_steps"))]
    rows = []
    for n in sizes:
        base = load_config(RLConfig, args.config, common).check()
        q = max(1, n // base.rollout.n_samples)
        cfg = load_config(RLConfig, args.config, [*common, f"train.questions_per_iter={q}", f"model.max_batch_size={n}",
                                                  "algo.dynamic_filtering=false", "model.compute_dtype=float32",
                                                  "model.rollout_weights=shared", *args.overrides]).check()
        r = one_iteration(cfg, tmp / f"n{n}")
        rows.append(r)
        print(f"N={r['trajectories']:>4}: iteration {r['iteration_s']} s (generate {r['generate_s']} s: forward "
              f"{r['forward_s']} s, host {r['host_s']} s over {r['decode_steps']} decode steps of {r['rows_per_step']} rows "
              f"= {r['host_ms_per_step']} ms/step; update {r['update_s']} s)", flush=True)
    pts = [(r["rows_per_step"], r["host_ms_per_step"]) for r in rows if r["host_ms_per_step"] is not None]
    a, b = linear_fit([x for x, _ in pts], [y for _, y in pts]) if len(pts) >= 2 else (float("nan"), float("nan"))
    print(f"host ms per decode step ~ {a:.3f} + {b:.4f} x rows (fit over {len(pts)} sizes)")
    print(json.dumps({"benchmark": "rl_iteration_cost", "cpu": cpu_name(), "cores": os.cpu_count(), "threads": args.threads,
                      "host_ms_per_step_fit": {"a_ms": round(a, 4), "b_ms_per_row": round(b, 5)}, "runs": rows}))
    return 0


if __name__ == "__main__":
    run_main(main)
