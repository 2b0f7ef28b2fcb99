"""Teacher forcing: a teacher policy writes each turn, a model backend emits (and scores) it.

:class:`ForcedBackend` asks ``teacher`` (e.g. the oracle, or an OpenAI-compatible teacher) for the
turn, then sends the same requests to ``inner`` (the HF backend) with ``forced_ids`` set, so the
output carries the *model's* log-probs of the teacher's tokens, computed batched with the KV cache
exactly as in sampling. Uses: log-probs of cold-start trajectories under the policy, and
benchmarks that need a real model's generation cost with a controlled number of turns.
"""

from __future__ import annotations

from dataclasses import replace

from r3rag.rollout.backends.base import GenerationOutput, GenerationRequest, PolicyBackend


class ForcedBackend(PolicyBackend):
    name = "forced"

    def __init__(self, inner: PolicyBackend, teacher: PolicyBackend) -> None:
        self.inner = inner
        self.teacher = teacher
        self.tokenizer = inner.tokenizer

    async def agenerate(self, requests: list[GenerationRequest]) -> list[GenerationOutput]:
        taught = await self.teacher.agenerate(requests)
        forced = [replace(r, forced_ids=list(t.token_ids)) for r, t in zip(requests, taught)]
        outs = await self.inner.agenerate(forced)
        for o, t in zip(outs, taught):
            if o.finish_reason != "error":
                o.finish_reason, o.stop_string = t.finish_reason, t.stop_string
        return outs
