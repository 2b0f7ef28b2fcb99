"""The HF backend's choice of each decode step's tokens: batched against the per-row loop it replaced.

Each decode step turns the model's last logits into one token and its log-prob per row. The loop
this replaced did it row by row: a softmax per sampled row, its copy to the host, a draw, a
``float()`` per log-prob (on a GPU each waits for the device), and a decode of the row's last
tokens after every token to look for stop strings. The backend now does one softmax, one draw and
one transfer for the whole batch, and decodes a row's tail only after a token that can end a stop
string (``HFBackend._pick``, ``HFBackend._may_end_stop``). ``PerRow`` below is the old loop, kept
here as the baseline.

Two measurements, both as ratios against the baseline in the same run:

1. ``pick``: the token choice alone on random logits (SmolLM2's 49,152-token vocabulary), for
   each batch size in ``--rows``, sampled rows at temperature 1 (the RL rollout) and greedy rows
   (the evaluation): milliseconds per step, the median of ``--repeats`` interleaved rounds.
2. ``generate``: one rollout turn end to end (``generate_batch``), ``--requests`` prompts of about
   ``--context`` tokens, temperature 1 with per-request seeds, the step format's stop strings,
   ``--max-tokens`` new tokens: wall seconds, and whether both produced the very same tokens.

The last line printed is a one-line JSON summary.

    python benchmark/perf/pick.py --quick                                 # tiny random model (seconds)
    python benchmark/perf/pick.py --model runs/quickstart/sft --threads 2
    python benchmark/perf/pick.py --device cuda --rows 64,512 --requests 256
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from r3rag.cli import ArgumentParser, run_main  # noqa: E402
from r3rag.rollout.backends.hf import HFBackend  # noqa: E402
from r3rag.rollout.formats.r3rag_steps import R3RagStepsFormat  # noqa: E402

STOPS = list(R3RagStepsFormat.chat_stop)  # the step format's stop strings (chat mode)


class PerRow(HFBackend):
    """The loop ``_pick`` replaced: each row's softmax, top-p, draw and log-prob on its own, and
    every row's tail decoded after every token."""

    def _pick(self, logits, rows, reqs, toks, gens, finish):  # type: ignore[no-untyped-def]
        import torch

        logp = torch.log_softmax(logits, dim=-1)
        greedy = logits.argmax(dim=-1).tolist()
        out_tok, out_lp = [], []
        for j, b in enumerate(rows):
            if finish[b] is not None:
                out_tok.append(self.pad_id)
                out_lp.append(0.0)
                continue
            r, probs = reqs[b], None
            if r.params.temperature > 0:
                probs = torch.softmax(logits[j] / r.params.temperature, dim=-1).cpu()
                if r.params.top_p < 1.0:
                    probs = _top_p_row(probs, r.params.top_p)
            if r.forced_ids is not None:
                tok = r.forced_ids[len(toks[b])]
            elif probs is None:
                tok = greedy[j]
            else:
                cdf = torch.cumsum(probs, dim=0, dtype=torch.float64)
                u = torch.rand((), generator=gens[b], dtype=torch.float64)
                tok = int(torch.searchsorted(cdf, u * cdf[-1], right=True))
                tok = tok if tok < len(cdf) else int(torch.nonzero(probs)[-1])
            out_tok.append(tok)
            out_lp.append(float(logp[j, tok]) if probs is None else float(torch.log(probs[tok])))
        return out_tok, out_lp

    def _may_end_stop(self, tok, stops):  # type: ignore[no-untyped-def]
        return True


def _top_p_row(probs, top_p):  # type: ignore[no-untyped-def]
    import torch

    sorted_p, idx = torch.sort(probs, descending=True, stable=True)
    keep = torch.cumsum(sorted_p, dim=-1) - sorted_p < top_p
    keep[0] = True
    out = torch.zeros_like(probs)
    out[idx[keep]] = sorted_p[keep]
    return out / out.sum()


