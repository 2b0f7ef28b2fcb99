"""Where evaluation time goes: every forward pass of the policy model, timed and classified.

:class:`ForwardTimer` wraps a model's ``forward`` (the instance attribute, so only this model
object is affected, and only inside the ``with`` block) and records, per call, whether it was a
**prefill** (more than one new position per row: a prompt, or the documents appended after a
retrieval) or a **decode** step (one new token per row), how many rows and new tokens it carried,
and its wall time. With the engine's own counters (:class:`r3rag.rollout.engine.EngineStats`:
generation, retrieval, other) this splits a run into

- prefill of prompts and documents (compute-bound on a CPU: cost grows with tokens, batching does
  not make a token cheaper),
- decode steps (memory-bound at small batch: a step costs nearly the same for 1 or 32 rows),
- the backend's Python work between forward passes (sampling, stop-string checks, cache moves),
- retrieval rounds and the engine's own bookkeeping.

>>> import torch
>>> class M(torch.nn.Module):
...     def forward(self, input_ids=None, **kw):
...         return input_ids.float().sum()
>>> m = M()
>>> with ForwardTimer(m) as t:
...     _ = m(input_ids=torch.ones(2, 5, dtype=torch.long)); _ = m(input_ids=torch.ones(2, 1, dtype=torch.long))
>>> t.summary()["prefill_tokens"], t.summary()["decode_steps"], t.summary()["decode_rows_mean"]
(10, 1, 2.0)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ForwardCall:
    kind: str  # "prefill" | "decode"
    rows: int
    new_tokens: int  # rows x new positions
    seconds: float
    cpu_seconds: float = 0.0  # process CPU time (all threads): the work, whatever else shares the cores


@dataclass
class ForwardTimer:
    model: Any
    calls: list[ForwardCall] = field(default_factory=list)

    def __enter__(self) -> "ForwardTimer":
        inner = self.model.forward

        def timed(*args: Any, **kwargs: Any) -> Any:
            ids = kwargs.get("input_ids", args[0] if args else None)
            rows, width = (int(ids.shape[0]), int(ids.shape[1])) if ids is not None and ids.dim() == 2 else (0, 0)
            t, c = time.perf_counter(), time.process_time()
            out = inner(*args, **kwargs)
            self.calls.append(ForwardCall("decode" if width == 1 else "prefill", rows, rows * width,
                                          time.perf_counter() - t, time.process_time() - c))
            return out

        self._own = self.model.__dict__.get("forward")  # an instance-level forward (hooks) to put back
        self.model.forward = timed
        return self

    def __exit__(self, *exc: object) -> None:
        if self._own is not None:
            self.model.forward = self._own
        else:
            del self.model.forward  # back to the class's method

    def summary(self) -> dict[str, Any]:
        pre = [c for c in self.calls if c.kind == "prefill"]
        dec = [c for c in self.calls if c.kind == "decode"]
        pre_s, dec_s = sum(c.seconds for c in pre), sum(c.seconds for c in dec)
        pre_cpu, dec_cpu = sum(c.cpu_seconds for c in pre), sum(c.cpu_seconds for c in dec)
        pre_tok = sum(c.new_tokens for c in pre)
        dec_tok = sum(c.new_tokens for c in dec)
        return {
            "prefill_s": round(pre_s, 3), "prefill_calls": len(pre), "prefill_tokens": pre_tok,
            "prefill_ms_per_token": round(1000 * pre_s / pre_tok, 3) if pre_tok else None,
            "decode_s": round(dec_s, 3), "decode_steps": len(dec), "decode_tokens": dec_tok,
            "decode_rows_mean": round(dec_tok / len(dec), 2) if dec else 0.0,
            "decode_ms_per_step": round(1000 * dec_s / len(dec), 2) if dec else None,
            "forward_s": round(pre_s + dec_s, 3),
            "prefill_cpu_s": round(pre_cpu, 3), "decode_cpu_s": round(dec_cpu, 3),
        }
