"""Build the world into a directory, streaming every file to disk.

Output (all JSON Lines except the manifest):

- ``corpus.jsonl``: ``{"id": "w0000123", "contents": "Title\\ntext"}`` (FlashRAG corpus);
- ``train.jsonl``, ``dev.jsonl``, ``test.jsonl``: ``{"id": "dev-000042", "question",
  "golden_answers", "metadata"}`` (FlashRAG dataset lines);
- ``facts.jsonl``: the relation table ``{"subject", "relation", "object", "value",
  "passage_id"}`` that the validator proves answers against;
- ``manifest.json``: seed, size, counts, per-type and per-hop counts, generator version and the
  sha256 of every file.

Memory stays bounded at any size: pass one keeps only the names (a few tens of bytes per entity)
to make them unique world-wide and count surnames; pass two generates, writes and forgets one
cluster at a time, so no passage string outlives its cluster.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any, TextIO

from r3rag.errors import R3RagError
from r3rag.world.corpus import render_cluster
from r3rag.world.generator import ROSTER, build_cluster, draw_cluster_names
from r3rag.world.questions import WorldView, cluster_questions
from r3rag.world.schema import GENERATOR_VERSION, QUESTION_TYPES, SIZES, SPLITS

FILES = ("corpus.jsonl", "train.jsonl", "dev.jsonl", "test.jsonl", "facts.jsonl")
PERSON_SLOTS = [i for i, (_, kind) in enumerate(ROSTER) if kind == "person"]


class HashingWriter:
    """A text file that also hashes and counts the lines written to it."""

    def __init__(self, path: Path):
        self.file: TextIO = path.open("w", encoding="utf-8", newline="\n")
        self.sha = hashlib.sha256()
        self.lines = 0
        self.bytes = 0

    def write_json(self, obj: dict[str, Any]) -> None:
        line = json.dumps(obj, ensure_ascii=False) + "\n"
        data = line.encode("utf-8")
        self.sha.update(data)
        self.bytes += len(data)
        self.lines += 1
        self.file.write(line)

    def close(self) -> dict[str, Any]:
        self.file.close()
        return {"sha256": self.sha.hexdigest(), "lines": self.lines, "bytes": self.bytes}


def _questions_for(cluster: int, rate: float) -> int:
    """Spread ``rate`` questions per cluster evenly: floor(rate*(c+1)) - floor(rate*c)."""
    return int(rate * (cluster + 1)) - int(rate * cluster)


def build_world(
    out_dir: str | Path,
    seed: int = 0,
    size: str = "small",
    *,
    clusters: int | None = None,
    questions_per_cluster: float | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Generate the world for ``seed`` and ``size`` into ``out_dir``; return the manifest.

    ``clusters`` and ``questions_per_cluster`` override the size's defaults (tests use them to
    exercise the streaming path at a scaled-down size).
    """
    if size not in SIZES:
        raise R3RagError(f"unknown world size {size!r}; expected one of {', '.join(SIZES)}")
    spec = SIZES[size]
    n_clusters = spec.clusters if clusters is None else clusters
    rate = spec.questions_per_cluster if questions_per_cluster is None else questions_per_cluster
    if n_clusters < 1 or rate < 0:
        raise R3RagError("clusters must be >= 1 and questions_per_cluster >= 0")
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise R3RagError(f"cannot create output directory {out}: {err.strerror}") from None

    # The manifest is written last: its presence marks a finished build (callers rely on it).
    (out / "manifest.json").unlink(missing_ok=True)

    # Pass one: unique names for every cluster, and how many people share each surname.
    used: set[str] = set()
    all_names: list[list[str]] = []
    surnames: Counter[str] = Counter()
    for c in range(n_clusters):
        names = draw_cluster_names(seed, c, used)
        all_names.append(names)
        surnames.update(names[i].rsplit(" ", 1)[1] for i in PERSON_SLOTS)
    del used

    writers = {name: HashingWriter(out / name) for name in FILES}
    per_type = {s: Counter() for s in SPLITS}
    per_hops = {s: Counter() for s in SPLITS}
    n_passages = n_entities = 0
    iterator = range(n_clusters)
    if progress:
        from tqdm import tqdm

        iterator = tqdm(iterator, desc=f"world {size}", unit="cluster")
    try:
        for c in iterator:
            cluster = build_cluster(seed, c, all_names[c])
            all_names[c] = []  # release pass one's names as we go
            n_entities += len(cluster.entities)
            for draft in render_cluster(cluster, seed):
                pid = f"w{n_passages:07d}"
                n_passages += 1
                for fact in draft.facts:
                    fact.passage_id = pid
                writers["corpus.jsonl"].write_json({"id": pid, "contents": draft.contents()})
            for e in cluster.entities.values():
                for fact in e.facts.values():
                    writers["facts.jsonl"].write_json(fact.to_dict())
            view = WorldView(cluster, surnames)
            split = cluster.split
            for q in cluster_questions(view, _questions_for(c, rate), seed):
                w = writers[f"{split}.jsonl"]
                meta = q["metadata"]
                meta["cluster"] = c
                w.write_json({"id": f"{split}-{w.lines:06d}", **q})
                per_type[split][meta["type"]] += 1
                per_hops[split][str(meta["hops"])] += 1
    finally:
        files = {name: w.close() for name, w in writers.items()}

    manifest = {
        "generator": "r3rag.world",
        "generator_version": GENERATOR_VERSION,
        "seed": seed,
        "size": size,
        "clusters": n_clusters,
        "questions_per_cluster": rate,
        "counts": {
            "passages": n_passages,
            "entities": n_entities,
            "facts": files["facts.jsonl"]["lines"],
            "questions": {s: files[f"{s}.jsonl"]["lines"] for s in SPLITS},
        },
        "per_type": {s: {t: per_type[s][t] for t in QUESTION_TYPES} for s in SPLITS},
        "per_hops": {s: {h: per_hops[s][h] for h in ("1", "2", "3", "4")} for s in SPLITS},
        "files": files,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest
