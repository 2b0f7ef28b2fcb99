"""The request/response shapes of the retrieval clients researchers already run.

Each dialect parses a JSON body into a :class:`SearchRequest` (or raises :class:`BadRequest`
with a message naming the field and what was wrong) and renders results in that client's
expected shape. They are registered by path in :data:`DIALECTS`:

- ``/retrieve`` (Search-R1, verl's search tool): ``{"queries": [str], "topk": int,
  "return_scores": bool}`` -> ``{"result": [[{"document": {"id", "contents"}, "score"}]]}``, or
  ``{"result": [[{"id", "contents"}]]}`` when ``return_scores`` is false;
- ``/search`` (R3-RAG): ``{"query": str}`` -> ``[{"id", "contents"}]``; ``{"querys": [str]}``
  -> a list of such lists;
- ``/queries`` (R1-Searcher): ``{"queries": [str], "k": int}`` -> ``{"queries": [...],
  "answers": [[contents, ...]]}``.

Every dialect also accepts ``"index"`` to pick one of the served indexes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from r3rag.data.records import Passage


class BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Limits:
    max_queries: int
    max_query_chars: int
    max_topk: int
    default_topk: int


@dataclass
class SearchRequest:
    queries: list[str]
    k: int
    index: str | None
    return_scores: bool = True
    single: bool = False


def _type_name(v: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer",
            float: "number", type(None): "null"}.get(type(v), type(v).__name__)


def check_fields(body: Any, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> dict:
    if not isinstance(body, dict):
        raise BadRequest(422, f"request body must be a JSON object with {', '.join(repr(a) for a in required or allowed)}; got {_type_name(body)}")
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise BadRequest(422, f"unknown field(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(allowed)}")
    for name in required:
        if name not in body:
            raise BadRequest(422, f"missing field {name!r}")
    return body


def check_query(q: Any, where: str, limits: Limits) -> str:
    if not isinstance(q, str):
        raise BadRequest(422, f"{where} must be a string, got {_type_name(q)}")
    if not q.strip():
        raise BadRequest(422, f"{where} is empty")
    if len(q) > limits.max_query_chars:
        raise BadRequest(422, f"{where} has {len(q)} characters; the limit is {limits.max_query_chars}")
    try:
        q.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest(422, f"{where} contains an unpaired UTF-16 surrogate (\\ud800-\\udfff)") from None
    if "\x00" in q:
        raise BadRequest(422, f"{where} contains a NUL character")
    return q


def check_queries(v: Any, name: str, limits: Limits) -> list[str]:
    if not isinstance(v, list):
        raise BadRequest(422, f"{name!r} must be an array of strings, got {_type_name(v)}")
    if not v:
        raise BadRequest(422, f"{name!r} is an empty array; send at least one query")
    if len(v) > limits.max_queries:
        raise BadRequest(413, f"{name!r} has {len(v)} queries; the limit is {limits.max_queries} per request")
    return [check_query(q, f"{name}[{i}]", limits) for i, q in enumerate(v)]


def check_topk(body: dict, name: str, limits: Limits) -> int:
    v = body.get(name, limits.default_topk)
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadRequest(422, f"{name!r} must be an integer, got {_type_name(v)}")
    if not 1 <= v <= limits.max_topk:
        raise BadRequest(422, f"{name!r} must be between 1 and {limits.max_topk}, got {v}")
    return v


def check_bool(body: dict, name: str, default: bool) -> bool:
    v = body.get(name, default)
    if not isinstance(v, bool):
        raise BadRequest(422, f"{name!r} must be true or false, got {_type_name(v)}")
    return v


def check_index(body: dict) -> str | None:
    v = body.get("index")
    if v is not None and not isinstance(v, str):
        raise BadRequest(422, f"'index' must be a string, got {_type_name(v)}")
    return v


@dataclass(frozen=True)
class Dialect:
    path: str
    client: str
    parse: Callable[[Any, Limits], SearchRequest]
    render: Callable[[SearchRequest, list[list[Passage]]], Any]


def _parse_retrieve(body: Any, limits: Limits) -> SearchRequest:
    check_fields(body, ("queries", "topk", "return_scores", "index"), required=("queries",))
    return SearchRequest(check_queries(body["queries"], "queries", limits), check_topk(body, "topk", limits),
                         check_index(body), return_scores=check_bool(body, "return_scores", True))


def _render_retrieve(req: SearchRequest, results: list[list[Passage]]) -> Any:
    if req.return_scores:
        return {"result": [[{"document": {"id": p.id, "contents": p.contents}, "score": p.score}
                            for p in ps] for ps in results]}
    return {"result": [[{"id": p.id, "contents": p.contents} for p in ps] for ps in results]}


def _parse_search(body: Any, limits: Limits) -> SearchRequest:
    check_fields(body, ("query", "querys", "topk", "index"))
    if ("query" in body) == ("querys" in body):
        raise BadRequest(422, "send exactly one of 'query' (a string) or 'querys' (an array of strings)")
    k, index = check_topk(body, "topk", limits), check_index(body)
    if "query" in body:
        return SearchRequest([check_query(body["query"], "query", limits)], k, index, single=True)
    return SearchRequest(check_queries(body["querys"], "querys", limits), k, index)


def _render_search(req: SearchRequest, results: list[list[Passage]]) -> Any:
    lists = [[{"id": p.id, "contents": p.contents} for p in ps] for ps in results]
    return lists[0] if req.single else lists


def _parse_queries(body: Any, limits: Limits) -> SearchRequest:
    check_fields(body, ("queries", "k", "index"), required=("queries",))
    return SearchRequest(check_queries(body["queries"], "queries", limits), check_topk(body, "k", limits),
                         check_index(body))


def _render_queries(req: SearchRequest, results: list[list[Passage]]) -> Any:
    return {"queries": req.queries, "answers": [[p.contents for p in ps] for ps in results]}


DIALECTS: dict[str, Dialect] = {
    d.path: d
    for d in (
        Dialect("/retrieve", "Search-R1 / verl", _parse_retrieve, _render_retrieve),
        Dialect("/search", "R3-RAG", _parse_search, _render_search),
        Dialect("/queries", "R1-Searcher", _parse_queries, _render_queries),
    )
}
