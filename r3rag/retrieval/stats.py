"""Service counters for ``GET /stats``: requests, queries, errors, cache hits, latency."""

from __future__ import annotations

import threading
from collections import Counter, deque

import numpy as np


class ServiceStats:
    """Counters plus the latencies of the last ``window`` search requests (for percentiles)."""

    def __init__(self, window: int = 20000) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[str] = Counter()
        self.queries = 0
        self.errors: Counter[int] = Counter()
        self.cache_hits = 0
        self.cache_misses = 0
        self.latencies_ms: deque[float] = deque(maxlen=window)

    def record_request(self, endpoint: str, n_queries: int, latency_s: float, hits: int, misses: int) -> None:
        with self._lock:
            self.requests[endpoint] += 1
            self.queries += n_queries
            self.cache_hits += hits
            self.cache_misses += misses
            self.latencies_ms.append(latency_s * 1000.0)

    def record_error(self, status: int) -> None:
        with self._lock:
            self.errors[status] += 1

    def snapshot(self) -> dict:
        with self._lock:
            lat = np.asarray(self.latencies_ms, dtype=np.float64)
            pct = {f"p{p}": round(float(np.percentile(lat, p)), 3) if lat.size else None for p in (50, 90, 99)}
            return {
                "requests": sum(self.requests.values()),
                "requests_by_endpoint": dict(self.requests),
                "queries": self.queries,
                "errors": sum(self.errors.values()),
                "errors_by_status": {str(k): v for k, v in self.errors.items()},
                "cache_hits": self.cache_hits,
                "cache_misses": self.cache_misses,
                "latency_ms": {**pct, "mean": round(float(lat.mean()), 3) if lat.size else None, "window": int(lat.size)},
            }
