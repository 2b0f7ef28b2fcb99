"""Questions with gold decompositions, in the shapes of the public multi-hop benchmarks.

Each question type is a sampler registered in ``SAMPLERS`` (by the type name written into
``metadata["type"]``):

- ``single``: one fact ("Where was Varnel Oskaro born?").
- ``bridge`` (HotpotQA): two facts chained through an entity ("Where was the director of The
  Silent Harbour born?" = "Who directed The Silent Harbour?" then "Where was Varnel Oskaro born?").
- ``compositional`` (2Wiki compositional, MuSiQue 3-4 hop): chains ending in a country
  ("In which country was X born?") and chains of three or four facts.
- ``inference`` (2Wiki): a named relation implied by two facts (father-in-law = spouse's father).
- ``comparison`` (HotpotQA, 2Wiki): which of two entities has the earlier/later date (two hops),
  or whose related entity does (2Wiki bridge-comparison, four hops).
- ``yesno``: whether two entities share a place or are in a given order (two or four hops).

A chain is walked fact by fact through the cluster's relation table; sub-question ``i`` names the
answer of sub-question ``i-1``. Comparisons record ``metadata["compare"] = {"op", "steps",
"options"}`` so that the validator can recompute the final answer from the sub-answers.
"""

from __future__ import annotations

import random
from typing import Any, Callable

from r3rag.world.generator import Cluster, Entity, Fact, date_aliases
from r3rag.world.names import acronym
from r3rag.world.schema import (
    BRIDGE_COMPARISONS, COMPARISONS, COMPOSED_PHRASES, INFERRED, KINDS, RELATIONS, YESNO,
)

TYPE_WEIGHTS = {
    "single": 0.14, "bridge": 0.20, "compositional": 0.26,
    "inference": 0.08, "comparison": 0.16, "yesno": 0.16,
}
Question = dict[str, Any]  # {"question", "golden_answers", "metadata"} (the id comes at writing)


class WorldView:
    """A cluster plus the world-wide facts the samplers need (surname counts for aliases)."""

    def __init__(self, cluster: Cluster, surname_counts: dict[str, int]):
        self.cluster = cluster
        self.by_id = cluster.by_id()
        self.surname_counts = surname_counts

    def entities(self, *kinds: str) -> list[Entity]:
        return [e for e in self.cluster.entities.values() if e.kind in kinds]

    def aliases(self, fact: Fact) -> list[str]:
        """The answer first, then natural aliases (a date's US form, a unique surname, initials)."""
        if fact.relation == "birth_date":
            return date_aliases(*fact.key)  # type: ignore[arg-type]
        if fact.obj is None:
            return [fact.value]
        return self.entity_aliases(self.by_id[fact.obj])

    def entity_aliases(self, e: Entity) -> list[str]:
        out = [e.name]
        if e.kind == "person":
            surname = e.name.rsplit(" ", 1)[1]
            if self.surname_counts.get(surname, 0) == 1:
                out.append(surname)
        elif e.kind == "org":
            short = acronym(e.name)
            if short:
                out.append(short)
        return out


def _step(view: WorldView, subject: Entity, relation: str, rng: random.Random) -> dict[str, Any]:
    fact = subject.facts[relation]
    return {
        "question": rng.choice(RELATIONS[relation].ask).format(x=subject.name),
        "answer": fact.value,
        "supporting_ids": [fact.passage_id],
        "subject": subject.id,
        "relation": relation,
    }


def _walk(view: WorldView, start: Entity, relations: tuple[str, ...]) -> list[Entity] | None:
    """The entities visited by following ``relations`` from ``start`` (None if a link is missing
    or an entity repeats); the last relation may end in a value."""
    path = [start]
    for i, rel in enumerate(relations):
        fact = path[-1].facts.get(rel)
        if fact is None:
            return None
        if i < len(relations) - 1:
            if fact.obj is None:
                return None
            if any(e.id == fact.obj for e in path):
                return None
            path.append(view.by_id[fact.obj])
        elif fact.obj is not None and any(e.id == fact.obj for e in path):
            return None
    return path


