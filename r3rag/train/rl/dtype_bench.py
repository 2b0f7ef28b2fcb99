"""Measure one RL training step (forward + backward over a padded batch) in float32 and under
bfloat16 autocast, to choose ``model.compute_dtype`` on this machine.

    python -m r3rag.train.rl.dtype_bench --model smollm2 --rows 4 --tokens 512 --repeat 2
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def step_time(model, ids, mask, action, temps, dtype, repeat: int) -> float:
    from r3rag.train.rl.forward import policy_logprobs

    best = float("inf")
    for _ in range(repeat):
        model.zero_grad(set_to_none=True)
        t = time.perf_counter()
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            lp, _ = policy_logprobs(model, ids, mask, action, temps)
            loss = -(lp * action).sum() / action.sum()
        loss.backward()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--threads", type=int, default=None)
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    from r3rag.rollout.backends.hf import load_model
    from r3rag.train.rl.checkpoint import strip_quantizer

    model, _ = load_model(a.model)
    strip_quantizer(model)
    model.float().train()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, model.config.vocab_size, (a.rows, a.tokens), generator=g)
    mask = torch.ones_like(ids)
    action = torch.zeros(a.rows, a.tokens - 1)
    action[:, a.tokens // 2:] = 1  # the second half generated, as in a trajectory after its prompt
    temps = torch.ones(a.rows)
    from r3rag.machine import cpu_name
    from r3rag.precision import choose_precision

    out = {"cpu": cpu_name(), "auto": choose_precision("auto", "cpu").name, "threads": torch.get_num_threads(), "rows": a.rows, "tokens": a.tokens}
    for name, dt in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        out[f"{name}_s"] = round(step_time(model, ids, mask, action, temps, dt, a.repeat), 3)
    out["bf16_speedup"] = round(out["float32_s"] / out["bfloat16_s"], 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
