"""The index manifest: everything the server needs to query an index the way it was built.

``build_index`` writes ``manifest.json`` beside the index files; ``load_searcher`` reads it.
It records the corpus (path, byte size, sha256, number of passages), the method and, per
method, the tokenisation (BM25) or the encoder, pooling, prefixes and faiss layout (dense), so
a query is always tokenised or encoded exactly like the passages were.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from r3rag.errors import R3RagError

MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 1


class IndexError_(R3RagError):
    """An index directory is missing, incomplete or inconsistent with its corpus."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


class CorpusInfo(_Strict):
    path: str
    bytes: int
    sha256: str
    num_passages: int


class BM25Info(_Strict):
    k1: float = 1.5
    b: float = 0.75
    variant: str = "lucene"
    stemmer: str | None = "english"
    stopwords: str | None = "en"
    lower: bool = True
    backend: str = "auto"


class DenseInfo(_Strict):
    encoder: str
    family: str
    pooling: Literal["mean", "cls"]
    query_prefix: str = ""
    passage_prefix: str = ""
    normalize: bool = True
    max_length: int = 256
    dim: int
    factory: str
    index_file: str = "dense.index"
    fp16: bool = False
    ef_search: int = 64
    nprobe: int = 16
    probe: list[list[float]] = []
    """Passage vectors of the encoder's probe texts: a server given another encoder refuses."""
    vectors_dir: str | None = None
    """Folder (relative to the index) of the fp16 vector shards, used for exact re-scoring."""
    refine_k: int = 0
    """Candidates re-scored exactly from ``vectors_dir`` per query (0: none)."""
    encode_dtype: str = "float32"


class Manifest(_Strict):
    format_version: int = FORMAT_VERSION
    name: str
    method: Literal["bm25", "dense"]
    corpus: CorpusInfo
    bm25: BM25Info | None = None
    dense: DenseInfo | None = None
    build_seconds: float = 0.0

    def save(self, index_dir: str | Path) -> Path:
        """Write the manifest last and atomically: a directory with one is a finished index."""
        import os

        path = Path(index_dir) / MANIFEST_NAME
        tmp = path.with_name(f"{MANIFEST_NAME}.tmp.{os.getpid()}")
        tmp.write_text(self.model_dump_json(indent=2), encoding="utf-8")
        os.replace(tmp, path)
        return path


def read_manifest(index_dir: str | Path) -> Manifest:
    path = Path(index_dir) / MANIFEST_NAME
    if not Path(index_dir).is_dir():
        raise IndexError_(f"{index_dir}: index directory not found")
    if not path.is_file():
        raise IndexError_(f"{index_dir}: no {MANIFEST_NAME}; build it with tool/build_index.py")
    try:
        return Manifest.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except (json.JSONDecodeError, ValidationError) as err:
        first = str(err).splitlines()[0]
        raise IndexError_(f"{path}: invalid manifest ({first})") from None


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
