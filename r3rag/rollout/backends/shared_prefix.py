"""Shared prompt prefixes: the system prompt's keys/values computed once, not once per question.

Every first-turn context of an evaluation or a rollout batch starts with the same tokens: the chat
template, the system prompt (a few hundred tokens with the few-shot examples) and the user-turn
header. Only the question differs. A causal model's keys/values for a token prefix do not depend
on what follows, so that prefix can be prefilled once and its keys/values copied into every row.

Who knows where the shared part ends? The caller that renders the prompts. The rollout engine and
the evaluation baselines call :func:`shared_prefix_len` once with their own renderer and put the
answer on every request (``GenerationRequest.shared_prefix``). A backend then splits each such
prefill at that length, always, and keeps the prefix's keys/values in a :class:`SharedPrefixes`
store keyed by the prefix's token ids. Because the split never depends on what else was seen, a
question's result is the same whether its prefix was just computed or came from the store: one
question at a time gives bit-identical results in any order, and a resumed run equals an
uninterrupted one.

>>> shared_prefix_len(lambda i: [1, 2, 3, 4, 5, 6] + [[7, 8], [9]][i], margin=2)
4
>>> sp = SharedPrefixes(min_tokens=3)
>>> sp.key_for([1, 2, 3, 4, 9, 9], 4)
(1, 2, 3, 4)
>>> sp.key_for([1, 2, 3, 4], 4)        # the row keeps its last token to prefill
(1, 2, 3)
>>> sp.key_for([1, 2, 9], 4) is None   # under min_tokens
True
>>> sp.store((1, 2, 3, 4), "kv of 1 2 3 4", nbytes=64)
True
>>> sp.get((1, 2, 3, 4)), sp.hits
('kv of 1 2 3 4', 1)
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Sequence


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Number of leading ids ``a`` and ``b`` have in common.

    >>> common_prefix_len([1, 2, 3], [1, 2, 4, 5])
    2
    """
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


#: two stand-in questions (or documents) that differ from their first character, for renderers
SENTINELS = ("Alpha beta?", "Zulu yankee?")


def shared_prefix_len(render: Callable[[int], Sequence[int]], margin: int = 2) -> int:
    """How many leading prompt ids every prompt of a renderer shares: the common prefix of
    ``render(0)`` and ``render(1)`` (two prompts whose variable parts differ from their first
    character on), less ``margin`` ids, so that a real question whose first word merges with
    the token before it still starts with the same ids."""
    return max(0, common_prefix_len(render(0), render(1)) - margin)


class SharedPrefixes:
    """An LRU store of prompt prefixes' keys/values, keyed by the prefix's token ids.

    ``min_tokens`` is the shortest prefix worth a separate prefill (0 turns sharing off); at most
    ``slots`` prefixes and ``max_bytes`` of their keys/values are kept (a 200-token prefix of
    SmolLM2-135M is about 9 MB). ``rows`` counts the rows that started from a shared prefix,
    ``hits`` those whose prefix came from the store, ``tokens_reused`` the prefix tokens of hits.
    """

    def __init__(self, min_tokens: int = 32, slots: int = 4, max_bytes: int = 256 << 20) -> None:
        self.min_tokens = min_tokens
        self.slots = slots
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.rows = 0
        self.hits = 0
        self.tokens_reused = 0
        self._sizes: dict[tuple[int, ...], int] = {}
        self._store: OrderedDict[tuple[int, ...], Any] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.min_tokens > 0 and self.slots > 0

    def key_for(self, ids: Sequence[int], shared: int) -> tuple[int, ...] | None:
        """The prefix of ``ids`` to share, given the caller's ``shared`` length: at most
        ``len(ids) - 1`` ids (the row's own last token gives its next-token logits); ``None``
        when sharing is off or the prefix is shorter than ``min_tokens``."""
        n = min(shared, len(ids) - 1)
        return tuple(ids[:n]) if self.enabled and n >= self.min_tokens else None

    def get(self, key: tuple[int, ...]) -> Any:
        """The stored value of ``key`` (marked recently used, counted as a hit), or ``None``."""
        if key not in self._store:
            return None
        self._store.move_to_end(key)
        self.hits += 1
        self.tokens_reused += len(key)
        return self._store[key]

    def store(self, key: tuple[int, ...], value: Any, nbytes: int = 0) -> bool:
        """Keep ``value`` (``nbytes`` big) for ``key``, evicting the least recently used; ``False``
        (nothing kept) when it alone exceeds ``max_bytes``."""
        if nbytes > self.max_bytes:
            return False
        self.nbytes += nbytes - self._sizes.get(key, 0)
        self._store[key] = value
        self._sizes[key] = nbytes
        self._store.move_to_end(key)
        while len(self._store) > self.slots or self.nbytes > self.max_bytes:
            old, _ = self._store.popitem(last=False)
            self.nbytes -= self._sizes.pop(old)
        return True

    def clear(self) -> None:
        self._store.clear()
        self._sizes.clear()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._store)
