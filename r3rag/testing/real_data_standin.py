"""Tiny stand-ins for the public releases the real-data path fetches, built from the embedded world.

The world's questions carry what a teacher needs (gold decompositions) and its corpus answers
them, so the whole path (fetch, index import, serve, evaluate, cold start) runs on them as it
would on HotpotQA and wiki18:

- :func:`flashrag_files`: FlashRAG's repository layout (``{set}/{split}.jsonl``, FlashRAG records)
  for every set and split the fetch asks for, each a slice of the world's questions;
- :func:`corpus_files`: ``wiki-18.jsonl.gz``, the world's corpus gzipped;
- :func:`index_files`: ``part_aa`` + ``part_ab``, a faiss Flat inner-product index of that corpus
  made with the given encoder (the packaged MiniLM in tests, where the real release has e5) and
  split in two as Search-R1 publishes it;
- :func:`standin_hub`: a :class:`~r3rag.testing.hub_standin.HubStandin` serving all three under
  the real repository names.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from r3rag.data.fetch.catalog import BENCHMARK_SPLITS, COLDSTART_SETS, DEFAULT_REPOS, FLASHRAG_NAMES
from r3rag.testing.hub_standin import HubStandin


def _lines(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")


def flashrag_files(world_dir: str | Path, per_split: int = 12) -> dict[str, bytes]:
    """``{"{folder}/{split}.jsonl": bytes}``: training splits from the world's train questions,
    evaluation splits from its dev questions (``per_split`` each; training splits get all). The
    tiny world has no dev cluster: its evaluation splits are then the last train questions."""
    world = Path(world_dir)
    train = [json.loads(x) for x in (world / "train.jsonl").read_text(encoding="utf-8").splitlines() if x.strip()]
    dev = [json.loads(x) for x in (world / "dev.jsonl").read_text(encoding="utf-8").splitlines() if x.strip()]
    dev = dev or train[-per_split:]
    files: dict[str, bytes] = {}
    for short, splits in BENCHMARK_SPLITS.items():
        for split in splits:
            files[f"{FLASHRAG_NAMES[short]}/{split}.jsonl"] = _lines(dev[:per_split])
    for short in COLDSTART_SETS:
        files[f"{FLASHRAG_NAMES[short]}/train.jsonl"] = _lines(train)
    return files


def corpus_files(world_dir: str | Path) -> dict[str, bytes]:
    return {"wiki-18.jsonl.gz": gzip.compress((Path(world_dir) / "corpus.jsonl").read_bytes(), mtime=0)}


def index_files(corpus_path: str | Path, encoder_path: str, family: str = "sbert") -> dict[str, bytes]:
    """A Flat inner-product faiss index of the corpus, serialised and cut in two halves."""
    import faiss
    import numpy as np

    from r3rag.retrieval.encoders import Encoder

    texts = [json.loads(x)["contents"] for x in Path(corpus_path).read_text(encoding="utf-8").splitlines() if x.strip()]
    enc = Encoder(encoder_path, family=family, device="cpu")
    vecs = np.ascontiguousarray(enc.encode(texts, "passage"), dtype=np.float32)
    index = faiss.IndexFlatIP(vecs.shape[1])
    index.add(vecs)
    blob = faiss.serialize_index(index).tobytes()
    half = len(blob) // 2
    return {"part_aa": blob[:half], "part_ab": blob[half:]}


def standin_hub(world_dir: str | Path, encoder_path: str | None = None, **opts) -> HubStandin:
    """A stand-in hub with the FlashRAG datasets, the wiki18 corpus and (given an encoder) the
    index, under the repository names the fetch uses by default. Not started."""
    repos = {
        f"datasets/{DEFAULT_REPOS['benchmarks']}": flashrag_files(world_dir),
        f"datasets/{DEFAULT_REPOS['corpus']}": corpus_files(world_dir),
    }
    if encoder_path is not None:
        repos[f"datasets/{DEFAULT_REPOS['index']}"] = index_files(Path(world_dir) / "corpus.jsonl", encoder_path)
    return HubStandin(repos, **opts)
