"""Helpers for the cold-start and SFT tests: a tiny world with its index, a scripted teacher,
and the LLaMA-Factory environment (skip without it, unless R3RAG_REQUIRE_ENVS=1)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from r3rag.rollout.backends.base import GenerationOutput, GenerationRequest, PolicyBackend
from r3rag.rollout.tokens import encode

ROOT = Path(__file__).resolve().parents[1]


def lf_venv() -> Path:
    return Path(os.environ.get("R3RAG_LLAMAFACTORY_VENV") or ROOT / ".venvs" / "llamafactory")


def require_lf_env() -> Path:
    """LLaMA-Factory's python, or skip (fail when R3RAG_REQUIRE_ENVS=1: CI created it)."""
    py = lf_venv() / "bin" / "python"
    stamp = lf_venv() / ".r3rag-llamafactory-installed"
    if py.is_file() and stamp.is_file():
        return py
    reason = f"LLaMA-Factory environment missing at {lf_venv()} (bash train/envs/llamafactory.sh)"
    if os.environ.get("R3RAG_REQUIRE_ENVS") == "1":
        pytest.fail(reason + " but R3RAG_REQUIRE_ENVS=1")
    pytest.skip(reason)


def make_world(root: Path, size: str = "tiny") -> tuple[Path, Path]:
    """``(world_dir, bm25_index_dir)`` built once under ``root``."""
    from r3rag.retrieval.bm25_index import build_bm25
    from r3rag.world import build_world

    world, index = root / f"world-{size}", root / f"bm25-{size}"
    if not (world / "manifest.json").is_file():
        build_world(world, seed=0, size=size)
    if not (index / "manifest.json").is_file():
        build_bm25(world / "corpus.jsonl", index, show_progress=False)
    return world, index


class ScriptedTeacher(PolicyBackend):
    """Answers each question in one step, no retrieval: attempt ``k`` of a question answers
    ``script[question][k]`` (the last entry repeats). Records the temperature of every attempt."""

    name = "scripted"

    def __init__(self, fmt: Any, tokenizer: Any, script: dict[str, list[str]]) -> None:
        self.fmt = fmt
        self.tokenizer = tokenizer
        self.script = script
        self.temperatures: dict[str, list[float]] = {q: [] for q in script}

    async def agenerate(self, requests: list[GenerationRequest]) -> list[GenerationOutput]:
        outs = []
        for r in requests:
            q = next(q for q in sorted(self.script, key=len, reverse=True) if q in r.prompt_text)
            k = len(self.temperatures[q])
            self.temperatures[q].append(r.params.temperature)
            answers = self.script[q]
            text = self.fmt.render_turn(0, "I know this one.", answer=answers[min(k, len(answers) - 1)])
            ids = encode(self.tokenizer, text)
            outs.append(GenerationOutput(ids, text, [0.0] * len(ids), "eos"))
        return outs
