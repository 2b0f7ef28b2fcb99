"""The plugin's retrieval client: the node-local replica first, the others on failure.

On a cluster every node runs one retrieval replica and every vLLM engine actor talks to the
replica on its own node (no cross-node traffic in the common case), falling over to the other
replicas only when its own fails. :func:`order_urls` moves the URLs whose host is this machine to
the front; :class:`LocalFirstClient` is :class:`~r3rag.retrieval.client.RetrievalClient` with
every request starting at the first URL instead of rotating (its retries still walk the list).
"""

from __future__ import annotations

import itertools
import socket
from typing import Iterable
from urllib.parse import urlsplit

from r3rag.retrieval.client import RetrievalClient


def local_hosts() -> set[str]:
    """Names and addresses that mean this machine."""
    names = {"localhost", "127.0.0.1", "::1", "0.0.0.0"}
    for name in {socket.gethostname(), socket.getfqdn()}:
        names.add(name)
        try:
            names.update(info[4][0] for info in socket.getaddrinfo(name, None))
        except OSError:
            pass
    return {n.lower() for n in names if n}


def order_urls(urls: Iterable[str], local: set[str] | None = None) -> list[str]:
    """The URLs on this machine first (stable order otherwise).

    >>> order_urls(["http://node2:8100", "http://node1:8100"], local={"node1"})
    ['http://node1:8100', 'http://node2:8100']
    """
    urls = list(urls)
    here = local_hosts() if local is None else {h.lower() for h in local}
    is_local = [(urlsplit(u).hostname or "").lower() in here or (urlsplit(u).hostname or "").startswith("127.") for u in urls]
    return [u for u, loc in zip(urls, is_local) if loc] + [u for u, loc in zip(urls, is_local) if not loc]


class LocalFirstClient(RetrievalClient):
    """Every request tries ``urls[0]`` first; a failed attempt moves on to the next URL."""

    def __init__(self, urls: list[str] | str, **kwargs: object) -> None:
        super().__init__(urls, **kwargs)  # type: ignore[arg-type]
        self._rr = itertools.repeat(0)  # the base class rotates the starting URL with this counter
