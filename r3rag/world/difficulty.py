"""How hard the world is for a teacher that copies the gold decomposition into BM25.

For every gold sub-question of every question, search the corpus with BM25 (bm25s; the same
tokeniser at index and query time: lower case, English stop words, Snowball stemming by
PyStemmer) and check whether the step's supporting passage is in the top ``k``. The world is
meant to land at "most but not all": if every sub-question hits, imitation of the gold
decomposition already solves everything and reinforcement learning has nothing left to find.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from r3rag.world.schema import SPLITS


def _load_questions(world: Path, splits: tuple[str, ...]) -> list[dict[str, Any]]:
    out = []
    for split in splits:
        with (world / f"{split}.jsonl").open(encoding="utf-8") as f:
            out.extend(json.loads(line) for line in f)
    return out


def subquestion_hits(world_dir: str | Path, k: int = 5, splits: tuple[str, ...] = SPLITS) -> dict[str, Any]:
    """Share of gold sub-questions whose supporting passage BM25 ranks in the top ``k``.

    Returns ``{"subquestions", "subq_hit", "questions", "all_hit", "by_hops", "by_relation"}``
    (shares in [0, 1]); ``all_hit`` is the share of questions whose every sub-question hits.
    """
    import bm25s
    import Stemmer
    from bm25s.tokenization import Tokenizer

    world = Path(world_dir)
    ids, texts = [], []
    with (world / "corpus.jsonl").open(encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            ids.append(d["id"])
            texts.append(d["contents"])
    tokenizer = Tokenizer(stopwords="en", stemmer=Stemmer.Stemmer("english"))
    retriever = bm25s.BM25()
    retriever.index(tokenizer.tokenize(texts, return_as="ids", show_progress=False), show_progress=False)
    del texts

    questions = _load_questions(world, splits)
    steps = [(qi, s) for qi, q in enumerate(questions) for s in q["metadata"]["decomposition"]]
    query_ids = tokenizer.tokenize([s["question"] for _, s in steps], update_vocab=False,
                                   return_as="ids", show_progress=False)
    docs, _ = retriever.retrieve(query_ids, k=k, show_progress=False)
    hit_q = [True] * len(questions)
    by_hops: dict[str, list[int]] = {}
    by_rel: dict[str, list[int]] = {}
    hits = 0
    for (qi, step), row in zip(steps, docs):
        found = {ids[int(i)] for i in row}
        ok = all(pid in found for pid in step["supporting_ids"])
        hits += ok
        hit_q[qi] &= ok
        rel = by_rel.setdefault(step.get("relation", "?"), [0, 0])
        rel[0] += ok
        rel[1] += 1
    for qi, q in enumerate(questions):
        h = by_hops.setdefault(str(q["metadata"]["hops"]), [0, 0])
        h[0] += hit_q[qi]
        h[1] += 1
    return {
        "k": k,
        "subquestions": len(steps),
        "subq_hit": hits / max(len(steps), 1),
        "questions": len(questions),
        "all_hit": sum(hit_q) / max(len(questions), 1),
        "all_hit_by_hops": {h: round(a / n, 4) for h, (a, n) in sorted(by_hops.items())},
        "subq_hit_by_relation": {r: round(a / n, 4) for r, (a, n) in sorted(by_rel.items())},
    }
