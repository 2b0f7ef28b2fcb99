"""One evaluation run as one process with T threads, or as W shard processes with T/W threads each.

The quickstart's evaluation stage can split each run over ``eval.workers`` processes
(:func:`r3rag.pipeline.stages.run_sharded_evaluation`): process ``i`` evaluates the questions at
positions ``p % W == i`` with ``benchmark/evaluate.py run --shard i/W`` and the shards are merged.
This benchmark times both ways on the same questions, checkpoint and settings (the quickstart's
trained-model settings: greedy, plain step prompt, ``max_steps 5``, ``max_turn_tokens 80``,
``doc_max_chars 512``, batch 64), model loading included, in alternating order over ``--repeats``
(ABBA...: drift on a noisy machine falls on both), and reports the ratio of the wall times and
whether the merged predictions equal the single process's.

    python benchmark/perf/eval_workers.py --quick
    python benchmark/perf/eval_workers.py --model WORK/sft --world-dir WORK/world --questions 300

The retrieval service runs in this process (retrieval is under 1% of a trained model's
evaluation: docs/results/quickstart.md). The last line is a one-line JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from r3rag.cli import ArgumentParser, run_main  # noqa: E402
from r3rag.machine import cpu_name  # noqa: E402


def run_config(base: list[str], out: Path, workers: int, threads: int, extra_env: dict[str, str] | None = None) -> float:
    """Wall seconds of one configuration: ``workers`` processes of ``threads // workers`` threads."""
    per = max(1, threads // workers)
    env = {**os.environ, "OMP_NUM_THREADS": str(per), "MKL_NUM_THREADS": str(per), "TOKENIZERS_PARALLELISM": "false", **(extra_env or {})}
    dirs = [out] if workers == 1 else [out / f"shard-{i}" for i in range(workers)]
    t0 = time.perf_counter()
    procs = [subprocess.Popen([*base, "--out", str(d), *(["--shard", f"{i}/{workers}"] if workers > 1 else [])],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for i, d in enumerate(dirs)]
    errors = [p.communicate()[1] for p in procs]
    wall = time.perf_counter() - t0
    for p, err in zip(procs, errors):
        if p.returncode != 0:
            raise SystemExit(f"evaluate.py failed (status {p.returncode}):\n{err[-2000:]}")
    if workers > 1:
        from r3rag.evaluation.merge import merge_runs

        merge_runs(dirs, out / "merged")
    return wall


def predictions(out: Path) -> list[tuple[str, str]]:
    from r3rag.evaluation.predictions import load_rows

    d = out / "merged" if (out / "merged").is_dir() else out
    return [(r["id"], r["prediction"]) for r in sorted(load_rows(d / "predictions.jsonl"), key=lambda r: r["index"])]


def em(out: Path) -> float:
    d = out / "merged" if (out / "merged").is_dir() else out
    return float(json.loads((d / "results.json").read_text())["metrics"]["em"])


def main() -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny random model, tiny world, 8 questions (seconds)")
    p.add_argument("--model", default=None, help="trained checkpoint folder (required unless --quick)")
    p.add_argument("--world-dir", default=None, help="the world the checkpoint was trained on (default: runs/world-SIZE)")
    p.add_argument("--world-size", default="medium", help="world size when --world-dir is not given (default: %(default)s)")
    p.add_argument("--questions", type=int, default=128, help="first N dev questions (default: %(default)s)")
    p.add_argument("--workers", type=int, default=2, help="shard processes of the second configuration (default: %(default)s)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                   help="torch threads in all, per configuration (default: this machine's cores, %(default)s)")
    p.add_argument("--batch", type=int, default=64, help="questions per engine call and rows per pass (default: %(default)s)")
    p.add_argument("--dtype", default="auto", help="model dtype: auto (as the quickstart) | float32 | bfloat16")
    p.add_argument("--repeats", type=int, default=1, help="runs of each configuration, order alternating (default: %(default)s)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="more evaluation overrides for both configurations")
    args = p.parse_args()
    if not args.quick and not args.model:
        p.error("--model is required (a trained checkpoint), or --quick")

    from r3rag.evaluation.components import world_index
    from r3rag.evaluation.datasets import ensure_world
    from r3rag.pipeline.stages import eval_dtype
    from r3rag.retrieval.service import serve_in_thread

    tmp = Path(tempfile.mkdtemp(prefix="r3rag-perf-workers-"))
    model, n_q, size = args.model, args.questions, args.world_size
    if args.quick:
        from r3rag.testing.tiny_models import save_tiny_model

        model, n_q, size = str(save_tiny_model(tmp / "tiny")), 8, "small"
    world = ensure_world(Path(args.world_dir) if args.world_dir else (tmp / "world" if args.quick else Path("runs") / f"world-{size}"),
                         size=size)
    dtype = eval_dtype(args.dtype)
    handle = serve_in_thread([world_index(world)], bm25_backend="numpy")
    try:
        base = [sys.executable, str(ROOT / "benchmark" / "evaluate.py"), "run", "--config", str(ROOT / "configs/evaluate/embedded-cpu.yaml"),
                "--no-progress", "--limit", str(n_q), "--batch-size", str(args.batch), "--retriever-url", handle.url]
        for kv in (f"dataset.world_dir={world}", f"dataset.world_size={size}", "dataset.split=dev", f"model.path={model}",
                   f"model.max_batch_size={args.batch}", f"model.dtype={dtype}", "rollout.prompt_variant=standard",
                   "rollout.max_steps=5", "rollout.max_turn_tokens=80", "rollout.doc_max_chars=512", "run.bootstrap=0",
                   *args.overrides):
            base += ["--set", kv]
        configs = {"one": 1, "sharded": args.workers}
        walls: dict[str, list[float]] = {k: [] for k in configs}
        outs: dict[str, Path] = {}
        for r in range(args.repeats):
            order = list(configs) if r % 2 == 0 else list(reversed(configs))
            for name in order:
                out = tmp / f"{name}-{r}"
                walls[name].append(run_config(base, out, configs[name], args.threads))
                outs[name] = out
                print(f"repeat {r}: {name:<8} ({configs[name]} x {max(1, args.threads // configs[name])} threads) "
                      f"{walls[name][-1]:.1f} s, EM {em(out):.1f}", flush=True)
    finally:
        handle.stop()
    one, sharded = (sum(walls[k]) / len(walls[k]) for k in ("one", "sharded"))
    p1, p2 = predictions(outs["one"]), predictions(outs["sharded"])
    same = p1 == p2
    differ = sum(a != b for a, b in zip(p1, p2))  # in bf16 a row's numbers depend on the rows batched with it
    print(f"{n_q} questions: one process {one:.1f} s, {args.workers} shard processes {sharded:.1f} s: "
          f"{one / sharded:.2f}x; predictions that differ: {differ} of {len(p1)}")
    print(json.dumps({"benchmark": "eval_workers", "quick": args.quick, "model": Path(model).name, "questions": n_q,
                      "threads": args.threads, "workers": args.workers, "dtype": dtype, "batch": args.batch, "cpu": cpu_name(),
                      "wall_s": {k: [round(w, 1) for w in v] for k, v in walls.items()}, "speedup": round(one / sharded, 3),
                      "same_predictions": same, "differing_predictions": differ, "em": {k: em(o) for k, o in outs.items()}}))
    return 0


if __name__ == "__main__":
    run_main(main)
