"""Checkpoints that survive SIGKILL at any moment, and the final HF folder.

A checkpoint ``checkpoints/iter_NNNNNN/`` holds the policy, the critic (``gae``), both optimizers,
the scheduler, every RNG state (python, numpy, torch, CUDA), the data order and the iteration
counter. It is written into ``iter_NNNNNN.tmp/`` and renamed when complete, so a folder without
``.tmp`` is always whole; a leftover ``.tmp`` (killed while writing) is deleted on the next start.
Older checkpoints beyond ``keep`` are removed after the new one is in place.

The final model is written with ``save_pretrained`` plus the tokenizer: a folder every other
command takes as ``--model``.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

CKPT_DIR = "checkpoints"
STATE = "state.json"


def rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _name(completed: int) -> str:
    return f"iter_{completed:06d}"


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The newest complete checkpoint folder (and leftover ``.tmp`` folders removed)."""
    root = Path(out_dir) / CKPT_DIR
    if not root.is_dir():
        return None
    for tmp in root.glob("*.tmp"):
        shutil.rmtree(tmp, ignore_errors=True)
    done = sorted(p for p in root.glob("iter_*") if (p / STATE).is_file())
    return done[-1] if done else None


def save_checkpoint(out_dir: str | Path, completed: int, objects: dict[str, Any], state: dict[str, Any], keep: int = 1) -> Path:
    """Write ``objects`` (name -> something with ``state_dict()``) and ``state`` (JSON) atomically."""
    root = Path(out_dir) / CKPT_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / _name(completed)
    tmp = root / (_name(completed) + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for name, obj in objects.items():
        if obj is not None:
            torch.save(obj.state_dict(), tmp / f"{name}.pt")
    torch.save(rng_state(), tmp / "rng.pt")
    (tmp / STATE).write_text(json.dumps({**state, "completed": completed}, indent=1), encoding="utf-8")
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    old = sorted(p for p in root.glob("iter_*") if p.is_dir() and not p.name.endswith(".tmp") and p != final)
    for p in old[: max(0, len(old) - (keep - 1))]:
        shutil.rmtree(p, ignore_errors=True)
    return final


def load_checkpoint(path: Path, objects: dict[str, Any], map_location: Any = "cpu") -> dict[str, Any]:
    """Load every object saved in ``path`` into ``objects`` (in place) and restore the RNGs;
    returns the JSON state."""
    for name, obj in objects.items():
        f = path / f"{name}.pt"
        if obj is not None and f.is_file():
            obj.load_state_dict(torch.load(f, map_location=map_location, weights_only=False))
    set_rng_state(torch.load(path / "rng.pt", weights_only=False))
    return read_state(path)


def read_state(path: Path) -> dict[str, Any]:
    """A checkpoint's JSON state (``completed``, ``train_s``, ...) without loading its tensors."""
    return json.loads((Path(path) / STATE).read_text(encoding="utf-8"))


def strip_quantizer(model: Any) -> None:
    """Forget that a model came from a quantised (GGUF) file: its weights are plain floats by
    then, and transformers refuses ``.float()``, training and ``save_pretrained`` round trips otherwise."""
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    if getattr(model, "is_quantized", False):
        try:
            model.is_quantized = False
        except AttributeError:
            pass


def save_hf_folder(model: Any, tokenizer: Any, out: str | Path) -> Path:
    """``save_pretrained`` model + tokenizer into ``out`` (written beside, then renamed).

    A model dequantised from a GGUF file carries a quantisation config that ``from_pretrained``
    would try to honour: it is dropped first (the weights are plain float tensors by then)."""
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    strip_quantizer(model)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out
