"""Cost of one batched decode step against batch size 1: where batching pays on a CPU.

For each batch size B (default 1, 8, 16, 32) a batch of B random contexts of ``--context`` tokens
(the first half of the rows left-padded by a quarter, as a real batch is) is prefilled, then
``--steps`` single-token decode steps are timed with the HF backend's reserved KV cache. Reported
per B: milliseconds per step and per token, and tokens per second relative to B = 1 in the same
run (``speedup_vs_b1``). Prefill is timed too (per token, B = 1 against the largest B), because
prefill is the part batching does not make cheaper on a compute-bound CPU.

The last line printed is a one-line JSON summary.

    python benchmark/perf/decode.py --quick        # tiny random model (seconds)
    python benchmark/perf/decode.py                # SmolLM2-135M, every core
    python benchmark/perf/decode.py --threads 1
    python benchmark/perf/decode.py --model runs/quickstart/sft --dtype bfloat16 --batches 32 --context 650 --profile 8

``--profile N`` also runs the largest batch's timed decode steps under ``torch.profiler`` and prints
the N operators with the most CPU time (where a decode step goes: attention kernel, matrix
products, cache copies).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from r3rag.cli import ArgumentParser, run_main  # noqa: E402


def main() -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny random model (seconds)")
    p.add_argument("--model", default="smollm2", help="model folder, .gguf or 'smollm2' (default: %(default)s)")
    p.add_argument("--batches", default="1,8,16,32", help="batch sizes, comma-separated (default: %(default)s)")
    p.add_argument("--context", type=int, default=400, help="context tokens per row (default: %(default)s)")
    p.add_argument("--steps", type=int, default=8, help="timed decode steps per batch size (default: %(default)s)")
    p.add_argument("--dtype", default="float32", help="model dtype: float32 | bfloat16 (default: %(default)s)")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="profile the largest batch's decode steps and print the top N operators by CPU time")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                   help="torch threads (default: the cores this process may use, %(default)s here)")
    args = p.parse_args()

    import torch

    from r3rag.rollout.backends.hf import _cache_of, _preallocate, load_model

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.quick:
        from r3rag.testing.tiny_models import build_tiny_model, build_tiny_tokenizer

        model, name = build_tiny_model(build_tiny_tokenizer()), "tiny"
        args.context, args.steps = min(args.context, 64), min(args.steps, 4)
    else:
        model, _ = load_model(args.model, dtype=args.dtype)
        name = Path(args.model).name
    vocab = model.config.vocab_size
    import inspect

    cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    batches = sorted({int(b) for b in args.batches.split(",")} | {1})
    rows: dict[int, dict[str, float]] = {}
    prefill: dict[int, float] = {}
    with torch.inference_mode():
        model(input_ids=torch.randint(0, vocab, (2, args.context)), logits_to_keep=1)  # warm-up
        for B in batches:
            ids = torch.randint(0, vocab, (B, args.context))  # (B, T)
            mask = torch.ones(B, args.context, dtype=torch.long)  # (B, T)
            mask[: B // 2, : args.context // 4] = 0  # half the rows left-padded
            t = time.perf_counter()
            out = model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1)
            prefill[B] = (time.perf_counter() - t) * 1000 / int(mask.sum())  # ms per real token
            past = _cache_of(out)
            _preallocate(past, args.steps + 2)
            nxt = torch.randint(0, vocab, (B, 1))  # (B, 1)
            pos = mask.sum(-1, keepdim=True)  # (B, 1): next position of each row

            def step() -> None:
                nonlocal past, mask, pos
                mask = torch.cat([mask, torch.ones(B, 1, dtype=torch.long)], dim=1)  # (B, T + 1)
                past = _cache_of(model(input_ids=nxt, attention_mask=mask, position_ids=pos, use_cache=True, **{cache_kw: past}))
                pos = pos + 1

            step()  # warm-up
            t = time.perf_counter()
            for _ in range(args.steps):
                step()
            ms = (time.perf_counter() - t) * 1000 / args.steps
            rows[B] = {"ms_per_step": round(ms, 2), "ms_per_token": round(ms / B, 2)}
            if args.profile and B == batches[-1]:
                from torch.profiler import ProfilerActivity, profile

                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    for _ in range(args.steps):
                        step()
                print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.profile))
    base = rows[1]["ms_per_token"]
    for B in batches:
        rows[B]["speedup_vs_b1"] = round(base / rows[B]["ms_per_token"], 2)
        print(f"B={B:>3}: decode {rows[B]['ms_per_step']:8.1f} ms/step {rows[B]['ms_per_token']:7.2f} ms/token "
              f"= {rows[B]['speedup_vs_b1']:.2f}x batch 1; prefill {prefill[B]:.2f} ms/token")
    big = batches[-1]
    print(json.dumps({
        "benchmark": "decode", "quick": args.quick, "model": name, "dtype": args.dtype, "threads": args.threads,
        "context": args.context, "steps": args.steps, "decode": {str(b): rows[b] for b in batches},
        "decode_speedup_largest_batch": rows[big]["speedup_vs_b1"],
        "prefill_ms_per_token": {"1": round(prefill[1], 2), str(big): round(prefill[big], 2)},
        "prefill_speedup_largest_batch": round(prefill[1] / prefill[big], 2),
    }))
    return 0


if __name__ == "__main__":
    run_main(main)
