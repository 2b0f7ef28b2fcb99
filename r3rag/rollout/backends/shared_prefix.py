"""Shared prompt prefixes: the system prompt's keys/values computed once, not once per question.

Every first-turn context of an evaluation or a rollout batch starts with the same tokens: the chat
template, the system prompt (a few hundred tokens with the few-shot examples) and the user-turn
header. Only the question differs. A causal model's keys/values for a token prefix do not depend on
what follows, so the prefix can be prefilled once and its keys/values copied into every row that
starts with it; the first n positions of a stored prefix are also the keys/values of its first n
tokens, so a stored prefix serves any prompt that shares at least ``min_tokens`` tokens with it.

:class:`SharedPrefixes` decides *which* prefixes to share, on token ids only (the backend runs the
model). A prefix is worth computing when at least two prompts are seen to share it:

- in one batch, rows without a cached prefix are sorted, and runs of rows whose common prefix is
  at least ``min_tokens`` long share that common prefix;
- a row alone (batch size 1) is compared with the last ``history`` such prompts, so one question at
  a time gets the same saving from the second question on.

Each row keeps at least one token of its own to prefill (the next-token logits come from it).

>>> sp = SharedPrefixes(min_tokens=3)
>>> sp.plan([[1, 2, 3, 4, 9], [1, 2, 3, 4, 7, 7], [5, 6]])   # rows 0 and 1 share [1, 2, 3, 4]
{(1, 2, 3, 4): [0, 1]}
>>> sp.store((1, 2, 3, 4), "kv of 1 2 3 4", nbytes=64)
True
>>> sp.match([1, 2, 3, 8, 8])                                # 3 tokens in common: a slice of it
((1, 2, 3, 4), 3)
>>> sp.match([1, 2, 3]) is None                              # would leave no token to prefill
True
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Any, Sequence


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


class SharedPrefixes:
    """Which prompt prefixes to compute once and share; an LRU store of their keys/values.

    ``min_tokens`` is the shortest prefix worth sharing (0 turns sharing off); at most ``slots``
    prefixes and ``max_bytes`` of their keys/values are kept (least recently used go first; a
    200-token prefix of SmolLM2-135M is about 9 MB); ``history`` is how many recent lone prompts
    a new one is compared with.
    """

    def __init__(self, min_tokens: int = 32, slots: int = 4, history: int = 8, max_bytes: int = 256 << 20) -> None:
        self.min_tokens = min_tokens
        self.slots = slots
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._sizes: dict[tuple[int, ...], int] = {}
        self._store: OrderedDict[tuple[int, ...], Any] = OrderedDict()
        self._recent: deque[tuple[int, ...]] = deque(maxlen=history)
        self.hits = 0
        self.tokens_reused = 0

    @property
    def enabled(self) -> bool:
        return self.min_tokens > 0 and self.slots > 0

    def match(self, ids: Sequence[int]) -> tuple[tuple[int, ...], int] | None:
        """``(stored key, n)``: the stored prefix sharing the most tokens with ``ids`` and how many
        (at least ``min_tokens``, at most ``len(ids) - 1``), or ``None``."""
        if not self.enabled:
            return None
        best: tuple[tuple[int, ...], int] | None = None
        for key in self._store:
            n = min(common_prefix_len(key, ids), len(ids) - 1)
            if n >= self.min_tokens and (best is None or n > best[1]):
                best = (key, n)
        return best

    def get(self, key: tuple[int, ...], n: int) -> Any:
        """The stored value of ``key`` (marked recently used); counts a hit of ``n`` tokens."""
        self._store.move_to_end(key)
        self.hits += 1
        self.tokens_reused += n
        return self._store[key]

    def plan(self, prompts: list[Sequence[int]]) -> dict[tuple[int, ...], list[int]]:
        """Prefixes to compute now for rows that matched nothing: ``{prefix: [row, ...]}``.

        Rows are sorted by their ids so rows sharing a prefix are neighbours; a run of neighbours
        whose common prefix stays at least ``min_tokens`` long shares it. A row left alone is
        compared with recent lone prompts. Every such row is then remembered as a recent prompt."""
        if not self.enabled or not prompts:
            return {}
        order = sorted(range(len(prompts)), key=lambda b: tuple(prompts[b]))
        plan: dict[tuple[int, ...], list[int]] = {}
        run = [order[0]]
        run_len = len(prompts[order[0]])
        for b in order[1:] + [None]:  # type: ignore[list-item]
            n = common_prefix_len(prompts[run[-1]], prompts[b]) if b is not None else 0
            if b is not None and min(n, run_len) >= self.min_tokens:
                run.append(b)
                run_len = min(n, run_len)
                continue
            if len(run) > 1:
                self._add(plan, prompts, run, run_len)
            else:
                lone = run[0]
                n_recent = max((common_prefix_len(r, prompts[lone]) for r in self._recent), default=0)
                if n_recent >= self.min_tokens:
                    self._add(plan, prompts, run, n_recent)
            if b is not None:
                run, run_len = [b], len(prompts[b])
        for p in prompts:
            self._recent.append(tuple(p))
        return plan

    def _add(self, plan: dict[tuple[int, ...], list[int]], prompts: list[Sequence[int]], rows: list[int], n: int) -> None:
        n = min([n] + [len(prompts[b]) - 1 for b in rows])  # every row keeps a token to prefill
        if n >= self.min_tokens:
            plan.setdefault(tuple(prompts[rows[0]][:n]), []).extend(sorted(rows))

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
        self._recent.clear()

    def __len__(self) -> int:
        return len(self._store)
