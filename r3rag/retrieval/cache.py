"""A bounded, thread-safe LRU cache of search results keyed by (index, query, k)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Hashable, Generic, TypeVar

V = TypeVar("V")


class LRUCache(Generic[V]):
    """``get`` refreshes recency; ``put`` evicts the least recently used entry past ``capacity``.
    ``capacity=0`` disables caching."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(0, int(capacity))
        self._data: OrderedDict[Hashable, V] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                self.hits += 1
                return self._data[key]
            self.misses += 1
            return None

    def put(self, key: Hashable, value: V) -> None:
        if self.capacity == 0:
            return
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.capacity:
                self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)