def _chain(view: WorldView, start: Entity, rels: tuple[str, ...], rng: random.Random) -> tuple[list, Fact, list[str]]:
    path = _walk(view, start, rels)
    assert path is not None
    steps = [_step(view, e, r, rng) for e, r in zip(path, rels)]
    last = path[-1].facts[rels[-1]]
    ids = [e.id for e in path] + ([last.obj] if last.obj else [])
    return steps, last, ids


def _random_chain(view: WorldView, hops: int, rng: random.Random, first_kinds=("person", "org", "film", "novel")):
    """Sample a relation path of ``hops`` facts by a random walk (None after a few failures)."""
    for _ in range(30):
        start = rng.choice(view.entities(*first_kinds))
        node, rels = start, []
        for i in range(hops):
            options = [r for r, f in node.facts.items()
                       if (i == hops - 1 or f.obj is not None) and not (rels and rels[-1] == r == "spouse")]
            if not options:
                break
            rel = rng.choice(sorted(options))
            rels.append(rel)
            fact = node.facts[rel]
            if fact.obj is None:
                break
            node = view.by_id[fact.obj]
        if len(rels) == hops and _walk(view, start, tuple(rels)) is not None:
            return start, tuple(rels)
    return None


def _compose(name: str, rels: tuple[str, ...]) -> str:
    """The question text of a chain: noun phrases nested inside the last relation's question."""
    tail = rels[-2:]
    body = rels[:-2] if tail in COMPOSED_PHRASES else rels[:-1]
    phrase = name
    for rel in body:
        phrase = RELATIONS[rel].phrase.format(x=phrase)  # type: ignore[union-attr]
    template = COMPOSED_PHRASES.get(tail) if tail in COMPOSED_PHRASES else RELATIONS[rels[-1]].ask[0]
    return template.format(x=phrase)


def _chain_question(view: WorldView, qtype: str, start: Entity, rels: tuple[str, ...], rng) -> Question:
    steps, last, ids = _chain(view, start, rels, rng)
    text = _compose(start.name, rels)
    return _question(text, view.aliases(last), qtype, steps, RELATIONS[rels[-1]].answer_type, ids)


def _question(text: str, answers: list[str], qtype: str, steps: list, answer_type: str,
              entities: list[str], compare: dict | None = None) -> Question:
    supporting: list[str] = []
    for s in steps:
        for pid in s["supporting_ids"]:
            if pid not in supporting:
                supporting.append(pid)
    meta: dict[str, Any] = {
        "hops": len(steps),
        "type": qtype,
        "decomposition": steps,
        "supporting_ids": supporting,
        "answer_type": answer_type,
        "entities": list(dict.fromkeys(entities)),
    }
    if compare is not None:
        meta["compare"] = compare
    return {"question": text, "golden_answers": answers, "metadata": meta}


def sample_single(view: WorldView, rng: random.Random) -> Question | None:
    found = _random_chain(view, 1, rng, ("person", "org", "film", "novel", "city"))
    if found is None:
        return None
    start, rels = found
    steps, last, ids = _chain(view, start, rels, rng)
    # A one-hop question uses a different wording than its own sub-question half of the time.
    text = rng.choice(RELATIONS[rels[0]].ask).format(x=start.name)
    return _question(text, view.aliases(last), "single", steps, RELATIONS[rels[0]].answer_type, ids)


def sample_bridge(view: WorldView, rng: random.Random) -> Question | None:
    for _ in range(10):
        found = _random_chain(view, 2, rng)
        if found and found[1] not in COMPOSED_PHRASES and found[1] not in INFERRED:
            return _chain_question(view, "bridge", found[0], found[1], rng)
    return None


def sample_compositional(view: WorldView, rng: random.Random) -> Question | None:
    if rng.random() < 0.2:
        tail = rng.choice(sorted(COMPOSED_PHRASES))
        starts = [e for e in view.entities("person", "org") if _walk(view, e, tail)]
        return _chain_question(view, "compositional", rng.choice(starts), tail, rng) if starts else None
    found = _random_chain(view, rng.choice((3, 3, 4)), rng)
    return _chain_question(view, "compositional", found[0], found[1], rng) if found else None


def sample_inference(view: WorldView, rng: random.Random) -> Question | None:
    rels = rng.choice(sorted(INFERRED))
    starts = [e for e in view.entities("person") if _walk(view, e, rels)]
    if not starts:
        return None
    start = rng.choice(starts)
    steps, last, ids = _chain(view, start, rels, rng)
    text = INFERRED[rels][0].format(x=start.name)
    return _question(text, view.aliases(last), "inference", steps, "person", ids)


