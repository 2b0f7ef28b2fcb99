"""Cross-request micro-batching: requests that arrive together are searched together.

Encoding one query through a transformer costs nearly as much as encoding sixteen, so a
server that searches each request on its own loses most of its throughput to concurrency.
:class:`MicroBatcher` puts every request on a queue; one worker task takes the first waiting
request, keeps collecting for at most ``window_s`` or until ``max_batch`` queries are in hand,
then runs a single ``searcher.search`` over all of them (with the largest ``k`` asked, each
request's results cut back to its own ``k``) on a worker thread, so the event loop stays free
for ``/health`` and new requests. While a batch runs, the next one fills up.

The cap is strict: a request that would take the batch past ``max_batch`` is not merged but
starts the next batch (a request larger than the cap runs alone). Merging already-large
requests gains nothing (the per-call cost is amortised) and would stall the pipeline: two
clients sending 64 queries each would be answered together, then send together again, and the
search thread would idle while both responses are rendered. Kept apart, one request is searched
while the other's answer is encoded on the event loop. With
``enabled=False`` every request is searched alone on the same worker thread, the baseline the
benchmark compares against.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from r3rag.data.records import Passage
from r3rag.retrieval.locks import locked_search
from r3rag.retrieval.searcher import Searcher


class Overloaded(Exception):
    """The index already holds ``max_queue`` requests; the caller should retry later."""

    def __init__(self, index: str, pending: int, max_queue: int) -> None:
        super().__init__(f"index {index!r} is overloaded: {pending} requests are waiting or being searched "
                         f"(max_queue={max_queue})")
        self.index, self.pending, self.max_queue = index, pending, max_queue


@dataclass
class _Job:
    queries: list[str]
    k: int
    future: asyncio.Future = field(repr=False)


class MicroBatcher:
    def __init__(self, searcher: Searcher, window_s: float = 0.002, max_batch: int = 64,
                 enabled: bool = True, executor: ThreadPoolExecutor | None = None, max_queue: int = 0) -> None:
        self.searcher = searcher
        self.max_queue = max(0, max_queue)
        self.pending = 0  # requests admitted and not yet answered (queued or being searched)
        self.shed = 0  # requests refused with Overloaded
        self.window_s = window_s
        self.max_batch = max(1, max_batch)
        self.enabled = enabled
        self.executor = executor or ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"search-{searcher.name}")
        self._own_executor = executor is None
        self._queue: asyncio.Queue[_Job] | None = None
        self._worker: asyncio.Task | None = None
        self._carry: _Job | None = None  # a request that did not fit the last batch: starts the next
        self.batches = 0
        self.batched_queries = 0

    async def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        """Results of ``queries``; raises :class:`Overloaded` when ``max_queue`` requests are held."""
        if self.max_queue and self.pending >= self.max_queue:
            self.shed += 1
            raise Overloaded(self.searcher.name, self.pending, self.max_queue)
        self.pending += 1
        try:
            return await self._search(queries, k)
        finally:
            self.pending -= 1

    async def _search(self, queries: list[str], k: int) -> list[list[Passage]]:
        loop = asyncio.get_running_loop()
        if not self.enabled:
            self.batches += 1
            self.batched_queries += len(queries)
            return await loop.run_in_executor(self.executor, locked_search, self.searcher, queries, k)
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._worker = loop.create_task(self._run())
        job = _Job(queries, k, loop.create_future())
        self._queue.put_nowait(job)
        return await job.future

    async def _collect(self) -> list[_Job]:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        if self._carry is not None:
            jobs, self._carry = [self._carry], None
        else:
            jobs = [await self._queue.get()]
            while jobs[0].future.done():  # its caller went away: nothing to search for it
                jobs = [await self._queue.get()]
        n = len(jobs[0].queries)
        deadline = loop.time() + self.window_s
        while n < self.max_batch:
            if not self._queue.empty():
                job = self._queue.get_nowait()
            else:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    job = await asyncio.wait_for(self._queue.get(), remaining)
                except asyncio.TimeoutError:
                    break
            if job.future.done():
                continue
            if n + len(job.queries) > self.max_batch:
                self._carry = job
                break
            jobs.append(job)
            n += len(job.queries)
        return jobs

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            jobs = await self._collect()
            queries = [q for j in jobs for q in j.queries]
            k = max(j.k for j in jobs)
            self.batches += 1
            self.batched_queries += len(queries)
            try:
                results = await loop.run_in_executor(self.executor, locked_search, self.searcher, queries, k)
            except Exception as err:  # noqa: BLE001 - handed to every waiting request
                for j in jobs:
                    if not j.future.done():
                        j.future.set_exception(err)
                continue
            pos = 0
            for j in jobs:
                part = results[pos : pos + len(j.queries)]
                pos += len(j.queries)
                if not j.future.done():
                    j.future.set_result([r[: j.k] for r in part])

    async def aclose(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
        if self._own_executor:
            self.executor.shutdown(wait=False)