def time_pick(backend, rows: int, vocab: int, temperature: float, device: str, steps: int) -> float:
    """Milliseconds per step of ``backend._pick`` on ``rows`` random logit rows."""
    import torch

    from r3rag.rollout.backends.base import GenerationRequest, SamplingParams

    reqs = [GenerationRequest([1], "", SamplingParams(temperature=temperature, seed=i)) for i in range(rows)]
    gens = [torch.Generator().manual_seed(i) for i in range(rows)]
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0)).mul_(3).to(device)  # (rows, V)
    toks: list[list[int]] = [[] for _ in range(rows)]
    finish: list[str | None] = [None] * rows
    backend._pick(logits, list(range(rows)), reqs, toks, gens, finish)  # warm-up
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        backend._pick(logits, list(range(rows)), reqs, toks, gens, finish)
    _sync(device)
    return 1000 * (time.perf_counter() - t0) / steps


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main() -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny random model and few rows (seconds)")
    p.add_argument("--model", default="smollm2", help="model folder, .gguf or 'smollm2' (default: %(default)s)")
    p.add_argument("--device", default="cpu", help="cpu | cuda (default: %(default)s)")
    p.add_argument("--dtype", default="bfloat16", help="model dtype for the generate measurement (default: %(default)s)")
    p.add_argument("--rows", default="32,64,512", help="batch sizes of the pick measurement (default: %(default)s)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per pick measurement (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=5,
                   help="interleaved rounds of each pick measurement, median reported (default: %(default)s)")
    p.add_argument("--requests", type=int, default=32, help="prompts of the generate measurement (default: %(default)s)")
    p.add_argument("--context", type=int, default=400, help="prompt tokens per request (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=80, help="new tokens per request at most (default: %(default)s)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                   help="torch threads (default: the cores this process may use, %(default)s here)")
    args = p.parse_args()

    import torch

    from r3rag.rollout.backends.base import GenerationRequest, SamplingParams
    from r3rag.machine import cpu_name
    from r3rag.rollout.backends.hf import load_model

    torch.set_num_threads(args.threads)
    if args.quick:
        from r3rag.testing.tiny_models import build_tiny_model, build_tiny_tokenizer

        tok = build_tiny_tokenizer()
        model, name = build_tiny_model(tok), "tiny"
        args.rows, args.steps, args.repeats, args.requests, args.context, args.max_tokens = "4,16", 3, 1, 8, 48, 16
    else:
        model, tok = load_model(args.model, dtype=args.dtype, device=args.device)
        name = args.model
    model.eval()
    vocab = model.get_output_embeddings().weight.shape[0]
    new, old = HFBackend(model, tok, max_batch_size=512), PerRow(model, tok, max_batch_size=512)
    cpu = cpu_name()
    print(f"model {name} ({vocab} tokens), {args.device}, {args.threads} threads, {cpu}")

    pick = []
    for rows in [int(x) for x in args.rows.split(",")]:
        for temp in (1.0, 0.0):
            times: dict[str, list[float]] = {"old": [], "new": []}
            for _ in range(args.repeats):  # interleaved rounds, medians: this machine's noise hits both alike
                times["old"].append(time_pick(old, rows, vocab, temp, args.device, args.steps))
                times["new"].append(time_pick(new, rows, vocab, temp, args.device, args.steps))
            a, b = statistics.median(times["old"]), statistics.median(times["new"])
            pick.append({"rows": rows, "temperature": temp, "per_row_ms": round(a, 3), "batched_ms": round(b, 3),
                         "speedup": round(a / b, 2)})
            print(f"pick  rows {rows:4d} T={temp}: per-row {a:8.2f} ms/step, batched {b:8.2f} ms/step, {a / b:5.2f}x")

    text = " ".join(f"Step {i}: the analysis of document {i} names the city where the author was born." for i in range(400))
    ids = tok.encode(text, add_special_tokens=False)
    reqs = [GenerationRequest(ids[i:i + args.context], "", SamplingParams(temperature=1.0, seed=i, stop=STOPS,
                                                                             max_tokens=args.max_tokens))
            for i in range(args.requests)]
    outs, secs = {}, {}
    for label, be in (("per_row", old), ("batched", new), ("per_row_again", old)):
        be.clear_cache()
        _sync(args.device)
        t0 = time.perf_counter()
        outs[label] = be.generate_batch(reqs)
        _sync(args.device)
        secs[label] = time.perf_counter() - t0
    base = min(secs["per_row"], secs["per_row_again"])  # the baseline twice: its better time
    same = sum(a.token_ids == b.token_ids for a, b in zip(outs["per_row"], outs["batched"]))
    tokens = sum(len(o.token_ids) for o in outs["batched"])
    print(f"generate {args.requests} requests x <= {args.max_tokens} tokens ({tokens} generated): per-row "
          f"{secs['per_row']:.2f} / {secs['per_row_again']:.2f} s, batched {secs['batched']:.2f} s, "
          f"{base / secs['batched']:.2f}x; identical outputs {same}/{args.requests}")
    print(json.dumps({"model": name, "device": args.device, "threads": args.threads, "cpu": cpu, "pick": pick,
                      "generate": {"requests": args.requests, "tokens": tokens, **{k: round(v, 3) for k, v in secs.items()},
                                   "speedup": round(base / secs["batched"], 3), "identical": same}}))
    return 0


if __name__ == "__main__":
    run_main(main)
