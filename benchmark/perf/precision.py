"""bf16 against float32 on this machine: one matrix product, timed in both, as a ratio.

The one precision rule (``r3rag/precision.py``) picks bf16 only where the CPU has native bf16
arithmetic (``avx512_bf16`` / ``amx_bf16``) or the GPU has it. This measures the fact the rule rests
on, on the machine at hand: an ``M x K @ K x N`` product (default 2048 x 576 @ 576 x 1536,
SmolLM2-135M's MLP up-projection over 2,048 tokens) in float32 and in bfloat16, interleaved,
``--repeats`` rounds, the median of each. The baseline is float32 in the same run; the printed
ratio is float32 time / bf16 time (above 1: bf16 faster). The last line is a one-line JSON summary
with the CPU's name and class and what ``auto`` picks here.

    python benchmark/perf/precision.py                       # this CPU, torch's threads
    python benchmark/perf/precision.py --threads 1 --repeats 30
    python benchmark/perf/precision.py --device cuda --m 8192 --k 4096 --n 4096
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from r3rag.cli import ArgumentParser, run_main  # noqa: E402


def time_matmul(a, b, repeats: int, sync) -> float:
    """Milliseconds of one ``a @ b`` (the median of ``repeats``, after one warm-up)."""
    a @ b
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--m", type=int, default=2048, help="rows of the left matrix (tokens) (default: %(default)s)")
    p.add_argument("--k", type=int, default=576, help="inner dimension (hidden size) (default: %(default)s)")
    p.add_argument("--n", type=int, default=1536, help="columns of the right matrix (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=15, help="timed products per dtype, interleaved (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N (default: %(default)s)")
    a = p.parse_args(argv)
    import torch

    from r3rag.machine import cpu_class, cpu_flags, cpu_name
    from r3rag.precision import choose_precision

    if a.threads:
        torch.set_num_threads(a.threads)
    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(a.m, a.k, generator=g).to(a.device)
    w = torch.randn(a.k, a.n, generator=g).to(a.device)
    pairs = {"float32": (x, w), "bfloat16": (x.bfloat16(), w.bfloat16())}
    ms: dict[str, list[float]] = {name: [] for name in pairs}
    for _ in range(a.repeats):  # interleaved, so a change of load hits both alike
        for name, (l, r) in pairs.items():
            ms[name].append(time_matmul(l, r, 1, sync))
    f32, b16 = statistics.median(ms["float32"]), statistics.median(ms["bfloat16"])
    auto = choose_precision("auto", a.device)
    out = {"device": a.device, "machine": auto.machine, "cpu": cpu_name(), "cpu_class": cpu_class(cpu_flags()),
           "threads": torch.get_num_threads(), "shape": [a.m, a.k, a.n], "repeats": a.repeats,
           "float32_ms": round(f32, 2), "bfloat16_ms": round(b16, 2), "bf16_speedup": round(f32 / b16, 2),
           "auto_picks": auto.name}
    verdict = f"{f32 / b16:.2f}x faster" if f32 >= b16 else f"{b16 / f32:.2f}x slower"
    print(f"{a.m}x{a.k} @ {a.k}x{a.n} on {auto.machine}: float32 {f32:.1f} ms, bfloat16 {b16:.1f} ms -> "
          f"bf16 {verdict} than float32; auto picks {auto.name} here")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    run_main(main)
