"""Optional cross-encoder reranking of a searcher's candidates.

A cross-encoder folder (``AutoModelForSequenceClassification``) scores each (query, passage)
pair jointly; the base searcher supplies the top ``depth`` candidates and the reranker
reorders them and keeps ``k``. With more than one output label the last logit is the
relevance score.
"""

from __future__ import annotations

from r3rag.data.records import Passage
from r3rag.errors import R3RagError
from r3rag.retrieval.searcher import Searcher


class CrossEncoder:
    def __init__(self, model: str, max_length: int = 512, batch_size: int = 32, device: str | None = None):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(model)
            self.model = AutoModelForSequenceClassification.from_pretrained(model)
        except (OSError, ValueError) as err:
            raise R3RagError(f"cannot load cross-encoder {model!r}: {str(err).splitlines()[0]}") from None
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model.eval().to(self.device)
        self.max_length = max_length
        self.batch_size = batch_size

    def score(self, pairs: list[tuple[str, str]]) -> list[float]:
        import torch

        out: list[float] = []
        with torch.inference_mode():
            for s in range(0, len(pairs), self.batch_size):
                chunk = pairs[s : s + self.batch_size]
                enc = self.tokenizer([q for q, _ in chunk], [p for _, p in chunk], padding=True,
                                     truncation=True, max_length=self.max_length, return_tensors="pt").to(self.device)
                logits = self.model(**enc).logits
                out.extend(logits[:, -1].float().cpu().tolist())
        return out


class RerankedSearcher(Searcher):
    """``base`` retrieves ``depth`` candidates per query; ``reranker`` keeps the best ``k``."""

    def __init__(self, base: Searcher, reranker: CrossEncoder, depth: int = 20):
        self.base, self.reranker, self.depth = base, reranker, depth
        self.name = base.name
        self.kind = f"{base.kind}+rerank"

    @property
    def size(self) -> int:
        return self.base.size

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        cands = self.base.search(queries, max(k, self.depth))
        pairs = [(q, p.contents) for q, ps in zip(queries, cands) for p in ps]
        scores = iter(self.reranker.score(pairs))
        out = []
        for ps in cands:
            rescored = [Passage(p.id, p.contents, next(scores)) for p in ps]
            out.append(sorted(rescored, key=lambda p: -(p.score or 0.0))[:k])
        return out