def _pair(items: list[Entity], rng: random.Random) -> tuple[Entity, Entity]:
    a, b = rng.sample(items, 2)
    return a, b


def sample_comparison(view: WorldView, rng: random.Random) -> Question | None:
    """Which of two entities comes first/last by a date (2 hops), or by a related entity's date (4)."""
    if rng.random() < 0.3:
        rels, template, op = rng.choice(BRIDGE_COMPARISONS)
    else:
        rel, template, op = rng.choice(COMPARISONS)
        rels = (rel,)
    kind = RELATIONS[rels[0]].subject
    a, b = _pair(view.entities(kind), rng)
    (sa, la, ia), (sb, lb, ib) = _chain(view, a, rels, rng), _chain(view, b, rels, rng)
    if la.key == lb.key or la is lb:
        return None
    a_wins = (la.key < lb.key) == (op == "earlier")
    winner = a if a_wins else b
    compare = {"op": op, "steps": [len(sa) - 1, len(sa) + len(sb) - 1], "options": [a.name, b.name]}
    return _question(template.format(a=a.name, b=b.name), view.entity_aliases(winner), "comparison",
                     sa + sb, KINDS[kind], ia + ib, compare)


def sample_yesno(view: WorldView, rng: random.Random) -> Question | None:
    """Do two entities share a place / come in a given order? The sampler aims for half yes."""
    rels, template, op = rng.choice(YESNO)
    kind = RELATIONS[rels[0]].subject
    want_yes = rng.random() < 0.5
    candidates = view.entities(kind)
    best = None
    for _ in range(12):
        a, b = _pair(candidates, rng)
        if _walk(view, a, rels) is None or _walk(view, b, rels) is None:
            continue
        (sa, la, ia), (sb, lb, ib) = _chain(view, a, rels, rng), _chain(view, b, rels, rng)
        if op == "before" and la.key == lb.key:
            continue
        yes = la.value == lb.value if op == "same" else la.key < lb.key
        best = (a, b, sa, sb, ia, ib, yes)
        if yes == want_yes:
            break
    if best is None:
        return None
    a, b, sa, sb, ia, ib, yes = best
    compare = {"op": op, "steps": [len(sa) - 1, len(sa) + len(sb) - 1], "options": [a.name, b.name]}
    return _question(template.format(a=a.name, b=b.name), ["yes" if yes else "no"], "yesno",
                     sa + sb, "yes/no", ia + ib, compare)


SAMPLERS: dict[str, Callable[[WorldView, random.Random], Question | None]] = {
    "single": sample_single,
    "bridge": sample_bridge,
    "compositional": sample_compositional,
    "inference": sample_inference,
    "comparison": sample_comparison,
    "yesno": sample_yesno,
}


def cluster_questions(view: WorldView, n: int, seed: int) -> list[Question]:
    """``n`` distinct questions about one cluster, types drawn with ``TYPE_WEIGHTS``."""
    rng = random.Random(f"{seed}:{view.cluster.index}:questions")
    types, weights = zip(*TYPE_WEIGHTS.items())
    out: list[Question] = []
    seen: set[str] = set()
    attempts = 0
    while len(out) < n and attempts < 20 * n + 20:
        attempts += 1
        qtype = rng.choices(types, weights)[0]
        q = SAMPLERS[qtype](view, rng)
        if q is None or q["question"] in seen:
            continue
        seen.add(q["question"])
        out.append(q)
    return out


def decide(compare: dict[str, Any], steps: list[dict[str, Any]], keys: list[Any]) -> str:
    """The final answer of a comparison/yes-no question from its sub-answers' sortable keys.

    ``keys[i]`` is the sortable value of step ``i`` (a date tuple, a year, a name)."""
    i, j = compare["steps"]
    op = compare["op"]
    if op == "same":
        return "yes" if steps[i]["answer"] == steps[j]["answer"] else "no"
    if op == "before":
        return "yes" if keys[i] < keys[j] else "no"
    first = keys[i] < keys[j]
    a_wins = first if op == "earlier" else not first
    return compare["options"][0] if a_wins else compare["options"][1]
