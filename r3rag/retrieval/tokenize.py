"""The one BM25 tokeniser, used at index time and at query time.

Lower-casing, the scikit-learn word pattern (words of two or more characters), optional
stop-word removal (bm25s's lists) and optional Snowball stemming (PyStemmer). The options are
stored in the manifest, so the server always rebuilds the exact tokeniser the index used.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Callable, Iterable

from r3rag.errors import R3RagError

TOKEN_PATTERN = re.compile(r"(?u)\b\w\w+\b")


@lru_cache(maxsize=None)
def _stopwords(name: str | None) -> frozenset[str]:
    if not name:
        return frozenset()
    from bm25s.tokenization import _infer_stopwords

    try:
        return frozenset(_infer_stopwords(name))
    except ValueError as err:
        raise R3RagError(f"unknown stop-word list {name!r}: {err}") from None


@lru_cache(maxsize=None)
def _stemmer(lang: str | None) -> Callable[[list[str]], list[str]] | None:
    if not lang:
        return None
    import Stemmer

    try:
        return Stemmer.Stemmer(lang).stemWords
    except KeyError:
        raise R3RagError(
            f"unknown stemmer language {lang!r}; choose from {', '.join(Stemmer.algorithms())}"
        ) from None


class Tokenizer:
    """``Tokenizer(stemmer="english", stopwords="en")(text) -> list[str]``."""

    def __init__(self, stemmer: str | None = "english", stopwords: str | None = "en", lower: bool = True):
        self.lower = lower
        self._stop = _stopwords(stopwords)
        self._stem = _stemmer(stemmer)

    def __call__(self, text: str) -> list[str]:
        if self.lower:
            text = text.lower()
        words = [w for w in TOKEN_PATTERN.findall(text) if w not in self._stop]
        return self._stem(words) if self._stem else words

    def many(self, texts: Iterable[str]) -> list[list[str]]:
        return [self(t) for t in texts]
