"""Resolve ``--dataset`` to validated questions, before any model is loaded.

``hotpotqa | 2wiki | musique | bamboogle``
    R1-Searcher's published evaluation subsets (500 random dev questions each, Bamboogle's 125) in
    ``dataset.data_dir``. With ``dataset.source`` set, HotpotQA/2Wiki/MuSiQue come instead from the
    Hugging Face hub (``source: hf``) or a local copy of a hub release (a file or a
    ``save_to_disk`` folder), converted by :mod:`r3rag.data.hf_datasets`.
``world``
    The embedded world's dev split (``dataset.split`` for another), built once into
    ``dataset.world_dir`` and reused afterwards.
anything else
    A JSONL path in FlashRAG or R1-Searcher layout.

Every reader validates the whole file and raises :class:`~r3rag.errors.DataError` naming
``file:line`` at the first bad record.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from r3rag.data.hf_datasets import HF_DATASETS, load_hf_questions
from r3rag.data.readers import read_questions
from r3rag.data.records import Question
from r3rag.errors import DataError
from r3rag.evaluation.config import DatasetConfig

#: named subsets shipped in ``data_dir`` (R1-Searcher's evaluation files)
SUBSET_FILES: dict[str, str] = {
    "hotpotqa": "hotpotqa_500.jsonl",
    "2wiki": "2wiki_500.jsonl",
    "musique": "musique_500.jsonl",
    "bamboogle": "bamboogle.jsonl",
}
WORLD_SPLITS = ("train", "dev", "test")
_REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class ResolvedDataset:
    name: str  # short name used in reports (subset name, "world", or the file stem)
    questions: list[Question]
    source: str  # the file or hub id the questions came from
    world_dir: Path | None = None  # set for the embedded world (its corpus lives there)
    first_position: int = 0  # position of questions[0] in its file or split (dataset.skip)


def _find(path: str | Path) -> Path:
    """A relative path is looked up from the working directory, then from the repository root."""
    p = Path(path)
    if p.is_absolute() or p.exists():
        return p
    alt = _REPO_ROOT / p
    return alt if alt.exists() else p


def ensure_world(world_dir: str | Path, seed: int = 0, size: str = "small") -> Path:
    """Build the embedded world into ``world_dir`` unless a finished build is already there."""
    out = Path(world_dir)
    manifest = out / "manifest.json"  # written last, so its presence means a finished build
    if manifest.is_file():
        m = json.loads(manifest.read_text(encoding="utf-8"))
        if (m.get("seed"), m.get("size")) != (seed, size):
            raise DataError(f"{out} holds the world with seed {m.get('seed')} size {m.get('size')!r}, "
                            f"not seed {seed} size {size!r}; set dataset.world_dir to another folder")
        return out
    from r3rag.world import build_world

    build_world(out, seed=seed, size=size)
    return out


def _world(cfg: DatasetConfig) -> ResolvedDataset:
    split = cfg.split or "dev"
    if split not in WORLD_SPLITS:
        raise DataError(f"world split {split!r}: choose one of {', '.join(WORLD_SPLITS)}")
    out = ensure_world(cfg.world_dir, cfg.world_seed, cfg.world_size)
    path = out / f"{split}.jsonl"
    return _skipped(ResolvedDataset("world", read_questions(path, _read_limit(cfg)), str(path), out), cfg)


def _subset(name: str) -> Callable[[DatasetConfig], ResolvedDataset]:
    def load(cfg: DatasetConfig) -> ResolvedDataset:
        if cfg.source is not None:
            if name not in HF_DATASETS:
                raise DataError(f"dataset {name!r} has no Hugging Face converter; drop dataset.source")
            src = None if cfg.source == "hf" else str(_find(cfg.source))
            qs = load_hf_questions(name, src, cfg.split, _read_limit(cfg))
            if not qs:
                raise DataError(f"{src or HF_DATASETS[name].hub_id}: no questions")
            return _skipped(ResolvedDataset(name, qs, src or HF_DATASETS[name].hub_id), cfg)
        path = _find(Path(cfg.data_dir) / SUBSET_FILES[name])
        return _skipped(ResolvedDataset(name, read_questions(path, _read_limit(cfg)), str(path)), cfg)

    return load


DATASETS: dict[str, Callable[[DatasetConfig], ResolvedDataset]] = {
    "world": _world,
    **{name: _subset(name) for name in SUBSET_FILES},
}


def resolve_dataset(cfg: DatasetConfig) -> ResolvedDataset:
    """The questions ``cfg`` names (a registered name or a JSONL path), validated."""
    loader = DATASETS.get(cfg.name)
    if loader is not None:
        return loader(cfg)
    path = _find(cfg.name)
    if not path.is_file():
        raise DataError(f"dataset {cfg.name!r}: not a file and not one of {', '.join(sorted(DATASETS))}")
    return _skipped(ResolvedDataset(path.stem, read_questions(path, _read_limit(cfg)), str(path)), cfg)


def _read_limit(cfg: DatasetConfig) -> int | None:
    """How many questions to read from the top so that ``limit`` remain after ``skip``."""
    return None if cfg.limit is None else cfg.skip + cfg.limit


def _skipped(ds: ResolvedDataset, cfg: DatasetConfig) -> ResolvedDataset:
    """``ds`` without its first ``cfg.skip`` questions; an empty remainder is an error."""
    if not cfg.skip:
        return ds
    if cfg.skip >= len(ds.questions):
        raise DataError(f"dataset.skip={cfg.skip}: {ds.source} has only {len(ds.questions)} questions")
    return dataclasses.replace(ds, questions=ds.questions[cfg.skip:], first_position=cfg.skip)


def select_shard(questions: list[Question], shard: tuple[int, int] | None, start: int = 0) -> list[tuple[int, Question]]:
    """``(position, question)`` pairs of one shard: positions ``p`` (counted from ``start``, the
    first question's position in its file) with ``p % n == i``."""
    pairs = list(enumerate(questions, start))
    if shard is None:
        return pairs
    i, n = shard
    return [(p, q) for p, q in pairs if p % n == i]
